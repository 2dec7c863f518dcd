// The one place where torch (and, later, NCCL) version differences are handled.
#pragma once

#include <torch/version.h>

#define DDPLITE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// Backend::supportsShrinking / shrink (torch's dist.shrink_group): torch 2.10 and later.
#define DDPLITE_TORCH_HAS_SHRINK DDPLITE_TORCH_AT_LEAST(2, 10)

#if !DDPLITE_TORCH_AT_LEAST(2, 7)
#error "torch-ddp-lite needs torch >= 2.7 (Backend options carry asyncOp since 2.7)"
#endif
