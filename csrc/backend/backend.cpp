#include "backend/backend.hpp"

#include "backend/validation.hpp"
#include "common/logging.hpp"
#include "cpu/transport/tcp.hpp"

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
  }
  return "";
}

}  // namespace

DdpliteBackend::DdpliteBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                               std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), rendezvous_(store), timeoutMs_(timeout.count()) {
  if (timeout.count() <= 0) {
    timeoutMs_ = std::chrono::duration_cast<std::chrono::milliseconds>(kBackendDefaultTimeout).count();
  }
  transport_ = TcpTransport::connectFullMesh(rendezvous_, rank, size,
                                             Clock::now() + std::chrono::milliseconds(timeoutMs_.load()));
  worker_ = std::make_unique<Worker>();
  DDPLITE_LOG(kInfo, "rank ", rank, "/", size, " ready (timeout ", timeoutMs_.load(), " ms)");
  init();
}

DdpliteBackend::~DdpliteBackend() {
  shutdown();
}

c10::intrusive_ptr<c10d::Backend::Options> DdpliteBackend::getBackendOptions() {
  return c10::make_intrusive<Options>(kName, std::chrono::milliseconds(timeoutMs_.load()));
}

void DdpliteBackend::setTimeout(std::chrono::milliseconds timeout) {
  if (timeout.count() > 0) timeoutMs_ = timeout.count();
}

OpContext DdpliteBackend::nextContext(const char* op) const {
  return OpContext{rank_, size_, op, seq_.load() + 1};
}

void DdpliteBackend::dispatchDevice(const OpContext& ctx, const at::Tensor& tensor) const {
  if (tensor.device().is_cuda()) {
    C10_THROW_ERROR(NotImplementedError,
                    strCat(ctx.describe(), ": CUDA tensors are not supported by ddplite yet (the NCCL path is "
                           "being built)\nHint: move the tensor to the CPU, or use "
                           "backend=\"cpu:ddplite,cuda:nccl\""));
  }
}

std::chrono::milliseconds DdpliteBackend::resolveTimeout(std::chrono::milliseconds requested) const {
  // Unset (kUnsetTimeout = -1) or zero means the group's timeout.
  return requested.count() > 0 ? requested : std::chrono::milliseconds(timeoutMs_.load());
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::enqueue(OpContext ctx, OpType type, std::vector<at::Tensor> outputs,
                                                       std::chrono::milliseconds timeout, CpuBody body) {
  std::lock_guard<std::mutex> lock(enqueueMutex_);
  ctx.seq = seq_.load() + 1;
  auto work = c10::make_intrusive<DdpliteWork>(ctx, type, std::move(outputs));
  worker_->enqueue([this, work, timeout, body = std::move(body)] { runOnWorker(*work, timeout, body); });
  seq_ = ctx.seq;  // only after a successful enqueue, so a refused op does not consume a number
  return work;
}

void DdpliteBackend::runOnWorker(DdpliteWork& work, std::chrono::milliseconds timeout, const CpuBody& body) {
  try {
    throwIfBroken(work.context());
    body(cpu::CpuContext{*transport_, scratch_, Clock::now() + timeout});
    work.markFinished(nullptr);
  } catch (const TransportError& error) {
    work.markFinished(failureFromTransport(work.context(), error));
  } catch (...) {
    work.markFinished(std::current_exception());
  }
}

std::exception_ptr DdpliteBackend::failureFromTransport(const OpContext& ctx, const TransportError& error) {
  std::string what = error.what();
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
    markBroken(summary);
    transport_->abort();
  }
  DDPLITE_LOG(kWarn, ctx.describe(), " failed: ", what);
  try {
    throwDistError(ctx, what, hintFor(error.kind()));
  } catch (...) {
    return std::current_exception();
  }
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

void DdpliteBackend::abort() {
  markBroken(strCat("abort() was called on rank ", rank_));
  transport_->abort();
}

void DdpliteBackend::shutdown() {
  if (closed_.exchange(true)) return;
  worker_->drainAndStop();
  markBroken(strCat("the process group was shut down on rank ", rank_));
  transport_->abort();
}

// ---- collectives -------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> DdpliteBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                         const c10d::BroadcastOptions& opts) {
  const OpContext ctx = nextContext("broadcast");
  at::Tensor tensor = validation::singleTensor(ctx, tensors, "broadcast");
  validation::checkRoot(ctx, opts.rootRank);
  dispatchDevice(ctx, tensor);
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(ctx, OpType::BROADCAST, {tensor}, resolveTimeout(opts.timeout),
                 [tensor, root](const cpu::CpuContext& cpu) mutable { cpu::broadcast(cpu, tensor, root); });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  const OpContext ctx = nextContext("allreduce");
  at::Tensor tensor = validation::singleTensor(ctx, tensors, "allreduce");
  validation::checkReduceOp(ctx, tensor, opts.reduceOp);
  dispatchDevice(ctx, tensor);
  const auto op = opts.reduceOp.op_;
  return enqueue(ctx, OpType::ALLREDUCE, {tensor}, resolveTimeout(opts.timeout),
                 [tensor, op](const cpu::CpuContext& cpu) mutable { cpu::allreduce(cpu, tensor, op); });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::reduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::ReduceOptions& opts) {
  const OpContext ctx = nextContext("reduce");
  at::Tensor tensor = validation::singleTensor(ctx, tensors, "reduce");
  validation::checkRoot(ctx, opts.rootRank);
  validation::checkReduceOp(ctx, tensor, opts.reduceOp);
  dispatchDevice(ctx, tensor);
  const int root = static_cast<int>(opts.rootRank);
  const auto op = opts.reduceOp.op_;
  return enqueue(ctx, OpType::REDUCE, {tensor}, resolveTimeout(opts.timeout),
                 [tensor, root, op](const cpu::CpuContext& cpu) mutable { cpu::reduce(cpu, tensor, root, op); });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllgatherOptions& opts) {
  const OpContext ctx = nextContext("allgather");
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
  dispatchDevice(ctx, input);
  return enqueue(ctx, OpType::ALLGATHER, targets, resolveTimeout(opts.timeout),
                 [input, targets](const cpu::CpuContext& cpu) mutable { cpu::allgatherList(cpu, input, targets); });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                               const c10d::AllgatherOptions& opts) {
  const OpContext ctx = nextContext("allgather_into_tensor");
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
  dispatchDevice(ctx, input);
  at::Tensor in = input;
  at::Tensor out = output;
  return enqueue(ctx, OpType::_ALLGATHER_BASE, {out}, resolveTimeout(opts.timeout),
                 [in, out](const cpu::CpuContext& cpu) mutable { cpu::allgatherInto(cpu, in, out); });
}

c10::intrusive_ptr<c10d::Work> DdpliteBackend::barrier(const c10d::BarrierOptions& opts) {
  // A barrier carries no data, so it always runs on the CPU transport, whatever opts.device says.
  const OpContext ctx = nextContext("barrier");
  return enqueue(ctx, OpType::BARRIER, {}, resolveTimeout(opts.timeout),
                 [](const cpu::CpuContext& cpu) { cpu::barrier(cpu); });
}

c10::intrusive_ptr<c10d::Backend> createBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                std::chrono::milliseconds timeout) {
  return c10::make_intrusive<DdpliteBackend>(store, rank, size, timeout);
}

}  // namespace ddplite
