#include "cuda/nccl_path.hpp"

#include "common/env.hpp"
#include "common/logging.hpp"

#include <c10/cuda/CUDAGuard.h>

namespace ddplite {

std::unique_ptr<CudaPath> createCudaPath(const CudaPathDeps& deps) {
  return std::make_unique<nccl::NcclPath>(deps);
}

namespace nccl {

namespace {

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
  shutdown();
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
  const env::CudaStaging staging = env::cudaStaging();
  if (staging == env::CudaStaging::kAlways) {
    state.staged = true;
    staged_.setReason("DDPLITE_CUDA_STAGING=always");
  } else {
    const auto identities = exchangeIdentities(deps_.bootstrap, strCat("nccl/device", ordinal), deps_.rank, deps_.size,
                                               identify(device));
    const std::string sharedGpu = describeSharedGpu(identities);
    bool everyRankMultiRank = true;
    for (const auto& identity : identities) everyRankMultiRank = everyRankMultiRank && identity.multiRankGpu;
    if (!sharedGpu.empty() && !everyRankMultiRank) {
      if (staging == env::CudaStaging::kNever) {
        throwDistError(ctx, strCat("NCCL cannot serve this group: ", whyStaged(sharedGpu)),
                       "give each rank its own GPU (torch.cuda.set_device(local_rank); check CUDA_VISIBLE_DEVICES), "
                       "or unset DDPLITE_CUDA_STAGING to run such groups through host memory");
      }
      state.staged = true;
      staged_.setReason(whyStaged(sharedGpu));
    }
  }
  if (!state.staged) createCommunicator(ctx, device, state, ordinal);
  return devices_.emplace(device.index(), std::move(state)).first->second;
}

bool NcclPath::knownStaged(at::Device device) {
  if (env::cudaStaging() == env::CudaStaging::kAlways) return true;
  std::lock_guard<std::mutex> lock(initMutex_);
  auto found = devices_.find(device.index());
  return found != devices_.end() && found->second.staged;
}

void NcclPath::createCommunicator(const OpContext& ctx, at::Device device, DeviceState& state, int ordinal) {
  state.comm = NcclComm::create(deps_.bootstrap, strCat("nccl/uid", ordinal), ctx, device);
  state.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  {
    std::lock_guard<std::mutex> lock(commsMutex_);
    comms_.push_back(state.comm.get());
  }
  if (!watchdog_) {
    watchdog_ = std::make_unique<NcclWatchdog>(device, [this] { return checkComms(); },
                                               [this](const WatchdogFailure& failure) { failGroup(failure); });
  }
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
  if (watchdog_) watchdog_->failAll(failure);
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
  if (watchdog_) watchdog_->stop();  // no poll may race with the abort below
  failGroup(WatchdogFailure{strCat("abort() was called on rank ", deps_.rank),
                            "abort() or shutdown() was called on this process group"});
}

void NcclPath::shutdown() {
  if (closed_.exchange(true)) return;
  if (watchdog_) {
    const auto deadline = std::chrono::steady_clock::now() + deps_.resolveTimeout(std::chrono::milliseconds(-1));
    if (!watchdog_->drain(deadline)) {
      watchdog_->stop();
      failGroup(WatchdogFailure{"shutdown() gave up waiting for CUDA collectives still running after the group's timeout",
                                "a peer did not reach them; call abort() to stop at once"});
    }
    watchdog_->stop();
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
  devices_.clear();  // ncclCommDestroy for communicators not aborted
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

c10::intrusive_ptr<c10d::Work> NcclPath::launch(DeviceState& state, Call call,
                                                const std::function<void(const Launch&)>& body) {
  std::lock_guard<std::mutex> lock(deps_.orderMutex);
  // send/recv keep the number the backend gave them; collectives take the next group number.
  const OpContext ctx = call.p2p ? *call.p2p : OpContext{deps_.rank, deps_.size, call.op, deps_.seq.load() + 1};
  throwIfBroken(ctx);

  c10::cuda::CUDAGuard deviceGuard(call.device);
  const c10::cuda::CUDAStream ncclStream = *state.stream;
  auto work = c10::make_intrusive<NcclWork>(ctx, call.type, call.device, call.outputs,
                                            deps_.resolveTimeout(call.timeout), call.barrier);
  work->waitForCaller(c10::cuda::getCurrentCUDAStream(call.device.index()), ncclStream);
  std::vector<at::Tensor> scratch;
  issue(state, ctx, ncclStream, body, scratch);
  work->stash(concat(concat(call.keepAlive, call.outputs), scratch));
  work->markLaunched(ncclStream);
  if (!call.p2p) deps_.seq = ctx.seq;
  watchdog_->watch(work);
  return work;
}

void NcclPath::issue(DeviceState& state, const OpContext& ctx, const c10::cuda::CUDAStream& stream,
                     const std::function<void(const Launch&)>& body, std::vector<at::Tensor>& scratch) {
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
      body(Launch{ctx, lease.comm(), stream, &scratch});
    } catch (const c10::Error& error) {  // DistBackendError from an NCCL call, ValueError, CUDA errors
      what = error.what_without_backtrace();
      failure = std::current_exception();
    } catch (const std::exception& error) {
      what = error.what();
      failure = std::current_exception();
    }
  }  // the Lease is released before failGroup aborts the communicator
  if (!failure) return;
  failGroup(WatchdogFailure{strCat(ctx.op, " #", ctx.seq, " failed while it was being issued on ", stream.device(),
                                   ": [", what, "]; the NCCL communicators were aborted"),
                            "fix the first failure; then destroy this group and create a new one"});
  std::rethrow_exception(failure);
}

// ---- collectives -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> NcclPath::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("broadcast", tensor.device());
  if (state.staged) return staged_.broadcast(tensors, opts);
  const OpContext ctx = peekContext("broadcast");
  requireDirect(ctx, {tensor}, tensor.device());
  toNcclType(ctx, tensor.scalar_type());
  const int root = static_cast<int>(opts.rootRank);
  return launch(state, Call{"broadcast", OpType::BROADCAST, tensor.device(), {tensor}, {}, opts.timeout},
                [&](const Launch& l) { nccl::broadcast(l, tensor, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("allreduce", tensor.device());
  if (state.staged) return staged_.allreduce(tensors, opts);
  const OpContext ctx = peekContext("allreduce");
  requireDirect(ctx, {tensor}, tensor.device());
  checkReduceOp(ctx, tensor.scalar_type(), opts.reduceOp);
  return launch(state, Call{"allreduce", OpType::ALLREDUCE, tensor.device(), {tensor}, {}, opts.timeout},
                [&](const Launch& l) { nccl::allreduce(l, tensor, opts.reduceOp); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceCoalescedOptions& opts) {
  const at::Device device = tensors.front().device();
  DeviceState& state = stateFor("allreduce_coalesced", device);
  if (state.staged) return staged_.allreduce_coalesced(tensors, opts);
  const OpContext ctx = peekContext("allreduce_coalesced");
  requireDirect(ctx, tensors, device);
  for (const auto& tensor : tensors) checkReduceOp(ctx, tensor.scalar_type(), opts.reduceOp);
  return launch(state, Call{"allreduce_coalesced", OpType::COALESCED, device, tensors, {}, opts.timeout},
                [&](const Launch& l) {
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
  checkReduceOp(ctx, tensor.scalar_type(), opts.reduceOp);
  const int root = static_cast<int>(opts.rootRank);
  return launch(state, Call{"reduce", OpType::REDUCE, tensor.device(), {tensor}, {}, opts.timeout},
                [&](const Launch& l) { nccl::reduce(l, tensor, opts.reduceOp, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  at::Tensor input = inputs.front();
  DeviceState& state = stateFor("allgather", input.device());
  if (state.staged) return staged_.allgather(outputs, inputs, opts);
  const OpContext ctx = peekContext("allgather");
  requireDirect(ctx, {input}, input.device());
  toNcclType(ctx, input.scalar_type());
  std::vector<at::Tensor> targets = outputs.front();
  return launch(state, Call{"allgather", OpType::ALLGATHER, input.device(), targets, {input}, opts.timeout},
                [&](const Launch& l) { nccl::allgatherList(l, input, targets, deps_.size); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                         const c10d::AllgatherOptions& opts) {
  DeviceState& state = stateFor("allgather_into_tensor", input.device());
  if (state.staged) return staged_._allgather_base(output, input, opts);
  const OpContext ctx = peekContext("allgather_into_tensor");
  requireDirect(ctx, {input, output}, input.device());
  toNcclType(ctx, input.scalar_type());
  return launch(state, Call{"allgather_into_tensor", OpType::_ALLGATHER_BASE, input.device(), {output}, {input},
                            opts.timeout},
                [&](const Launch& l) { nccl::allgatherInto(l, input, output); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::AllgatherOptions& opts) {
  const at::Device device = inputs.front().device();
  DeviceState& state = stateFor("allgather_into_tensor_coalesced", device);
  if (state.staged) return staged_.allgather_into_tensor_coalesced(outputs, inputs, opts);
  const OpContext ctx = peekContext("allgather_into_tensor_coalesced");
  requireDirect(ctx, concat(inputs, outputs), device);
  for (const auto& input : inputs) toNcclType(ctx, input.scalar_type());
  return launch(state, Call{"allgather_into_tensor_coalesced", OpType::COALESCED, device, outputs, inputs, opts.timeout},
                [&](const Launch& l) {
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
  checkReduceOp(ctx, output.scalar_type(), opts.reduceOp);
  const std::vector<at::Tensor> list = inputs.front();
  return launch(state, Call{"reduce_scatter", OpType::REDUCE_SCATTER, output.device(), {output}, list, opts.timeout},
                [&](const Launch& l) { nccl::reduceScatterList(l, list, output, opts.reduceOp); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::ReduceScatterOptions& opts) {
  DeviceState& state = stateFor("reduce_scatter_tensor", input.device());
  if (state.staged) return staged_._reduce_scatter_base(output, input, opts);
  const OpContext ctx = peekContext("reduce_scatter_tensor");
  requireDirect(ctx, {input, output}, input.device());
  checkReduceOp(ctx, output.scalar_type(), opts.reduceOp);
  return launch(state, Call{"reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE, input.device(), {output}, {input},
                            opts.timeout},
                [&](const Launch& l) { nccl::reduceScatterInto(l, input, output, opts.reduceOp); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                         std::vector<at::Tensor>& inputs,
                                                                         const c10d::ReduceScatterOptions& opts) {
  const at::Device device = inputs.front().device();
  DeviceState& state = stateFor("reduce_scatter_tensor_coalesced", device);
  if (state.staged) return staged_.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  const OpContext ctx = peekContext("reduce_scatter_tensor_coalesced");
  requireDirect(ctx, concat(inputs, outputs), device);
  for (const auto& output : outputs) checkReduceOp(ctx, output.scalar_type(), opts.reduceOp);
  return launch(state, Call{"reduce_scatter_tensor_coalesced", OpType::COALESCED, device, outputs, inputs, opts.timeout},
                [&](const Launch& l) {
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
  toNcclType(ctx, input.scalar_type());
  return launch(state, Call{"gather", OpType::GATHER, input.device(), targets, {input}, opts.timeout},
                [&](const Launch& l) { nccl::gather(l, input, targets, root); });
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
  toNcclType(ctx, output.scalar_type());
  return launch(state, Call{"scatter", OpType::SCATTER, output.device(), {output}, sources, opts.timeout},
                [&](const Launch& l) { nccl::scatter(l, sources, output, root); });
}

c10::intrusive_ptr<c10d::Work> NcclPath::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                       std::vector<int64_t>& outputSplitSizes,
                                                       std::vector<int64_t>& inputSplitSizes,
                                                       const c10d::AllToAllOptions& opts) {
  DeviceState& state = stateFor("all_to_all_single", input.device());
  if (state.staged) return staged_.alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
  const OpContext ctx = peekContext("all_to_all_single");
  requireDirect(ctx, {input, output}, input.device());
  toNcclType(ctx, input.scalar_type());
  return launch(state, Call{"all_to_all_single", OpType::ALLTOALL_BASE, input.device(), {output}, {input}, opts.timeout},
                [&](const Launch& l) {
                  nccl::alltoallBase(l, input, output, outputSplitSizes, inputSplitSizes, deps_.size);
                });
}

c10::intrusive_ptr<c10d::Work> NcclPath::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                  const c10d::AllToAllOptions& opts) {
  const at::Device device = inputs.front().device();
  DeviceState& state = stateFor("all_to_all", device);
  if (state.staged) return staged_.alltoall(outputs, inputs, opts);
  const OpContext ctx = peekContext("all_to_all");
  requireDirect(ctx, concat(inputs, outputs), device);
  toNcclType(ctx, inputs.front().scalar_type());
  return launch(state, Call{"all_to_all", OpType::ALLTOALL, device, outputs, inputs, opts.timeout},
                [&](const Launch& l) { nccl::alltoallList(l, inputs, outputs); });
}

// Point-to-point: the tag is not sent (NCCL matches sends and receives by order per peer).
// The first CUDA op of a group must be one every rank issues (it creates the communicator).
c10::intrusive_ptr<c10d::Work> NcclPath::send(std::vector<at::Tensor>& tensors, int dstRank, int tag,
                                              const OpContext& ctx) {
  at::Tensor tensor = tensors.front();
  DeviceState& state = stateFor("send", tensor.device());
  if (state.staged) return staged_.send(tensors, dstRank, tag, ctx);
  requireDirect(ctx, {tensor}, tensor.device());
  toNcclType(ctx, tensor.scalar_type());
  Call call{"send", OpType::SEND, tensor.device(), {tensor}, {}, std::chrono::milliseconds(-1)};
  call.p2p = ctx;
  return launch(state, call, [&](const Launch& l) { nccl::send(l, tensor, dstRank); });
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
  if (state.staged) return staged_.recv(tensors, srcRank, tag, ctx);
  requireDirect(ctx, {tensor}, tensor.device());
  toNcclType(ctx, tensor.scalar_type());
  Call call{"recv", OpType::RECV, tensor.device(), {tensor}, {}, std::chrono::milliseconds(-1)};
  call.p2p = ctx;
  return launch(state, call, [&](const Launch& l) { nccl::recv(l, tensor, srcRank); });
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
  return launch(state, call, [&](const Launch& l) { nccl::allreduce(l, token, sum); });
}

}  // namespace nccl
}  // namespace ddplite
