// The reduction kernels compiled for AVX2 (256-bit vectors) with F16C for float16 conversions.
// Chosen at run time only on a CPU that has both (reduce_kernels.cpp); see kernel_body.hpp for
// why every header comes before the target pragma.
#include "cpu/reduce/kernel_sets.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)

#include <immintrin.h>

namespace ddplite::cpu::kernels {

#pragma GCC push_options
#pragma GCC target("avx2,f16c")

namespace {

// vcvtph2ps / vcvtps2ph, round to nearest even: the same values as c10::Half's conversions
// (NaN payloads aside: every NaN stays a NaN).
struct HalfConvert {
  static void widen(const uint16_t* in, float* out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    }
    for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
  }
  static void narrow(const float* in, uint16_t* out, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

#include "cpu/reduce/kernel_body.hpp"

}  // namespace

#pragma GCC pop_options

KernelPair avx2Kernels(c10::ScalarType dtype, RedOpType op) { return selectFor(dtype, op); }

}  // namespace ddplite::cpu::kernels

#else

namespace ddplite::cpu::kernels {
KernelPair avx2Kernels(c10::ScalarType, RedOpType) { return {}; }
}  // namespace ddplite::cpu::kernels

#endif
