// What straggler scores are made of (torch_ddp_lite.stragglers): for each of a group's last
// collectives, when this rank arrived (the backend took the call: the Work's `issued` stage) and
// when the collective ended here (its body returned), on this rank's own steady clock. Ranks on
// other hosts have other clocks, so the scores use only durations measured on one clock: how
// long this rank waited in each collective, and how long it spent outside collectives (see
// torch_ddp_lite/stragglers.py). The rank the others wait for waits least and spends longest
// outside.
//
// A ring of the last `capacity` collectives that completed without error (DDPLITE_STRAGGLER_WINDOW,
// 512). Cost on the collective path: one clock read is the Work's own; record() adds four
// relaxed stores and two release stores of a slot's version, no lock.
//
// Threading: record() from the thread that runs the group's ops (one op at a time: the worker, or
// a caller that claimed it); snapshot() from any thread. Each slot is a seqlock: the writer makes
// its version odd (relaxed store, then a release fence), writes the fields (relaxed), then makes
// the version even (release store); a reader loads the version (acquire), the fields (relaxed),
// then an acquire fence and the version again (relaxed), and keeps the slot only if both loads
// saw the same even version. A slot rewritten during the read is skipped, not torn.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace ddplite {

class WaitLedger {
 public:
  struct Entry {
    uint64_t seq = 0;       // the group's collective sequence number
    int64_t arrivedNs = 0;  // steady_clock ns at which the backend took the call
    int64_t endedNs = 0;    // steady_clock ns at which the collective ended on this rank
  };

  explicit WaitLedger(int64_t capacity);

  void record(uint64_t seq, int64_t arrivedNs, int64_t endedNs);
  // The recorded collectives, oldest first (at most capacity; those being rewritten are left out).
  std::vector<Entry> snapshot() const;
  int64_t capacity() const { return capacity_; }

 private:
  struct Slot {
    std::atomic<uint64_t> version{0};  // odd while written
    std::atomic<uint64_t> seq{0};
    std::atomic<int64_t> arrivedNs{0};
    std::atomic<int64_t> endedNs{0};
  };
  const int64_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  uint64_t next_ = 0;  // writer's own: the next slot to write (record is called by one thread at a time)
};

}  // namespace ddplite
