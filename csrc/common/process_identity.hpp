// Who a process is, in a form any process on the host can check later without holding a
// descriptor for it: its pid, its start time and its PID namespace.
//
// Used by shared-memory peers (cpu/shm/) to tell a peer whose process has ended while they wait
// for it. A pidfd per peer would do it too, at one descriptor per peer per group; at 64 ranks per
// host that alone was more than gloo's whole socket mesh (docs/history/scale.md). Here the identity is
// published once in the segment, and a check reads /proc/<pid>/task/<pid>/stat (a few
// microseconds, paid by a wait that did not end while it spun).
//
// A pid alone is not an identity: the kernel hands an ended process's pid to a new one. The start
// time (clock ticks since boot, field 22 of /proc/<pid>/stat) is fixed for a process's life, so
// (pid, start time) names one process for as long as the host runs.
#pragma once

#include <cstdint>
#include <string>

namespace ddplite {

struct ProcessIdentity {
  uint32_t pid = 0;           // 0: unknown
  uint64_t startTicks = 0;    // 0: unknown (no /proc)
  uint64_t pidNamespace = 0;  // device and inode of /proc/self/ns/pid; 0: unknown

  static ProcessIdentity ofThisProcess();
};

enum class ProcessState {
  kRunning,
  kEnded,    // exited (gone, or a zombie not reaped yet), or its pid now names a later process
  kUnknown,  // not checkable from here: another PID namespace, a /proc that shows another
             // namespace's pids, a /proc that hides the process (hidepid), or no /proc
};

// What `peer` is now, as seen from this process. Any thread; no descriptor outlives the call.
ProcessState stateOf(const ProcessIdentity& peer);

// This host's name (gethostname), "" when it cannot be read. Any thread.
std::string hostName();

}  // namespace ddplite
