#include "backend/arrival_recorder.hpp"

#include "common/errors.hpp"

#include <algorithm>

namespace ddplite {

namespace {
constexpr auto kRecordAfter = std::chrono::seconds(1);
constexpr auto kPollInterval = std::chrono::milliseconds(100);
}  // namespace

ArrivalRecorder::ArrivalRecorder(StoreRendezvous& rendezvous, int rank, int size)
    : rendezvous_(rendezvous), rank_(rank), size_(size), thread_([this] { run(); }) {}

ArrivalRecorder::~ArrivalRecorder() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string ArrivalRecorder::key(uint64_t seq, int rank) {
  return strCat("arrived/", seq, "/", rank);
}

void ArrivalRecorder::begin(uint64_t seq, std::chrono::steady_clock::time_point deadline,
                            std::chrono::milliseconds timeout) {
  const auto after = std::min<std::chrono::steady_clock::duration>(kRecordAfter, timeout / 4);
  recordAt_.store((deadline - timeout + after).time_since_epoch().count(), std::memory_order_relaxed);
  running_.store(seq, std::memory_order_release);  // publishes recordAt_ with it
}

void ArrivalRecorder::end() {
  running_.store(0, std::memory_order_relaxed);
}

// Looks every kPollInterval rather than being woken by begin(): a wake-up per op would cost the
// hot path a system call and a context switch.
void ArrivalRecorder::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, kPollInterval, [&] { return stop_; })) {
    const uint64_t seq = running_.load(std::memory_order_acquire);
    const auto recordAt = recordAt_.load(std::memory_order_relaxed);  // seq's, or a later op's
    if (seq == 0 || seq == recorded_ || std::chrono::steady_clock::now().time_since_epoch().count() < recordAt) {
      continue;
    }
    recorded_ = seq;
    lock.unlock();
    record(seq);
    lock.lock();
  }
}

void ArrivalRecorder::record(uint64_t seq) {
  try {
    rendezvous_.set(key(seq, rank_), "1");
  } catch (const std::exception&) {
    // the store's host may be gone; the timeout error then lists no arrivals
  }
}

std::optional<std::vector<int>> ArrivalRecorder::missingRanks(uint64_t seq) {
  record(seq);
  std::vector<int> missing;
  for (int member = 0; member < size_; ++member) {
    const std::optional<bool> arrived = rendezvous_.has(key(seq, member));
    if (!arrived) return std::nullopt;
    if (!*arrived) missing.push_back(member);
  }
  return missing;
}

}  // namespace ddplite
