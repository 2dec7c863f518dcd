// The NUMA node a process runs on, for shaping shared-memory synchronisation (cpu/shm/arrival_tree.hpp).
#pragma once

namespace ddplite {

// The node of every CPU the calling thread may run on (sched_getaffinity, then /sys/devices/system/cpu/
// cpu<N>/node<M>), when they all share one: a rank pinned to a socket (numactl --cpunodebind,
// taskset, a launcher's binding). -1 when they span several nodes (an unpinned process, which the
// kernel may move) or when this cannot be told (no /sys, more than CPU_SETSIZE CPUs). Reads /sys
// on every call (once per shared-memory group).
int numaNodeOfThisProcess();

}  // namespace ddplite
