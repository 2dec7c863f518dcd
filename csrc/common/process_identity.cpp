#include "common/process_identity.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ddplite {

namespace {

uint64_t readPidNamespace() {
  struct stat about = {};
  if (stat("/proc/self/ns/pid", &about) != 0) return 0;
  return (static_cast<uint64_t>(about.st_dev) << 32) ^ static_cast<uint64_t>(about.st_ino);
}

// A process's PID namespace never changes (unshare(CLONE_NEWPID) moves only its later children).
uint64_t thisPidNamespace() {
  static const uint64_t tag = readPidNamespace();
  return tag;
}

// Whether the /proc mounted here shows this process's PID namespace: "/proc/self" names our own
// pid. A namespace entered without a /proc of its own (unshare --pid --fork without --mount-proc)
// shows the outer namespace's pids, where our pid names some other process.
bool procShowsOurPids() {
  char target[32] = {};
  const ssize_t length = readlink("/proc/self", target, sizeof(target) - 1);
  if (length <= 0) return false;
  return std::strtoul(target, nullptr, 10) == static_cast<unsigned long>(getpid());
}

struct StatLine {
  char state = '?';         // of the thread-group leader
  uint64_t threads = 0;     // of the whole process
  uint64_t startTicks = 0;
};

enum class ReadOutcome { kRead, kNoSuchProcess, kUnreadable };

// /proc/<pid>/stat: "pid (comm) state ppid ... starttime ...". comm may hold spaces and ')', so
// the fields are counted from the last ')': state is the first after it, num_threads the 18th,
// starttime the 20th.
ReadOutcome readStat(uint32_t pid, StatLine* out) {
  // The leader thread's own stat: the same state, num_threads and starttime as /proc/<pid>/stat,
  // without summing every thread's counters.
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%u/task/%u/stat", pid, pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? ReadOutcome::kNoSuchProcess : ReadOutcome::kUnreadable;
  char text[1024];
  ssize_t length;
  do {
    length = read(fd, text, sizeof(text) - 1);
  } while (length < 0 && errno == EINTR);
  const int readError = errno;
  close(fd);
  // A process that ends between open and read leaves a descriptor whose read fails with ESRCH.
  if (length < 0) return readError == ESRCH ? ReadOutcome::kNoSuchProcess : ReadOutcome::kUnreadable;
  text[length] = '\0';
  const char* field = std::strrchr(text, ')');
  if (field == nullptr) return ReadOutcome::kUnreadable;
  ++field;
  for (int index = 0; index < 20; ++index) {  // index 0: state (field 3); 17: num_threads; 19: starttime
    while (*field == ' ') ++field;
    if (*field == '\0') return ReadOutcome::kUnreadable;
    if (index == 0) out->state = *field;
    if (index == 17) out->threads = std::strtoull(field, nullptr, 10);
    if (index == 19) {
      out->startTicks = std::strtoull(field, nullptr, 10);
      return ReadOutcome::kRead;
    }
    while (*field != ' ' && *field != '\0') ++field;
  }
  return ReadOutcome::kUnreadable;
}

}  // namespace

ProcessIdentity ProcessIdentity::ofThisProcess() {
  ProcessIdentity self;
  self.pid = static_cast<uint32_t>(getpid());
  self.pidNamespace = thisPidNamespace();
  StatLine line;
  // startTicks stays 0 (peers: "unknown", so they watch the TCP mesh) where /proc shows another
  // namespace's pids: there /proc/<our pid> is some other process.
  if (procShowsOurPids() && readStat(self.pid, &line) == ReadOutcome::kRead) self.startTicks = line.startTicks;
  return self;
}

ProcessState stateOf(const ProcessIdentity& peer) {
  static const bool procIsOurs = procShowsOurPids();  // the mounts a process sees do not change under it
  const uint64_t mine = thisPidNamespace();
  if (peer.pid == 0 || peer.startTicks == 0 || mine == 0 || peer.pidNamespace != mine || !procIsOurs) {
    return ProcessState::kUnknown;
  }
  StatLine line;
  switch (readStat(peer.pid, &line)) {
    case ReadOutcome::kNoSuchProcess:
      // Confirmed through the kernel's own table (this namespace's): /proc with hidepid hides
      // processes of other users, which kill(0) still finds (EPERM).
      if (kill(static_cast<pid_t>(peer.pid), 0) == 0 || errno == EPERM) return ProcessState::kUnknown;
      return ProcessState::kEnded;
    case ReadOutcome::kUnreadable:
      return ProcessState::kUnknown;
    case ReadOutcome::kRead:
      break;
  }
  if (line.startTicks != peer.startTicks) return ProcessState::kEnded;  // the pid was handed on
  // Z: the leader exited and is not reaped yet; X: being reaped. A zombie leader whose other
  // threads still run (it called pthread_exit, or an exit_group is still ending them, holding
  // the process's descriptors) counts them: the process has ended when the leader is all that is left.
  const bool leaderExited = line.state == 'Z' || line.state == 'X';
  return leaderExited && line.threads <= 1 ? ProcessState::kEnded : ProcessState::kRunning;
}

std::string hostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

}  // namespace ddplite
