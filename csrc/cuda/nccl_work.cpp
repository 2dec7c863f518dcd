#include "cuda/nccl_work.hpp"

#include <c10/cuda/CUDAGuard.h>

#include <thread>

namespace ddplite::nccl {

NcclWork::NcclWork(const OpContext& context, c10d::OpType type, at::Device device, std::vector<at::Tensor> outputs,
                   std::chrono::milliseconds timeout, bool isBarrier, ProfilingArgs profiling, bool timed)
    : c10d::Work(context.rank, type, profiling.title, profiling.inputs),
      context_(context),
      device_(device),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      isBarrier_(isBarrier),
      launchedAt_(std::chrono::steady_clock::now()),
      timingStart_(timed ? std::make_unique<compat::CudaEvent>(cudaEventDefault) : nullptr),
      endEvent_(timed ? cudaEventDefault : cudaEventDisableTiming),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{device})),
      resultFuture_(c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get())) {}

void NcclWork::stash(std::vector<at::Tensor> tensors) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& tensor : tensors) stash_.push_back(std::move(tensor));
}

void NcclWork::waitForCaller(const c10::cuda::CUDAStream& current, const c10::cuda::CUDAStream& ncclStream) {
  startEvent_.record(current);
  startEvent_.block(ncclStream);
  if (timingStart_) timingStart_->record(ncclStream);
}

void NcclWork::recordEnd(const c10::cuda::CUDAStream& ncclStream) {
  endEvent_.record(ncclStream);
  launchedAt_ = std::chrono::steady_clock::now();  // a deferred op's timeout runs from its launch
  launched_.store(true, std::memory_order_release);
}

void NcclWork::markLaunched(const c10::cuda::CUDAStream& ncclStream) {
  recordEnd(ncclStream);
  completeFuture(ncclStream);
}

void NcclWork::completeFuture(const c10::cuda::CUDAStream& ncclStream) {
  // The future records its own event on the current stream of the device: make that the NCCL
  // stream, so waiting on the future means waiting on the collective.
  c10::cuda::CUDAMultiStreamGuard guard(ncclStream);
  future_->markCompleted(c10::IValue(outputs_));
}

bool NcclWork::endEventDone() const {
  return endEvent_.query();
}

bool NcclWork::timedOut(std::chrono::steady_clock::time_point now) const {
  return now - launchedAt_ > timeout_;
}

void NcclWork::markDone() {
  std::vector<at::Tensor> released;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    released.swap(stash_);
  }
  finish(nullptr);
  setResult(c10d::WorkResult::SUCCESS);
  // `released` frees the buffers here, after the GPU is done with them.
}

void NcclWork::markFailed(std::exception_ptr error, c10d::WorkResult result) {
  failed_ = true;
  finish(error);  // the stash stays: kernels of an aborted communicator may still be running
  // An op whose NCCL calls were issued completed its future then (NCCL semantics: the future is
  // about stream order); one that never got there (a deferred op whose group failed or was
  // dropped, an op that failed while being issued) would otherwise never complete. A no-op on
  // a completed future; markLaunched always precedes a failure of the same Work.
  future_->setErrorIfNeeded(error);
  setResult(result);
}

void NcclWork::setResult(c10d::WorkResult result) {
  if (resultSet_.exchange(true)) return;  // the first of markDone/markFailed (any threads) decides
  resultFuture_->markCompleted(static_cast<int64_t>(result));
}

void NcclWork::releaseStash() {
  std::vector<at::Tensor> released;
  std::lock_guard<std::mutex> lock(mutex_);
  released.swap(stash_);
}

float NcclWork::getDuration() const {
  if (!timingStart_) {
    throwRuntimeError(context_, "Work._get_duration() needs collectives timing, which was off when this op was issued",
                      "call pg._enable_collectives_timing() on the group (every rank) before issuing the op");
  }
  if (failed_.load() || !launched() || !endEventDone()) {
    throwRuntimeError(context_, "Work._get_duration() called before the op completed on the GPU (or after it failed)",
                      "call work.wait() and torch.cuda.synchronize() first");
  }
  return timingStart_->elapsed_time(endEvent_);
}

bool NcclWork::isCompleted() {
  return failed_.load() || (launched() && endEventDone());
}

bool NcclWork::isSuccess() const {
  return !failed_.load() && launched() && endEventDone();
}

std::exception_ptr NcclWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

void NcclWork::throwIfFailed() const {
  if (!failed_.load()) return;
  if (auto error = exception()) std::rethrow_exception(error);
}

void NcclWork::synchronize() {
  throwIfFailed();
  c10::cuda::CUDAGuard guard(device_);
  endEvent_.block(c10::cuda::getCurrentCUDAStream(device_.index()));
}

void NcclWork::waitOnHost(std::chrono::steady_clock::time_point deadline, bool bounded) {
  // Polls instead of cudaEventSynchronize so that a failure reported by the watchdog (which
  // aborts the communicator) ends the wait with that error instead of a hang.
  while (!isCompleted()) {
    if (bounded && std::chrono::steady_clock::now() > deadline) {
      throwDistError(context_, "Work.wait(timeout) expired; the collective is still running on the GPU",
                     "a peer has not reached this collective yet; call wait() again, or raise the timeout");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool NcclWork::wait(std::chrono::milliseconds timeout) {
  const bool bounded = timeout != kNoTimeout;
  if (!launched() && !failed_.load() && (bounded || isBarrier_)) {
    throwDistError(context_, "Work.wait(timeout) on an op of a coalesced group that has not ended: its NCCL calls are "
                             "issued when the group ends",
                   "wait on the Work the coalescing manager returns (or on this one after the group has ended)");
  }
  if (bounded || isBarrier_) {
    waitOnHost(std::chrono::steady_clock::now() + timeout, bounded);
  }
  synchronize();
  throwIfFailed();
  return true;
}

}  // namespace ddplite::nccl
