// Element-wise reduction kernels for every dtype and op ddplite supports on CPU, in two forms:
//   ReduceFn      dst = dst op src                      (the byte-stream algorithms' step)
//   ReduceManyFn  out = s0 op s1 op ... op sN-1, left to right (the shared-memory path's fold)
// Half and bfloat16 accumulate in float32 across all sources of one call and round once, as
// torch's own sum does; the pairwise form therefore rounds once per step (as gloo does).
//
// The kernels are compiled three times (kernel_sets.hpp: generic, AVX2, AVX-512); each group
// fixes its set when it is created: DDPLITE_CPU_KERNELS, else the widest this CPU runs. Every set
// gives the same bits for the same sources in the same order (tests/test_kernels.py checks this).
#pragma once

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace ddplite::cpu {

using ReduceFn = void (*)(void* dst, const void* src, size_t count);
// `out` may be sources[0] (or another source at exactly the same address); n >= 1.
using ReduceManyFn = void (*)(void* out, const void* const* sources, int n, size_t count);

// One compiled set of kernels ("generic", "avx2" or "avx512"). A group fixes its set when it
// is created (kernelSetFromEnv); sets live for the whole process.
struct KernelSet;

// Both forms of one (dtype, op) reduction in `set`; nullptr when the pair is not supported
// (reduceOpProblem() then says why). Without a set: the one DDPLITE_CPU_KERNELS named when a
// kernel was first asked for this way (the MPI path's user-defined reductions).
ReduceFn selectReduceFn(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op, const KernelSet& set);
ReduceManyFn selectReduceManyFn(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op, const KernelSet& set);
ReduceFn selectReduceFn(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// "" when supported, else a sentence for the user's ValueError.
std::string reduceOpProblem(c10::ScalarType dtype, c10d::ReduceOp::RedOpType op);

// The dtypes every CPU collective accepts: float32/64, float16, bfloat16, int8/16/32/64,
// uint8/16/32/64, bool, and float8 e4m3fn/e5m2 (moved, never reduced).
bool isSupportedDtype(c10::ScalarType dtype);
bool isFloat8(c10::ScalarType dtype);

const char* reduceOpName(c10d::ReduceOp::RedOpType op);

// ---- Which compiled set runs ---------------------------------------------------------------------

// "generic", "avx2", "avx512": every set, narrowest first; and the ones this CPU (and its OS)
// can run.
const std::vector<std::string>& kernelSetNames();
std::vector<std::string> runnableSetNames();
const std::string& kernelSetName(const KernelSet& set);
// DDPLITE_CPU_KERNELS as it is set now ("auto": the widest set this CPU runs). Throws
// std::invalid_argument when it names an unknown set or one this CPU cannot run (checked when a
// group is created, so that init_process_group raises a ValueError, not a later SIGILL).
const KernelSet& kernelSetFromEnv();
// The named set, for tests that compare the sets on the same inputs. Throws
// std::invalid_argument for a set this CPU cannot run.
const KernelSet& kernelSetNamed(const std::string& name);

}  // namespace ddplite::cpu
