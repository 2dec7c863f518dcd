#include "cuda/nccl_path.hpp"

#include "common/env.hpp"
#include "common/logging.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>

namespace ddplite {

std::unique_ptr<CudaPath> createCudaPath(const CudaPathDeps& deps) {
  return std::make_unique<nccl::NcclPath>(deps);
}

namespace nccl {

namespace {

// An error's message for another message: c10 errors without their C++ backtrace.
std::string messageOf(const std::exception& error) {
  const auto* c10Error = dynamic_cast<const c10::Error*>(&error);
  return c10Error != nullptr ? c10Error->what_without_backtrace() : error.what();
}

// A deferred op that will never be issued: its Work fails (future and WorkResult included).
void failNeverIssued(NcclWork& work, const OpContext& ctx, const char* why, const char* hint) {
  try {
    throwDistError(ctx, why, hint);
  } catch (...) {
    work.markFailed(std::current_exception());
  }
}

using c10d::OpType;

std::vector<at::Tensor> concat(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string whyStaged(const std::string& sharedGpu) {
#if DDPLITE_NCCL_HAS_MULTI_RANK_GPU
  return strCat(sharedGpu, ", and not every rank set NCCL_MULTI_RANK_GPU_ENABLE=1");
#else
  return strCat(sharedGpu, ", and NCCL ", versionText(compiledVersion()),
                " cannot put two ranks of one communicator on one GPU (NCCL >= 2.30 can)");
#endif
}

}  // namespace

NcclPath::NcclPath(const CudaPathDeps& deps) : deps_(deps), staged_(deps) {}

NcclPath::~NcclPath() {
  teardown(rules::TeardownCause::kDestructor);
}

OpContext NcclPath::peekContext(const char* op) const {
  return OpContext{deps_.rank, deps_.size, op, deps_.seq.load() + 1};
}

// ---- communicators -----------------------------------------------------------------------

NcclPath::DeviceState& NcclPath::stateFor(const char* op, at::Device device) {
  std::lock_guard<std::mutex> lock(initMutex_);
  auto found = devices_.find(device.index());
  if (found != devices_.end()) return found->second;

  const OpContext ctx = peekContext(op);
  throwIfBroken(ctx);
  const int ordinal = devicesSeen_++;
  DeviceState state;
  state.ordinal = ordinal;
  const env::CudaStaging staging = env::cudaStaging();
  if (staging == env::CudaStaging::kAlways) {
    state.staged = true;
    staged_.setReason("DDPLITE_CUDA_STAGING=always");
  } else {
    state.identities = exchangeIdentities(deps_.bootstrap, ordinal, deps_.rank, deps_.size, identify(device));
    state.minCompCap = rules::minComputeCapability(state.identities);
    const rules::SharedGpuDecision shared = rules::sharedGpu(state.identities);
    if (!shared.ncclServes) {
      if (staging == env::CudaStaging::kNever) {
        throwDistError(ctx, strCat("NCCL cannot serve this group: ", whyStaged(shared.sharedGpu)),
                       "give each rank its own GPU (torch.cuda.set_device(local_rank); check CUDA_VISIBLE_DEVICES), "
                       "or unset DDPLITE_CUDA_STAGING to run such groups through host memory");
      }
      state.staged = true;
      staged_.setReason(whyStaged(shared.sharedGpu));
    }
  }
  if (!state.staged) {
    try {
      createCommunicator(ctx, device, state, ordinal);
    } catch (const std::exception& error) {
      // The ranks' set-up keys no longer pair (this rank's ordinal moved on): nothing more can
      // be set up in this group.
      std::lock_guard<std::mutex> broken(brokenMutex_);
      if (brokenReason_.empty()) brokenReason_ = strCat("NCCL communicator set-up on ", device, " failed");
      throw;
    }
  }
  return devices_.emplace(device.index(), std::move(state)).first->second;
}

void NcclPath::connect(at::Device requested) {
  // "cuda" without an index means the current device, as for barrier().
  stateFor("eager_connect", requested.has_index() ? requested : at::Device(at::kCUDA, c10::cuda::current_device()));
}

bool NcclPath::knownStaged(at::Device device) {
  if (env::cudaStaging() == env::CudaStaging::kAlways) return true;
  std::lock_guard<std::mutex> lock(initMutex_);
  auto found = devices_.find(device.index());
  return found != devices_.end() && found->second.staged;
}

void NcclPath::createCommunicator(const OpContext& ctx, at::Device device, DeviceState& state, int ordinal) {
  const auto deadline = std::chrono::steady_clock::now() + deps_.resolveTimeout(std::chrono::milliseconds(-1));
  state.comm = NcclComm::create(deps_.bootstrap, rules::uniqueIdKey(ordinal), ctx, device, deadline, [this] {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    return closed_.load() || !brokenReason_.empty();  // shut down or aborted meanwhile
  });
  watchCommunicator(state, device);
}

void NcclPath::watchCommunicator(DeviceState& state, at::Device device) {
  state.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  {
    std::lock_guard<std::mutex> lock(commsMutex_);
    comms_.push_back(state.comm.get());
  }
  std::lock_guard<std::mutex> lock(watchdogMutex_);
  if (!watchdog_) {
    watchdog_ = std::make_shared<NcclWatchdog>(device, [this] { return checkComms(); },
                                               [this](const WatchdogFailure& failure) { failGroup(failure); });
  }
}

namespace {
struct NcclSplit final : CudaSplit {
  struct Device {
    int index;
    std::unique_ptr<NcclComm> comm;
    int minCompCap;
  };
  std::map<int, Device> devices;  // by the parent's ordinal of the device

  std::vector<int> ordinals() const override {
    std::vector<int> held;
    for (const auto& [ordinal, device] : devices) held.push_back(ordinal);
    return held;
  }
  void keepOnly(const std::vector<int>& keep) override {
    for (auto it = devices.begin(); it != devices.end();) {
      if (std::find(keep.begin(), keep.end(), it->first) != keep.end()) {
        ++it;
        continue;
      }
      it->second.comm->abort();  // not finalize: its peers may not have one to pair with
      it = devices.erase(it);
    }
  }
};
}  // namespace

std::unique_ptr<CudaSplit> NcclPath::split(const std::vector<int>& members) {
  const rules::SplitArgs args = rules::splitArgs(members, deps_.rank, NCCL_SPLIT_NOCOLOR);
  auto made = std::make_unique<NcclSplit>();
  std::lock_guard<std::mutex> order(deps_.orderMutex);
  std::lock_guard<std::mutex> init(initMutex_);
  const OpContext ctx{deps_.rank, deps_.size, "split_group", deps_.seq.load()};
  throwIfBroken(ctx);
  const auto deadline = std::chrono::steady_clock::now() + deps_.resolveTimeout(std::chrono::milliseconds(-1));
  // The ranks' communicators pair by ordinal (the order each rank first used its devices), not
  // by device index; staged devices are staged on every rank (the decision is shared).
  std::map<int, std::pair<int, DeviceState*>> byOrdinal;
  for (auto& [index, state] : devices_) {
    if (!state.staged && state.comm) byOrdinal[state.ordinal] = {index, &state};
  }
  for (auto& [ordinal, entry] : byOrdinal) {
    auto& [index, state] = entry;
    std::unique_ptr<NcclComm> child;
    try {
      child = NcclComm::split(*state->comm, args.color, args.key, static_cast<int>(members.size()), ctx, deadline);
    } catch (const std::exception& error) {
      failGroup(WatchdogFailure{strCat("split_group: ncclCommSplit failed on ", state->comm->device(), ": [",
                                       messageOf(error), "]; the NCCL communicators were aborted"),
                                "check that every rank of the parent group called split_group with disjoint lists"});
      throw;
    }
    if (!child) continue;
    std::vector<rules::GpuIdentity> mine;
    for (int member : members) {
      if (member < static_cast<int>(state->identities.size())) mine.push_back(state->identities[member]);
    }
    made->devices[ordinal] = NcclSplit::Device{index, std::move(child),
                                               mine.empty() ? state->minCompCap : rules::minComputeCapability(mine)};
  }
  if (made->devices.empty()) return nullptr;
  return made;
}

std::string NcclPath::shrinkReadiness(bool abortPending) {
  std::lock_guard<std::mutex> init(initMutex_);
  bool broken = false;
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    broken = !brokenReason_.empty();
  }
  // NCCL_SHRINK_DEFAULT must not meet outstanding work on the parent (it may deadlock). A work
  // whose kernel ended is retired by the watchdog's next poll: allow a few polls for that.
  const auto watchdog = currentWatchdog();
  const bool idle = !watchdog || watchdog->drain(std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  std::string ready;
  for (auto& [index, state] : devices_) {
    if (state.staged || !state.comm) continue;
    std::string detail;
    const ncclResult_t health = state.comm->asyncError(detail);
    const bool usable = !broken && !state.comm->aborted() && (health == ncclSuccess || health == ncclInProgress) &&
                        (abortPending || idle);
    const rules::ShrinkPlan plan = rules::shrinkPlan(DDPLITE_NCCL_HAS_SHRINK, loadedVersion(), usable, abortPending);
    DDPLITE_LOG(kInfo, "rank ", deps_.rank, "/", deps_.size, " shrink_group on ", state.comm->device(), ": ",
                plan.how == rules::ShrinkComm::kShrinkParent ? "can shrink this group's communicator" : "cannot",
                " (", plan.why, ")");
    if (plan.how == rules::ShrinkComm::kShrinkParent) ready += strCat(state.ordinal, ",");
  }
  return ready;
}

std::unique_ptr<CudaSplit> NcclPath::shrink(const std::vector<int>& excluded, bool abortPending,
                                            const std::vector<int>& agreedOrdinals,
                                            const ShrinkCoordination& coordination) {
  if (agreedOrdinals.empty()) return nullptr;
  if (abortPending) {
    // NCCL_SHRINK_ABORT makes the parent's kernels exit: their end events would read as success.
    // Before the locks: failing a work runs its future's callbacks, which may issue ops.
    if (auto watchdog = currentWatchdog()) {
      watchdog->failAll(WatchdogFailure{"shrink_group(SHRINK_ABORT) aborted this work before it finished",
                                        "its output is undefined; run it again on the shrunk group"});
    }
  }
  auto made = std::make_unique<NcclSplit>();
  std::lock_guard<std::mutex> order(deps_.orderMutex);
  std::lock_guard<std::mutex> init(initMutex_);
  const OpContext ctx{deps_.rank, deps_.size, "shrink_group", deps_.seq.load()};
  const auto deadline = std::chrono::steady_clock::now() + deps_.resolveTimeout(std::chrono::milliseconds(-1));
  const int survivors = deps_.size - static_cast<int>(excluded.size());
  // In the parent's order of first use (the same on every survivor), as split pairs them.
  std::map<int, std::pair<int, DeviceState*>> byOrdinal;
  for (auto& [index, state] : devices_) {
    const bool agreed = std::find(agreedOrdinals.begin(), agreedOrdinals.end(), state.ordinal) != agreedOrdinals.end();
    if (agreed && !state.staged && state.comm) byOrdinal[state.ordinal] = {index, &state};
  }
  for (auto& [ordinal, entry] : byOrdinal) {
    auto& [index, state] = entry;
    std::unique_ptr<NcclComm> child;
    const int deviceOrdinal = ordinal;
    try {
      child = NcclComm::shrink(*state->comm, excluded, abortPending ? rules::kNcclShrinkAbort : rules::kNcclShrinkDefault,
                               survivors, ctx, deadline, [&] { return coordination.othersGaveUp(deviceOrdinal); });
    } catch (const std::exception& error) {
      // The parent was aborted (NcclComm::shrink does it): every survivor drops this device's
      // shrink and the new group makes its communicator on its first op.
      coordination.giveUp(deviceOrdinal);
      DDPLITE_LOG(kWarn, ctx.describe(), ": ncclCommShrink on ", state->comm->device(), " did not finish (",
                  messageOf(error), "); the shrunk group makes its own communicator there on its first CUDA op");
      continue;
    }
    if (!child) continue;
    std::vector<rules::GpuIdentity> kept;
    for (int r = 0; r < static_cast<int>(state->identities.size()); ++r) {
      if (!std::binary_search(excluded.begin(), excluded.end(), r)) kept.push_back(state->identities[r]);
    }
    made->devices[ordinal] = NcclSplit::Device{index, std::move(child),
                                               kept.empty() ? state->minCompCap : rules::minComputeCapability(kept)};
  }
  if (made->devices.empty()) return nullptr;
  return made;
}

void NcclPath::adopt(std::unique_ptr<CudaSplit> split) {
  auto* made = dynamic_cast<NcclSplit*>(split.get());
  if (made == nullptr) return;
  std::lock_guard<std::mutex> lock(initMutex_);
  for (auto& [parentOrdinal, device] : made->devices) {  // in the parent's order: the same on every member
    DeviceState state;
    state.comm = std::move(device.comm);
    state.minCompCap = device.minCompCap;
    state.ordinal = devicesSeen_++;  // as if made here: the next device's keys stay paired across the ranks
    watchCommunicator(state, at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device.index)));
    devices_.emplace(device.index, std::move(state));
  }
}

std::shared_ptr<NcclWatchdog> NcclPath::currentWatchdog() {
  std::lock_guard<std::mutex> lock(watchdogMutex_);
  return watchdog_;
}

WatchdogFailure NcclPath::checkComms() {
  std::lock_guard<std::mutex> lock(commsMutex_);
  for (NcclComm* comm : comms_) {
    std::string detail;
    const ncclResult_t error = comm->asyncError(detail);
    if (error != ncclSuccess && error != ncclInProgress) {
      return WatchdogFailure{strCat("NCCL reported an asynchronous error on ", comm->device(), ": ", detail,
                                    "; the communicator was aborted"),
                             hintFor(error)};
    }
  }
  return WatchdogFailure{};
}

// Any thread (the watchdog, a launch that failed, abort/shutdown), holding no NcclComm Lease.
// Each abort waits for a launch using that communicator at most NcclComm::kAbortWait.
void NcclPath::failGroup(const WatchdogFailure& failure) {
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    if (brokenReason_.empty()) brokenReason_ = failure.what;
  }
  {
    std::lock_guard<std::mutex> lock(commsMutex_);
    for (NcclComm* comm : comms_) comm->abort();
  }
  if (auto watchdog = currentWatchdog()) watchdog->failAll(failure);
}

void NcclPath::throwIfBroken(const OpContext& ctx) {
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    reason = brokenReason_;
  }
  if (!reason.empty()) {
    throwDistError(ctx, "the NCCL communicators of this process group are unusable: [" + reason + "]",
                   "fix the first failure; then destroy this group and create a new one (or restart the job)");
  }
}

void NcclPath::abort() {
  // The communicators are aborted and pending work fails; the watchdog keeps running to release
  // the failed works' tensors once their kernels have exited. shutdown()/the destructor close.
  failGroup(WatchdogFailure{strCat("abort() was called on rank ", deps_.rank),
                            "abort() or shutdown() was called on this process group"});
}

void NcclPath::shutdown() {
  teardown(rules::TeardownCause::kShutdown);
}

void NcclPath::abandon() {
  teardown(rules::TeardownCause::kDestructor);
}

void NcclPath::teardown(rules::TeardownCause cause) {
  if (closed_.exchange(true)) return;
  bool broken = false;
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    broken = !brokenReason_.empty();
  }
  const rules::Teardown plan = rules::teardownFor(cause, broken);
  if (plan == rules::Teardown::kDrainThenDestroy) {
    // From now on new CUDA ops are refused (a launch during the drain would hand its Work to a
    // watchdog about to stop); the queued ones may finish.
    std::lock_guard<std::mutex> lock(brokenMutex_);
    brokenReason_ = strCat("the process group is shutting down on rank ", deps_.rank);
  }
  auto watchdog = currentWatchdog();
  if (plan == rules::Teardown::kAbort && !broken && watchdog) {
    // First, so that a launch waiting in NCCL (ncclInProgress) sees the abort and lets go of the
    // order mutex taken below.
    DDPLITE_LOG(kWarn, "rank ", deps_.rank, "/", deps_.size, ": a ddplite process group with NCCL communicators "
                "was destroyed without destroy_process_group(); its communicators are aborted, and CUDA work it "
                "still had queued fails. Call torch.distributed.destroy_process_group() before exiting.");
    failGroup(WatchdogFailure{strCat("the process group was destroyed on rank ", deps_.rank,
                                     " without destroy_process_group()"),
                              "call torch.distributed.destroy_process_group() to let queued work finish first"});
  }
  std::vector<Deferred> dropped;
  {
    std::lock_guard<std::mutex> order(deps_.orderMutex);
    dropped.swap(deferred_);  // a coalesced group never ended: its ops were never issued
    groupOwner_.reset();
  }
  for (auto& op : dropped) {
    failNeverIssued(*op.work, op.ctx, "the process group was closed with this op's coalesced group still open, so it "
                    "was never issued", "end the coalescing manager before destroying the group");
  }
  if (watchdog) {
    if (plan == rules::Teardown::kDrainThenDestroy) {
      const auto deadline = std::chrono::steady_clock::now() + deps_.resolveTimeout(std::chrono::milliseconds(-1));
      if (!watchdog->drain(deadline)) {
        failGroup(WatchdogFailure{"shutdown() gave up waiting for CUDA collectives still running after the group's "
                                  "timeout", "a peer did not reach them; call abort() to stop at once"});
      }
    }
    watchdog->stop();  // waits (bounded) for failed works' kernels before their tensors are freed
  }
  {
    std::lock_guard<std::mutex> lock(brokenMutex_);
    if (brokenReason_.empty()) brokenReason_ = strCat("the process group was shut down on rank ", deps_.rank);
  }
  {
    std::lock_guard<std::mutex> lock(commsMutex_);
    comms_.clear();
  }
  std::lock_guard<std::mutex> lock(initMutex_);
  devices_.clear();  // NcclComm's destructor: finalize and destroy what was not aborted
}

// ---- launching ---------------------------------------------------------------------------

void NcclPath::requireDirect(const OpContext& ctx, const std::vector<at::Tensor>& tensors, at::Device device) const {
  for (const auto& tensor : tensors) {
    if (tensor.device() != device) {
      throwValueError(ctx, strCat("tensors on ", device, " and ", tensor.device(), " in one call"),
                      "put every tensor of one collective on the same GPU");
    }
    if (!tensor.is_contiguous()) {
      throwValueError(ctx, "NCCL needs contiguous CUDA tensors; this one is strided",
                      "pass tensor.contiguous() (and copy the result back if you need the original layout)");
    }
  }
}

namespace {

bool isCapturing(const c10::cuda::CUDAStream& stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream.stream(), &status));
  return status != cudaStreamCaptureStatusNone;
}

void runAfter(std::vector<std::function<void()>>& steps) {
  for (auto& step : steps) step();
  steps.clear();
}

}  // namespace

void NcclPath::startCoalescing() {
  std::vector<Deferred> dropped;
  {
    std::lock_guard<std::mutex> order(deps_.orderMutex);
    // The previous window never ended (its _coalescing_manager body raised): its ops were never
    // issued, on any rank that raised alike. They fail rather than complete unnoticed.
    dropped.swap(deferred_);
    groupOwner_ = std::this_thread::get_id();
  }
  for (auto& op : dropped) {  // outside the lock: callbacks of their futures may issue ops
    failNeverIssued(*op.work, op.ctx, "this op's coalesced group was never ended, so it was never issued",
                    "the coalescing manager's body raised: fix that error");
  }
}

void NcclPath::endCoalescing() {
  // Any thread may end the group (as the collector allows): NCCL's group is opened and closed on
  // this thread inside issueGroup.
  std::vector<Deferred> issued;
  {
    std::lock_guard<std::mutex> order(deps_.orderMutex);
    if (!groupOwner_) return;
    issued = issueOpenGroup(/*close=*/true);
  }
  finishIssued(std::move(issued));
}

bool NcclPath::joinsOpenGroup() {
  return groupOwner_ && *groupOwner_ == std::this_thread::get_id();
}

std::vector<NcclPath::Deferred> NcclPath::issueOpenGroup(bool close) {
  std::vector<Deferred> ops;
  ops.swap(deferred_);
  if (close) groupOwner_.reset();
  return issueGroup(std::move(ops));
}

void NcclPath::finishIssued(std::vector<Deferred> ops) {
  std::exception_ptr failure;
  for (auto& op : ops) {
    c10::cuda::CUDAGuard deviceGuard(op.call.device);
    if (op.neverIssued) {  // NCCL never saw it: its Work fails alone (wait() raises), the group goes on
      op.work->markFailed(op.failure);
      continue;
    }
    if (op.failure) {
      failIssued(op.work, *op.state->stream, concat(op.call.keepAlive, op.call.outputs), op.capturing, op.failure);
      failure = op.failure;
      continue;
    }
    op.work->completeFuture(*op.state->stream);  // its callbacks run here, outside the order mutex
    track(op.work, op.capturing);
  }
  if (failure) std::rethrow_exception(failure);
}

void NcclPath::failIssued(const c10::intrusive_ptr<NcclWork>& work, const c10::cuda::CUDAStream& stream,
                          std::vector<at::Tensor> tensors, bool capturing, std::exception_ptr failure) {
  work->stash(std::move(tensors));
  try {
    work->recordEnd(stream);
  } catch (const std::exception&) {
    // CUDA itself is failing: nothing more of this op will run, the tensors may go
  }
  auto watchdog = currentWatchdog();
  if (capturing || !watchdog) {
    work->markFailed(failure);  // nobody watches it: fail it here
    return;
  }
  watchdog->watch(work);  // the group's failure sticks: it fails, and retires once the event is done
}

void NcclPath::track(const c10::intrusive_ptr<NcclWork>& work, bool capturing) {
  if (capturing) return;  // no event queries inside a graph capture; the Work keeps its tensors
  currentWatchdog()->watch(work);
}

c10::intrusive_ptr<c10d::Work> NcclPath::launch(DeviceState& state, Call call, std::function<void(const Launch&)> body) {
  std::unique_lock<std::mutex> lock(deps_.orderMutex);
  const bool inGroup = joinsOpenGroup();
  if (inGroup && call.barrier) {
    // Its wait() blocks the host: nothing may stay deferred. The flushed ops finish outside the
    // lock (their futures' callbacks may issue ops), then the barrier takes it again.
    std::vector<Deferred> flushed = issueOpenGroup(/*close=*/false);
    lock.unlock();
    finishIssued(std::move(flushed));
    lock.lock();
  }
  // send/recv keep the number the backend gave them; collectives take the next group number.
  const OpContext ctx = call.p2p ? *call.p2p : OpContext{deps_.rank, deps_.size, call.op, deps_.seq.load() + 1};
  throwIfBroken(ctx);
  if (call.p2p && call.peer == ctx.rank && !inGroup) {  // the backend lets it through only in a batch
    throwValueError(ctx, "a send to or receive from this rank outside a batch: NCCL pairs one only inside a group",
                    "put it and its partner in one batch_isend_irecv");
  }

  c10::cuda::CUDAGuard deviceGuard(call.device);
  const c10::cuda::CUDAStream ncclStream = *state.stream;
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(call.device.index());
  const bool capturing = isCapturing(current);
  const auto timeout = deps_.resolveTimeout(call.timeout);
  // keepAlive holds the inputs NCCL reads (empty when they are the outputs, as in all_reduce).
  auto work = c10::make_intrusive<NcclWork>(ctx, call.type, call.device, call.outputs, timeout, call.barrier,
                                            profilingArgs(call.type, call.op,
                                                          call.keepAlive.empty() ? call.outputs : call.keepAlive),
                                            deps_.timing.load(std::memory_order_relaxed));
  work->waitForCaller(current, ncclStream);
  if (inGroup && !call.barrier) {
    if (!call.p2p) deps_.seq = ctx.seq;
    deferred_.push_back(Deferred{&state, std::move(call), ctx, std::move(body), work, capturing});
    return work;
  }
  std::vector<at::Tensor> scratch;
  try {
    issue(state, ctx, ncclStream, body, scratch, std::chrono::steady_clock::now() + timeout);
  } catch (...) {
    // The group is failed (issue()), but NCCL may hold part of the op. No callback can be on
    // this Work yet (the caller has not seen it), so failing it under the lock is safe.
    failIssued(work, ncclStream, concat(concat(call.keepAlive, call.outputs), scratch), capturing,
               std::current_exception());
    throw;
  }
  work->stash(concat(concat(call.keepAlive, call.outputs), scratch));
  work->markLaunched(ncclStream);
  if (!call.p2p) deps_.seq = ctx.seq;
  track(work, capturing);
  return work;
}

void NcclPath::issue(DeviceState& state, const OpContext& ctx, const c10::cuda::CUDAStream& stream,
                     const std::function<void(const Launch&)>& body, std::vector<at::Tensor>& scratch,
                     std::chrono::steady_clock::time_point deadline) {
  std::exception_ptr failure;
  std::string what;
  {
    NcclComm::Lease lease = state.comm->lease();
    if (lease.comm() == nullptr) {
      throwIfBroken(ctx);  // failGroup records its reason before it aborts
      throwDistError(ctx, "the NCCL communicator was aborted", "destroy this group and create a new one");
    }
    try {
      c10::cuda::CUDAStreamGuard streamGuard(stream);
      std::vector<std::function<void()>> after;
      body(Launch{ctx, lease.comm(), stream, &scratch, deadline, &after, [&lease] { return lease.abortRequested(); }});
      runAfter(after);
    } catch (const std::exception& error) {  // DistBackendError from an NCCL call, CUDA errors
      what = messageOf(error);
      failure = std::current_exception();
    }
  }  // the Lease is released before failGroup aborts the communicator
  if (!failure) return;
  failGroup(WatchdogFailure{strCat(ctx.op, " #", ctx.seq, " failed while it was being issued on ", stream.device(),
                                   ": [", what, "]; the NCCL communicators were aborted"),
                            "fix the first failure; then destroy this group and create a new one"});
  std::rethrow_exception(failure);
}

// With deps_.orderMutex held: the sends to and receives from this rank that NCCL could not pair
// inside this group are marked never issued and given their error (finishIssued fails them).
void NcclPath::markUnpairedSelfOps(std::vector<Deferred>& ops) {
  std::vector<rules::SelfOp> selfOps;
  std::vector<size_t> where;  // index into ops of each self-op
  for (size_t i = 0; i < ops.size(); ++i) {
    const Call& call = ops[i].call;
    const bool p2p = call.type == OpType::SEND || call.type == OpType::RECV;
    if (!p2p || call.peer != ops[i].ctx.rank) continue;
    selfOps.push_back(rules::SelfOp{call.type == OpType::SEND, call.device.index(), call.outputs.front().nbytes()});
    where.push_back(i);
  }
  for (size_t k : rules::unpairedSelfOps(selfOps)) {
    Deferred& op = ops[where[k]];
    op.neverIssued = true;
    try {
      throwValueError(op.ctx,
                      strCat("this ", op.call.type == OpType::SEND ? "send to" : "receive from",
                             " this rank has no ", op.call.type == OpType::SEND ? "receive from" : "send to",
                             " this rank of the same size in its batch, so NCCL cannot pair it"),
                      "give every send to yourself a receive from yourself of the same size in the same "
                      "batch_isend_irecv, with no barrier between them");
    } catch (...) {
      op.failure = std::current_exception();
    }
  }
}

// With deps_.orderMutex held. Every communicator the ops use is leased (in device order) for the
// whole group: an abort meanwhile waits, or is performed when the leases are released. The end
// events are recorded here; futures and the watchdog are the caller's (finishIssued).
std::vector<NcclPath::Deferred> NcclPath::issueGroup(std::vector<Deferred> ops) {
  markUnpairedSelfOps(ops);
  const auto issued = [](const Deferred& op) { return !op.neverIssued; };
  const auto firstIssued = std::find_if(ops.begin(), ops.end(), issued);
  if (firstIssued == ops.end()) return ops;
  const size_t firstIndex = static_cast<size_t>(firstIssued - ops.begin());
  const Deferred& first = *firstIssued;
  const auto issuedCount = std::count_if(ops.begin(), ops.end(), issued);
  std::map<int, DeviceState*> byDevice;
  auto deadline = std::chrono::steady_clock::time_point::max();
  for (const auto& op : ops) {
    if (op.neverIssued) continue;
    byDevice[op.call.device.index()] = op.state;
    deadline = std::min(deadline, std::chrono::steady_clock::now() + op.work->timeout());
  }
  std::vector<std::vector<at::Tensor>> scratch(ops.size());
  std::exception_ptr failure;
  std::string what;
  {
    std::vector<std::unique_ptr<NcclComm::Lease>> leases;
    std::map<int, ncclComm_t> commOf;
    std::vector<ncclComm_t> comms;
    try {
      for (auto& [index, state] : byDevice) {
        leases.push_back(std::make_unique<NcclComm::Lease>(*state->comm));
        if (leases.back()->comm() == nullptr) {
          throwIfBroken(first.ctx);
          throwDistError(first.ctx, "the NCCL communicator was aborted", "destroy this group and create a new one");
        }
        commOf[index] = leases.back()->comm();
        comms.push_back(leases.back()->comm());
      }
      std::vector<std::vector<std::function<void()>>> after(ops.size());
      const auto abortRequested = [&leases] {
        return std::any_of(leases.begin(), leases.end(), [](const auto& lease) { return lease->abortRequested(); });
      };
      const Launch outer{first.ctx, commOf[first.call.device.index()], *first.state->stream, &scratch[firstIndex],
                         deadline, &after[firstIndex], abortRequested};
      groupStart(outer);
      try {
        for (size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].neverIssued) continue;
          c10::cuda::CUDAGuard deviceGuard(ops[i].call.device);
          c10::cuda::CUDAStreamGuard streamGuard(*ops[i].state->stream);
          ops[i].body(Launch{ops[i].ctx, commOf[ops[i].call.device.index()], *ops[i].state->stream, &scratch[i],
                             deadline, &after[i], abortRequested});
        }
      } catch (...) {
        groupAbandon();
        throw;
      }
      groupEnd(outer, comms);  // the kernels are enqueued now
      for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].neverIssued) continue;
        c10::cuda::CUDAGuard deviceGuard(ops[i].call.device);
        c10::cuda::CUDAStreamGuard streamGuard(*ops[i].state->stream);
        runAfter(after[i]);
      }
    } catch (const std::exception& error) {
      what = messageOf(error);
      failure = std::current_exception();
    }
  }  // leases released
  if (failure) {
    failGroup(WatchdogFailure{strCat("a coalesced group of ", issuedCount, " ops (", first.ctx.op, " #", first.ctx.seq,
                                     " first) failed while it was being issued: [", what,
                                     "]; the NCCL communicators were aborted"),
                              "fix the first failure; then destroy this group and create a new one"});
    for (size_t i = 0; i < ops.size(); ++i) {  // finishIssued keeps their tensors and fails them
      if (ops[i].neverIssued) continue;
      ops[i].failure = failure;
      for (auto& tensor : scratch[i]) ops[i].call.keepAlive.push_back(tensor);
    }
    return ops;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].neverIssued) continue;
    c10::cuda::CUDAGuard deviceGuard(ops[i].call.device);
    ops[i].work->stash(concat(concat(ops[i].call.keepAlive, ops[i].call.outputs), scratch[i]));
    ops[i].work->recordEnd(*ops[i].state->stream);  // right after the group's kernels
  }
  return ops;
}

// ---- collectives -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> NcclPath::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("broadcast", tensor.device());
  if (state.staged) return staged_.broadcast(tensors, opts);
  const OpContext ctx = peekContext("broadcast");
  requireDirect(ctx, {tensor}, tensor.device());
  const int root = static_cast<int>(opts.rootRank);
  return launch(state, Call{"broadcast", OpType::BROADCAST, tensor.device(), {tensor}, {}, opts.timeout},
                [=](const Launch& l) mutable { nccl::broadcast(l, tensor, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("allreduce", tensor.device());
  if (state.staged) return staged_.allreduce(tensors, opts);
  const OpContext ctx = peekContext("allreduce");
  requireDirect(ctx, {tensor}, tensor.device());
  checkReduceOp(ctx, tensor.scalar_type(), opts.reduceOp, state.minCompCap);
  return launch(state, Call{"allreduce", OpType::ALLREDUCE, tensor.device(), {tensor}, {}, opts.timeout},
                [=](const Launch& l) mutable { nccl::allreduce(l, tensor, opts.reduceOp); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceCoalescedOptions& opts) {
  const at::Device device = tensors.front().device();
  DeviceState& state = stateFor("allreduce_coalesced", device);
  if (state.staged) return staged_.allreduce_coalesced(tensors, opts);
  const OpContext ctx = peekContext("allreduce_coalesced");
  requireDirect(ctx, tensors, device);
  for (const auto& tensor : tensors) checkReduceOp(ctx, tensor.scalar_type(), opts.reduceOp, state.minCompCap);
  return launch(state, Call{"allreduce_coalesced", OpType::COALESCED, device, tensors, {}, opts.timeout},
                [=](const Launch& l) mutable {
                  grouped(l, [&] {
                    for (auto& tensor : tensors) nccl::allreduce(l, tensor, opts.reduceOp);
                  });
                });
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("reduce", tensor.device());
  if (state.staged) return staged_.reduce(tensors, opts);
  const OpContext ctx = peekContext("reduce");
  requireDirect(ctx, {tensor}, tensor.device());
  checkReduceOp(ctx, tensor.scalar_type(), opts.reduceOp, state.minCompCap);
  const int root = static_cast<int>(opts.rootRank);
  return launch(state, Call{"reduce", OpType::REDUCE, tensor.device(), {tensor}, {}, opts.timeout},
                [=](const Launch& l) mutable { nccl::reduce(l, tensor, opts.reduceOp, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  at::Tensor input = inputs.front();
  DeviceState& state = stateFor("allgather", input.device());
  if (state.staged) return staged_.allgather(outputs, inputs, opts);
  const OpContext ctx = peekContext("allgather");
  requireDirect(ctx, {input}, input.device());
  std::vector<at::Tensor> targets = outputs.front();
  return launch(state, Call{"allgather", OpType::ALLGATHER, input.device(), targets, {input}, opts.timeout},
                [input, targets, size = deps_.size](const Launch& l) mutable {
                  nccl::allgatherList(l, input, targets, size);
                });
}

c10::intrusive_ptr<c10d::Work> NcclPath::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                         const c10d::AllgatherOptions& opts) {
  DeviceState& state = stateFor("allgather_into_tensor", input.device());
  if (state.staged) return staged_._allgather_base(output, input, opts);
  const OpContext ctx = peekContext("allgather_into_tensor");
  requireDirect(ctx, {input, output}, input.device());
  return launch(state, Call{"allgather_into_tensor", OpType::_ALLGATHER_BASE, input.device(), {output}, {input},
                            opts.timeout},
                [=](const Launch& l) mutable { nccl::allgatherInto(l, input, output); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::AllgatherOptions& opts) {
  const at::Device device = inputs.front().device();
  DeviceState& state = stateFor("allgather_into_tensor_coalesced", device);
  if (state.staged) return staged_.allgather_into_tensor_coalesced(outputs, inputs, opts);
  const OpContext ctx = peekContext("allgather_into_tensor_coalesced");
  requireDirect(ctx, concat(inputs, outputs), device);
    return launch(state, Call{"allgather_into_tensor_coalesced", OpType::COALESCED, device, outputs, inputs, opts.timeout},
                [=](const Launch& l) mutable {
                  grouped(l, [&] {
                    for (size_t i = 0; i < inputs.size(); ++i) nccl::allgatherInto(l, inputs[i], outputs[i]);
                  });
                });
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ReduceScatterOptions& opts) {
  at::Tensor output = outputs.front();
  DeviceState& state = stateFor("reduce_scatter", output.device());
  if (state.staged) return staged_.reduce_scatter(outputs, inputs, opts);
  const OpContext ctx = peekContext("reduce_scatter");
  requireDirect(ctx, {output}, output.device());
  checkReduceOp(ctx, output.scalar_type(), opts.reduceOp, state.minCompCap);
  const std::vector<at::Tensor> list = inputs.front();
  return launch(state, Call{"reduce_scatter", OpType::REDUCE_SCATTER, output.device(), {output}, list, opts.timeout},
                [=](const Launch& l) mutable { nccl::reduceScatterList(l, list, output, opts.reduceOp); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::ReduceScatterOptions& opts) {
  DeviceState& state = stateFor("reduce_scatter_tensor", input.device());
  if (state.staged) return staged_._reduce_scatter_base(output, input, opts);
  const OpContext ctx = peekContext("reduce_scatter_tensor");
  requireDirect(ctx, {input, output}, input.device());
  checkReduceOp(ctx, output.scalar_type(), opts.reduceOp, state.minCompCap);
  return launch(state, Call{"reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE, input.device(), {output}, {input},
                            opts.timeout},
                [=](const Launch& l) mutable { nccl::reduceScatterInto(l, input, output, opts.reduceOp); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::ReduceScatterOptions& opts) {
  const at::Device device = inputs.front().device();
  DeviceState& state = stateFor("reduce_scatter_tensor_coalesced", device);
  if (state.staged) return staged_.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  const OpContext ctx = peekContext("reduce_scatter_tensor_coalesced");
  requireDirect(ctx, concat(inputs, outputs), device);
  for (const auto& output : outputs) checkReduceOp(ctx, output.scalar_type(), opts.reduceOp, state.minCompCap);
  return launch(state, Call{"reduce_scatter_tensor_coalesced", OpType::COALESCED, device, outputs, inputs, opts.timeout},
                [=](const Launch& l) mutable {
                  grouped(l, [&] {
                    for (size_t i = 0; i < inputs.size(); ++i) nccl::reduceScatterInto(l, inputs[i], outputs[i], opts.reduceOp);
                  });
                });
}

c10::intrusive_ptr<c10d::Work> NcclPath::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  at::Tensor input = inputs.front();
  DeviceState& state = stateFor("gather", input.device());
  if (state.staged) return staged_.gather(outputs, inputs, opts);
  const OpContext ctx = peekContext("gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> targets = deps_.rank == root ? outputs.front() : std::vector<at::Tensor>{};
  requireDirect(ctx, concat({input}, targets), input.device());
  return launch(state, Call{"gather", OpType::GATHER, input.device(), targets, {input}, opts.timeout},
                [=](const Launch& l) mutable { nccl::gather(l, input, targets, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::scatter(std::vector<at::Tensor>& outputs,
                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                 const c10d::ScatterOptions& opts) {
  at::Tensor output = outputs.front();
  DeviceState& state = stateFor("scatter", output.device());
  if (state.staged) return staged_.scatter(outputs, inputs, opts);
  const OpContext ctx = peekContext("scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> sources = deps_.rank == root ? inputs.front() : std::vector<at::Tensor>{};
  requireDirect(ctx, concat({output}, sources), output.device());
  return launch(state, Call{"scatter", OpType::SCATTER, output.device(), {output}, sources, opts.timeout},
                [=](const Launch& l) mutable { nccl::scatter(l, sources, output, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                       std::vector<int64_t>& outputSplitSizes,
                                                       std::vector<int64_t>& inputSplitSizes,
                                                       const c10d::AllToAllOptions& opts) {
  DeviceState& state = stateFor("all_to_all_single", input.device());
  if (state.staged) return staged_.alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
  const OpContext ctx = peekContext("all_to_all_single");
  requireDirect(ctx, {input, output}, input.device());
  return launch(state, Call{"all_to_all_single", OpType::ALLTOALL_BASE, input.device(), {output}, {input}, opts.timeout},
                [input, output, outputSplitSizes, inputSplitSizes, size = deps_.size](const Launch& l) mutable {
                  nccl::alltoallBase(l, input, output, outputSplitSizes, inputSplitSizes, size);
                });
}

c10::intrusive_ptr<c10d::Work> NcclPath::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                  const c10d::AllToAllOptions& opts) {
  const at::Device device = inputs.front().device();
  DeviceState& state = stateFor("all_to_all", device);
  if (state.staged) return staged_.alltoall(outputs, inputs, opts);
  const OpContext ctx = peekContext("all_to_all");
  requireDirect(ctx, concat(inputs, outputs), device);
  return launch(state, Call{"all_to_all", OpType::ALLTOALL, device, outputs, inputs, opts.timeout},
                [=](const Launch& l) mutable { nccl::alltoallList(l, inputs, outputs); });
}

namespace {
// A staged GPU's point-to-point goes over the CPU transport, which has no exchange with itself.
[[noreturn]] void refuseSelfWhenStaged(const OpContext& ctx, const char* direction) {
  throwValueError(ctx, strCat("cannot ", direction, " rank ", ctx.rank, " (this rank) on a GPU served by host staging"),
                  "a rank exchanges with itself only where NCCL serves the GPU (not shared with another rank, and "
                  "DDPLITE_CUDA_STAGING not 'always'); copy the tensor instead");
}
}  // namespace

// Point-to-point: the tag is not sent (NCCL matches sends and receives by order per peer).
// The first CUDA op of a group must be one every rank issues (it creates the communicator).
c10::intrusive_ptr<c10d::Work> NcclPath::send(std::vector<at::Tensor>& tensors, int dstRank, int tag,
                                              const OpContext& ctx) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("send", tensor.device());
  if (state.staged) {
    if (dstRank == ctx.rank) refuseSelfWhenStaged(ctx, "send to");
    return staged_.send(tensors, dstRank, tag, ctx);
  }
  requireDirect(ctx, {tensor}, tensor.device());
  Call call{"send", OpType::SEND, tensor.device(), {tensor}, {}, std::chrono::milliseconds(-1)};
  call.p2p = ctx;
  call.peer = dstRank;
  return launch(state, call, [=](const Launch& l) mutable { nccl::send(l, tensor, dstRank); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                              const OpContext& ctx) {
  at::Tensor tensor = tensors.front();
  // Refused before stateFor(): on a device's first use that is collective, and this rank would
  // leave the others waiting in it. A device already known to be staged serves any source.
  if (srcRank < 0 && !knownStaged(tensor.device())) {
    throwValueError(ctx, "NCCL cannot receive from any source (or this GPU's path is not settled yet: its first "
                         "CUDA op must be one every rank issues)",
                    "name the source rank: recv(tensor, src=...)");
  }
  DeviceState& state = stateFor("recv", tensor.device());
  if (state.staged) {
    if (srcRank == ctx.rank) refuseSelfWhenStaged(ctx, "receive from");
    return staged_.recv(tensors, srcRank, tag, ctx);
  }
  requireDirect(ctx, {tensor}, tensor.device());
  Call call{"recv", OpType::RECV, tensor.device(), {tensor}, {}, std::chrono::milliseconds(-1)};
  call.p2p = ctx;
  call.peer = srcRank;
  return launch(state, call, [=](const Launch& l) mutable { nccl::recv(l, tensor, srcRank); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::barrier(at::Device requested, const c10d::BarrierOptions& opts) {
  // torch may name "cuda" without an index: that means the current device.
  const at::Device device = requested.has_index() ? requested : at::Device(at::kCUDA, c10::cuda::current_device());
  DeviceState& state = stateFor("barrier", device);
  if (state.staged) return staged_.barrier(device, opts);
  // As torch does: a one-element allreduce, allocated on the caller's stream (the NCCL stream
  // waits for it); wait() blocks the host until it has completed.
  at::Tensor token = at::zeros({1}, at::TensorOptions().device(device).dtype(at::kFloat));
  Call call{"barrier", OpType::BARRIER, device, {token}, {}, opts.timeout};
  call.barrier = true;
  const c10d::ReduceOp sum;
  return launch(state, call, [=](const Launch& l) mutable { nccl::allreduce(l, token, sum); });
}

}  // namespace nccl
}  // namespace ddplite
