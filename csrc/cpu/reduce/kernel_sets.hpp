// The three compilations of kernel_body.hpp, one per instruction set, and what they share.
// reduce_kernels.cpp picks one at run time (DDPLITE_CPU_KERNELS, else the best this CPU runs).
#pragma once

#include "cpu/reduce/reduce_kernels.hpp"

namespace ddplite::cpu::kernels {

using RedOpType = c10d::ReduceOp::RedOpType;

// Both forms of one (dtype, op) reduction; both null when the pair is not supported.
struct KernelPair {
  ReduceFn pairwise = nullptr;
  ReduceManyFn many = nullptr;
};

// Call only on a CPU that has the instruction set (cpuRuns in reduce_kernels.cpp).
KernelPair genericKernels(c10::ScalarType dtype, RedOpType op);  // kernels_generic.cpp: x86-64 baseline (SSE2), or any other architecture
KernelPair avx2Kernels(c10::ScalarType dtype, RedOpType op);     // kernels_avx2.cpp: AVX2 + F16C
KernelPair avx512Kernels(c10::ScalarType dtype, RedOpType op);   // kernels_avx512.cpp: AVX-512 F/BW/VL/DQ + F16C

}  // namespace ddplite::cpu::kernels
