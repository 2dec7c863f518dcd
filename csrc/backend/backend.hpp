// DdpliteBackend: the c10d::Backend that torch.distributed calls for backend="ddplite".
//
// One object serves CPU and CUDA tensors of one process group (torch registers the same object
// for both devices). Every collective is validated on the caller's thread, given the group's next
// sequence number, and queued to the worker thread, which runs it through the CPU transport and
// completes its Work; send/recv go through the P2P engine instead. Calls on CUDA tensors are
// validated here, then handed to the CUDA path (cuda/cuda_path.hpp: the group's own NCCL
// communicator, or host staging on a shared GPU), which shares the group's sequence numbers.
//
// Failure model: the first transport failure (peer closed, timeout, I/O error) records its cause
// in the store, aborts this rank's connections (so peers fail promptly instead of hanging) and
// leaves the group unusable; later collectives fail at once with the recorded cause.
#pragma once

#include "backend/arrival_recorder.hpp"
#include "backend/caller_spin_trial.hpp"
#include "backend/coalescing.hpp"
#include "backend/detail_check.hpp"
#include "backend/flight_recorder.hpp"
#include "backend/monitored_barrier.hpp"
#include "backend/wait_ledger.hpp"
#include "backend/work.hpp"
#include "health/status_server.hpp"
#include "backend/worker.hpp"
#include "common/compat.hpp"
#include "common/errors.hpp"
#include "common/fork_guard.hpp"
#include "cpu/algorithms/algorithm.hpp"
#include "cpu/collectives.hpp"
#include "cpu/cpu_path.hpp"
#include "cpu/transport/transport.hpp"
#include "cuda/cuda_path.hpp"
#include "rendezvous/bootstrap.hpp"
#include "rendezvous/mpi.hpp"
#include "rendezvous/store.hpp"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace ddplite {

// The options getBackendOptions() returns: torch's, as a type of ours so that Python can copy it
// (dist.split_group deep-copies the parent's options; torch's own Options type cannot be copied).
struct DdpliteOptions : c10d::Backend::Options {
  using Options::Options;
  // torch 2.14+: ProcessGroup::splitGroup clones the parent's options before handing them to the
  // child; without this the copy is torch's Options, not ddplite's.
  c10::intrusive_ptr<c10d::Backend::Options> clone() const DDPLITE_OVERRIDE_SINCE_2_14 {
    return c10::make_intrusive<DdpliteOptions>(*this);
  }
};

class DdpliteBackend final : public c10d::Backend {
 public:
  static constexpr const char* kName = "ddplite";

  // Collective over the group: connects every pair of ranks before returning. `trace`: the
  // group's name and global ranks for the flight recorder (empty: group "0" of ranks 0..size-1).
  // Every key it writes is under "ddplite/size<N>/run<k>/" of `store`, k the number of this
  // group's run on that store, so a store reused by a later run cannot hand it stale addresses
  // or ids.
  DdpliteBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                 TraceGroupIdentity trace = {});
  ~DdpliteBackend() override;
  // When the last strong reference goes (c10::intrusive_ptr): drops this backend's weak entry in
  // the registry of live backends (registerLive), so that the destructor runs now, closing the
  // group's sockets and joining its threads, not at the next group's creation.
  void release_resources() override;

  const std::string getBackendName() const override { return kName; }
  // Virtual in torch from 2.9; on 2.8 they serve ddplite's own bindings (`options`).
  c10::intrusive_ptr<Options> getBackendOptions() DDPLITE_OVERRIDE_SINCE_2_9;
  void setTimeout(std::chrono::milliseconds timeout) DDPLITE_OVERRIDE_SINCE_2_9;
  void setSequenceNumberForGroup() override {}
  // pg._enable_collectives_timing(): every op issued afterwards serves Work._get_duration() (ms;
  // CPU: from when the op starts running to its completion; CUDA: between events around the
  // NCCL calls on the NCCL stream) and its flight-recorder entry carries duration_ms. Any thread.
  void enableCollectivesTiming() override { timing_.store(true, std::memory_order_relaxed); }
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  // gloo's allgather_coalesced: outputLists[r][i] receives rank r's inputs[i]. CPU only (NCCL's
  // backend does not serve it either).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
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

  // Point-to-point (P2pEngine): independent of the collectives' order and sockets; they carry
  // their own sequence numbers ("send #3").
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // Coalescing (backend/coalescing.hpp): the ops issued between start and end, one Work for all.
  // endCoalescing without startCoalescing raises ValueError.
  bool supportsCoalescing() const override { return true; }
  // init_process_group(device_id=cuda:i): the CUDA path sets that GPU up now (collective), as
  // torch's NCCL backend does; the CPU path is connected at construction already.
  void eagerConnectSingleDevice(at::Device device) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // torch's split_group (ProcessGroup::splitGroup): a new ddplite group of this group's ranks
  // `ranks` (distinct), numbered by their position in `ranks` (torch 2.14+ passes the caller's
  // order, earlier torches the sorted list); null on a rank not in `ranks`. Every rank of this group calls it
  // once per split_group (torch's contract: collective over the parent), members or not; the new
  // group connects over this group's store under "ddplite-split/<n>/<ranks>/", n counting the
  // splits of this group. It does not use torch's `store`, whose prefix is a name torch derives
  // from how many groups each rank has registered, which differs on a rank that was left out of
  // an earlier split. torch 2.11 calls split once per device type this backend serves (cpu and
  // cuda) with one `store`: a call with the store of the previous call returns what that made
  // (and then forgets both). A split this rank refuses (ValueError) still counts.
  // CUDA: the new group's communicators come from ncclCommSplit of this group's (cuda_->split(),
  // every rank of this group, members or not; NCCL >= 2.18 and a communicator on that GPU), else
  // it makes its own when it first meets a CUDA tensor (docs/parity.md). Caller's thread.
  // torch 2.8 has no Backend::split (its split_group splits NCCL communicators in Python): false.
  bool supportsSplitting() const override { return DDPLITE_TORCH_HAS_SPLIT; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) DDPLITE_OVERRIDE_SINCE_2_9;
  // torch_ddp_lite.failed_ranks: the ranks of this group that are gone (dead or stuck), the same
  // sorted list on every rank that calls it. Each caller publishes "alive" under
  // "failed-ranks/<n>/" (n counting this group's calls) and waits until every rank has either
  // published or is known dead (a rank on this host whose process has ended: pidfd), at most
  // `wait`; it then proposes the ranks that have not published, and the store's compareSet keeps
  // the first proposal, which every caller returns. A caller named in it raises DistBackendError
  // (the others declared it failed). Caller's thread; store requests only.
  std::vector<int> failedRanks(std::chrono::milliseconds wait);
  // This rank's arrival and end of the group's last collectives (torch_ddp_lite.stragglers); empty
  // when DDPLITE_STRAGGLER_WINDOW=0. Any thread.
  std::vector<WaitLedger::Entry> waitLedger() const;
#if DDPLITE_TORCH_HAS_SHRINK
  // torch's shrink_group: a new ddplite group of this group's ranks but `excluded`, called by
  // every survivor and by no excluded rank (they may be dead). The survivors first agree through
  // the store (which torchrun's agent, or the user, hosts) on the list: each publishes its own
  // under "shrink/<n>/excluded/<rank>" (in the group's keys) and reads every other survivor's, n
  // counting this group's shrinks; a survivor with another list, or one that does not publish
  // within the group's timeout (or whose process has ended), makes every survivor raise
  // DistBackendError naming it: one decision per shrink, "agreed" or "abandoned", compare-set in the
  // store under "shrink/<n>/excluded/decision", which every survivor follows (a late one raises at
  // once, naming the decision it missed; all then count this shrink). The new group then connects afresh under
  // "ddplite-shrink/<n>/" (new sockets and segment: nothing of this group's streams can reach it).
  // `flags` & SHRINK_ABORT (1): this group's pending ops are aborted once the survivors agreed. CUDA:
  // the new group's NCCL communicators are made from this group's by ncclCommShrink among the
  // survivors (NCCL >= 2.27, NCCL_SHRINK_ABORT with SHRINK_ABORT), else by the new group when it
  // first meets a CUDA tensor (cuda/rules/nccl_rules.hpp, shrinkPlan). Caller's thread.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& excluded, int flags,
                                           const c10::intrusive_ptr<Options>& opts) override;
#endif
  // gloo's monitored barrier (backend/monitored_barrier.hpp), over the send/recv mesh; CPU only.
  // A timeout of zero is zero (rank 0 gives up at once), as in gloo; unset is the group's.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;

  // abort(): fail pending and future collectives now. shutdown(): finish pending ones, then
  // close. Both idempotent; destroy_process_group() calls shutdown().
  void abort() override;
  void shutdown() override;
  // At interpreter exit, before Python finalizes (stopAllBackendsForExit): every thread of this
  // group ends now; collectives still pending in a group that was not shut down fail (the
  // connections are closed only then). A thread of ours that
  // drops the last reference to a tensor with a Python object takes the GIL; during finalization
  // Python ends such a thread with pthread_exit, whose unwinding through a destructor is
  // std::terminate. Idempotent; the group refuses new ops afterwards.
  void stopForExit();

  // How this group shares set-up blobs (the NCCL unique id): over MPI when the processes are one
  // MPI job (mpi:// or DDPLITE_CPU_TRANSPORT=mpi), else over the store.
  Bootstrap& bootstrap() { return *bootstrap_; }
  // "tcp", "shm", "hierarchical" or "mpi": what carries this group's CPU collectives, and why it
  // was chosen (cpu::CpuPath).
  const char* cpuTransportName() const { return cpu_->collectivesName(); }
  const std::string& cpuPathReason() const { return cpu_->why(); }
  // "shared-memory channels" or "TCP".
  const char* p2pPathName() const { return cpu_->p2pName(); }
  // The reduction kernels its CPU collectives use (DDPLITE_CPU_KERNELS when it was created).
  const std::string& kernelSetName() const { return cpu::kernelSetName(*kernels_); }

 private:
  struct RunScoped {};  // `store` is already the run's own view
  DdpliteBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
                 TraceGroupIdentity trace, RunScoped);

  using CpuBody = std::function<void(const cpu::CpuContext&)>;

  // Context for messages about the op about to be issued (its sequence number is the next one).
  OpContext nextContext(const char* op) const;
  // Validates and issues the collective `op` through `issue(ctx)`. A call this rank refuses
  // (ValueError, NotImplementedError: raised before anything is issued) still consumes its
  // sequence number: ranks that refuse the same call stay in step and the group stays usable,
  // while a rank that refused a call its peers ran is one number ahead of them, so its next
  // collective fails the wire fingerprint check on both sides instead of pairing with theirs.
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> collective(const char* op, Issue&& issue);
  void consumeRefusedNumber(const char* op, const std::string& why);
  // ". This rank refused gather #3 ..." when the collective just before `mismatchedSeq` was
  // refused here (which explains a mismatch met in `mismatchedSeq`), else "".
  std::string refusalNote(uint64_t mismatchedSeq) const;
  // True for CUDA tensors (the caller hands the call to cuda_); NotImplementedError for CUDA
  // tensors in a build without NCCL.
  bool routesToCuda(const OpContext& ctx, const at::Tensor& tensor) const;
  std::chrono::milliseconds resolveTimeout(std::chrono::milliseconds requested) const;
  // How the caller issued an op: its timeout, and whether the caller blocks on it at once
  // (torch sets opts.asyncOp = async_op; dist.all_reduce(t) passes false and calls wait() next).
  struct Issued {
    std::chrono::milliseconds timeout;
    bool callerWaits = false;
  };
  template <typename Options>
  Issued issued(const Options& opts) const {
    return {resolveTimeout(opts.timeout), syncOnCaller_ && !opts.asyncOp};
  }
  // What enqueue needs besides the outputs, for the flight recorder and the DETAIL check.
  struct OpArgs {
    c10::ArrayRef<at::Tensor> inputs;    // recorded as the op's inputs
    c10::ArrayRef<at::Tensor> compared;  // what every rank passes alike (detail_check.hpp)
    int root = -1;                       // rooted ops
    int reduceOp = -1;                   // reductions: c10d::ReduceOp::RedOpType
  };
  // How one queued op runs (runOp), fixed when it is enqueued.
  struct OpRun {
    std::chrono::milliseconds timeout;
    uint64_t refusedSeq = 0;  // the op just before, when this rank refused it (cpu::CpuContext)
    FlightRecorder::Handle trace = 0;             // its flight-recorder entry; 0: none
    std::optional<ArgumentSignature> signature;  // checked across ranks first (DETAIL)
  };
  // all_reduce of a sparse COO CPU tensor (backend/sparse_allreduce.hpp): three all_gathers
  // waited for on the caller's thread; returns a completed Work. Sequence numbers: those of
  // the all_gathers, the same on every rank.
  c10::intrusive_ptr<c10d::Work> sparseAllreduce(const OpContext& ctx, at::Tensor& tensor,
                                                 const c10d::AllreduceOptions& opts);
  // Queues a validated CPU collective for the worker, or runs it on the calling thread when the
  // worker is idle and either the caller blocks on it anyway (Issued::callerWaits) or it is a
  // small shared-memory op every peer has started (mayRunInline, kInlineWait).
  c10::intrusive_ptr<c10d::Work> enqueue(OpContext ctx, c10d::OpType type, const OpArgs& args,
                                         std::vector<at::Tensor> outputs, Issued issue, CpuBody body);
  // Runs a CPU op on this thread (the worker's, or the caller's when claimed).
  void runOp(DdpliteWork& work, const OpRun& run, const CpuBody& body);
  // Records a send/recv in the flight recorder (0 when it does not run).
  FlightRecorder::Handle recordP2p(const OpContext& ctx, c10d::OpType type, const at::Tensor& tensor, int peer);
  // Completes a send/recv's Work and flight-recorder entry (P2P engine thread).
  void finishP2p(DdpliteWork& work, const OpContext& ctx, FlightRecorder::Handle trace, std::exception_ptr error,
                 int source);
  // The first failure of this group dumps the flight recorder: ". Flight recorder dump: ..." for
  // its error message; "" after the first, or when the recorder is off.
  std::string dumpOnFailure();
  // How long a caller that could run a small async op itself waits for its peers to start it
  // too before handing it to the worker (enqueue()).
  static constexpr std::chrono::microseconds kInlineWait{50};
  // How long a caller that blocks on its op waits for the worker to finish earlier ops before
  // handing its op to the worker after all (enqueue()).
  static constexpr std::chrono::microseconds kCallerWaitsForIdle{10000};
  // Whether an op may run on the calling thread (see Worker::tryClaimIdle): it goes through
  // shared memory (or the group has one rank) and moves at most DDPLITE_SHM_INLINE_BYTES.
  bool mayRunInline(const std::vector<at::Tensor>& outputs) const;
  std::exception_ptr failureFromTransport(const OpContext& ctx, const TransportError& error);
  // "; rank(s) that did not arrive at this collective: 2, 3 (...)" for a timeout in op `seq`.
  std::string arrivalsNote(uint64_t seq);
  c10::intrusive_ptr<c10d::Work> postRecv(const char* op, std::vector<at::Tensor>& tensors, int srcRank, int tag);
  OpContext nextP2pContext(const char* op);
  void markBroken(const std::string& reason);
  bool isBroken();
  // Whether an op left a shared-memory collective begun and not ended (cpu::ShmGroup).
  bool segmentLeftOpen() const;
  // For an exception (not a TransportError) that left a collective part-way on a segment: records
  // and marks the failure, breaks every segment's group for all of its ranks, closes the TCP mesh.
  void breakAfterAbandonedCollective(const OpContext& ctx, const std::exception_ptr& failure);
  // shutdown(): settles a pending broadcast check on each segment (ShmGroup::settlePendingCheck),
  // warning with what it finds. Once the worker has stopped.
  void settlePendingChecks();
  void throwIfBroken(const OpContext& ctx);
  // The group's MPI communicator when this process is part of an MPI job (see bootstrap()); when
  // DDPLITE_CPU_TRANSPORT=mpi, also a duplicate of it for MPI's collectives (the CPU path's), which
  // it returns (else null). Collective over the group.
  std::unique_ptr<mpi::GroupComm> connectMpi(bool mpiTransport);
  // In a forked child (not creatorPid_): let go of every member that owns threads, sockets or
  // segments without running its destructor; true when it did. Any thread.
  bool abandonInForkedChild();
  // Whether `peer`'s process is known to have ended: it shares this host (its identity, published
  // at construction under "proc/<rank>") and its pid no longer runs. False when unknown.
  bool peerProcessEnded(int peer);
  // shrink, CUDA: the store keys through which the survivors stop each other's ncclCommShrink on a
  // device where one of them failed (CudaPath::shrink), and the round after it: each survivor says
  // which devices it shrunk, and keeps only those every survivor shrunk (the rest get a new
  // communicator on every survivor). Caller's thread.
  ShrinkCoordination shrinkCoordination(uint64_t epoch);
  void keepDevicesEverySurvivorShrunk(const OpContext& ctx, uint64_t epoch, const std::vector<int>& survivors,
                                      std::unique_ptr<CudaSplit>& shrunk);
  // shrink's agreement round (see shrink): returns the survivors, sorted. Each survivor also
  // publishes `cudaReady` (CudaPath::shrinkReadiness) before its list; `cudaAgreed` gets the
  // devices every survivor named (all of them shrink those communicators, or none does).
  std::vector<int> agreeOnExclusion(const OpContext& ctx, uint64_t epoch, const std::vector<int>& excluded,
                                    const std::string& cudaReady, std::vector<int>* cudaAgreed);
  // Raises DistBackendError for an op called in a forked child.
  void refuseInForkedChild(const OpContext& ctx) const;

  StoreRendezvous rendezvous_;
  std::string statusName_;        // torch's group name at creation ("0" for the default group); written once in the constructor
  std::vector<int> globalRanks_;  // global rank of each rank of this group; written once in the constructor
  c10::intrusive_ptr<c10d::Store> store_;  // this group's store; split groups connect over it
  std::mutex splitMutex_;                  // guards the three below
  uint64_t splits_ = 0;                    // split_group calls so far
  uint64_t shrinks_ = 0;                   // shrink_group calls so far
  std::atomic<uint64_t> failedRankRounds_{0};  // failed_ranks calls so far
  // torch's store of the last split() call (held, so that no later call's store reuses its
  // address), and the group it made on this rank.
  c10::intrusive_ptr<c10d::Store> lastSplitStore_;
  std::optional<c10::weak_intrusive_ptr<c10d::Backend>> lastSplit_;
  // Declared early so that it outlives the P2P engine and the worker, whose completions use it.
  std::shared_ptr<FlightRecorder> recorder_;   // null when DDPLITE_TRACE_BUFFER_SIZE=0
  std::atomic<bool> recorderNamed_{false};     // torch's group name and desc passed on (first op)
  std::atomic<bool> dumpedOnFailure_{false};
  std::atomic<int64_t> timeoutMs_;
  std::atomic<bool> timing_{false};  // enableCollectivesTiming; read relaxed when an op is issued
  std::unique_ptr<mpi::GroupComm> mpiComm_;              // null unless one MPI job
  std::unique_ptr<Bootstrap> bootstrap_;  // NCCL unique id and device ids: MPI in one MPI job, else the store
  // Everything CPU tensors travel through: the collectives' transports, segments or hierarchy,
  // MPI's collectives, the send/recv engine (cpu/cpu_path.hpp). Set once in the constructor.
  std::unique_ptr<cpu::CpuPath> cpu_;
  std::atomic<uint64_t> p2pSeq_{0};
  std::atomic<uint64_t> monitoredBarriers_{0};  // calls so far: every rank counts alike
  CoalescingCollector coalescing_;  // the caller's thread only (see coalescing.hpp)
  const cpu::KernelSet* kernels_ = nullptr;  // written once in the constructor

  mutable std::mutex enqueueMutex_;  // makes "assign seq + enqueue" atomic
  std::atomic<uint64_t> seq_{0};
  std::string lastRefusal_;     // "allreduce #3 (ValueError: ...)"; guarded by enqueueMutex_
  uint64_t lastRefusedSeq_ = 0; // its sequence number; guarded by enqueueMutex_

  std::mutex brokenMutex_;
  std::string brokenReason_;    // non-empty once the group is unusable

  std::unique_ptr<CudaPath> cuda_;        // null in builds without NCCL
  std::unique_ptr<ArrivalRecorder> arrivals_;  // which ranks reached a stalled collective; null for one rank
  std::unique_ptr<WaitLedger> waits_;  // the last collectives' arrival and end (stragglers); null when off
  bool detailChecks_ = false;  // DDPLITE_DEBUG=DETAIL / TORCH_DISTRIBUTED_DEBUG=DETAIL; set once in the constructor
  bool syncOnCaller_ = true;   // DDPLITE_SYNC_ON_CALLER; set once in the constructor (issued())
  // Whether an op run on its caller spins (DDPLITE_CALLER_SPIN_TRIAL); only the holder of the
  // worker claim uses it (enqueue). Set once in the constructor.
  CallerSpinTrial callerSpinTrial_{false};

  std::atomic<bool> closed_{false};
  // The process that built this group. A forked child holds a copy of this object without its
  // threads: its teardown leaks instead of joining, shutting sockets down or unlinking (common/fork_guard.hpp).
  const pid_t creatorPid_ = fork_guard::currentPid();
  std::unique_ptr<Worker> worker_;  // its thread uses everything above

  // What the live status query shows (health/status_server.hpp). An op's fields are written by
  // the thread that runs or posts it: op name and time relaxed, then seq with release; the status
  // thread loads seq with acquire, then the rest (relaxed). A snapshot taken as one op ends and
  // the next begins may pair the new op's name with the old one's seq: it is a display.
  struct LiveOp {
    std::atomic<uint64_t> seq{0};  // 0: none
    std::atomic<const char*> op{""};  // a string literal (OpContext::op)
    std::atomic<int64_t> sinceNs{0};  // steady clock: when it began (running) or ended (last)
    std::atomic<int> peer{-1};        // send/recv only
  };
  LiveOp running_;           // the collective running now
  LiveOp lastDone_;          // the last collective that completed without error
  LiveOp lastP2p_;           // the last send/recv posted
  std::atomic<int> p2pPending_{0};  // send/recv posted and not finished (relaxed: a count for display)
  void noteP2pPosted(const OpContext& ctx, int peer);
  std::string describeForStatus();  // the status thread's view of this group, as JSON
  std::unique_ptr<health::Registration> status_;  // last member: destroyed first, before what describeForStatus reads
};

// Remembers `backend` (weakly) for stopAllBackendsForExit; forgetLive() drops it.
void registerLive(const c10::intrusive_ptr<DdpliteBackend>& backend);
void forgetLive(const DdpliteBackend* backend);
// DdpliteBackend::stopForExit on every backend of this process still alive: torch_ddp_lite's
// atexit hook, which runs before Python finalizes. Any thread; releases the GIL.
void stopAllBackendsForExit();

// `globalRanks`, `groupName`: torch's (the extended backend API), for the flight recorder; empty
// when unknown.
c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout, std::vector<int> globalRanks = {},
                                                std::string groupName = "");

}  // namespace ddplite
