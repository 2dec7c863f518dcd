#include "backend/coalescing.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>

namespace ddplite {

bool CoalescingCollector::start() {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool wasIdle = !active_;
  active_ = true;
  owner_ = std::this_thread::get_id();
  parts_.clear();
  return wasIdle;
}

bool CoalescingCollector::openOnThisThread() {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_ && owner_ == std::this_thread::get_id();
}

void CoalescingCollector::add(c10::intrusive_ptr<c10d::Work> work) {
  if (!work) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (active_ && owner_ == std::this_thread::get_id()) parts_.push_back(std::move(work));
}

std::optional<std::vector<c10::intrusive_ptr<c10d::Work>>> CoalescingCollector::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!active_) return std::nullopt;
  active_ = false;
  return std::exchange(parts_, {});
}

namespace {

// What the parts' completions share. `remaining` counts down (acq_rel: the last part to finish
// sees every earlier part's error); `firstError`/`firstOutcome` are guarded by `mutex`.
struct Pending {
  c10::intrusive_ptr<DdpliteWork> whole;
  std::atomic<size_t> remaining;
  std::mutex mutex;
  std::exception_ptr firstError;
  c10d::WorkResult firstOutcome = c10d::WorkResult::COMM_ERROR;

  Pending(c10::intrusive_ptr<DdpliteWork> w, size_t n) : whole(std::move(w)), remaining(n) {}
};

// How a failed part classifies its failure (TIMEOUT or COMM_ERROR), where it can say.
c10d::WorkResult outcomeOf(c10d::Work& part) {
  try {
    auto result = part.getFutureResult();
    if (result->completed() && result->value().isInt()) return static_cast<c10d::WorkResult>(result->value().toInt());
  } catch (const std::exception&) {  // a Work without getFutureResult
  }
  return c10d::WorkResult::COMM_ERROR;
}

std::vector<at::Tensor> outputsOf(const std::vector<c10::intrusive_ptr<c10d::Work>>& parts) {
  std::vector<at::Tensor> outputs;
  for (const auto& part : parts) {
    try {
      for (auto& tensor : part->result()) outputs.push_back(tensor);
    } catch (const std::exception&) {  // a Work without result(): its tensors are not listed
    }
  }
  return outputs;
}

// The aggregate DdpliteWork of `parts` (defined below coalescedWork).
c10::intrusive_ptr<DdpliteWork> aggregateOf(const OpContext& ctx, const std::vector<c10::intrusive_ptr<c10d::Work>>& parts,
                                            bool timed);

// The coalesced Work of parts that are not all DdpliteWorks (see coalescedWork): waits and
// queries go to the parts; the future and WorkResult are `aggregate`'s.
class PartsWork final : public c10d::Work {
 public:
  PartsWork(c10::intrusive_ptr<DdpliteWork> aggregate, std::vector<c10::intrusive_ptr<c10d::Work>> parts)
      : c10d::Work(-1, c10d::OpType::COALESCED), aggregate_(std::move(aggregate)), parts_(std::move(parts)) {}

  bool isCompleted() override {
    return std::all_of(parts_.begin(), parts_.end(), [](const auto& part) { return part->isCompleted(); });
  }
  bool isSuccess() const override {
    return std::all_of(parts_.begin(), parts_.end(), [](const auto& part) { return part->isSuccess(); });
  }
  std::exception_ptr exception() const override {
    for (const auto& part : parts_) {
      if (auto error = part->exception()) return error;
    }
    return nullptr;
  }
  std::vector<at::Tensor> result() override { return aggregate_->result(); }
  void synchronize() override {
    for (const auto& part : parts_) part->synchronize();
  }
  // Each part's wait() with what is left of `timeout` (kNoTimeout: each waits as it would).
  bool wait(std::chrono::milliseconds timeout) override {
    const auto start = std::chrono::steady_clock::now();
    for (const auto& part : parts_) {
      std::chrono::milliseconds left = timeout;
      if (timeout != kNoTimeout) {
        const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
        left = std::max(std::chrono::milliseconds(1), timeout - spent);
      }
      part->wait(left);
    }
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return aggregate_->getFuture(); }
  // The parts' own WorkResults (an NCCL part's is set by the watchdog, after its future, which
  // completes at launch, so the aggregate's would say SUCCESS too early): once every part has
  // one, the first in issue order that is not SUCCESS. The aggregate's where a part has none.
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override {
    std::lock_guard<std::mutex> lock(resultMutex_);
    if (!result_) result_ = combinedResult();
    return result_;
  }
  uint64_t getSequencenumber() const override { return aggregate_->getSequencenumber(); }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> combinedResult() {
    c10::List<c10::intrusive_ptr<c10::ivalue::Future>> results(c10::FutureType::create(c10::IntType::get()));
    try {
      for (const auto& part : parts_) results.push_back(part->getFutureResult());
    } catch (const std::exception&) {  // a part without getFutureResult
      return aggregate_->getFutureResult();
    }
    return c10::collectAll(results)->then(
        [results](c10::ivalue::Future&) -> c10::IValue {
          for (const auto& result : results) {
            const c10::intrusive_ptr<c10::ivalue::Future> done = result;
            const int64_t value = done->value().toInt();
            if (value != static_cast<int64_t>(c10d::WorkResult::SUCCESS)) return value;
          }
          return static_cast<int64_t>(c10d::WorkResult::SUCCESS);
        },
        c10::IntType::get());
  }

  const c10::intrusive_ptr<DdpliteWork> aggregate_;
  const std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
  std::mutex resultMutex_;
  c10::intrusive_ptr<c10::ivalue::Future> result_;  // built on first getFutureResult()
};

}  // namespace

c10::intrusive_ptr<c10d::Work> coalescedWork(const OpContext& ctx, std::vector<c10::intrusive_ptr<c10d::Work>> parts,
                                             bool timed) {
  const bool allOurs = std::all_of(parts.begin(), parts.end(), [](const auto& part) {
    return dynamic_cast<DdpliteWork*>(part.get()) != nullptr;
  });
  c10::intrusive_ptr<DdpliteWork> whole = aggregateOf(ctx, parts, timed);
  if (allOurs) return whole;
  return c10::make_intrusive<PartsWork>(whole, std::move(parts));
}

namespace {

c10::intrusive_ptr<DdpliteWork> aggregateOf(const OpContext& ctx, const std::vector<c10::intrusive_ptr<c10d::Work>>& parts,
                                            bool timed) {
  // No profiler span of its own: each part has one.
  auto whole = c10::make_intrusive<DdpliteWork>(ctx, c10d::OpType::COALESCED, outputsOf(parts), ProfilingArgs{}, timed);
  whole->markStarted();
  if (parts.empty()) {
    whole->markFinished(nullptr);
    return whole;
  }
  auto pending = std::make_shared<Pending>(whole, parts.size());
  for (const auto& part : parts) {
    // The callback runs on the part's completing thread, or here when it is already complete.
    part->getFuture()->addCallback([pending, part](c10::ivalue::Future& future) {
      if (future.hasError()) {
        std::lock_guard<std::mutex> lock(pending->mutex);
        if (!pending->firstError) {
          pending->firstError = future.exception_ptr();
          pending->firstOutcome = outcomeOf(*part);
        }
      }
      if (pending->remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
      std::exception_ptr error;
      c10d::WorkResult outcome;
      {
        std::lock_guard<std::mutex> lock(pending->mutex);
        error = pending->firstError;
        outcome = pending->firstOutcome;
      }
      pending->whole->markFinished(error, outcome);
    });
  }
  return whole;
}

}  // namespace

}  // namespace ddplite
