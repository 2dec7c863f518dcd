// The seam between the backend and its CUDA data path.
//
// DdpliteBackend (backend/backend.cpp) validates every call, then hands calls whose tensors are
// on CUDA to a CudaPath with the caller's arguments unchanged; CPU tensors never come here. The
// implementations live in this folder and are compiled only when setup.py found NCCL
// (DDPLITE_WITH_NCCL): NcclPath (nccl_path.hpp) runs them on the group's own NCCL communicator,
// and for devices that another rank shares it hands them to StagedPath (staged_path.hpp), which
// copies through host memory and reuses the backend's CPU collectives.
//
// Threads: every method is called on the caller's thread (the Python thread or DDP's autograd
// thread), possibly from two threads at once; implementations order their launches with the
// backend's order mutex (CudaPathDeps::orderMutex), the same lock that orders CPU collectives.
#pragma once

#include "common/errors.hpp"
#include "rendezvous/bootstrap.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace ddplite {

// What the backend lends its CUDA path. Everything referenced outlives the path.
struct CudaPathDeps {
  c10d::Backend& cpuBackend;   // the owning backend; its collectives on CPU tensors (staging)
  Bootstrap& bootstrap;        // carries the NCCL unique id and the device ids
  int rank;
  int size;
  std::mutex& orderMutex;      // held while a sequence number is assigned and the op is issued
  std::atomic<uint64_t>& seq;  // the group's collective sequence number (shared with the CPU path)
  std::function<std::chrono::milliseconds(std::chrono::milliseconds)> resolveTimeout;  // opts.timeout -> effective
  // enableCollectivesTiming was called (any thread; read relaxed when an op is issued): Works
  // issued from then on serve getDuration.
  const std::atomic<bool>& timing;
};

// A split group's CUDA state made from its parent's (opaque to the backend): NcclPath's holds the
// communicators ncclCommSplit made.
class CudaSplit {
 public:
  virtual ~CudaSplit() = default;
  // The ordinals (parent's order of first use) of the devices it holds a communicator for.
  virtual std::vector<int> ordinals() const = 0;
  // Aborts and drops the communicators of the other devices (shrink: what not every survivor made).
  virtual void keepOnly(const std::vector<int>& ordinals) = 0;
};

// How the survivors of a shrink_group tell each other that a device's ncclCommShrink failed on
// one of them (store keys the backend owns): the others stop waiting in theirs (checked at most
// every 100 ms while NCCL is in progress), and every survivor makes that device's communicator
// anew on the new group's first op instead.
struct ShrinkCoordination {
  std::function<bool(int ordinal)> othersGaveUp;
  std::function<void(int ordinal)> giveUp;
};

class CudaPath {
 public:
  virtual ~CudaPath() = default;

  virtual c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceCoalescedOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                         const c10d::AllgatherOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::AllgatherOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::ReduceScatterOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::ReduceScatterOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                 const c10d::ScatterOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                       std::vector<int64_t>& outputSplitSizes,
                                                       std::vector<int64_t>& inputSplitSizes,
                                                       const c10d::AllToAllOptions& opts) = 0;
  virtual c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                  const c10d::AllToAllOptions& opts) = 0;
  // Point-to-point ops arrive with the backend's context: `ctx.seq` is its p2p sequence number
  // (one per send/recv, separate from the collective sequence); the path uses it as is.
  // recv: srcRank < 0 means any source.
  virtual c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag,
                                              const OpContext& ctx) = 0;
  virtual c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                              const OpContext& ctx) = 0;
  // A one-element allreduce on `device`; its wait() blocks the host until every rank arrived.
  virtual c10::intrusive_ptr<c10d::Work> barrier(at::Device device, const c10d::BarrierOptions& opts) = 0;

  // Collective: sets `device` up now (NCCL or staging, and its communicator) instead of on its
  // first op; torch calls it when init_process_group is given device_id.
  virtual void connect(at::Device device) = 0;

  // split_group, collective over this (the parent) group: every rank calls it once per split, in
  // the same order, with the sorted parent ranks of its new group (empty: in none, or refused).
  // Returns what the new group's path adopts; null where nothing was split.
  virtual std::unique_ptr<CudaSplit> split(const std::vector<int>& members) = 0;
  // shrink_group, in two steps on the survivors only. shrinkReadiness: the ordinals (order of first
  // use, "0,1,") of the devices whose communicator this rank could shrink (rules::shrinkPlan); the
  // backend takes the devices every survivor named, so that all or none shrink each. shrink,
  // collective over the survivors (`excluded`: the sorted parent ranks left out): the survivors'
  // communicators made from this group's on those devices (ncclCommShrink; `abortPending`:
  // SHRINK_ABORT, whose pending works fail first). Null where none was (the new group then makes
  // its own on its first CUDA op). Both before the backend aborts this group.
  virtual std::string shrinkReadiness(bool abortPending) = 0;
  virtual std::unique_ptr<CudaSplit> shrink(const std::vector<int>& excluded, bool abortPending,
                                            const std::vector<int>& agreedOrdinals,
                                            const ShrinkCoordination& coordination) = 0;
  // The new group's path, before its first op: takes over the split (or shrunk) communicators.
  virtual void adopt(std::unique_ptr<CudaSplit> split) = 0;

  // Coalescing (backend/coalescing.hpp), on the thread that opened the group: the CUDA ops this
  // thread issues between the two calls are issued at endCoalescing as one NCCL group
  // (ncclGroupStart/ncclGroupEnd), so batch_isend_irecv's sends and receives cannot block each
  // other. endCoalescing runs before the backend builds the group's Work; it raises if the group
  // could not be issued (its ops' Works fail too).
  virtual void startCoalescing() = 0;
  virtual void endCoalescing() = 0;

  // abort(): fail pending CUDA work now and abort the communicators. shutdown(): let pending
  // work finish (up to the group's timeout), then destroy them (destroy_process_group).
  // abandon(): the group is destroyed without shutdown(): abort, as ProcessGroupNCCL's
  // destructor does (rules::teardownFor). All idempotent.
  virtual void abort() = 0;
  virtual void shutdown() = 0;
  virtual void abandon() = 0;
};

// The CUDA path of this build: NcclPath with NCCL compiled in; nullptr otherwise.
std::unique_ptr<CudaPath> createCudaPath(const CudaPathDeps& deps);

}  // namespace ddplite
