#include "backend/work.hpp"

namespace ddplite {

DdpliteWork::DdpliteWork(const OpContext& context, c10d::OpType type, std::vector<at::Tensor> outputs,
                         ProfilingArgs profiling, bool timed)
    : c10d::Work(context.rank, type, profiling.title, profiling.inputs),
      context_(context),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      timed_(timed) {
  stages_.issued = nowNs();
}

float DdpliteWork::getDuration() const {
  if (!timed_) {
    throwRuntimeError(context_, "Work._get_duration() needs collectives timing, which was off when this op was issued",
                      "call pg._enable_collectives_timing() on the group (every rank) before issuing the op, as for "
                      "torch's NCCL backend");
  }
  bool done = false;
  {
    // Work::finish sets completed_ under this mutex after the clock's end(): seeing it completed
    // here orders both clock stores before the reads below.
    std::lock_guard<std::mutex> lock(mutex_);
    done = completed_;
  }
  const std::optional<float> duration = done ? clock_.durationMs() : std::nullopt;
  if (!duration) {
    throwRuntimeError(context_, "Work._get_duration() called before the op completed", "call work.wait() first");
  }
  return *duration;
}

bool DdpliteWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [this] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
    lock.unlock();
    throwDistError(context_,
                   strCat("Work.wait(timeout) expired after ", timeout.count(),
                          " ms; the collective is still in progress and may still complete"),
                   "a peer has not reached this collective yet; call wait() again, or raise the timeout");
  }
  if (exception_) {
    std::rethrow_exception(exception_);
  }
  return true;
}

std::vector<at::Tensor> DdpliteWork::result() {
  return outputs_;
}

c10::intrusive_ptr<c10::ivalue::Future> DdpliteWork::getFuture() {
  return future_;
}

uint64_t DdpliteWork::getSequencenumber() const {
  return context_.seq;
}

c10::intrusive_ptr<c10::ivalue::Future> DdpliteWork::getFutureResult() {
  std::lock_guard<std::mutex> lock(resultMutex_);
  if (!resultFuture_) {
    resultFuture_ = c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get());
    if (result_) resultFuture_->markCompleted(c10::IValue(static_cast<int64_t>(*result_)));
  }
  return resultFuture_;
}

void DdpliteWork::markFinished(std::exception_ptr error, c10d::WorkResult outcome) {
  c10::intrusive_ptr<c10::ivalue::Future> resultFuture;
  {
    std::lock_guard<std::mutex> lock(resultMutex_);
    result_ = error ? outcome : c10d::WorkResult::SUCCESS;
    resultFuture = resultFuture_;
  }
  if (timed_) clock_.end();
  stages_.finished = nowNs();
  // The futures first: a caller woken by wait() may read getFuture()->value() at once.
  if (resultFuture) resultFuture->markCompleted(c10::IValue(static_cast<int64_t>(*result_)));
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

}  // namespace ddplite
