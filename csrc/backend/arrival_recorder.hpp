// Which ranks arrived at a collective that stalls, so that a timeout error lists every rank that
// did not arrive, not only the peer this rank happened to wait for (a ring waits on one
// neighbour; the missing rank may be three hops away).
//
// An op still running after min(1 s, its timeout / 4) is recorded by this class's own thread in the
// group's store as "arrived/<seq>/<rank>" (the thread looks every 100 ms, so it is recorded
// within that much more). Healthy ops end sooner and cost three plain atomic stores (begin,
// end): no lock, no wake-up, no store traffic. On a timeout, missingRanks(seq) reads every
// rank's record: the ranks without one did not arrive (or were not seen waiting in it for a
// second: a broadcast root over TCP may finish its part at once).
//
// Threading: begin/end from whichever thread runs the group's ops (one op at a time);
// missingRanks from the thread that handles the failure; the recording thread runs until the
// destructor stops and joins it.
#pragma once

#include "rendezvous/store.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace ddplite {

class ArrivalRecorder {
 public:
  ArrivalRecorder(StoreRendezvous& rendezvous, int rank, int size);
  ~ArrivalRecorder();
  ArrivalRecorder(const ArrivalRecorder&) = delete;
  ArrivalRecorder& operator=(const ArrivalRecorder&) = delete;

  // The op `seq` starts on this rank; it times out at `deadline`, `timeout` after it started.
  void begin(uint64_t seq, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  void end();
  // Records `seq` for this rank at once, then returns the ranks with no record for it, or
  // nothing when the store cannot be read (its host may be the rank that failed).
  std::optional<std::vector<int>> missingRanks(uint64_t seq);

  static std::string key(uint64_t seq, int rank);

 private:
  void run();
  void record(uint64_t seq);

  StoreRendezvous& rendezvous_;
  const int rank_;
  const int size_;
  // The op running now (0: none) and when it is due to be recorded (steady_clock ticks): written
  // by begin/end without a lock (recordAt_ relaxed, then running_ with release; the thread loads
  // running_ with acquire, then recordAt_), so the hot path pays two plain stores.
  std::atomic<uint64_t> running_{0};
  std::atomic<int64_t> recordAt_{0};
  uint64_t recorded_ = 0;  // the last op recorded; the thread's own
  std::mutex mutex_;       // guards stop_
  std::condition_variable wake_;
  bool stop_ = false;  // set by the destructor, which wakes the thread through wake_
  std::thread thread_;  // last: started once the rest is set
};

}  // namespace ddplite
