#include "cuda/nccl_comm.hpp"

#include "common/logging.hpp"
#include "common/process_identity.hpp"
#include "cuda/nccl_errors.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace ddplite::nccl {

namespace {

std::string hex(const void* data, size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string text;
  const auto* raw = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    text += digits[raw[i] >> 4];
    text += digits[raw[i] & 15];
  }
  return text;
}

void checkCuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throwDistError(strCat(call, " failed: ", cudaGetErrorString(status)),
                   "check that the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)");
  }
}

bool multiRankGpuEnabled() {
#if DDPLITE_NCCL_HAS_MULTI_RANK_GPU
  const char* value = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return value != nullptr && std::strcmp(value, "1") == 0;
#else
  return false;
#endif
}

// What NCCL's host hash covers: NCCL_HOSTID when set, else the host name and the boot id.
std::string hostIdentity() {
  if (const char* hostId = std::getenv("NCCL_HOSTID"); hostId != nullptr && hostId[0] != '\0') return hostId;
  std::string bootId;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), bootId);
  return strCat(hostName(), ":", bootId);
}

}  // namespace

rules::GpuIdentity identify(at::Device device) {
  cudaDeviceProp properties{};
  checkCuda(cudaGetDeviceProperties(&properties, device.index()), "cudaGetDeviceProperties");
  char busId[64] = {0};
  checkCuda(cudaDeviceGetPCIBusId(busId, sizeof(busId), device.index()), "cudaDeviceGetPCIBusId");
  std::string bus(busId);
  std::transform(bus.begin(), bus.end(), bus.begin(), [](unsigned char c) { return std::tolower(c); });
  rules::GpuIdentity identity;
  identity.host = hostIdentity();
  identity.busId = bus;
  identity.uuid = hex(&properties.uuid, sizeof(properties.uuid));
  identity.ccMajor = properties.major;
  identity.ccMinor = properties.minor;
  identity.multiRankGpu = multiRankGpuEnabled();
  return identity;
}

std::vector<rules::GpuIdentity> exchangeIdentities(Bootstrap& bootstrap, int ordinal, int rank, int size,
                                                   const rules::GpuIdentity& mine) {
  std::vector<rules::GpuIdentity> all;
  all.reserve(size);
  for (int root = 0; root < size; ++root) {
    const std::string text = bootstrap.broadcast(rules::identityKey(ordinal, root), rules::encodeIdentity(mine), root);
    try {
      all.push_back(rules::decodeIdentity(text));
    } catch (const std::invalid_argument& error) {
      DDPLITE_ENFORCE(false, error.what(), " from rank ", root, " (rank ", rank, " of ", size, ")");
    }
  }
  return all;
}

std::unique_ptr<NcclComm> NcclComm::create(Bootstrap& bootstrap, const std::string& key, const OpContext& ctx,
                                           at::Device device, std::chrono::steady_clock::time_point deadline,
                                           const std::function<bool()>& cancelled) {
  checkLoadedVersion(ctx);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (ctx.rank == 0) DDPLITE_NCCL_CHECK(ctx, nullptr, ncclGetUniqueId(&id));
  const std::string blob = bootstrap.broadcast(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)), 0);
  DDPLITE_ENFORCE(blob.size() == sizeof(id), "NCCL unique id of ", blob.size(), " bytes, expected ", sizeof(id));
  std::memcpy(&id, blob.data(), sizeof(id));

  c10::cuda::CUDAGuard guard(device);
  ncclComm_t comm = nullptr;
#if DDPLITE_NCCL_HAS_NONBLOCKING
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every later call on it may answer ncclInProgress: see waitWhileInProgress
#if DDPLITE_NCCL_HAS_SPLIT
  config.splitShare = 0;  // children split from it get resources (and an abort flag) of their own
#endif
  const ncclResult_t started = ncclCommInitRankConfig(&comm, ctx.size, id, ctx.rank, &config);
  try {
    check(ctx, "ncclCommInitRankConfig", started, comm);
    waitWhileInProgress(ctx, "ncclCommInitRankConfig", comm, deadline, cancelled);
  } catch (...) {
    if (comm != nullptr) ncclCommAbort(comm);  // stops its set-up threads; the error says why
    throw;
  }
#else
  (void)deadline, (void)cancelled;  // set-up blocks in NCCL with no deadline of ours (NCCL < 2.14; docs/gpu.md)
  DDPLITE_NCCL_CHECK(ctx, nullptr, ncclCommInitRank(&comm, ctx.size, id, ctx.rank));
#endif
  DDPLITE_LOG(kInfo, ctx.describe(), ": NCCL communicator ready on ", device, " (", bootstrap.name(), " bootstrap, NCCL ",
              versionText(loadedVersion()), ")");
  return std::unique_ptr<NcclComm>(new NcclComm(comm, device));
}

std::unique_ptr<NcclComm> NcclComm::split(NcclComm& parent, int color, int key, int expectedSize, const OpContext& ctx,
                                          std::chrono::steady_clock::time_point deadline) {
#if DDPLITE_NCCL_HAS_SPLIT
  Lease lease(parent);  // exclusive use of the parent's handle while NCCL splits it
  if (lease.comm() == nullptr) {
    throwDistError(ctx, "the parent group's NCCL communicator was aborted, so it cannot be split",
                   "destroy the parent group and create a new one");
  }
  c10::cuda::CUDAGuard guard(parent.device());
  // A nonblocking split runs as a job of the parent that writes the child's handle into this
  // slot when it ends, possibly after we gave up: the slot is on the heap, freed only once the
  // job is known to be over (success, or the parent aborted, which joins it).
  auto* slot = new ncclComm_t(nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = 0;  // the child's abort must not abort the parent's kernels, nor the reverse
  const ncclResult_t started = ncclCommSplit(lease.comm(), color, key, slot, &config);
  const auto cancelled = [&lease] { return lease.abortRequested(); };
  ncclComm_t child = nullptr;
  try {
    check(ctx, "ncclCommSplit", started, lease.comm());
    // The parent's state says when the job is done (a rank that passed NCCL_SPLIT_NOCOLOR has
    // no child to ask), then the child's says when it is ready.
    waitWhileInProgress(ctx, "ncclCommSplit", lease.comm(), deadline, cancelled);
    child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (child != nullptr) waitWhileInProgress(ctx, "ncclCommSplit", child, deadline, cancelled);
    int count = 0;
    if (child != nullptr && ncclCommCount(child, &count) == ncclSuccess && count != expectedSize) {
      throwValueError(ctx, strCat("ncclCommSplit made a communicator of ", count, " ranks for a new group of ",
                                  expectedSize, ": the split lists of the ranks overlap"),
                      "give split_group disjoint lists of ranks");
    }
  } catch (...) {
    // The parent cannot be used after a split that did not finish: abort it here (joining the
    // job), then whatever child the job made.
    parent.abortLocked();
    child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (child != nullptr) ncclCommAbort(child);
    delete slot;
    throw;
  }
  delete slot;
  if (child == nullptr) return nullptr;
  DDPLITE_LOG(kInfo, ctx.describe(), ": NCCL communicator split from the parent group's on ", parent.device(),
              " (color ", color, ", key ", key, ")");
  return std::unique_ptr<NcclComm>(new NcclComm(child, parent.device()));
#else
  (void)parent, (void)color, (void)key, (void)expectedSize, (void)ctx, (void)deadline;
  return nullptr;  // NCCL < 2.18: the new group makes its own communicator on its first op
#endif
}

std::unique_ptr<NcclComm> NcclComm::shrink(NcclComm& parent, const std::vector<int>& excluded, int ncclFlags,
                                           int expectedSize, const OpContext& ctx,
                                           std::chrono::steady_clock::time_point deadline,
                                           const std::function<bool()>& othersGaveUp) {
#if DDPLITE_NCCL_HAS_SHRINK
  Lease lease(parent);  // exclusive use of the parent's handle while NCCL shrinks it
  if (lease.comm() == nullptr) {
    throwDistError(ctx, "the parent group's NCCL communicator was aborted, so it cannot be shrunk",
                   "shrink_group again: the new group then makes its own communicator");
  }
  c10::cuda::CUDAGuard guard(parent.device());
  // As in split: the job may write the child's handle after we gave up, so the slot lives on the
  // heap until the job is known to be over.
  auto* slot = new ncclComm_t(nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.shrinkShare = 0;  // the child's abort must not abort the parent's kernels, nor the reverse
  if (const char* share = std::getenv("NCCL_COMM_SHRINK_SHARE_RESOURCES"); share && std::string(share) == "1") {
    DDPLITE_LOG(kWarn, ctx.describe(), ": NCCL_COMM_SHRINK_SHARE_RESOURCES=1 overrides shrinkShare = 0: aborting "
                "the old group may then abort the shrunk group's kernels too");
  }
  std::vector<int> exclude(excluded);  // ncclCommShrink takes a non-const list
  const ncclResult_t started = ncclCommShrink(lease.comm(), exclude.data(), static_cast<int>(exclude.size()), slot,
                                              &config, ncclFlags);
  const auto cancelled = [&lease, &othersGaveUp] { return lease.abortRequested() || othersGaveUp(); };
  ncclComm_t child = nullptr;
  try {
    check(ctx, "ncclCommShrink", started, lease.comm());
    waitWhileInProgress(ctx, "ncclCommShrink", lease.comm(), deadline, cancelled);
    child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (child == nullptr) {
      throwDistError(ctx, "ncclCommShrink returned no communicator for a surviving rank",
                     "check that every survivor passed the same ranks to exclude");
    }
    waitWhileInProgress(ctx, "ncclCommShrink", child, deadline, cancelled);
    int count = 0;
    if (ncclCommCount(child, &count) == ncclSuccess && count != expectedSize) {
      throwDistError(ctx, strCat("ncclCommShrink made a communicator of ", count, " ranks for a group of ",
                                 expectedSize, " survivors"),
                     "pass the same ranks to exclude on every survivor");
    }
  } catch (...) {
    parent.abortLocked();  // a shrink that did not finish leaves the parent unusable; joins the job
    child = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (child != nullptr) ncclCommAbort(child);
    delete slot;
    throw;
  }
  delete slot;
  DDPLITE_LOG(kInfo, ctx.describe(), ": NCCL communicator shrunk from the parent group's on ", parent.device(),
              " (", excluded.size(), " rank(s) excluded, flags ", ncclFlags, ")");
  return std::unique_ptr<NcclComm>(new NcclComm(child, parent.device()));
#else
  (void)parent, (void)excluded, (void)ncclFlags, (void)expectedSize, (void)ctx, (void)deadline, (void)othersGaveUp;
  return nullptr;  // NCCL < 2.27: the new group makes its own communicator on its first op
#endif
}

NcclComm::~NcclComm() {
  std::lock_guard<std::timed_mutex> lock(mutex_);  // no Lease outlives the owner; wait out a late abort()
  if (aborted_.load() || comm_ == nullptr) return;
  // Errors at teardown have no one left to report to.
#if DDPLITE_NCCL_HAS_NONBLOCKING
  const ncclResult_t finalizing = ncclCommFinalize(comm_);
  bool settled = finalizing == ncclSuccess;
  if (finalizing == ncclInProgress) {
    try {
      waitWhileInProgress(OpContext{}, "ncclCommFinalize", comm_, std::chrono::steady_clock::now() + kFinalizeWait);
      settled = true;
    } catch (const std::exception&) {
      // failed or still running after kFinalizeWait: abort below
    }
  }
  if (settled) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
#else
  ncclCommDestroy(comm_);
#endif
}

ncclResult_t NcclComm::asyncError(std::string& detail) {
  std::unique_lock<std::timed_mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || aborted_.load()) return ncclSuccess;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  const ncclResult_t error = result != ncclSuccess ? result : state;
  if (error != ncclSuccess && error != ncclInProgress) detail = describeFailure("ncclCommGetAsyncError", error, comm_);
  return error;
}

NcclComm::Lease::Lease(NcclComm& owner) : owner_(owner), lock_(owner.mutex_) {}

NcclComm::Lease::~Lease() {
  if (owner_.abortRequested_.load()) owner_.abortLocked();
}

void NcclComm::abort() {
  std::unique_lock<std::timed_mutex> lock(mutex_, std::defer_lock);
  if (!lock.try_lock_for(kAbortWait)) {
    // A launch holds the handle (blocked inside NCCL); its Lease aborts on release.
    abortRequested_.store(true);
    if (!lock.try_lock()) return;  // else the holder released it just now: abort here
  }
  abortLocked();
}

void NcclComm::abortLocked() {
  if (aborted_.exchange(true)) return;
  ncclCommAbort(comm_);
}

}  // namespace ddplite::nccl
