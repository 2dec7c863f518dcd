#include "backend/backend.hpp"

#include <ATen/Context.h>

#include "common/fork_guard.hpp"
#include "common/gil.hpp"
#include "common/process_identity.hpp"

#include "backend/settings_agreement.hpp"
#include "backend/sparse_allreduce.hpp"
#include "backend/validation.hpp"
#include "common/env.hpp"
#include "common/logging.hpp"
#include "cpu/algorithms/selector.hpp"
#include "cpu/reduce/reduce_kernels.hpp"
#include "cpu/p2p/p2p_engine.hpp"
#include "cpu/transport/wait_policy.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <thread>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace ddplite {

namespace {

using c10d::OpType;

const char* hintFor(TransportError::Kind kind) {
  switch (kind) {
    case TransportError::Kind::kPeerClosed:
      return "a rank exited or crashed: its own log shows the first error. Every later collective on this "
             "group fails; restart the job (torchrun --max-restarts can do it) or create a new group";
    case TransportError::Kind::kTimeout:
      return "a rank did not reach this collective in time: it may be slower, stuck, or have issued a "
             "different collective or size (compare the '#seq' in each rank's error). Raise the limit with "
             "init_process_group(timeout=...) if the work is just slow";
    case TransportError::Kind::kIo:
      return "a socket error between ranks; check the network and DDPLITE_SOCKET_IFNAME";
    case TransportError::Kind::kAborted:
      return "abort() or shutdown() was called on this process group";
    case TransportError::Kind::kMismatch:
      return "every rank must issue the same collectives, in the same order, with matching sizes, dtypes, "
             "reduce ops, roots and DDPLITE_* settings. A collective that raised on one rank (a ValueError for "
             "its arguments) still ran on the ranks where it did not: fix that call on every rank. "
             "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective's arguments across ranks";
  }
  return "";
}

// DDPLITE_ALGO is checked when the first group is created, so a typo fails init_process_group.
void applyAlgorithmPins(int rank, int size) {
  try {
    cpu::applyAlgorithmPinsFromEnv();
  } catch (const std::invalid_argument& error) {
    throwValueError(OpContext{rank, size, "init", 0}, error.what(),
                    "fix DDPLITE_ALGO (the same value on every rank), or unset it for the automatic choice");
  }
}

// Every DDPLITE_* knob with a fixed set of values (env::validateAll): a typo fails
// init_process_group with a ValueError naming the knob and the allowed values.
void validateKnobs(int rank, int size) {
  try {
    env::validateAll();
  } catch (const std::invalid_argument& error) {
    throwValueError(OpContext{rank, size, "init", 0}, error.what(),
                    "set it to an allowed value (the same on every rank), or unset it for the default; "
                    "torch_ddp_lite.env_knobs() lists every knob with its default");
  }
}

// DDPLITE_CPU_KERNELS: a known set this CPU runs, else a ValueError from init_process_group.
const cpu::KernelSet& chooseKernelSet(int rank, int size) {
  try {
    return cpu::kernelSetFromEnv();
  } catch (const std::invalid_argument& error) {
    throwValueError(OpContext{rank, size, "init", 0}, error.what(),
                    "unset DDPLITE_CPU_KERNELS (or set it to auto) to use the widest set this CPU runs");
  }
}

c10d::WorkResult workResultOf(const TransportError& error) {
  return error.kind() == TransportError::Kind::kTimeout ? c10d::WorkResult::TIMEOUT : c10d::WorkResult::COMM_ERROR;
}

// The same for a failure carried as an exception_ptr (the P2P engine's); COMM_ERROR for anything
// but a TransportError timeout, and for none (unused then).
c10d::WorkResult workResultOf(const std::exception_ptr& error) {
  if (!error) return c10d::WorkResult::COMM_ERROR;
  try {
    std::rethrow_exception(error);
  } catch (const TransportError& failure) {
    return workResultOf(failure);
  } catch (...) {
    return c10d::WorkResult::COMM_ERROR;
  }
}

// What an exception says, for another message (c10 errors without their C++ backtrace).
std::string describeException(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const c10::Error& error) {
    return error.what_without_backtrace();
  } catch (const std::exception& error) {
    return strCat(c10::demangle(typeid(error).name()), ": ", error.what());
  } catch (...) {
    return "an unknown exception";
  }
}

// True for a failure that abort()/shutdown() caused (no flight-recorder dump for those).
bool isAbort(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const TransportError& failure) {
    return failure.kind() == TransportError::Kind::kAborted;
  } catch (...) {
    return false;
  }
}

bool wantsMpiTransport(int rank, int size) {
  if (env::cpuTransport() != "mpi") return false;
  if (!mpi::compiledIn()) {
    throwValueError(OpContext{rank, size, "init", 0}, "DDPLITE_CPU_TRANSPORT=mpi, but this ddplite was built without MPI",
                    mpi::kRebuildHint);
  }
  return true;
}

// A send/recv failure reported by the P2P engine, as the DistBackendError wait() raises.
// `dumpNote`: where the flight recorder was dumped, appended to the message ("" for none).
std::exception_ptr p2pFailure(const OpContext& ctx, std::exception_ptr error, const std::string& dumpNote) {
  try {
    try {
      std::rethrow_exception(error);
    } catch (const TransportError& failure) {
      const char* hint = failure.kind() == TransportError::Kind::kTimeout
                             ? "the peer did not send a matching message (same tag) in time; check that it "
                               "calls send with this rank as destination and the same tag, or raise the "
                               "group's timeout"
                             : hintFor(failure.kind());
      throwDistError(ctx, failure.what() + dumpNote, hint);
    } catch (const std::exception& failure) {
      throwDistError(ctx, failure.what() + dumpNote, "send and recv of one message must use tensors of the same size in bytes");
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

namespace {
// "proc/<rank>": this process's identity (common/process_identity.hpp) and its host
// (CpuPath::hostIdentity), for failed_ranks on the other ranks of this host.
std::string publishedIdentity() {
  const ProcessIdentity me = ProcessIdentity::ofThisProcess();
  return strCat(me.pid, " ", me.startTicks, " ", me.pidNamespace, " ", cpu::CpuPath::hostIdentity());
}
}  // namespace

namespace {
// A store that outlives a run (a persistent store handed to init_process_group again, a file://
// path not deleted) still holds the earlier run's keys: addresses of listeners that are gone, an
// NCCL unique id. Each run of a group therefore works under "ddplite/size<N>/run<k>/", k counted by
// "ddplite/runs/size<N>", to which every rank of the group adds 1 once, so one run's ranks all
// get k (counted per group size: a later run may give the same group name another size).
c10::intrusive_ptr<c10d::Store> runScopedStore(const c10::intrusive_ptr<c10d::Store>& store, int size) {
  int64_t arrival = 0;
  try {
    arrival = store->add(strCat("ddplite/runs/size", size), 1);
  } catch (const std::exception& error) {
    throwDistError(strCat("rendezvous failed: the store could not count this group's ranks: ", error.what()),
                   "the store (MASTER_ADDR:MASTER_PORT, or the file:// path) must be reachable from every rank");
  }
  return c10::make_intrusive<c10d::PrefixStore>(strCat("ddplite/size", size, "/run", (arrival - 1) / std::max(size, 1)),
                                                store);  // size < 1 is refused just after
}
}  // namespace

DdpliteBackend::DdpliteBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               std::chrono::milliseconds timeout, TraceGroupIdentity trace)
    : DdpliteBackend(runScopedStore(store, size), rank, size, timeout, std::move(trace), RunScoped{}) {}

DdpliteBackend::DdpliteBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               std::chrono::milliseconds timeout, TraceGroupIdentity trace, RunScoped)
    : c10d::Backend(rank, size), rendezvous_(store), store_(store), timeoutMs_(timeout.count()) {
  if (timeout.count() <= 0) {
    timeoutMs_ = std::chrono::duration_cast<std::chrono::milliseconds>(kBackendDefaultTimeout).count();
  }
  validateKnobs(rank, size);
  kernels_ = &chooseKernelSet(rank, size);
  agreeOnGroupWideKnobs(rendezvous_, rank, size);
  applyAlgorithmPins(rank, size);
  std::unique_ptr<mpi::GroupComm> mpiData = connectMpi(wantsMpiTransport(rank, size));
  const std::chrono::milliseconds groupTimeout(timeoutMs_.load());
  cpu_ = std::make_unique<cpu::CpuPath>(
      cpu::CpuPath::Setup{rendezvous_, rank, size, Clock::now() + groupTimeout, groupTimeout, std::move(mpiData)});
  cuda_ = createCudaPath(CudaPathDeps{*this, *bootstrap_, rank, size, enqueueMutex_, seq_,
                                      [this](std::chrono::milliseconds t) { return resolveTimeout(t); }, timing_});
  if (size > 1) arrivals_ = std::make_unique<ArrivalRecorder>(rendezvous_, rank, size);
  if (const int64_t window = env::stragglerWindow(); window > 0) waits_ = std::make_unique<WaitLedger>(window);
  if (size > 1) rendezvous_.set(strCat("proc/", rank), publishedIdentity());
  if (trace.name.empty()) trace.name = "0";
  if (trace.desc.empty()) trace.desc = "undefined";
  if (static_cast<int>(trace.globalRanks.size()) != size) {
    trace.globalRanks.resize(size);
    for (int r = 0; r < size; ++r) trace.globalRanks[r] = r;
  }
  globalRanks_ = trace.globalRanks;
  statusName_ = trace.name;
  const int globalRank = trace.globalRanks[rank];
  recorder_ = FlightRecorder::create(std::move(trace), globalRank);
  detailChecks_ = env::detailChecks();
  syncOnCaller_ = env::syncOpsOnCaller();
  // Without a caller spin the mark changes nothing: every op takes it, as before the trial.
  callerSpinTrial_ = CallerSpinTrial(env::callerSpin().count() > 0 && env::callerSpinTrial());
  installTraceSignalHandler();
  worker_ = std::make_unique<Worker>();
  status_ = health::registerGroup(
      health::GroupSetup{store_, size, globalRank,
                         *std::max_element(globalRanks_.begin(), globalRanks_.end()) + 1},
      [this] { return describeForStatus(); });
  DDPLITE_LOG(kInfo, "rank ", rank, "/", size, " ready (timeout ", timeoutMs_.load(), " ms, CPU collectives over ",
              cpuTransportName(), ", send/recv over ", p2pPathName(), ", bootstrap over ", bootstrap_->name(), ")");
  init();
}

std::unique_ptr<mpi::GroupComm> DdpliteBackend::connectMpi(bool mpiTransport) {
  bootstrap_ = std::make_unique<StoreBootstrap>(rendezvous_, rank_, size_);
  if (!mpiTransport && !mpi::isInitialized()) return nullptr;  // not an MPI job: the store does everything
  const OpContext ctx{rank_, size_, "init", 0};
  const auto [worldRank, worldSize] = mpi::initWorld();
  // The members' MPI_COMM_WORLD ranks in group-rank order, through the group's store.
  rendezvous_.set(strCat("mpi/world_rank/", rank_), std::to_string(worldRank));
  std::vector<int> worldRanks(size_);
  std::vector<bool> seen(worldSize, false);
  bool oneJob = true;
  for (int member = 0; member < size_; ++member) {
    const std::string text = rendezvous_.get(strCat("mpi/world_rank/", member), strCat("rank ", member, "'s MPI rank"));
    char* end = nullptr;
    const long parsed = std::strtol(text.c_str(), &end, 10);
    worldRanks[member] = (end != text.c_str() && *end == '\0' && parsed >= 0 && parsed <= INT32_MAX)
                             ? static_cast<int>(parsed) : -1;  // unparsable: not one job (reported below)
    const int w = worldRanks[member];
    oneJob = oneJob && w >= 0 && w < worldSize && !seen[w];
    if (oneJob) seen[w] = true;
  }
  if (!oneJob) {
    if (mpiTransport) {
      throwValueError(ctx,
                      strCat("DDPLITE_CPU_TRANSPORT=mpi, but the ranks of this group are not one MPI job (this rank is "
                             "MPI rank ", worldRank, " of ", worldSize, "; the group's ranks report MPI ranks ",
                             c10::Join(",", worldRanks), ")"),
                      "launch every rank with one mpirun (mpirun -np N python train.py), or unset "
                      "DDPLITE_CPU_TRANSPORT to use ddplite's own transport");
    }
    return nullptr;  // e.g. mpi4py singletons under torchrun: keep the store
  }
  mpiComm_ = std::make_unique<mpi::GroupComm>(worldRanks, rank_);
  bootstrap_ = std::make_unique<mpi::MpiBootstrap>(*mpiComm_);
  return mpiTransport ? mpiComm_->duplicate() : nullptr;
}

DdpliteBackend::~DdpliteBackend() {
  // The threads are joined here, without the GIL (common/gil.hpp), not by the members' own
  // destructors after this body, which would run with the GIL the caller holds.
  if (abandonInForkedChild()) return;
  GilReleasedScope released;
  // Destroyed without destroy_process_group (shutdown): the CUDA path aborts rather than wait for
  // queued NCCL work, as ProcessGroupNCCL's destructor does (cuda/rules/nccl_rules.hpp).
  if (!closed_.load() && cuda_) cuda_->abandon();
  shutdown();
  worker_.reset();
  cpu_->destroyP2p();
  cuda_.reset();
}

bool DdpliteBackend::abandonInForkedChild() {
  if (fork_guard::createdHere(creatorPid_)) return false;
  closed_ = true;
  // Deliberate leaks: their threads do not exist here, their sockets were closed at fork, and the
  // segments and the NCCL communicator are the parent's.
  (void)worker_.release();
  if (cpu_) cpu_->abandon();  // keeps its names (cpu_path()) and nothing that owns a thread, socket or segment
  (void)cuda_.release();
  (void)mpiComm_.release();
  (void)bootstrap_.release();
  (void)arrivals_.release();
  (void)status_.release();  // the registry's mutex may have been held by another thread at fork
  return true;
}

void DdpliteBackend::release_resources() {
  forgetLive(this);  // c10's own release_resources() is empty, and neither Backend nor its bases add to it
}

c10::intrusive_ptr<c10d::Backend::Options> DdpliteBackend::getBackendOptions() {
  auto options = c10::make_intrusive<DdpliteOptions>(kName, std::chrono::milliseconds(timeoutMs_.load()));
  compat::setGroupIdentity(*options, getGroupUid(), getGroupDesc());
  return options;
}

void DdpliteBackend::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) timeoutMs_ = timeout.count();
}

OpContext DdpliteBackend::nextContext(const char* op) const {
  OpContext ctx{rank_, size_, op, seq_.load() + 1};
  refuseInForkedChild(ctx);
  return ctx;
}

void DdpliteBackend::refuseInForkedChild(const OpContext& ctx) const {
  if (fork_guard::createdHere(creatorPid_)) return;
  throwDistError(ctx, strCat("this process (pid ", fork_guard::currentPid(), ") is a fork of the one that created the "
                             "process group (pid ", creatorPid_, "): a forked child has none of the group's threads "
                             "and its copies of the group's connections were closed at fork"),
                 "call collectives only in the process that created the group; a child process (a DataLoader "
                 "worker, multiprocessing with fork) that needs one must create its own group");
}

bool DdpliteBackend::routesToCuda(const OpContext& ctx, const at::Tensor& tensor) const {
  if (!tensor.device().is_cuda()) return false;
  if (!cuda_) {
    C10_THROW_ERROR(NotImplementedError,
                    strCat(ctx.describe(), ": CUDA tensors need NCCL, and this ddplite build has none (setup.py "
                           "found no CUDA torch, nccl.h or libnccl.so.2; torch_ddp_lite.build_info()['nccl'] says "
                           "which)\nHint: rebuild where the CUDA toolkit and the nvidia-nccl wheel are installed, move "
                           "the tensor to the CPU, or use backend=\"cpu:ddplite,cuda:nccl\""));
  }
  return true;
}

namespace {
// How many collective() calls this thread is inside: a staged CUDA op issues its CPU collective
// through the backend again, and only the outermost call may consume a refused number.
thread_local int collectiveDepth = 0;
struct DepthGuard {
  DepthGuard() { ++collectiveDepth; }
  ~DepthGuard() { --collectiveDepth; }
};

// The Work of an op on `tensor` that starts now, on this thread (a send/recv posted at once, a
// sparse all_reduce run in the call): its profiler span opens and its clock starts here.
c10::intrusive_ptr<DdpliteWork> workStartedNow(const OpContext& ctx, OpType type, const at::Tensor& tensor, bool timed) {
  auto work = c10::make_intrusive<DdpliteWork>(ctx, type, std::vector<at::Tensor>{tensor},
                                               profilingArgs(type, ctx.op, {tensor}), timed);
  work->markStarted();
  return work;
}
}  // namespace

template <typename Issue>
c10::intrusive_ptr<c10d::Work> DdpliteBackend::collective(const char* op, Issue&& issue) {
  const OpContext ctx = nextContext(op);
  const DepthGuard depth;
  const bool outermost = collectiveDepth == 1;
  try {
    c10::intrusive_ptr<c10d::Work> work = issue(ctx);
    if (outermost) coalescing_.add(work);
    return work;
  } catch (const c10::ValueError& error) {
    if (outermost) consumeRefusedNumber(op, strCat("ValueError: ", error.what_without_backtrace()));
    throw;
  } catch (const c10::NotImplementedError& error) {
    if (outermost) consumeRefusedNumber(op, strCat("NotImplementedError: ", error.what_without_backtrace()));
    throw;
  }
}

void DdpliteBackend::consumeRefusedNumber(const char* op, const std::string& why) {
  std::lock_guard<std::mutex> lock(enqueueMutex_);
  const uint64_t seq = ++seq_;
  std::string firstLine = why.substr(0, why.find('\n'));
  lastRefusal_ = strCat(op, " #", seq, " (", firstLine, ")");
  lastRefusedSeq_ = seq;
  DDPLITE_LOG(kInfo, "rank ", rank_, "/", size_, ": ", op, " #", seq, " refused on this rank: ", firstLine);
}

std::string DdpliteBackend::refusalNote(uint64_t mismatchedSeq) const {
  std::lock_guard<std::mutex> lock(enqueueMutex_);
  // Only a refusal just before the collective that met the stray message explains it.
  if (lastRefusal_.empty() || lastRefusedSeq_ + 1 != mismatchedSeq) return "";
  return strCat(". This rank refused ", lastRefusal_,
                " and sent nothing for it; a rank where the same call succeeded is still in that collective");
}

std::chrono::milliseconds DdpliteBackend::resolveTimeout(std::chrono::milliseconds requested) const {
  // Unset (kUnsetTimeout = -1) or zero means the group's timeout.
  return requested.count() > 0 ? requested : std::chrono::milliseconds(timeoutMs_.load());
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::enqueue(OpContext ctx, OpType type, const OpArgs& args,
                                                       std::vector<at::Tensor> outputs, Issued issue, CpuBody body) {
  // A caller that blocks on the op at once gains nothing from the worker but two thread
  // hand-offs (the worker's wake-up, then the caller's): it runs the op itself whatever the
  // transport and size, as a blocking backend would. An async op stays on the worker unless it
  // is small, on shared memory, and every peer has started it (below).
  const bool inlineCandidate = issue.callerWaits || mayRunInline(outputs);
  // The worker may still be finishing the op before (its Work completed, which woke this caller,
  // before the worker marked itself idle) or hold earlier async ops, which must end before this
  // one anyway: a caller that blocks on this op waits for that here, outside every lock, so that
  // the claim below succeeds. Bounded: another thread may keep the worker busy.
  if (issue.callerWaits) worker_->waitIdle(kCallerWaitsForIdle);
  const bool timed = timing_.load(std::memory_order_relaxed);
  c10::intrusive_ptr<DdpliteWork> work;
  OpRun run{issue.timeout};
  auto task = [this](c10::intrusive_ptr<DdpliteWork> work, OpRun run, CpuBody body) {
    return [this, work = std::move(work), run = std::move(run), body = std::move(body)] { runOp(*work, run, body); };
  };
  if (recorder_) {
    if (!recorderNamed_.load(std::memory_order_relaxed) && !recorderNamed_.exchange(true)) {
      recorder_->nameGroup(getGroupUid(), getGroupDesc());
    }
    recorder_->captureCallerStack();  // before enqueueMutex_: it takes the GIL
  }
  {
    std::lock_guard<std::mutex> lock(enqueueMutex_);
    ctx.seq = seq_.load() + 1;
    if (recorder_) {
      run.trace = recorder_->record(TraceOp{frOpName(type, ctx.op), false, ctx.seq, p2pSeq_.load(), args.inputs,
                                            outputs, type == OpType::REDUCE_SCATTER, type == OpType::ALLGATHER,
                                            cpuTransportName(), issue.timeout, timed});
    }
    if (detailChecks_ && size_ > 1) run.signature = signatureOf(ctx, args.compared, args.root, args.reduceOp);
    work = c10::make_intrusive<DdpliteWork>(ctx, type, std::move(outputs), profilingArgs(type, ctx.op, args.inputs),
                                            timed);
    run.refusedSeq = lastRefusedSeq_ != 0 && lastRefusedSeq_ + 1 == ctx.seq ? lastRefusedSeq_ : 0;
    if (!inlineCandidate || !worker_->tryClaimIdle()) {
      worker_->enqueue(task(work, std::move(run), std::move(body)));
      seq_ = ctx.seq;  // only after a successful enqueue, so a refused op does not consume a number
      return work;
    }
    seq_ = ctx.seq;  // claimed: later ops queue behind this one (the worker waits for the release)
  }
  // Claimed, outside enqueueMutex_ (a failure report takes it: refusalNote). An async op runs
  // here only if every peer has started it too, so that the caller is never held by a late peer
  // for longer than kInlineWait: an async op stays async. The work then completes before it is
  // returned; a failure is raised by wait(), as for a queued op.
  cpu_->markStarted(ctx.seq);
  if (issue.callerWaits) {
    // Its waits may spin longer (DDPLITE_CALLER_SPIN_US), where the trial keeps the spin.
    const bool spin = callerSpinTrial_.spins(ctx.seq);
    const auto started = Clock::now();
    {
      std::optional<CallerBlocksScope> blocked;
      if (spin) blocked.emplace();
      runOp(*work, run, body);
    }
    callerSpinTrial_.record(ctx.seq, spin, Clock::now() - started);
  } else if (cpu_->peersStarted(ctx.seq, kInlineWait)) {
    runOp(*work, run, body);
  } else {
    worker_->enqueueFirst(task(work, std::move(run), std::move(body)));
  }
  worker_->releaseClaim();
  return work;
}

bool DdpliteBackend::mayRunInline(const std::vector<at::Tensor>& outputs) const {
  // Every CPU op goes through the segment (send/recv do not come here); a group of one only
  // copies locally.
  if (!cpu_->throughOneSegment() && size_ > 1) return false;
  int64_t bytes = 0;
  for (const auto& tensor : outputs) bytes += static_cast<int64_t>(tensor.nbytes());
  return bytes <= env::shmInlineBytes();
}

void DdpliteBackend::runOp(DdpliteWork& work, const OpRun& run, const CpuBody& body) {
  work.markRunning();
  work.markStarted();
  cpu_->markStarted(work.context().seq);
  const Deadline deadline = Clock::now() + run.timeout;
  if (arrivals_) arrivals_->begin(work.context().seq, deadline, run.timeout);
  running_.op.store(work.context().op, std::memory_order_relaxed);
  running_.sinceNs.store(work.stages().running, std::memory_order_relaxed);  // markRunning's clock read
  running_.seq.store(work.context().seq, std::memory_order_release);
  if (run.trace != 0) recorder_->started(run.trace);
  const char* algorithm = nullptr;
  std::exception_ptr failure;
  c10d::WorkResult outcome = c10d::WorkResult::COMM_ERROR;
  try {
    throwIfBroken(work.context());
    const cpu::CpuContext cpu =
        cpu_->context(deadline, work.context(), run.refusedSeq, kernels_, run.trace != 0 ? &algorithm : nullptr);
    if (run.signature) checkArgumentsAcrossRanks(cpu, *run.signature);
    body(cpu);
    work.markRan();
    if (waits_) waits_->record(work.context().seq, work.stages().issued, work.stages().ran);
    lastDone_.op.store(work.context().op, std::memory_order_relaxed);
    lastDone_.sinceNs.store(work.stages().ran, std::memory_order_relaxed);
    lastDone_.seq.store(work.context().seq, std::memory_order_release);
    if (run.trace != 0) recorder_->completed(run.trace, algorithm);  // a failed op stays "started"
  } catch (const TransportError& error) {
    failure = failureFromTransport(work.context(), error);
    outcome = workResultOf(error);
  } catch (...) {
    failure = std::current_exception();
    // Not when the group was broken already (this op then failed at throwIfBroken, and the
    // segment is still "open" from the collective that failed first).
    if (segmentLeftOpen() && !isBroken()) breakAfterAbandonedCollective(work.context(), failure);
  }
  if (arrivals_) arrivals_->end();
  running_.seq.store(0, std::memory_order_release);
  work.markFinished(failure, outcome);
}

std::vector<WaitLedger::Entry> DdpliteBackend::waitLedger() const {
  return waits_ ? waits_->snapshot() : std::vector<WaitLedger::Entry>{};
}

void DdpliteBackend::noteP2pPosted(const OpContext& ctx, int peer) {
  lastP2p_.op.store(ctx.op, std::memory_order_relaxed);
  lastP2p_.peer.store(peer, std::memory_order_relaxed);
  lastP2p_.sinceNs.store(DdpliteWork::nowNs(), std::memory_order_relaxed);
  lastP2p_.seq.store(ctx.seq, std::memory_order_release);
  p2pPending_.fetch_add(1, std::memory_order_relaxed);  // after the op: a count above 0 has a last_p2p
}

namespace {
std::string describeLiveOp(const char* what, const std::atomic<uint64_t>& seqOf, const std::atomic<const char*>& op,
                           const std::atomic<int64_t>& since, int peer, int64_t nowNs) {
  const uint64_t seq = seqOf.load(std::memory_order_acquire);
  if (seq == 0) return strCat("\"", what, "\":null");
  const double seconds = static_cast<double>(nowNs - since.load(std::memory_order_relaxed)) / 1e9;
  return strCat("\"", what, "\":{\"op\":", health::jsonString(op.load(std::memory_order_relaxed)), ",\"seq\":", seq,
                ",\"seconds\":", seconds, peer >= 0 ? strCat(",\"peer\":", peer) : std::string(), "}");
}
}  // namespace

// The status thread (health/status_server.hpp), under the registry's mutex: reads atomics, the
// wait ledger (a seqlock) and brokenReason_ (a short lock); never blocks on an op.
std::string DdpliteBackend::describeForStatus() {
  const int64_t now = DdpliteWork::nowNs();
  std::string broken;
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    broken = brokenReason_;
  }
  std::string ledger;
  for (const auto& entry : waitLedger()) {
    ledger += strCat(ledger.empty() ? "" : ",", "[", entry.seq, ",", entry.arrivedNs, ",", entry.endedNs, "]");
  }
  return strCat("{\"name\":", health::jsonString(statusName_), ",\"rank\":", rank_, ",\"size\":", size_,
                ",\"global_ranks\":[", c10::Join(",", globalRanks_), "],\"transport\":",
                health::jsonString(cpuTransportName()), ",\"issued\":", seq_.load(), ",",
                describeLiveOp("running", running_.seq, running_.op, running_.sinceNs, -1, now), ",",
                describeLiveOp("last", lastDone_.seq, lastDone_.op, lastDone_.sinceNs, -1, now), ",\"p2p_pending\":",
                p2pPending_.load(std::memory_order_relaxed), ",",
                describeLiveOp("last_p2p", lastP2p_.seq, lastP2p_.op, lastP2p_.sinceNs,
                               lastP2p_.peer.load(std::memory_order_relaxed), now),
                ",\"broken\":", health::jsonString(broken), ",\"ledger\":[", ledger, "],\"now_ns\":", now, "}");
}

bool DdpliteBackend::segmentLeftOpen() const { return cpu_->segmentLeftOpen(); }

void DdpliteBackend::breakAfterAbandonedCollective(const OpContext& ctx, const std::exception_ptr& failure) {
  // This rank's flags no longer say what its buffers hold (it may have posted a step it never
  // reduced): no rank may read them again. Every rank of the segment learns it at once
  // (breakGroup); ranks on other hosts through the TCP connections closed below.
  const std::string what = strCat(ctx.describe(), " left the collective part-way after an error (",
                                  describeException(failure), "), which breaks the group");
  if (!rendezvous_.recordedFailure()) rendezvous_.recordFailure(what);
  markBroken(what);
  DDPLITE_LOG(kWarn, what);
  cpu_->breakGroup();
}

std::string DdpliteBackend::arrivalsNote(uint64_t seq) {
  // Bounded: a frozen store host must not hold the error back (the store's own timeout is the
  // group's, 30 minutes by default).
  constexpr auto kStoreAnswerWithin = std::chrono::seconds(2);
  if (!arrivals_) return "";
  const std::optional<std::vector<int>> missing = arrivals_->missingRanks(seq, kStoreAnswerWithin);
  if (!missing) return "";
  if (missing->empty()) return "; every rank of the group was seen waiting in this collective";
  return strCat("; rank(s) that did not arrive at this collective: ", c10::Join(", ", *missing),
                " (not seen waiting in it, per the group's store: absent, or done with its part in under a second)");
}

std::exception_ptr DdpliteBackend::failureFromTransport(const OpContext& ctx, const TransportError& error) {
  std::string what = error.what();
  if (error.kind() == TransportError::Kind::kMismatch) what += refusalNote(ctx.seq);
  if (error.kind() == TransportError::Kind::kTimeout) what += arrivalsNote(ctx.seq);
  if (error.kind() == TransportError::Kind::kAborted) {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    if (!brokenReason_.empty()) what = brokenReason_;
  } else {
    // Name the first failure in the group: a rank that only sees the cascade (a neighbour that
    // tore its connections down) reports the root cause recorded by the rank that saw it.
    auto firstFailure = rendezvous_.recordedFailure();
    const std::string summary = strCat(ctx.describe(), ": ", what);
    if (firstFailure) {
      what += strCat("; first failure reported in the group: [", *firstFailure, "]");
    } else {
      rendezvous_.recordFailure(summary);
    }
    markBroken(strCat(ctx.describe(), ": ", what));  // quotes the first failure too
    // This host's ranks may wait for this rank (their leader) in the segment: all of them stop
    // now, after the failure is in the store for them to quote (HostHierarchy::runAmongLeaders).
    cpu_->stopAfterFailure();
  }
  if (error.kind() != TransportError::Kind::kAborted) what += dumpOnFailure();  // not for abort()/shutdown()
  DDPLITE_LOG(kWarn, ctx.describe(), " failed: ", what);
  try {
    throwDistError(ctx, what, hintFor(error.kind()));
  } catch (...) {
    return std::current_exception();
  }
}

std::string DdpliteBackend::dumpOnFailure() {
  return recorder_ ? dumpFlightRecorderOnFailure(dumpedOnFailure_) : "";
}

FlightRecorder::Handle DdpliteBackend::recordP2p(const OpContext& ctx, OpType type, const at::Tensor& tensor,
                                                 int peer) {
  if (!recorder_) return 0;
  (void)peer;
  if (!recorderNamed_.load(std::memory_order_relaxed) && !recorderNamed_.exchange(true)) {
    recorder_->nameGroup(getGroupUid(), getGroupDesc());
  }
  recorder_->captureCallerStack();
  const bool isSend = type == OpType::SEND;
  const c10::ArrayRef<at::Tensor> one(tensor);
  const FlightRecorder::Handle handle = recorder_->record(
      TraceOp{frOpName(type, ctx.op), true, seq_.load(), ctx.seq, isSend ? one : c10::ArrayRef<at::Tensor>(),
              isSend ? c10::ArrayRef<at::Tensor>() : one, false, false, p2pPathName(),
              std::chrono::milliseconds(timeoutMs_.load()), timing_.load(std::memory_order_relaxed)});
  recorder_->started(handle);  // a send/recv runs from when it is posted (its Work's duration too)
  return handle;
}

bool DdpliteBackend::isBroken() {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  return !brokenReason_.empty();
}

void DdpliteBackend::markBroken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(brokenMutex_);
  if (brokenReason_.empty()) brokenReason_ = reason;
}

void DdpliteBackend::throwIfBroken(const OpContext& ctx) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    reason = brokenReason_;
  }
  if (!reason.empty()) {
    throwDistError(ctx, "this process group is unusable after an earlier failure: [" + reason + "]",
                   "fix the first failure; then destroy this group and create a new one (or restart the job)");
  }
}

void DdpliteBackend::settlePendingChecks() {
  // A broadcast checks its peers' posts at its next step; when it was the last op, that is now.
  // Bounded: a peer that is merely late gets a few seconds, not the group's timeout.
  constexpr auto kSettleWithin = std::chrono::seconds(5);
  if (isBroken()) return;
  cpu_->settlePendingChecks(Clock::now() + std::min<std::chrono::milliseconds>(
                                               kSettleWithin, std::chrono::milliseconds(timeoutMs_.load())));
}

void DdpliteBackend::stopForExit() {
  if (abandonInForkedChild()) return;
  GilReleasedScope released;
  // With nothing pending, the connections stay as they are until the process ends (a peer still
  // waiting for this rank meets the group's timeout, or the closed connections, as without this).
  if (!closed_.load() && !worker_->idle()) {
    DDPLITE_LOG(kWarn, "rank ", rank_, "/", size_, ": the process exits with a ddplite process group that was not "
                "destroyed; its pending ops are aborted. Call torch.distributed.destroy_process_group() before exiting.");
    markBroken(strCat("the process is exiting on rank ", rank_, " (the group was not destroyed)"));
    cpu_->abortCollectives(/*exiting=*/true);
  }
  if (!closed_.load() && cuda_) cuda_->abandon();  // its watchdog thread ends too
  worker_->drainAndStop();  // what is queued fails at once (the transports are aborted)
  cpu_->p2p().stop();
}

void DdpliteBackend::abort() {
  if (abandonInForkedChild()) return;
  markBroken(strCat("abort() was called on rank ", rank_));
  cpu_->abortCollectives();  // first: NCCL's abort may take seconds, and the worker may wait on a CPU path
  if (cuda_) cuda_->abort();
  cpu_->p2p().abort();
}

void DdpliteBackend::shutdown() {
  if (abandonInForkedChild()) return;
  if (closed_.exchange(true)) return;
  GilReleasedScope released;  // it joins the worker (common/gil.hpp)
  if (cuda_) cuda_->shutdown();  // drains CUDA work first; staged ops finish on the worker below
  status_.reset();  // before the worker stops: a query during teardown sees the group, or nothing
  worker_->drainAndStop();
  settlePendingChecks();  // the worker has stopped: this thread may use the segments now
  // Its only user was the worker. Destroyed here, without the GIL: it joins its threads, which
  // drop their copies of the store before destroy_process_group returns (arrival_recorder.hpp).
  arrivals_.reset();
  markBroken(strCat("the process group was shut down on rank ", rank_));
  cpu_->closeConnections();
  cpu_->p2p().abort();
}

// ---- collectives -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> DdpliteBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                         const c10d::BroadcastOptions& opts) {
  return collective("broadcast", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    at::Tensor tensor = validation::singleTensor(ctx, tensors, "broadcast");
    validation::checkRoot(ctx, opts.rootRank);
    validation::checkWritable(ctx, tensor, "broadcast");
    if (routesToCuda(ctx, tensor)) return cuda_->broadcast(tensors, opts);
    const int root = static_cast<int>(opts.rootRank);
    return enqueue(ctx, OpType::BROADCAST, {tensor, tensor, root}, {tensor}, issued(opts),
                   [tensor, root](const cpu::CpuContext& cpu) mutable { cpu::broadcast(cpu, tensor, root); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  return collective("allreduce", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    if (tensors.size() == 1 && tensors[0].defined() && tensors[0].is_sparse()) {
      return sparseAllreduce(ctx, tensors[0], opts);
    }
    at::Tensor tensor = validation::singleTensor(ctx, tensors, "allreduce");
    validation::checkReduceOp(ctx, tensor, opts.reduceOp);
    validation::checkWritable(ctx, tensor, "allreduce");
    if (routesToCuda(ctx, tensor)) return cuda_->allreduce(tensors, opts);
    const c10d::ReduceOp op = opts.reduceOp;
    return enqueue(ctx, OpType::ALLREDUCE, {tensor, tensor, -1, op.op_}, {tensor}, issued(opts),
                   [tensor, op](const cpu::CpuContext& cpu) mutable { cpu::allreduce(cpu, tensor, op); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::sparseAllreduce(const OpContext& ctx, at::Tensor& tensor,
                                                               const c10d::AllreduceOptions& opts) {
  checkSparseAllreduce(ctx, tensor, opts.reduceOp);
  c10d::AllgatherOptions gatherOptions;
  gatherOptions.timeout = opts.timeout;
  const auto allgather = [&](const at::Tensor& part) {
    at::Tensor input = part.contiguous();
    at::Tensor output = at::empty({size_ * input.numel()}, input.options());
    _allgather_base(output, input, gatherOptions)->wait();
    return output;
  };
  // Done before it is returned: its span and duration are those of the call (three all_gathers).
  auto work = workStartedNow(ctx, OpType::ALLREDUCE, tensor, timing_.load(std::memory_order_relaxed));
  try {
    tensor.copy_(sparseAllreduceSum(ctx, tensor, size_, allgather));
  } catch (...) {
    work->markFinished(std::current_exception());  // closes its profiler span; the caller gets the error
    throw;
  }
  work->markFinished(nullptr);
  return work;
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::reduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::ReduceOptions& opts) {
  return collective("reduce", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    at::Tensor tensor = validation::singleTensor(ctx, tensors, "reduce");
    validation::checkRoot(ctx, opts.rootRank);
    validation::checkReduceOp(ctx, tensor, opts.reduceOp);
    validation::checkWritable(ctx, tensor, "reduce");
    if (routesToCuda(ctx, tensor)) return cuda_->reduce(tensors, opts);
    const int root = static_cast<int>(opts.rootRank);
    const c10d::ReduceOp op = opts.reduceOp;
    return enqueue(ctx, OpType::REDUCE, {tensor, tensor, root, op.op_}, {tensor}, issued(opts),
                   [tensor, root, op](const cpu::CpuContext& cpu) mutable { cpu::reduce(cpu, tensor, root, op); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllgatherOptions& opts) {
  return collective("allgather", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    at::Tensor input = validation::singleTensor(ctx, inputs, "allgather input");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
      throwValueError(ctx,
                      strCat("expected one output list of ", size_, " tensors (one per rank), got ",
                             outputs.size() == 1 ? outputs[0].size() : outputs.size(),
                             outputs.size() == 1 ? " tensors" : " lists"),
                      "all_gather(tensor_list, tensor) needs len(tensor_list) == world size of the group");
    }
    std::vector<at::Tensor> targets = outputs[0];
    for (const auto& target : targets) validation::checkMatches(ctx, input, target, "allgather output");
    targets.push_back(input);
    validation::checkSameDevice(ctx, targets);
    targets.pop_back();
    validation::checkWritable(ctx, targets, "allgather output");
    if (routesToCuda(ctx, input)) return cuda_->allgather(outputs, inputs, opts);
    return enqueue(ctx, OpType::ALLGATHER, {input, input}, targets, issued(opts),
                   [input, targets](const cpu::CpuContext& cpu) mutable { cpu::allgatherList(cpu, input, targets); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const c10d::AllgatherOptions& opts) {
  return collective("allgather_coalesced", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkNonEmptyList(ctx, inputs, "allgather_coalesced input");
    for (const auto& input : inputs) {
      if (input.scalar_type() != inputs.front().scalar_type()) {
        throwValueError(ctx, strCat("the inputs mix ", inputs.front().scalar_type(), " and ", input.scalar_type()),
                        "pass inputs of one dtype (torch.distributed refuses mixed dtypes here too)");
      }
    }
    if (static_cast<int>(outputLists.size()) != size_) {
      throwValueError(ctx, strCat("expected one output list per rank (", size_, "), got ", outputLists.size()),
                      "all_gather_coalesced(output_tensor_lists, input_tensor_list) needs len(output_tensor_lists) "
                      "== world size");
    }
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < size_; ++r) {
      if (outputLists[r].size() != inputs.size()) {
        throwValueError(ctx, strCat("output list ", r, " has ", outputLists[r].size(), " tensors for ", inputs.size(),
                                    " inputs"),
                        "each output list needs one tensor per input, shaped like it");
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        const at::Tensor& output = outputLists[r][i];
        validation::checkTensor(ctx, output, "allgather_coalesced output");
        if (output.scalar_type() != inputs[i].scalar_type() || output.sizes() != inputs[i].sizes()) {
          throwValueError(ctx,
                          strCat("output [", r, "][", i, "] (", output.scalar_type(), ", shape ", output.sizes(),
                                 ") must have input ", i, "'s dtype and shape (", inputs[i].scalar_type(), ", shape ",
                                 inputs[i].sizes(), ")"),
                          "shape each output list like the input list");
        }
        outputs.push_back(output);
      }
    }
    std::vector<at::Tensor> all = outputs;
    all.insert(all.end(), inputs.begin(), inputs.end());
    validation::checkSameDevice(ctx, all);
    validation::checkWritable(ctx, outputs, "allgather_coalesced output");
    if (routesToCuda(ctx, inputs.front())) {
      C10_THROW_ERROR(NotImplementedError,
                      strCat(ctx.describe(), ": allgather_coalesced is served for CPU tensors only (NCCL's backend "
                                             "does not serve it either)\nHint: use all_gather_into_tensor on each "
                                             "tensor inside torch.distributed._coalescing_manager"));
    }
    return enqueue(ctx, OpType::ALLGATHER_COALESCED, {inputs, inputs}, outputs, issued(opts),
                   [inputs, outputLists](const cpu::CpuContext& cpu) mutable {
                     cpu::allgatherCoalesced(cpu, inputs, outputLists);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                               const c10d::AllgatherOptions& opts) {
  return collective("allgather_into_tensor", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkTensor(ctx, input, "input");
    validation::checkTensor(ctx, output, "output");
    if (output.scalar_type() != input.scalar_type() || output.numel() != input.numel() * size_) {
      throwValueError(ctx,
                      strCat("the output (", output.scalar_type(), ", ", output.numel(),
                             " elements) must have the input's dtype and world size x its elements (",
                             input.scalar_type(), ", ", size_, " x ", input.numel(), ")"),
                      "allocate the output as torch.empty(world_size * input.numel(), dtype=input.dtype)");
    }
    validation::checkSameDevice(ctx, {input, output});
    validation::checkWritable(ctx, output, "output");
    if (routesToCuda(ctx, input)) return cuda_->_allgather_base(output, input, opts);
    at::Tensor in = input;
    at::Tensor out = output;
    return enqueue(ctx, OpType::_ALLGATHER_BASE, {in, in}, {out}, issued(opts),
                   [in, out](const cpu::CpuContext& cpu) mutable { cpu::allgatherInto(cpu, in, out); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::barrier(const c10d::BarrierOptions& opts) {
  // A barrier carries no data: it runs on the CPU transport unless it is for a GPU, which makes
  // it a one-element NCCL allreduce as in torch. torch's barrier() picks the device (device_ids[0]
  // on the accelerator it detects, the group's bound device, or the CPU), but its dispatcher op
  // (Ops.cpp, barrier<DEV>) hands a backend only device_ids, timeout and asyncOp, and this one
  // object serves both device types. So, without opts.device (always, through
  // torch.distributed.barrier), device_ids mean CUDA only where CUDA can run: on a machine
  // without a GPU, barrier(device_ids=[i]) (Accelerate's wait_for_everyone() on CPU) is the CPU
  // barrier, as on gloo, instead of a CUDA error. On a host with a GPU, device_ids still name
  // CUDA devices (torch's documented meaning), even for a job whose tensors are all on the CPU.
  // at::hasCUDA() (it initialises the driver) only when there is a CUDA path and ids to weigh.
  return collective("barrier", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    const bool forCuda =
        cuda_ && (opts.device ? opts.device->is_cuda() : !opts.device_ids.empty() && at::hasCUDA());
    if (forCuda) {
      const auto index = opts.device_ids.empty() ? opts.device->index() : opts.device_ids.front();
      return cuda_->barrier(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(index)), opts);
    }
    return enqueue(ctx, OpType::BARRIER, {}, {}, issued(opts),
                   [](const cpu::CpuContext& cpu) { cpu::barrier(cpu); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceCoalescedOptions& opts) {
  return collective("allreduce_coalesced", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkNonEmptyList(ctx, tensors, "allreduce_coalesced");
    for (const auto& tensor : tensors) validation::checkReduceOp(ctx, tensor, opts.reduceOp);
    validation::checkWritable(ctx, tensors, "allreduce_coalesced");
    if (routesToCuda(ctx, tensors.front())) return cuda_->allreduce_coalesced(tensors, opts);
    const c10d::ReduceOp op = opts.reduceOp;
    return enqueue(ctx, OpType::COALESCED, {tensors, tensors, -1, op.op_}, tensors, issued(opts),
                   [tensors, op](const cpu::CpuContext& cpu) mutable { cpu::allreduceCoalesced(cpu, tensors, op); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                               std::vector<at::Tensor>& inputs,
                                                                               const c10d::AllgatherOptions& opts) {
  return collective("allgather_into_tensor_coalesced", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkCoalescedPairs(ctx, inputs, outputs, /*inputScale=*/size_, /*outputScale=*/1);
    validation::checkWritable(ctx, outputs, "output");
    if (routesToCuda(ctx, inputs.front())) return cuda_->allgather_into_tensor_coalesced(outputs, inputs, opts);
    return enqueue(ctx, OpType::COALESCED, {inputs, inputs}, outputs, issued(opts),
                   [inputs, outputs](const cpu::CpuContext& cpu) mutable {
                     for (size_t i = 0; i < inputs.size(); ++i) cpu::allgatherInto(cpu, inputs[i], outputs[i]);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    at::Tensor output = validation::singleTensor(ctx, outputs, "reduce_scatter output");
    if (inputs.size() != 1) {
      throwValueError(ctx, strCat("expected one input list, got ", inputs.size()),
                      "reduce_scatter(output, input_list) takes one list of world-size tensors");
    }
    validation::checkList(ctx, inputs[0], size_, output, "reduce_scatter input",
                          "reduce_scatter(output, input_list) needs len(input_list) == world size, each like output");
    validation::checkReduceOp(ctx, output, opts.reduceOp);
    std::vector<at::Tensor> all = inputs[0];
    all.push_back(output);
    validation::checkSameDevice(ctx, all);
    validation::checkWritable(ctx, output, "reduce_scatter output");
    if (routesToCuda(ctx, output)) return cuda_->reduce_scatter(outputs, inputs, opts);
    const std::vector<at::Tensor> list = inputs[0];
    const c10d::ReduceOp op = opts.reduceOp;
    return enqueue(ctx, OpType::REDUCE_SCATTER, {list, output, -1, op.op_}, {output}, issued(opts),
                   [list, output, op](const cpu::CpuContext& cpu) mutable { cpu::reduceScatterList(cpu, list, output, op); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter_tensor", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkTensor(ctx, input, "input");
    validation::checkTensor(ctx, output, "output");
    if (output.scalar_type() != input.scalar_type() || input.numel() != output.numel() * size_) {
      throwValueError(ctx,
                      strCat("the input (", input.scalar_type(), ", ", input.numel(),
                             " elements) must have the output's dtype and world size x its elements (",
                             output.scalar_type(), ", ", size_, " x ", output.numel(), ")"),
                      "allocate the output as torch.empty(input.numel() // world_size, dtype=input.dtype)");
    }
    validation::checkReduceOp(ctx, output, opts.reduceOp);
    validation::checkSameDevice(ctx, {input, output});
    validation::checkWritable(ctx, output, "output");
    if (routesToCuda(ctx, input)) return cuda_->_reduce_scatter_base(output, input, opts);
    at::Tensor in = input;
    at::Tensor out = output;
    const c10d::ReduceOp op = opts.reduceOp;
    return enqueue(ctx, OpType::_REDUCE_SCATTER_BASE, {in, out, -1, op.op_}, {out}, issued(opts),
                   [in, out, op](const cpu::CpuContext& cpu) mutable { cpu::reduceScatterInto(cpu, in, out, op); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                               std::vector<at::Tensor>& inputs,
                                                                               const c10d::ReduceScatterOptions& opts) {
  return collective("reduce_scatter_tensor_coalesced", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkCoalescedPairs(ctx, inputs, outputs, /*inputScale=*/1, /*outputScale=*/size_);
    for (const auto& output : outputs) validation::checkReduceOp(ctx, output, opts.reduceOp);
    validation::checkWritable(ctx, outputs, "output");
    if (routesToCuda(ctx, inputs.front())) return cuda_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    const c10d::ReduceOp op = opts.reduceOp;
    return enqueue(ctx, OpType::COALESCED, {inputs, outputs, -1, op.op_}, outputs, issued(opts),
                   [inputs, outputs, op](const cpu::CpuContext& cpu) mutable {
                     for (size_t i = 0; i < inputs.size(); ++i) cpu::reduceScatterInto(cpu, inputs[i], outputs[i], op);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return collective("gather", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    at::Tensor input = validation::singleTensor(ctx, inputs, "gather input");
    validation::checkRoot(ctx, opts.rootRank);
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> targets =
        validation::rootOnlyList(ctx, outputs, rank_ == root, input, "gather_list", "destination");
    validation::checkWritable(ctx, targets, "gather_list");
    if (routesToCuda(ctx, input)) return cuda_->gather(outputs, inputs, opts);
    return enqueue(ctx, OpType::GATHER, {input, input, root}, targets, issued(opts),
                   [input, targets, root](const cpu::CpuContext& cpu) mutable { cpu::gather(cpu, input, targets, root); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ScatterOptions& opts) {
  return collective("scatter", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    at::Tensor output = validation::singleTensor(ctx, outputs, "scatter output");
    validation::checkRoot(ctx, opts.rootRank);
    const int root = static_cast<int>(opts.rootRank);
    std::vector<at::Tensor> sources =
        validation::rootOnlyList(ctx, inputs, rank_ == root, output, "scatter_list", "source");
    validation::checkWritable(ctx, output, "scatter output");
    if (routesToCuda(ctx, output)) return cuda_->scatter(outputs, inputs, opts);
    return enqueue(ctx, OpType::SCATTER, {sources, output, root}, {output}, issued(opts),
                   [sources, output, root](const cpu::CpuContext& cpu) mutable { cpu::scatter(cpu, sources, output, root); });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                             std::vector<int64_t>& outputSplitSizes,
                                                             std::vector<int64_t>& inputSplitSizes,
                                                             const c10d::AllToAllOptions& opts) {
  return collective("all_to_all_single", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    validation::checkTensor(ctx, input, "input");
    validation::checkTensor(ctx, output, "output");
    if (input.scalar_type() != output.scalar_type()) {
      throwValueError(ctx, strCat("input is ", input.scalar_type(), " but output is ", output.scalar_type()),
                      "use one dtype for both");
    }
    validation::checkSplits(ctx, input, inputSplitSizes, "input");
    validation::checkSplits(ctx, output, outputSplitSizes, "output");
    validation::checkOwnBlock(ctx, validation::ownSplitBytes(ctx, input, inputSplitSizes),
                              validation::ownSplitBytes(ctx, output, outputSplitSizes));
    validation::checkSameDevice(ctx, {input, output});
    validation::checkWritable(ctx, output, "output");
    if (routesToCuda(ctx, input)) return cuda_->alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
    at::Tensor in = input;
    at::Tensor out = output;
    std::vector<int64_t> inSplits = inputSplitSizes;
    std::vector<int64_t> outSplits = outputSplitSizes;
    return enqueue(ctx, OpType::ALLTOALL_BASE, {in, {}}, {out}, issued(opts),
                   [in, out, inSplits, outSplits](const cpu::CpuContext& cpu) mutable {
                     cpu::alltoallBase(cpu, in, out, inSplits, outSplits);
                   });
  });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllToAllOptions& opts) {
  return collective("all_to_all", [&](const OpContext& ctx) -> c10::intrusive_ptr<c10d::Work> {
    for (const auto* list : {&inputs, &outputs}) {
      if (static_cast<int>(list->size()) != size_) {
        throwValueError(ctx, strCat("expected ", size_, " ", list == &inputs ? "input" : "output", " tensors, got ", list->size()),
                        "all_to_all(output_list, input_list) takes one tensor per rank in each list");
      }
      validation::checkNonEmptyList(ctx, *list, list == &inputs ? "input" : "output");
    }
    for (const auto& tensor : outputs) {
      if (tensor.scalar_type() != inputs.front().scalar_type()) {
        throwValueError(ctx, strCat("mixed dtypes ", inputs.front().scalar_type(), " and ", tensor.scalar_type()),
                        "use one dtype for every tensor of an all_to_all");
      }
    }
    validation::checkOwnBlock(ctx, inputs[rank_].nbytes(), outputs[rank_].nbytes());
    validation::checkWritable(ctx, outputs, "output");
    if (routesToCuda(ctx, inputs.front())) return cuda_->alltoall(outputs, inputs, opts);
    return enqueue(ctx, OpType::ALLTOALL, {inputs, {}}, outputs, issued(opts),
                   [inputs, outputs](const cpu::CpuContext& cpu) mutable { cpu::alltoallList(cpu, inputs, outputs); });
  });
}

// ---- point-to-point ----------------------------------------------------------------------

OpContext DdpliteBackend::nextP2pContext(const char* op) {
  refuseInForkedChild(OpContext{rank_, size_, op, p2pSeq_.load() + 1});
  return OpContext{rank_, size_, op, ++p2pSeq_};
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  const OpContext ctx = nextP2pContext("send");
  const DepthGuard depth;  // a staged CUDA send comes back here: only the outermost joins a coalesced group
  const bool outermost = collectiveDepth == 1;
  at::Tensor tensor = validation::singleTensor(ctx, tensors, "send");
  const bool cuda = routesToCuda(ctx, tensor);
  validation::checkPeer(ctx, dstRank, "send to", cuda && outermost && coalescing_.openOnThisThread());
  validation::checkTag(ctx, tag, kFirstUserTag);
  if (cuda) {
    auto work = cuda_->send(tensors, dstRank, tag, ctx);
    if (outermost) coalescing_.add(work);
    return work;
  }
  auto work = workStartedNow(ctx, OpType::SEND, tensor, timing_.load(std::memory_order_relaxed));
  const FlightRecorder::Handle trace = recordP2p(ctx, OpType::SEND, tensor, dstRank);
  noteP2pPosted(ctx, dstRank);
  cpu_->p2p().send(dstRank, tag, tensor.contiguous(), Clock::now() + std::chrono::milliseconds(timeoutMs_.load()),
             [this, work, ctx, trace](std::exception_ptr error, int source) {
               finishP2p(*work, ctx, trace, error, source);
             });
  if (outermost) coalescing_.add(work);
  return work;
}

c10::intrusive_ptr<c10d::Backend> DdpliteBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                        const std::vector<int>& ranks,
                                                        const c10::intrusive_ptr<Options>& opts) {
  const OpContext ctx{rank_, size_, "split_group", seq_.load()};
  refuseInForkedChild(ctx);
  std::lock_guard<std::mutex> lock(splitMutex_);
  // The number comes first, so that a split this rank refuses still uses one, as on its peers.
  if (store && lastSplitStore_.get() == store.get()) {  // the other device type's call of one split_group
    std::optional<c10::weak_intrusive_ptr<c10d::Backend>> made = std::move(lastSplit_);
    lastSplit_.reset();
    lastSplitStore_.reset();  // no more calls for this split: hold neither its store nor its group
    if (made) {
      if (auto same = made->lock()) return same;
    }
    return {};
  }
  ++splits_;
  lastSplitStore_ = store;
  lastSplit_.reset();
  // The new group's rank of each member is its position in `ranks`, as torch numbers it: torch
  // 2.14+ keeps the caller's order (split_group(split_ranks=[[2, 1, 0]]) makes global rank 2 rank
  // 0); up to 2.13 it passes the list sorted.
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  const bool distinct = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
  const bool valid = !sorted.empty() && distinct && sorted.front() >= 0 && sorted.back() < size_;
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  const bool member = valid && me != ranks.end();
  // The CUDA path splits its communicators (ncclCommSplit) on every rank of this group, members,
  // others and refusers alike: the split is collective over the parent.
  std::unique_ptr<CudaSplit> cudaSplit = cuda_ ? cuda_->split(member ? ranks : std::vector<int>{}) : nullptr;
  if (!valid) {
    std::string listed;
    for (int r : ranks) listed += strCat(listed.empty() ? "" : ", ", r);
    throwValueError(ctx, strCat("split ranks [", listed, "] are not distinct ranks of this group of ", size_),
                    "pass each new group's ranks once, as ranks of the group being split");
  }
  if (opts && opts->backend != kName) {
    throwValueError(ctx, strCat("pg_options are ", opts->backend, "'s options; a ddplite group takes ddplite's"),
                    "pass torch_ddp_lite.Options(timeout=...) or no pg_options (the parent group's are copied)");
  }
  if (!member) return {};
  std::string prefix = strCat("ddplite-split/", splits_, "/");
  for (int r : ranks) prefix += strCat(r, "_");
  auto childStore = c10::make_intrusive<c10d::PrefixStore>(prefix + "/", store_);
  TraceGroupIdentity trace{opts ? compat::groupName(*opts) : std::string(), opts ? compat::groupDesc(*opts) : std::string(), {}};
  for (int r : ranks) trace.globalRanks.push_back(globalRanks_[r]);
  const auto timeout = opts ? opts->timeout : std::chrono::milliseconds(timeoutMs_.load());
  auto child = c10::make_intrusive<DdpliteBackend>(childStore, static_cast<int>(me - ranks.begin()),
                                                   static_cast<int>(ranks.size()), timeout, std::move(trace));
  registerLive(child);
  if (cudaSplit && child->cuda_) child->cuda_->adopt(std::move(cudaSplit));
  c10::intrusive_ptr<c10d::Backend> made = child;
  lastSplit_ = c10::weak_intrusive_ptr<c10d::Backend>(made);
  return made;
}

void DdpliteBackend::eagerConnectSingleDevice(at::Device device) {
  if (!device.is_cuda() || !cuda_) return;
  cuda_->connect(device);
}

void DdpliteBackend::startCoalescing() {
  if (!coalescing_.start()) {
    DDPLITE_LOG(kWarn, "rank ", rank_, "/", size_, ": startCoalescing while a coalesced group was still open (its "
                "_coalescing_manager body raised?): that group is dropped; its CPU ops complete on their own, its "
                "CUDA ops (never issued) fail");
  }
  if (cuda_) cuda_->startCoalescing();
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::endCoalescing() {
  const OpContext ctx{rank_, size_, "coalesced", seq_.load()};
  auto parts = coalescing_.end();
  if (!parts) {
    throwValueError(ctx, "endCoalescing without startCoalescing",
                    "use torch.distributed._coalescing_manager, or call _start_coalescing first");
  }
  if (cuda_) cuda_->endCoalescing();  // issues the CUDA ops of the group as one NCCL group
  return coalescedWork(ctx, std::move(*parts), timing_.load(std::memory_order_relaxed));
}

void DdpliteBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  const OpContext ctx{rank_, size_, "monitored_barrier", ++monitoredBarriers_};
  refuseInForkedChild(ctx);
  const std::chrono::milliseconds groupTimeout(timeoutMs_.load());
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? groupTimeout : opts.timeout;
  if (timeout.count() < 0) {
    throwValueError(ctx, strCat("timeout ", timeout.count(), " ms is negative"), "pass a timedelta >= 0");
  }
  throwIfBroken(ctx);  // an aborted or failed group says so, rather than "Rank 1 failed to pass"
  // A rank > 0 waits for rank 0 to arrive (up to the group's timeout) and then to decide.
  ddplite::monitoredBarrier(cpu_->p2p(), MonitoredBarrierCall{ctx, timeout, waitAllRanks, groupTimeout + timeout});
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return postRecv("recv", tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return postRecv("recv (any source)", tensors, cpu::P2pEngine::kAnySource, tag);
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::postRecv(const char* op, std::vector<at::Tensor>& tensors, int srcRank,
                                                        int tag) {
  const OpContext ctx = nextP2pContext(op);
  const DepthGuard depth;  // as in send()
  const bool outermost = collectiveDepth == 1;
  at::Tensor tensor = validation::singleTensor(ctx, tensors, "recv");
  const bool cuda = routesToCuda(ctx, tensor);
  if (srcRank != cpu::P2pEngine::kAnySource) {
    validation::checkPeer(ctx, srcRank, "receive from", cuda && outermost && coalescing_.openOnThisThread());
  }
  validation::checkTag(ctx, tag, kFirstUserTag);
  validation::checkWritable(ctx, tensor, "recv");
  if (cuda) {
    auto work = cuda_->recv(tensors, srcRank, tag, ctx);
    if (outermost) coalescing_.add(work);
    return work;
  }
  const OpType type = srcRank == cpu::P2pEngine::kAnySource ? OpType::RECVANYSOURCE : OpType::RECV;
  auto work = workStartedNow(ctx, type, tensor, timing_.load(std::memory_order_relaxed));
  // The engine fills a contiguous tensor; a strided one gets its copy on the engine thread.
  at::Tensor landing = tensor.is_contiguous() ? tensor : at::empty_like(tensor, at::MemoryFormat::Contiguous);
  const FlightRecorder::Handle trace = recordP2p(ctx, work->retrieveOpType(), tensor, srcRank);
  noteP2pPosted(ctx, srcRank);
  cpu_->p2p().recv(srcRank, tag, landing, Clock::now() + std::chrono::milliseconds(timeoutMs_.load()),
             [this, work, ctx, tensor, landing, trace](std::exception_ptr error, int source) mutable {
               if (!error && !landing.is_same(tensor)) tensor.copy_(landing);
               finishP2p(*work, ctx, trace, error, source);
             });
  if (outermost) coalescing_.add(work);
  return work;
}

void DdpliteBackend::finishP2p(DdpliteWork& work, const OpContext& ctx, FlightRecorder::Handle trace,
                               std::exception_ptr error, int source) {
  p2pPending_.fetch_sub(1, std::memory_order_relaxed);
  work.setSourceRank(source);
  if (!error) {
    if (trace != 0) recorder_->completed(trace, p2pPathName());
    work.markFinished(nullptr, workResultOf(error));
    return;
  }
  work.markFinished(p2pFailure(ctx, error, isAbort(error) ? "" : dumpOnFailure()), workResultOf(error));
}

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout, std::vector<int> globalRanks,
                                                std::string groupName) {
  TraceGroupIdentity trace{std::move(groupName), "", std::move(globalRanks)};
  auto backend = c10::make_intrusive<DdpliteBackend>(store, rank, size, timeout, std::move(trace));
  registerLive(backend);
  return backend;
}

namespace {

// Every backend of this process that may still be alive (stopAllBackendsForExit).
std::mutex liveMutex;
std::vector<c10::weak_intrusive_ptr<DdpliteBackend>> liveBackends;  // guarded by liveMutex

}  // namespace

void registerLive(const c10::intrusive_ptr<DdpliteBackend>& backend) {
  std::lock_guard<std::mutex> lock(liveMutex);
  liveBackends.erase(std::remove_if(liveBackends.begin(), liveBackends.end(),
                                    [](const auto& weak) { return weak.expired(); }),
                     liveBackends.end());
  liveBackends.emplace_back(backend);
}

void forgetLive(const DdpliteBackend* backend) {
  std::lock_guard<std::mutex> lock(liveMutex);
  // A weak entry keeps a c10 object from being destroyed (only released) while it exists.
  liveBackends.erase(std::remove_if(liveBackends.begin(), liveBackends.end(),
                                    [&](const auto& weak) { return weak._unsafe_get_target() == backend; }),
                     liveBackends.end());
}

void stopAllBackendsForExit() {
  GilReleasedScope released;  // the threads stopped below may need the GIL to finish
  std::vector<c10::intrusive_ptr<DdpliteBackend>> alive;
  {
    std::lock_guard<std::mutex> lock(liveMutex);
    for (const auto& weak : liveBackends) {
      if (auto strong = weak.lock()) alive.push_back(std::move(strong));
    }
    liveBackends.clear();
  }
  for (const auto& backend : alive) backend->stopForExit();
  alive.clear();  // a last reference destroys its backend here, without the GIL
}

}  // namespace ddplite
