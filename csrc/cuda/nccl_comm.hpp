// One NCCL communicator: one (process group, CUDA device) pair.
//
// Each ddplite backend object is one process group and owns its communicators, so subgroups
// get their own. A new_group's are created with a fresh, nonblocking ncclCommInitRankConfig:
// groups are created lazily and independently (a subgroup may touch CUDA before the world group
// does), and a fresh init needs nothing but the group's own Bootstrap. A split_group's come from
// split() (ncclCommSplit of the parent's communicator).
//
// Threads: create() is collective (every rank of the group calls it, in the same order); lease()
// from the launching thread; asyncError() from the watchdog; abort() from any thread, any time.
//
// Lifetime of the raw ncclComm_t: ncclCommAbort frees it, so a launch must not use it while
// abort() runs. The launching thread holds a Lease (the communicator's own mutex) from the
// moment it reads the handle until its last NCCL call of the op has returned; abort() takes the
// same mutex. abort() waits for it at most kAbortWait: a launch that is blocked inside NCCL on the
// host (lazy connection set-up to a peer that never comes) cannot be aborted safely, so abort()
// then leaves a request that the Lease performs when it is released.
// Lock order: the backend's order mutex -> NcclComm::mutex_ (launch); NcclPath::commsMutex_ ->
// NcclComm::mutex_ (failGroup, timed). Nothing is acquired while a Lease is held except by NCCL.
#pragma once

#include "common/errors.hpp"
#include "cuda/nccl_compat.hpp"
#include "rendezvous/bootstrap.hpp"

#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddplite::nccl {

// This rank's GPU (rules::GpuIdentity): host as NCCL hashes it, bus id, UUID, compute capability.
rules::GpuIdentity identify(at::Device device);

// Collective over the group (Bootstrap broadcasts, one per rank, under rules::identityKey):
// every rank's identity.
std::vector<rules::GpuIdentity> exchangeIdentities(Bootstrap& bootstrap, int ordinal, int rank, int size,
                                                   const rules::GpuIdentity& mine);

class NcclComm {
 public:
  // Collective: rank 0 makes the unique id (ncclGetUniqueId), `bootstrap` carries it under
  // `key` (same on every rank, rules::uniqueIdKey), then the communicator is created on `device`:
  // nonblocking where NCCL has it (ncclCommInitRankConfig, blocking = 0), polled until ready or
  // `deadline` (then aborted, and DistBackendError), so a rank that never comes cannot hang it.
  // `cancelled()`: the group was aborted or shut down meanwhile; set-up stops and raises.
  static std::unique_ptr<NcclComm> create(Bootstrap& bootstrap, const std::string& key, const OpContext& ctx,
                                          at::Device device, std::chrono::steady_clock::time_point deadline,
                                          const std::function<bool()>& cancelled);
  // Collective over `parent`'s ranks (ncclCommSplit, nonblocking, polled up to `deadline`): the
  // communicator of this rank's new group (checked to have `expectedSize` ranks), or nullptr for
  // `color` NCCL_SPLIT_NOCOLOR. When it fails the parent is aborted (a split that did not finish
  // leaves it unusable) and the error raised.
  static std::unique_ptr<NcclComm> split(NcclComm& parent, int color, int key, int expectedSize, const OpContext& ctx,
                                         std::chrono::steady_clock::time_point deadline);
  // Collective over the survivors of `parent` (ncclCommShrink, nonblocking, polled up to
  // `deadline`; the `excluded` parent ranks take no part): the survivors' communicator, checked to
  // have `expectedSize` ranks. `ncclFlags`: NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT (rules::shrinkPlan).
  // When it fails the parent is aborted and the error raised. nullptr where NCCL has no shrink.
  // `othersGaveUp()` (cheap to call often): another survivor's shrink failed; stop and raise.
  static std::unique_ptr<NcclComm> shrink(NcclComm& parent, const std::vector<int>& excluded, int ncclFlags,
                                          int expectedSize, const OpContext& ctx,
                                          std::chrono::steady_clock::time_point deadline,
                                          const std::function<bool()>& othersGaveUp);
  // ncclCommFinalize (polled up to kFinalizeWait) and ncclCommDestroy; ncclCommAbort when it does
  // not settle in time. Nothing when aborted.
  ~NcclComm();
  static constexpr std::chrono::milliseconds kFinalizeWait{10000};

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Exclusive use of the handle for one launch. comm() is nullptr if the communicator was aborted.
  class Lease {
   public:
    explicit Lease(NcclComm& owner);
    ~Lease();  // performs an abort() requested while held, then unlocks
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ncclComm_t comm() const { return owner_.aborted_.load() ? nullptr : owner_.comm_; }
    // An abort() came while this Lease was held (it is performed when the Lease is released).
    bool abortRequested() const { return owner_.abortRequested_.load(); }

   private:
    NcclComm& owner_;
    std::unique_lock<std::timed_mutex> lock_;
  };
  Lease lease() { return Lease(*this); }

  at::Device device() const { return device_; }
  // ncclCommGetAsyncError, with `detail` set to its description on an error; ncclSuccess once
  // aborted (the abort's cause is reported elsewhere) or while a Lease holds the handle (the
  // next poll asks again; a failing NCCL call of that launch reports itself).
  ncclResult_t asyncError(std::string& detail);
  // ncclCommAbort: kernels in flight on this communicator exit. Idempotent. Waits up to
  // kAbortWait for a Lease holder; past that the holder aborts when it releases its Lease.
  void abort();
  static constexpr std::chrono::milliseconds kAbortWait{2000};
  bool aborted() const { return aborted_.load(); }

 private:
  NcclComm(ncclComm_t comm, at::Device device) : comm_(comm), device_(device) {}

  void abortLocked();  // with mutex_ held

  ncclComm_t comm_;
  at::Device device_;
  std::timed_mutex mutex_;                    // held by a Lease, and by abort() around ncclCommAbort
  std::atomic<bool> abortRequested_{false};  // abort() could not get mutex_ in time
  std::atomic<bool> aborted_{false};
};

}  // namespace ddplite::nccl
