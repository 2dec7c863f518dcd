// One NCCL communicator: one (process group, CUDA device) pair.
//
// Each ddplite backend object is one process group and owns its communicators, so subgroups
// (new_group) get their own. They are created with a fresh ncclCommInitRank per group rather
// than ncclCommSplit of the default group's communicator: groups are created lazily and
// independently (a subgroup may touch CUDA before the world group does), and a fresh init needs
// nothing but the group's own Bootstrap.
//
// Threads: create() is collective (every rank of the group calls it, in the same order); get()
// from the launching thread; asyncError() from the watchdog; abort() from any thread, any time.
#pragma once

#include "common/errors.hpp"
#include "cuda/nccl_compat.hpp"
#include "rendezvous/bootstrap.hpp"

#include <c10/core/Device.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace ddplite::nccl {

// One rank's GPU, as exchanged before NCCL init to find ranks that share a GPU.
struct DeviceIdentity {
  std::string uuid;   // cudaDeviceProp::uuid in hex: equal iff the same physical GPU
  std::string busId;  // PCI bus id, for messages
  bool multiRankGpu;  // this rank's NCCL can put several ranks on one GPU (NCCL >= 2.30 + env)
};

DeviceIdentity identify(at::Device device);

// Collective over the group (Bootstrap broadcasts, one per rank): every rank's identity.
std::vector<DeviceIdentity> exchangeIdentities(Bootstrap& bootstrap, const std::string& key, int rank, int size,
                                               const DeviceIdentity& mine);

// The first pair of ranks on one GPU, as "ranks 0 and 1 are both on GPU <uuid> (bus <id>)"; "" if none.
std::string describeSharedGpu(const std::vector<DeviceIdentity>& identities);

class NcclComm {
 public:
  // Collective: rank 0 makes the unique id (ncclGetUniqueId), `bootstrap` carries it under
  // `key` (same on every rank, unique within the group), then ncclCommInitRank on `device`.
  static std::unique_ptr<NcclComm> create(Bootstrap& bootstrap, const std::string& key, const OpContext& ctx,
                                          at::Device device);
  ~NcclComm();  // ncclCommDestroy, unless aborted

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  ncclComm_t get() const { return comm_; }
  at::Device device() const { return device_; }
  // ncclCommGetAsyncError; ncclSuccess once aborted (the abort's cause is reported elsewhere).
  ncclResult_t asyncError() const;
  // ncclCommAbort: kernels in flight on this communicator exit. Idempotent.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  NcclComm(ncclComm_t comm, at::Device device) : comm_(comm), device_(device) {}

  ncclComm_t comm_;
  at::Device device_;
  std::atomic<bool> aborted_{false};
};

}  // namespace ddplite::nccl
