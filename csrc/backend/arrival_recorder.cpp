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
// How long the destructor waits for a store call in progress before it detaches the thread.
constexpr auto kJoinWithin = std::chrono::seconds(2);

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
  std::mutex mutex;  // guards stop and threadsInStore
  std::condition_variable wake;     // stop was set
  std::condition_variable leaving;  // threadsInStore went down
  bool stop = false;
  // Threads that may still call the store: the recorder until its loop ends, each asker until its
  // answer is set. Raised by the creating thread before the thread starts, lowered by the thread.
  int threadsInStore = 1;

  void leave() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      --threadsInStore;
    }
    leaving.notify_all();
  }

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
    lock.unlock();
    leave();
  }
};

ArrivalRecorder::ArrivalRecorder(const StoreRendezvous& rendezvous, int rank, int size)
    : shared_(std::make_shared<Shared>(rendezvous, rank)), size_(size) {
  recorder_ = std::thread([shared = shared_] { shared->run(); });
  nameThread(recorder_, "ddplite-arrival");
}

// Runs on the thread that destroys the backend. Joined threads have dropped their store copies
// before this returns (see the header: a store released at exit on another thread can tear it).
ArrivalRecorder::~ArrivalRecorder() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stop = true;
  shared_->wake.notify_all();
  const bool allLeft = shared_->leaving.wait_for(lock, kJoinWithin, [&] { return shared_->threadsInStore == 0; });
  lock.unlock();
  std::lock_guard<std::mutex> askersLock(askersMutex_);
  for (std::thread* thread : allThreads()) {
    if (allLeft) {
      thread->join();
    } else {
      thread->detach();  // still in a store call whose host does not answer: it ends at the store's timeout
    }
  }
}

std::vector<std::thread*> ArrivalRecorder::allThreads() {
  std::vector<std::thread*> threads{&recorder_};
  for (std::thread& asker : askers_) threads.push_back(&asker);
  return threads;
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
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    ++shared_->threadsInStore;
  }
  std::thread asker([shared = shared_, store = shared_->store, size, seq, answer]() mutable {
    struct Leave {
      Shared& shared;
      ~Leave() { shared.leave(); }
    } leaveOnReturn{*shared};
    record(store, shared->rank, seq);
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
  {
    std::lock_guard<std::mutex> lock(askersMutex_);
    askers_.push_back(std::move(asker));
  }
  if (future.wait_for(within) != std::future_status::ready) return std::nullopt;
  return future.get();
}

}  // namespace ddplite
