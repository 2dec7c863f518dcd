// How long a collective's wait spins before it sleeps, by who waits.
//
// A wait (a shared-memory flag, shm_group.cpp; a TCP transfer, tcp.cpp) spins for its own setting
// (DDPLITE_SHM_SPIN_US, DDPLITE_TCP_SPIN_US: 50 us) and then sleeps. On a thread that runs an op
// its caller blocks on (async_op=False, run on the calling thread by DdpliteBackend::enqueue),
// nothing else waits for that thread, and a sleep costs a wake-up through the scheduler: there it
// may spin up to DDPLITE_CALLER_SPIN_US instead (0 by default: off), where the owner of the wait
// allows it: the TCP transport (set by CpuPath, unless the group is on one host's segment) and
// the segment of a host in a group across hosts (set by HostHierarchy; a group on one host keeps
// its spin, ShmGroup::setCallerSpin says why).
// Never where the wait's own setting is 0, nor where more than kSpinRanksPerCpu of the group's
// ranks share each CPU of this host: there a spinning rank holds a core that the rank it waits
// for needs (ShmGroup's spin_ is 0 then, and CpuPath gives the TCP transport no caller spin). A
// host is what the group's host layout says: ranks of other "hosts" on the same machine (network
// namespaces, containers) are not counted, as in the measurement below. An
// async op's wait, on the group's worker, keeps the short spin: its caller computes on the same
// cores meanwhile (DDP's buckets).
// Why off by default (docs/benchmarks.md, "Across hosts"): at 4 namespace hosts x 2 ranks on 2
// cores (2 ranks and 2 CPUs per host as the check sees it, 8 ranks on the machine's 2 cores),
// 1000 us took an 8-byte all_reduce 1.6x faster on a machine with no other work and 3.1-5.5x
// slower under other load (4.1x beside one busy process; why was not found). A spin that ended once a yield had been
// away for long (40 or 200 us) did not tell the two apart.
//
// Threading: CallerBlocksScope marks the constructing thread until it is destroyed; spinFor reads
// the mark of the thread that calls it. No state is shared between threads.
#pragma once

#include <algorithm>
#include <chrono>

namespace ddplite {

// The most ranks of a group per CPU of the host at which its waits spin (docs/data/shm_spin_ab.txt:
// 3 and 4 ranks on 2 cores ran faster spinning than sleeping).
inline constexpr int kSpinRanksPerCpu = 2;

namespace detail {
inline thread_local bool callerBlocks = false;
}  // namespace detail

// While alive, waits on this thread are a blocked caller's (nests; restores the previous mark).
class CallerBlocksScope {
 public:
  CallerBlocksScope() : previous_(detail::callerBlocks) { detail::callerBlocks = true; }
  ~CallerBlocksScope() { detail::callerBlocks = previous_; }
  CallerBlocksScope(const CallerBlocksScope&) = delete;
  CallerBlocksScope& operator=(const CallerBlocksScope&) = delete;

 private:
  bool previous_;
};

inline bool callerBlocks() { return detail::callerBlocks; }

// The spin of a wait whose own setting is `own` (0: it does not spin) and whose blocked caller's
// is `caller`: the longer of the two on a blocked caller's thread, else `own`.
inline std::chrono::microseconds spinFor(std::chrono::microseconds own, std::chrono::microseconds caller) {
  if (own.count() == 0 || !callerBlocks()) return own;
  return std::max(own, caller);
}

}  // namespace ddplite
