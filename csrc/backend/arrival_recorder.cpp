#include "backend/arrival_recorder.hpp"

#include "common/errors.hpp"
#include "common/thread_name.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace ddplite {

namespace {

constexpr auto kRecordAfter = std::chrono::seconds(1);
constexpr auto kPollInterval = std::chrono::milliseconds(100);

std::string keyOf(int rank) {
  return strCat("arrived/", rank);
}

void record(StoreRendezvous& store, int rank, uint64_t seq) {
  try {
    store.set(keyOf(rank), std::to_string(seq));
  } catch (const std::exception&) {
    // the store's host may be gone; the timeout error then lists no arrivals
  }
}

}  // namespace

struct ArrivalRecorder::Shared {
  Shared(const StoreRendezvous& rendezvous, int rank) : store(rendezvous), rank(rank) {}

  StoreRendezvous store;  // a copy: holds the store alive for as long as the thread runs
  const int rank;
  // The op running now (0: none) and when it is due to be recorded (steady_clock ticks): written
  // by begin/end without a lock (recordAt relaxed, then running with release; the thread loads
  // running with acquire, then recordAt), so the hot path pays plain stores.
  std::atomic<uint64_t> running{0};
  std::atomic<int64_t> recordAt{0};
  std::mutex mutex;  // guards stop
  std::condition_variable wake;
  bool stop = false;

  // The recording thread's loop; `recorded` is its own.
  void run() {
    uint64_t recorded = 0;
    std::unique_lock<std::mutex> lock(mutex);
    while (!wake.wait_for(lock, kPollInterval, [&] { return stop; })) {
      const uint64_t seq = running.load(std::memory_order_acquire);
      const auto due = recordAt.load(std::memory_order_relaxed);  // seq's, or a later op's
      if (seq == 0 || seq == recorded || std::chrono::steady_clock::now().time_since_epoch().count() < due) continue;
      recorded = seq;
      lock.unlock();
      record(store, rank, seq);
      lock.lock();
    }
  }
};

ArrivalRecorder::ArrivalRecorder(const StoreRendezvous& rendezvous, int rank, int size)
    : shared_(std::make_shared<Shared>(rendezvous, rank)), size_(size) {
  std::thread recorder([shared = shared_] { shared->run(); });
  nameThread(recorder, "ddplite-arrival");
  recorder.detach();
}

ArrivalRecorder::~ArrivalRecorder() {
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stop = true;
  }
  shared_->wake.notify_all();  // the thread exits at once, or after a store call in progress
}

void ArrivalRecorder::begin(uint64_t seq, std::chrono::steady_clock::time_point deadline,
                            std::chrono::milliseconds timeout) {
  const auto after = std::min<std::chrono::steady_clock::duration>(kRecordAfter, timeout / 4);
  shared_->recordAt.store((deadline - timeout + after).time_since_epoch().count(), std::memory_order_relaxed);
  shared_->running.store(seq, std::memory_order_release);  // publishes recordAt with it
}

void ArrivalRecorder::end() {
  shared_->running.store(0, std::memory_order_relaxed);
}

std::optional<std::vector<int>> ArrivalRecorder::missingRanks(uint64_t seq, std::chrono::milliseconds within) {
  using Answer = std::optional<std::vector<int>>;
  auto answer = std::make_shared<std::promise<Answer>>();
  std::future<Answer> future = answer->get_future();
  const int size = size_;
  std::thread asker([store = shared_->store, rank = shared_->rank, size, seq, answer]() mutable {
    record(store, rank, seq);
    std::vector<int> missing;
    for (int member = 0; member < size; ++member) {
      const std::optional<bool> present = store.has(keyOf(member));
      if (!present) return answer->set_value(std::nullopt);
      uint64_t last = 0;
      if (*present) {
        try {
          last = std::stoull(store.get(keyOf(member), strCat("rank ", member, "'s last arrival")));
        } catch (const std::exception&) {
          return answer->set_value(std::nullopt);
        }
      }
      if (last < seq) missing.push_back(member);
    }
    answer->set_value(std::move(missing));
  });
  nameThread(asker, "ddplite-missing");
  asker.detach();
  if (future.wait_for(within) != std::future_status::ready) return std::nullopt;
  return future.get();
}

}  // namespace ddplite
