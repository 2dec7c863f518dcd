// The one place where NCCL version differences are handled (torch's are in common/compat.hpp).
//
// Every `#if NCCL_VERSION_CODE ...` of ddplite lives here; the rest of csrc/cuda tests the
// DDPLITE_NCCL_HAS_* feature macros below. Only compiled when setup.py found NCCL
// (DDPLITE_WITH_NCCL=1).
#pragma once

#include "cuda/rules/nccl_rules.hpp"

#include <nccl.h>

#ifndef NCCL_VERSION_CODE
#error "nccl.h does not define NCCL_VERSION_CODE (NCCL older than 2.2?)"
#endif

#define DDPLITE_NCCL_AT_LEAST(major, minor) (NCCL_VERSION_CODE >= NCCL_VERSION((major), (minor), 0))

// Oldest NCCL ddplite builds against: ncclAvg and ncclBfloat16 (2.10), ncclRedOpCreatePreMulSum
// (2.11) and ncclGetLastError (2.13) are used unconditionally.
#if !DDPLITE_NCCL_AT_LEAST(2, 13)
#error "torch-ddp-lite's CUDA path needs NCCL >= 2.13 (the nvidia-nccl wheel torch ships is newer)"
#endif

// Reductions on float8 (e4m3, e5m2) tensors.
#if DDPLITE_NCCL_AT_LEAST(2, 24)
#define DDPLITE_NCCL_HAS_FP8 1
#else
#define DDPLITE_NCCL_HAS_FP8 0
#endif

// Several ranks of one communicator on one GPU, enabled by NCCL_MULTI_RANK_GPU_ENABLE=1.
// Before it, NCCL refuses with "Duplicate GPU detected" and ddplite stages through the CPU.
#if DDPLITE_NCCL_AT_LEAST(2, 30)
#define DDPLITE_NCCL_HAS_MULTI_RANK_GPU 1
#else
#define DDPLITE_NCCL_HAS_MULTI_RANK_GPU 0
#endif

// Nonblocking communicators: ncclConfig_t with blocking = 0, ncclCommInitRankConfig and
// ncclCommFinalize. Before it, set-up blocks the host with no deadline of ours.
#if DDPLITE_NCCL_AT_LEAST(2, 14)
#define DDPLITE_NCCL_HAS_NONBLOCKING 1
#else
#define DDPLITE_NCCL_HAS_NONBLOCKING 0
#endif

// ncclCommSplit (split_group makes the new group's communicators from the parent's).
#if DDPLITE_NCCL_AT_LEAST(2, 18)
#define DDPLITE_NCCL_HAS_SPLIT 1
#else
#define DDPLITE_NCCL_HAS_SPLIT 0
#endif

// ncclCommShrink (shrink_group makes the survivors' communicators from the parent's).
#if DDPLITE_NCCL_AT_LEAST(2, 27)
#define DDPLITE_NCCL_HAS_SHRINK 1
#else
#define DDPLITE_NCCL_HAS_SHRINK 0
#endif

namespace ddplite::nccl {

using rules::Version;

// NCCL's own version encoding changed at 2.9 (see NCCL_VERSION in nccl.h); these decode both.

inline Version decodeVersion(int code) {
  if (code < 10000) {  // 2.8 and older: X*1000 + Y*100 + Z
    return Version{code / 1000, (code % 1000) / 100, code % 100};
  }
  return Version{code / 10000, (code % 10000) / 100, code % 100};
}

inline Version compiledVersion() {
  return Version{NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH};
}

// A loaded library can serve code compiled against this header when it has the same major
// version and is not older (NCCL only adds symbols and enum values within a major version).
inline bool loadedCanServeCompiled(const Version& loaded, const Version& compiled) {
  if (loaded.major != compiled.major) return false;
  if (loaded.minor != compiled.minor) return loaded.minor > compiled.minor;
  return loaded.patch >= compiled.patch;
}

}  // namespace ddplite::nccl
