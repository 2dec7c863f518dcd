// Waiting on 32-bit words in memory shared between processes: the primitives of the segment's
// step protocol (shm_group.cpp) and of the point-to-point channels (channels.cpp). Each caller
// states the memory ordering of the words it waits on.
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

// The CPUs this process may run on. With more ranks on the host than that, a spinning waiter
// takes the core the rank it waits for needs: such waiters do not spin at all.
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
