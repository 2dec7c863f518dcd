#include "backend/work.hpp"

namespace ddplite {

DdpliteWork::DdpliteWork(const OpContext& context, c10d::OpType type, std::vector<at::Tensor> outputs)
    : c10d::Work(context.rank, type, nullptr),
      context_(context),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

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
