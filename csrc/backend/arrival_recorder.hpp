// Which ranks arrived at a collective that stalls, so that a timeout error lists every rank that
// did not arrive, not only the peer this rank happened to wait for (a ring waits on one
// neighbour; the missing rank may be three hops away).
//
// An op still running after min(1 s, its timeout / 4) is recorded by this class's own thread in
// the group's store: key "arrived/<rank>" = the op's sequence number (one key per rank, so the
// store does not grow with the job's length). The thread looks every 100 ms, so an op is recorded
// within that much more. Healthy ops end sooner and cost three plain atomic stores (begin, end):
// no lock, no wake-up, no store traffic. On a timeout, missingRanks(seq) reads every rank's
// record: a rank whose last record is older than seq was not seen waiting in it (absent, or its
// part ended in under a second: a broadcast root, for one).
//
// Store calls can block for the store's own timeout when its host is frozen, so none is made on
// a thread that matters: the recording thread owns a copy of the store handle, and missingRanks
// waits at most `within` for its answer, from a thread of its own.
//
// Teardown (DdpliteBackend::shutdown, after the worker stopped): the destructor stops both kinds
// of thread and joins them, waiting at most kJoinWithin for a store call in progress (askers look
// at `stop` between their calls); only a thread still inside a store call after that is detached. A
// thread must not be left running at exit while it holds the store: when it drops the last
// reference, torch's ~FileStore runs on it, and a process that exits in the middle of that
// leaves half an entry in the store file, which makes every other rank's next FileStore read
// spin at the end of the file for ever (torch's File::read loops on a read() of 0).
//
// Threading: begin/end from whichever thread runs the group's ops (one op at a time);
// missingRanks from the thread that handles the failure.
#pragma once

#include "rendezvous/store.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace ddplite {

class ArrivalRecorder {
 public:
  ArrivalRecorder(const StoreRendezvous& rendezvous, int rank, int size);
  ~ArrivalRecorder();
  ArrivalRecorder(const ArrivalRecorder&) = delete;
  ArrivalRecorder& operator=(const ArrivalRecorder&) = delete;

  // The op `seq` starts on this rank; it times out at `deadline`, `timeout` after it started.
  void begin(uint64_t seq, std::chrono::steady_clock::time_point deadline, std::chrono::milliseconds timeout);
  void end();
  // Records `seq` for this rank, then returns the ranks whose record is older than seq; nothing
  // when the store does not answer within `within`.
  std::optional<std::vector<int>> missingRanks(uint64_t seq, std::chrono::milliseconds within);

 private:
  struct Shared;  // what the threads use: it may outlive this object (a thread detached in a store call)
  std::shared_ptr<Shared> shared_;
  const int size_;
  std::thread recorder_;
  std::mutex askersMutex_;  // guards askers_: missingRanks may run on several failure-handling threads
  std::vector<std::thread> askers_;

  void endThread(std::thread& thread);
};

}  // namespace ddplite
