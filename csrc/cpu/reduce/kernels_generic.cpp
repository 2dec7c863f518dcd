// The reduction kernels for any CPU: x86-64's baseline (SSE2), or whatever architecture this is
// built for. float16 converts through c10's portable bit manipulation (no F16C assumed).
#include "cpu/reduce/kernel_sets.hpp"

#include <c10/util/Half.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ddplite::cpu::kernels {

namespace {

struct HalfConvert {
  static void widen(const uint16_t* in, float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = c10::detail::fp16_ieee_to_fp32_value(in[i]);
  }
  static void narrow(const float* in, uint16_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = c10::detail::fp16_ieee_from_fp32_value(in[i]);
  }
};

#include "cpu/reduce/kernel_body.hpp"

}  // namespace

KernelPair genericKernels(c10::ScalarType dtype, RedOpType op) { return selectFor(dtype, op); }

}  // namespace ddplite::cpu::kernels
