// Element-wise reduction kernels: dst[i] = op(dst[i], src[i]) for every dtype and op ddplite
// supports on CPU. Half and bfloat16 are reduced in float and rounded once per step.
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>
#include <string>

namespace ddplite::cpu {

using ReduceFn = void (*)(void* dst, const void* src, size_t count);

// nullptr when the (dtype, op) pair is not supported; reduceOpProblem() then says why.
ReduceFn selectReduceFn(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// "" when supported, else a sentence for the user's ValueError.
std::string reduceOpProblem(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// The dtypes every CPU collective accepts.
bool isSupportedDtype(c10::ScalarType dtype);

const char* reduceOpName(c10d::ReduceOp::RedOpType op);

}  // namespace ddplite::cpu
