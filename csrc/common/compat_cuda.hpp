// torch version differences in the CUDA headers the NCCL path uses (the rest: common/compat.hpp).
// Included by csrc/cuda/ only: a CPU-only build never sees a CUDA header.
#pragma once

#include "common/compat.hpp"

#if DDPLITE_TORCH_HAS_C10_CUDA_EVENT
#include <c10/cuda/CUDAEvent.h>
#else
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace ddplite::compat {

// A CUDA event owned by torch's RAII type (record/block/query/elapsed_time are the same in both).
#if DDPLITE_TORCH_HAS_C10_CUDA_EVENT
using CudaEvent = c10::cuda::CUDAEvent;
#else
using CudaEvent = at::cuda::CUDAEvent;
#endif

}  // namespace ddplite::compat
