// NcclPath: CUDA tensors of one process group on the group's own NCCL communicators.
//
// Per device, on the first CUDA op that touches it (collective: every rank reaches it in the
// same op), the ranks exchange their host, GPU PCI bus id, UUID and compute capability through
// the Bootstrap. If no two ranks share a GPU (or NCCL >= 2.30 runs in multi-rank mode on every
// rank), rank 0 makes an NCCL unique id, the Bootstrap carries it, and every rank runs a
// nonblocking ncclCommInitRankConfig (a split group adopts its parent's split instead); the device then gets a
// dedicated NCCL stream from torch's pool. If two ranks share the GPU, the device is served by
// StagedPath instead, with a one-time warning (DDPLITE_CUDA_STAGING can force either choice).
//
// Launch (caller's thread, under the backend's order mutex, so CPU and CUDA ops of the group
// take sequence numbers in issue order): the NCCL stream waits on an event recorded on the
// caller's current stream, the NCCL call(s) run with the NCCL stream current, an end event is
// recorded, and the Work (nccl_work.hpp) goes to the watchdog (nccl_watchdog.hpp), which
// aborts the communicators and fails every pending Work on an NCCL error or a timeout.
//
// Coalescing: between startCoalescing and endCoalescing, ops of the opening thread get their
// number, their Work and their stream ordering at once, and their NCCL calls are deferred; at
// endCoalescing they are issued together inside one ncclGroupStart/ncclGroupEnd. A barrier
// inside the window first issues what is deferred, then runs alone (its wait blocks the host).
//
// Set-up keys live under the backend's per-run store prefix, so a store reused by a later run
// never hands it this run's unique id, and the bootstrap deletes them once read. Communicators
// are nonblocking where NCCL allows, and every call that answers ncclInProgress is polled
// against the op's deadline (nccl_errors.hpp), so a rank that never comes is a DistBackendError.
#pragma once

#include "cuda/cuda_path.hpp"
#include "cuda/cuda_collectives.hpp"
#include "cuda/nccl_comm.hpp"
#include "cuda/nccl_watchdog.hpp"
#include "cuda/staged_path.hpp"

#include <map>
#include <optional>
#include <thread>

namespace ddplite::nccl {

class NcclPath final : public CudaPath {
 public:
  explicit NcclPath(const CudaPathDeps& deps);
  ~NcclPath() override;  // shutdown()

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag,
                                      const OpContext& ctx) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                      const OpContext& ctx) override;
  c10::intrusive_ptr<c10d::Work> barrier(at::Device device, const c10d::BarrierOptions& opts) override;
  void connect(at::Device device) override;
  std::unique_ptr<CudaSplit> split(const std::vector<int>& members) override;
  std::string shrinkReadiness(bool abortPending) override;
  std::unique_ptr<CudaSplit> shrink(const std::vector<int>& excluded, bool abortPending,
                                    const std::vector<int>& agreedOrdinals,
                                    const ShrinkCoordination& coordination) override;
  void adopt(std::unique_ptr<CudaSplit> split) override;
  void startCoalescing() override;
  void endCoalescing() override;
  void abort() override;
  void shutdown() override;
  void abandon() override;

 private:
  struct DeviceState {
    bool staged = false;
    std::unique_ptr<NcclComm> comm;
    std::optional<c10::cuda::CUDAStream> stream;  // the dedicated NCCL stream
    int minCompCap = 0;                           // lowest compute capability over the ranks (fp8 rule)
    std::vector<rules::GpuIdentity> identities;   // every rank's GPU, by rank (empty when adopted)
    int ordinal = 0;                              // order of first use: pairs the ranks' communicators
  };
  struct Call {  // one op, as launch() needs it
    const char* op;
    c10d::OpType type;
    at::Device device;
    std::vector<at::Tensor> outputs;    // what result() and the future hold
    std::vector<at::Tensor> keepAlive;  // inputs NCCL reads
    std::chrono::milliseconds timeout;
    std::optional<OpContext> p2p;  // send/recv: the backend's context (its p2p sequence number)
    int peer = -1;                 // send/recv: the peer's group rank
    bool barrier = false;
  };

  // The context for messages about an op not issued yet.
  OpContext peekContext(const char* op) const;
  // Collective on a device's first use: decides NCCL or staging, creates the communicator.
  DeviceState& stateFor(const char* op, at::Device device);
  void createCommunicator(const OpContext& ctx, at::Device device, DeviceState& state, int ordinal);
  // A communicator (made or adopted) joins the watched list; the watchdog starts with the first.
  void watchCommunicator(DeviceState& state, at::Device device);
  // Not collective: true if `device` is served by StagedPath already (or staging is forced).
  bool knownStaged(at::Device device);
  // `body` must own what it uses (capture by value): a deferred op runs it at endCoalescing.
  c10::intrusive_ptr<c10d::Work> launch(DeviceState& state, Call call, std::function<void(const Launch&)> body);
  // Runs `body` under the communicator's Lease with `stream` current, then its `after` steps. If
  // it throws (an NCCL call failed, or failed half-way through a group), the group is failed
  // (failGroup) and the error rethrown: the ranks' NCCL streams may no longer match.
  void issue(DeviceState& state, const OpContext& ctx, const c10::cuda::CUDAStream& stream,
             const std::function<void(const Launch&)>& body, std::vector<at::Tensor>& scratch,
             std::chrono::steady_clock::time_point deadline);

  struct Deferred {  // an op of an open coalesced group
    DeviceState* state;  // a node of devices_: stable until shutdown
    Call call;
    OpContext ctx;
    std::function<void(const Launch&)> body;
    c10::intrusive_ptr<NcclWork> work;
    bool capturing;
    std::exception_ptr failure;  // set by issueGroup when the group failed, or for an unpaired self-op
    bool neverIssued = false;    // an unpaired send to or receive from this rank (rules::unpairedSelfOps)
  };
  // With deps_.orderMutex held: marks the self-ops NCCL could not pair in `ops` (never issued).
  void markUnpairedSelfOps(std::vector<Deferred>& ops);
  // With deps_.orderMutex held: whether the calling thread has a coalesced group open.
  bool joinsOpenGroup();
  // With deps_.orderMutex held: issues the deferred ops as one NCCL group (leaving the window
  // open when `close` is false). Returns them; the caller finishes them (finishIssued) once it
  // has released the order mutex, because their futures' callbacks may issue ops.
  std::vector<Deferred> issueOpenGroup(bool close);
  std::vector<Deferred> issueGroup(std::vector<Deferred> ops);
  void finishIssued(std::vector<Deferred> ops);
  // A Work whose issue failed (the group is failed already) keeps `tensors` until what NCCL has
  // of it has run, and fails: in watch() (the failure sticks), or here when it is not watched.
  void failIssued(const c10::intrusive_ptr<NcclWork>& work, const c10::cuda::CUDAStream& stream,
                  std::vector<at::Tensor> tensors, bool capturing, std::exception_ptr failure);
  // Hands a launched Work to the watchdog (or, while capturing a CUDA graph, to nobody).
  void track(const c10::intrusive_ptr<NcclWork>& work, bool capturing);
  std::shared_ptr<NcclWatchdog> currentWatchdog();
  void teardown(rules::TeardownCause cause);
  // Tensors NCCL reads or writes in place: on `device` and contiguous.
  void requireDirect(const OpContext& ctx, const std::vector<at::Tensor>& tensors, at::Device device) const;

  WatchdogFailure checkComms();
  void failGroup(const WatchdogFailure& failure);  // aborts the communicators, fails pending works
  void throwIfBroken(const OpContext& ctx);

  CudaPathDeps deps_;
  StagedPath staged_;
  std::mutex initMutex_;                 // device states; held through communicator creation
  std::map<int, DeviceState> devices_;   // by device index
  int devicesSeen_ = 0;                  // ordinal of the next device: names its bootstrap keys
  // Lock order: deps_.orderMutex -> NcclComm's Lease (launch); brokenMutex_ alone;
  // commsMutex_ -> NcclComm's mutex (checkComms, failGroup: timed or try-lock); the watchdog's
  // own mutex alone. failGroup never takes orderMutex, so the watchdog can fail a group while a
  // launch is blocked.
  std::mutex commsMutex_;                // the list the watchdog polls
  std::vector<NcclComm*> comms_;
  std::mutex brokenMutex_;
  std::string brokenReason_;             // non-empty once aborted, failed or shut down
  std::atomic<bool> closed_{false};
  // The open coalesced group: guarded by deps_.orderMutex (taken by every launch).
  std::optional<std::thread::id> groupOwner_;
  std::vector<Deferred> deferred_;
  std::mutex watchdogMutex_;                // guards the pointer below (created by a launch, read by abort)
  std::shared_ptr<NcclWatchdog> watchdog_;  // started with the first communicator
};

}  // namespace ddplite::nccl
