#include "backend/coalescing.hpp"

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>

namespace ddplite {

bool CoalescingCollector::start() {
  const bool wasIdle = !active_;
  active_ = true;
  parts_.clear();
  return wasIdle;
}

void CoalescingCollector::add(c10::intrusive_ptr<c10d::Work> work) {
  if (active_ && work) parts_.push_back(std::move(work));
}

std::optional<std::vector<c10::intrusive_ptr<c10d::Work>>> CoalescingCollector::end() {
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

}  // namespace

c10::intrusive_ptr<DdpliteWork> coalescedWork(const OpContext& ctx, std::vector<c10::intrusive_ptr<c10d::Work>> parts) {
  auto whole = c10::make_intrusive<DdpliteWork>(ctx, c10d::OpType::COALESCED, outputsOf(parts));
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

}  // namespace ddplite
