#include "backend/wait_ledger.hpp"

#include <algorithm>

namespace ddplite {

WaitLedger::WaitLedger(int64_t capacity)
    : capacity_(std::max<int64_t>(capacity, 1)), slots_(std::make_unique<Slot[]>(static_cast<size_t>(capacity_))) {}

void WaitLedger::record(uint64_t seq, int64_t arrivedNs, int64_t endedNs) {
  Slot& slot = slots_[next_ % static_cast<uint64_t>(capacity_)];
  ++next_;
  const uint64_t version = slot.version.load(std::memory_order_relaxed);
  slot.version.store(version + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);         // orders the odd version before the fields
  slot.seq.store(seq, std::memory_order_relaxed);
  slot.arrivedNs.store(arrivedNs, std::memory_order_relaxed);
  slot.endedNs.store(endedNs, std::memory_order_relaxed);
  slot.version.store(version + 2, std::memory_order_release);  // even: the fields above are whole
}

std::vector<WaitLedger::Entry> WaitLedger::snapshot() const {
  std::vector<Entry> entries;
  entries.reserve(static_cast<size_t>(capacity_));
  for (int64_t i = 0; i < capacity_; ++i) {
    const Slot& slot = slots_[static_cast<size_t>(i)];
    const uint64_t before = slot.version.load(std::memory_order_acquire);
    if (before == 0 || before % 2 != 0) continue;  // never written, or being written
    Entry entry{slot.seq.load(std::memory_order_relaxed), slot.arrivedNs.load(std::memory_order_relaxed),
                slot.endedNs.load(std::memory_order_relaxed)};
    std::atomic_thread_fence(std::memory_order_acquire);  // orders the field loads before the second version load
    if (slot.version.load(std::memory_order_relaxed) != before) continue;  // rewritten while read
    entries.push_back(entry);
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.seq < b.seq; });
  return entries;
}

}  // namespace ddplite
