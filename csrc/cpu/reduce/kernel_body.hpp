// The reduction kernels, written once and compiled once per instruction set (kernels_generic.cpp,
// kernels_avx2.cpp, kernels_avx512.cpp). Not a normal header: each including file
//   1. includes every header it needs (<type_traits> and <cstdint> at least; this file includes none: a header read after a
//      `#pragma GCC target` would have its inline functions compiled for that target, and the
//      linker could hand those copies to code that runs on any x86-64);
//   2. switches the target on (`#pragma GCC target`), and opens an anonymous namespace (every
//      instantiation below has internal linkage: no copy is shared between the three files);
//   3. defines `HalfConvert` (float16 <-> float32 for its instruction set), then includes this file.
// The loops are plain C++ that GCC vectorises at -O3 for the target in effect; only the float16
// conversions need intrinsics (HalfConvert).
//
// Every kernel folds its sources left, in the order given: out = ((s0 op s1) op s2) ... op sN-1,
// element by element, so the same sources in the same order give the same bits on every rank and
// with every instruction set (IEEE add, multiply, compare and the conversions below are exact
// operations; no kernel contracts a multiply and an add).

constexpr size_t kBlockBytes = 4096;  // one block of the output stays in L1 while all sources fold into it

template <typename T>
inline T smaller(T a, T b) { return a < b ? a : b; }

// Integers wrap around (two's complement) through the unsigned type they are promoted to
// (unsigned int for 8- and 16-bit types, whose products would otherwise overflow a signed int):
// no undefined overflow for the optimiser to exploit, the same bits as torch's integer sums.
template <typename T, bool = std::is_integral_v<T>>
struct ArithmeticOf { using type = T; };
template <typename T>
struct ArithmeticOf<T, true> { using type = std::make_unsigned_t<decltype(T{} + T{})>; };
template <typename T>
using Arithmetic = typename ArithmeticOf<T>::type;

struct Sum {
  template <typename T> static T apply(T a, T b) {
    return static_cast<T>(static_cast<Arithmetic<T>>(a) + static_cast<Arithmetic<T>>(b));
  }
};
struct Product {
  template <typename T> static T apply(T a, T b) {
    return static_cast<T>(static_cast<Arithmetic<T>>(a) * static_cast<Arithmetic<T>>(b));
  }
};
// MIN/MAX keep gloo's (and std::min/std::max's) choice when the operands are unordered (a NaN):
// MIN(a, b) = b < a ? b : a, MAX(a, b) = a < b ? b : a.
struct Min { template <typename T> static T apply(T a, T b) { return b < a ? b : a; } };
struct Max { template <typename T> static T apply(T a, T b) { return a < b ? b : a; } };
struct BitAnd { template <typename T> static T apply(T a, T b) { return a & b; } };
struct BitOr { template <typename T> static T apply(T a, T b) { return a | b; } };
struct BitXor { template <typename T> static T apply(T a, T b) { return a ^ b; } };

// out may be sources[0] (the pairwise form below), or any other source at the same address range;
// partial overlaps are not allowed.
template <typename T, typename Op>
void foldSources(void* out, const void* const* sources, int n, size_t count) {
  T* o = static_cast<T*>(out);
  if (n == 1) {
    if (o != sources[0]) __builtin_memmove(o, sources[0], count * sizeof(T));
    return;
  }
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  for (size_t first = 0; first < count; first += kBlock) {
    const size_t m = smaller(kBlock, count - first);
    T* ob = o + first;
    const T* a = static_cast<const T*>(sources[0]) + first;
    const T* b = static_cast<const T*>(sources[1]) + first;
    for (size_t i = 0; i < m; ++i) ob[i] = Op::apply(a[i], b[i]);
    for (int k = 2; k < n; ++k) {
      const T* s = static_cast<const T*>(sources[k]) + first;
      for (size_t i = 0; i < m; ++i) ob[i] = Op::apply(ob[i], s[i]);
    }
  }
}

// bfloat16 <-> float32: widening is exact (the top 16 bits); narrowing rounds to nearest even and
// maps every NaN to 0x7FC0, bit for bit what c10::BFloat16(float) does.
struct BFloat16Convert {
  static void widen(const uint16_t* in, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = __builtin_bit_cast(float, static_cast<uint32_t>(in[i]) << 16);
  }
  static void narrow(const float* in, uint16_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const uint32_t bits = __builtin_bit_cast(uint32_t, in[i]);
      const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
      out[i] = in[i] != in[i] ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
    }
  }
};

// 16-bit floats accumulate in float32 across all sources and round once at the end, as torch's
// own sum of a stacked half tensor does (acc_type<Half> is float). The pairwise form (two
// sources, the byte-stream algorithms' step) therefore rounds once per step.
template <typename Convert, typename Op>
void foldWidened(void* out, const void* const* sources, int n, size_t count) {
  uint16_t* o = static_cast<uint16_t*>(out);
  if (n == 1) {
    if (o != sources[0]) __builtin_memmove(o, sources[0], count * sizeof(uint16_t));
    return;
  }
  constexpr size_t kBlock = kBlockBytes / sizeof(float);
  alignas(64) float accumulator[kBlock];
  alignas(64) float next[kBlock];
  for (size_t first = 0; first < count; first += kBlock) {
    const size_t m = smaller(kBlock, count - first);
    Convert::widen(static_cast<const uint16_t*>(sources[0]) + first, accumulator, m);
    for (int k = 1; k < n; ++k) {
      Convert::widen(static_cast<const uint16_t*>(sources[k]) + first, next, m);
      for (size_t i = 0; i < m; ++i) accumulator[i] = Op::apply(accumulator[i], next[i]);
    }
    Convert::narrow(accumulator, o + first, m);
  }
}

// dst = dst op src: the byte-stream algorithms' step, the fold of two sources.
template <ReduceManyFn Fold>
void pairwise(void* dst, const void* src, size_t count) {
  const void* sources[2] = {dst, src};
  Fold(dst, sources, 2, count);
}

template <ReduceManyFn Fold>
constexpr KernelPair kernels() { return KernelPair{&pairwise<Fold>, Fold}; }

template <typename T>
KernelPair arithmetic(RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::AVG:  // summed here, divided by the world size afterwards
      return kernels<foldSources<T, Sum>>();
    case RedOpType::PRODUCT: return kernels<foldSources<T, Product>>();
    case RedOpType::MIN: return kernels<foldSources<T, Min>>();
    case RedOpType::MAX: return kernels<foldSources<T, Max>>();
    default: return {};
  }
}

// PREMUL_SUM: the caller has already multiplied the input by the factor; what remains is a sum.
template <typename T>
KernelPair floating(RedOpType op) {
  return op == RedOpType::PREMUL_SUM ? kernels<foldSources<T, Sum>>() : arithmetic<T>(op);
}

template <typename Convert>
KernelPair widened(RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::AVG:
    case RedOpType::PREMUL_SUM: return kernels<foldWidened<Convert, Sum>>();
    case RedOpType::PRODUCT: return kernels<foldWidened<Convert, Product>>();
    case RedOpType::MIN: return kernels<foldWidened<Convert, Min>>();
    case RedOpType::MAX: return kernels<foldWidened<Convert, Max>>();
    default: return {};
  }
}

template <typename T>
KernelPair integral(RedOpType op) {
  switch (op) {
    case RedOpType::BAND: return kernels<foldSources<T, BitAnd>>();
    case RedOpType::BOR: return kernels<foldSources<T, BitOr>>();
    case RedOpType::BXOR: return kernels<foldSources<T, BitXor>>();
    default: return arithmetic<T>(op);
  }
}

// bool is one byte holding 0 or 1: SUM/MAX are OR, PRODUCT/MIN are AND.
KernelPair boolean(RedOpType op) {
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::MAX:
    case RedOpType::BOR: return kernels<foldSources<uint8_t, BitOr>>();
    case RedOpType::PRODUCT:
    case RedOpType::MIN:
    case RedOpType::BAND: return kernels<foldSources<uint8_t, BitAnd>>();
    case RedOpType::BXOR: return kernels<foldSources<uint8_t, BitXor>>();
    default: return {};
  }
}

KernelPair selectFor(c10::ScalarType dtype, RedOpType op) {
  switch (dtype) {
    case c10::kFloat: return floating<float>(op);
    case c10::kDouble: return floating<double>(op);
    case c10::kHalf: return widened<HalfConvert>(op);
    case c10::kBFloat16: return widened<BFloat16Convert>(op);
    case c10::kChar: return integral<int8_t>(op);
    case c10::kByte: return integral<uint8_t>(op);
    case c10::kShort: return integral<int16_t>(op);
    case c10::kUInt16: return integral<uint16_t>(op);
    case c10::kInt: return integral<int32_t>(op);
    case c10::kUInt32: return integral<uint32_t>(op);
    case c10::kLong: return integral<int64_t>(op);
    case c10::kUInt64: return integral<uint64_t>(op);
    case c10::kBool: return boolean(op);
    default: return {};  // float8: moved, never reduced (reduceOpProblem)
  }
}
