// The one place where torch version differences are handled (NCCL's: cuda/nccl_compat.hpp).
// Supported: torch 2.8 through 2.15 (torch_ddp_lite/torch_versions.py lists the releases tested;
// scripts/torch_compile_check.py compiles csrc/ against the headers of each). Each difference is a
// feature macro keyed on torch's version macros, named for what the newer torch has, with the
// release that brought it; code elsewhere asks the macro or calls a helper below, never the
// version. A feature an older torch lacks is not served on it (torch has no call that reaches
// it, or torch_ddp_lite refuses it naming the release that has it: torch_ddp_lite.require_torch);
// everything else works. build_info()["torch_features"] reports these macros.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/version.h>

#include <string>

#define DDPLITE_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !DDPLITE_TORCH_AT_LEAST(2, 8)
#error "torch-ddp-lite needs torch >= 2.8 (the oldest release it builds and tests with)"
#endif

// Backend::getBackendOptions(), setTimeout() and split() (torch's split_group through
// ProcessGroup::splitGroup), and Options::group_name: torch 2.9.
#define DDPLITE_TORCH_HAS_SPLIT DDPLITE_TORCH_AT_LEAST(2, 9)
// Backend::supportsShrinking / shrink (torch's dist.shrink_group): torch 2.10.
#define DDPLITE_TORCH_HAS_SHRINK DDPLITE_TORCH_AT_LEAST(2, 10)
// Options::group_desc: torch 2.11.
#define DDPLITE_TORCH_HAS_GROUP_DESC DDPLITE_TORCH_AT_LEAST(2, 11)
// c10::cuda::CUDAEvent (before: at::cuda::CUDAEvent, ATen/cuda/CUDAEvent.h): torch 2.11.
#define DDPLITE_TORCH_HAS_C10_CUDA_EVENT DDPLITE_TORCH_AT_LEAST(2, 11)
// Options::clone(), which ProcessGroup::splitGroup calls on the parent's options: torch 2.14. A
// subclass that does not override it is sliced to torch's Options (the ddplite type is lost).
#define DDPLITE_TORCH_HAS_OPTIONS_CLONE DDPLITE_TORCH_AT_LEAST(2, 14)

// torch's split_group numbers a split's ranks by their position in the caller's list (up to 2.13
// it sorts the list first): torch 2.14. ddplite's split follows the list it is given either way.
#define DDPLITE_TORCH_SPLIT_KEEPS_ORDER DDPLITE_TORCH_AT_LEAST(2, 14)
// torch's dist.monitored_barrier calls any backend with a CPU device (up to 2.13 it refuses all
// but gloo in Python; torch_ddp_lite.monitored_barrier serves ddplite groups there): torch 2.14.
#define DDPLITE_TORCH_MONITORED_BARRIER_ANY_BACKEND DDPLITE_TORCH_AT_LEAST(2, 14)
// torch attaches its own FlightRecorderHook to groups of backends outside its set of
// self-recording ones (ddplite joins the set: _ddplite_autoload.py): torch 2.15.
#define DDPLITE_TORCH_HAS_FLIGHT_RECORDER_HOOK DDPLITE_TORCH_AT_LEAST(2, 15)

// `override` on a member that overrides torch's virtual only from torch 2.9 (getBackendOptions,
// setTimeout, split): on 2.8 the member exists for ddplite's own callers.
#if DDPLITE_TORCH_HAS_SPLIT
#define DDPLITE_OVERRIDE_SINCE_2_9 override
#else
#define DDPLITE_OVERRIDE_SINCE_2_9
#endif
#if DDPLITE_TORCH_HAS_OPTIONS_CLONE
#define DDPLITE_OVERRIDE_SINCE_2_14 override
#else
#define DDPLITE_OVERRIDE_SINCE_2_14
#endif

namespace ddplite::compat {

// The group's name and description as torch passes them in Options (empty where this torch's
// Options has no such field).
inline std::string groupName([[maybe_unused]] const c10d::Backend::Options& options) {
#if DDPLITE_TORCH_HAS_SPLIT
  return options.group_name;
#else
  return {};
#endif
}
inline std::string groupDesc([[maybe_unused]] const c10d::Backend::Options& options) {
#if DDPLITE_TORCH_HAS_GROUP_DESC
  return options.group_desc;
#else
  return {};
#endif
}
inline void setGroupIdentity([[maybe_unused]] c10d::Backend::Options& options, [[maybe_unused]] const std::string& name,
                             [[maybe_unused]] const std::string& desc) {
#if DDPLITE_TORCH_HAS_SPLIT
  options.group_name = name;
#endif
#if DDPLITE_TORCH_HAS_GROUP_DESC
  options.group_desc = desc;
#endif
}

}  // namespace ddplite::compat
