// The reduction kernels compiled for AVX-512 (F, BW, VL, DQ: 512-bit vectors, with byte and
// 64-bit integer operations) and F16C for float16 conversions. Chosen at run time only on a CPU
// that has all of them (reduce_kernels.cpp); see kernel_body.hpp for why every header comes
// before the target pragma.
#include "cpu/reduce/kernel_sets.hpp"

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__x86_64__)

#include <immintrin.h>

namespace ddplite::cpu::kernels {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c,prefer-vector-width=512")
// g++ 12 warns inside its own avx512fintrin.h (the undefined vector _mm512_cvtph_ps starts from).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

// vcvtph2ps / vcvtps2ph on 16 lanes, round to nearest even: the same values as c10::Half's conversions
// (NaN payloads aside: every NaN stays a NaN).
struct HalfConvert {
  static void widen(const uint16_t* in, float* out, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
    }
    for (; i < n; ++i) out[i] = _cvtsh_ss(in[i]);
  }
  static void narrow(const float* in, uint16_t* out, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    for (; i < n; ++i) out[i] = _cvtss_sh(in[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
};

#include "cpu/reduce/kernel_body.hpp"

}  // namespace

#pragma GCC diagnostic pop
#pragma GCC pop_options

KernelPair avx512Kernels(c10::ScalarType dtype, RedOpType op) { return selectFor(dtype, op); }

}  // namespace ddplite::cpu::kernels

#else

namespace ddplite::cpu::kernels {
KernelPair avx512Kernels(c10::ScalarType, RedOpType) { return {}; }
}  // namespace ddplite::cpu::kernels

#endif
