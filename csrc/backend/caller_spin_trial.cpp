#include "backend/caller_spin_trial.hpp"

#include "common/logging.hpp"

#include <algorithm>
#include <bitset>

namespace ddplite {

namespace {

int64_t median(std::vector<int64_t> values) {
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

bool spinsInTrial(uint64_t seq) {
  return std::bitset<64>(seq / CallerSpinTrial::kBlockOps).count() % 2 == 0;
}

}  // namespace

bool CallerSpinTrial::trialOpen() const {
  return !decided_ && (spun_.size() < kTrialOps || slept_.size() < kTrialOps);
}

bool CallerSpinTrial::spins(uint64_t seq) {
  if (!measured_) return true;
  const uint64_t period = seq / kPeriodOps;
  if (period != period_) {  // a new trial
    period_ = period;
    decided_ = false;
    spun_.clear();
    slept_.clear();
  }
  if (trialOpen()) return spinsInTrial(seq);
  return spinKept_;  // decided: record() decides once both sides are full
}

void CallerSpinTrial::record(uint64_t seq, bool spun, std::chrono::nanoseconds took) {
  const bool follows = previous_.has_value() && *previous_ == spun;
  previous_ = spun;
  if (!measured_ || seq / kPeriodOps != period_ || !trialOpen() || !follows) return;
  std::vector<int64_t>& side = spun ? spun_ : slept_;
  if (side.size() < kTrialOps) side.push_back(took.count());
  if (!trialOpen()) decide();
}

void CallerSpinTrial::decide() {
  decided_ = true;
  const int64_t spinning = median(spun_);
  const int64_t sleeping = median(slept_);
  spinKept_ = static_cast<double>(spinning) < kSpinMargin * static_cast<double>(sleeping);
  DDPLITE_LOG(kTrace, "caller spin trial of period ", period_, ": median ", spinning / 1000.0, " us spinning, ",
              sleeping / 1000.0, " us sleeping: ", spinKept_ ? "spins" : "sleeps");
}

}  // namespace ddplite
