#include "backend/arrival_recorder.hpp"

#include "common/errors.hpp"
#include "common/thread_name.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
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
  std::mutex mutex;  // guards stop, threadsInStore and finished
  std::condition_variable wake;     // stop was set
  std::condition_variable leaving;  // threadsInStore went down
  bool stop = false;
  // Threads that may still call the store: the recorder until its loop ends, each asker until its
  // answer is set. Raised by the creating thread before the thread starts, lowered by the thread.
  int threadsInStore = 1;
  // The threads that are past their last store call: the destructor joins these and detaches
  // only the others. An id stays unique while its std::thread is neither joined nor detached.
  std::set<std::thread::id> finished;

  bool stopping() {
    std::lock_guard<std::mutex> lock(mutex);
    return stop;
  }

  // Called by a thread (recorder or asker) after its last store call.
  void leave() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      --threadsInStore;
      finished.insert(std::this_thread::get_id());
    }
    leaving.notify_all();
  }

  // An asker that could not be started (no thread: nothing to join).
  void neverStarted() {
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

// Runs on the thread that destroys the backend (without the GIL: DdpliteBackend::shutdown). Joined
// threads have dropped their store copies before this returns (see the header: a store released
// at exit on another thread can tear it).
ArrivalRecorder::~ArrivalRecorder() {
  std::lock_guard<std::mutex> askersLock(askersMutex_);  // before shared_->mutex, as in missingRanks
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stop = true;
  shared_->wake.notify_all();
  // Askers look at `stop` between store calls, so this waits for one call in progress at most.
  shared_->leaving.wait_for(lock, kJoinWithin, [&] { return shared_->threadsInStore == 0; });
  endThread(recorder_);
  for (std::thread& asker : askers_) endThread(asker);
}

// shared_->mutex held; a finished thread takes it no more, so joining under it cannot deadlock.
void ArrivalRecorder::endThread(std::thread& thread) {
  if (shared_->finished.count(thread.get_id()) != 0) {
    thread.join();  // past its last store call: it ends at once
  } else {
    thread.detach();  // still in a store call whose host does not answer: it ends at the store's timeout
  }
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
  std::unique_lock<std::mutex> askersLock(askersMutex_);
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    ++shared_->threadsInStore;
  }
  try {
    askers_.emplace_back([shared = shared_, store = shared_->store, size, seq, answer]() mutable {
      struct Leave {
        Shared& shared;
        ~Leave() { shared.leave(); }
      } leaveOnReturn{*shared};
      record(store, shared->rank, seq);
      std::vector<int> missing;
      for (int member = 0; member < size; ++member) {
        if (shared->stopping()) return answer->set_value(std::nullopt);  // the group is going away
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
  } catch (const std::exception&) {  // no thread (EAGAIN) or no memory: the error goes without the list
    shared_->neverStarted();
    return std::nullopt;
  }
  nameThread(askers_.back(), "ddplite-missing");
  askersLock.unlock();
  if (future.wait_for(within) != std::future_status::ready) return std::nullopt;
  return future.get();
}

}  // namespace ddplite
