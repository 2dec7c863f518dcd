// Waiting on words in memory shared between processes (futexes on 32-bit ones): the primitives
// of the segment's step protocol (shm_group.cpp) and of the point-to-point channels
// (channels.cpp). Each caller states the memory ordering of the words it waits on.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <ctime>

namespace ddplite::cpu {

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain 32-bit words");

// The CPUs this process may run on. With more ranks on the host than that, peersStarted (a look
// that decides whether an async op runs on the caller) does not spin at all.
inline int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

// Spins until `done()` (the caller's look at a shared word, in the ordering it states) returns
// true, then returns true. Pauses between looks and reads the clock every 64 pauses: returns false
// at the first read that finds `until` passed (so even an `until` already past gets 64 looks),
// else yields the core at every YieldEvery-th pause: with more ranks on the machine than cores
// (other hosts' or jobs' ranks are not counted by the callers' group-size test) the rank waited
// for may need it.
template <unsigned YieldEvery, typename Done>
bool spinUntil(std::chrono::steady_clock::time_point until, Done&& done) {
  static_assert(YieldEvery > 0 && YieldEvery % 64 == 0, "yields happen at the clock reads, every 64 pauses");
  for (unsigned i = 1; !done(); ++i) {
    cpuRelax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= until) return false;
      if (i % YieldEvery == 0) sched_yield();
    }
  }
  return true;
}

// Blocks while *word == expected, at most `timeout` (spurious returns are fine: callers loop).
// Shared (not FUTEX_PRIVATE): the word lives in memory mapped by several processes.
inline void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec relative{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &relative, nullptr, 0);
}

inline void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline size_t roundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace ddplite::cpu
