#include "cpu/reduce_kernels.hpp"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>

namespace ddplite::cpu {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

struct Sum { template <typename T> static T apply(T a, T b) { return a + b; } };
struct Product { template <typename T> static T apply(T a, T b) { return a * b; } };
struct Min { template <typename T> static T apply(T a, T b) { return std::min(a, b); } };
struct Max { template <typename T> static T apply(T a, T b) { return std::max(a, b); } };
struct BitAnd { template <typename T> static T apply(T a, T b) { return a & b; } };
struct BitOr { template <typename T> static T apply(T a, T b) { return a | b; } };
struct BitXor { template <typename T> static T apply(T a, T b) { return a ^ b; } };

template <typename T, typename Op>
void reduceLoop(void* dst, const void* src, size_t count) {
  T* out = static_cast<T*>(dst);
  const T* in = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) {
    out[i] = Op::apply(out[i], in[i]);
  }
}

// 16-bit floats: widen to float, reduce, round back (one rounding per step, like gloo).
template <typename T, typename Op>
void reduceLoopWidened(void* dst, const void* src, size_t count) {
  T* out = static_cast<T*>(dst);
  const T* in = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) {
    out[i] = static_cast<T>(Op::apply(static_cast<float>(out[i]), static_cast<float>(in[i])));
  }
}

// bool is stored as one byte holding 0 or 1: SUM/MAX are OR, PRODUCT/MIN are AND.
template <typename Op>
void reduceBool(void* dst, const void* src, size_t count) {
  reduceLoop<uint8_t, Op>(dst, src, count);
}

template <typename T>
ReduceFn selectArithmetic(RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::AVG:  // summed here, divided by the world size afterwards
      return &reduceLoop<T, Sum>;
    case RedOpType::PRODUCT: return &reduceLoop<T, Product>;
    case RedOpType::MIN: return &reduceLoop<T, Min>;
    case RedOpType::MAX: return &reduceLoop<T, Max>;
    default: return nullptr;
  }
}

// PREMUL_SUM: the caller has already multiplied the input by the factor; what remains is a sum.
template <typename T>
ReduceFn selectFloating(RedOpType op) {
  return op == RedOpType::PREMUL_SUM ? &reduceLoop<T, Sum> : selectArithmetic<T>(op);
}

template <typename T>
ReduceFn selectWidened(RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::AVG:
    case RedOpType::PREMUL_SUM: return &reduceLoopWidened<T, Sum>;
    case RedOpType::PRODUCT: return &reduceLoopWidened<T, Product>;
    case RedOpType::MIN: return &reduceLoopWidened<T, Min>;
    case RedOpType::MAX: return &reduceLoopWidened<T, Max>;
    default: return nullptr;
  }
}

template <typename T>
ReduceFn selectIntegral(RedOpType op) {
  switch (op) {
    case RedOpType::BAND: return &reduceLoop<T, BitAnd>;
    case RedOpType::BOR: return &reduceLoop<T, BitOr>;
    case RedOpType::BXOR: return &reduceLoop<T, BitXor>;
    default: return selectArithmetic<T>(op);
  }
}

ReduceFn selectBool(RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::MAX:
    case RedOpType::BOR: return &reduceBool<BitOr>;
    case RedOpType::PRODUCT:
    case RedOpType::MIN:
    case RedOpType::BAND: return &reduceBool<BitAnd>;
    case RedOpType::BXOR: return &reduceBool<BitXor>;
    default: return nullptr;
  }
}

}  // namespace

bool isSupportedDtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: case c10::kDouble: case c10::kHalf: case c10::kBFloat16:
    case c10::kChar: case c10::kByte: case c10::kInt: case c10::kLong: case c10::kBool:
      return true;
    default:
      return false;
  }
}

ReduceFn selectReduceFn(c10::ScalarType dtype, RedOpType op) {
  switch (dtype) {
    case c10::kFloat: return selectFloating<float>(op);
    case c10::kDouble: return selectFloating<double>(op);
    case c10::kHalf: return selectWidened<c10::Half>(op);
    case c10::kBFloat16: return selectWidened<c10::BFloat16>(op);
    case c10::kChar: return selectIntegral<int8_t>(op);
    case c10::kByte: return selectIntegral<uint8_t>(op);
    case c10::kInt: return selectIntegral<int32_t>(op);
    case c10::kLong: return selectIntegral<int64_t>(op);
    case c10::kBool: return selectBool(op);
    default: return nullptr;
  }
}

const char* reduceOpName(RedOpType op) {
  switch (op) {
    case RedOpType::SUM: return "SUM";
    case RedOpType::AVG: return "AVG";
    case RedOpType::PRODUCT: return "PRODUCT";
    case RedOpType::MIN: return "MIN";
    case RedOpType::MAX: return "MAX";
    case RedOpType::BAND: return "BAND";
    case RedOpType::BOR: return "BOR";
    case RedOpType::BXOR: return "BXOR";
    case RedOpType::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

std::string reduceOpProblem(c10::ScalarType dtype, RedOpType op) {
  if (selectReduceFn(dtype, op) != nullptr) {
    return "";
  }
  std::string name = reduceOpName(op);
  std::string type = c10::toString(dtype);
  if (op == RedOpType::PREMUL_SUM) {
    return "ReduceOp.PREMUL_SUM is defined for floating-point tensors only, not " + type;
  }
  if (dtype == c10::kBool) {
    return "ReduceOp." + name + " is not defined for bool tensors (use SUM/MAX for 'any', PRODUCT/MIN for 'all')";
  }
  return "ReduceOp." + name + " is not defined for " + type + " tensors (bitwise ops need an integer or bool dtype)";
}

}  // namespace ddplite::cpu
