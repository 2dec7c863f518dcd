#include "common/fork_guard.hpp"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <utility>
#include <vector>

namespace ddplite::fork_guard {
namespace {

std::mutex registryMutex;
std::vector<std::pair<int, const void*>>* registry = nullptr;  // never freed: used by handlers until exit
std::atomic<pid_t> thisPid{0};  // getpid(), refreshed in each forked child

void lockForFork() { registryMutex.lock(); }
void unlockInParent() { registryMutex.unlock(); }

// Runs in the child, single-threaded, with registryMutex held by this (the forking) thread.
// close() and getpid() are async-signal-safe; clear() frees nothing.
void closeInChild() {
  thisPid.store(getpid(), std::memory_order_relaxed);
  for (const auto& [fd, owner] : *registry) ::close(fd);
  registry->clear();
  registryMutex.unlock();
}

// When the extension is loaded, before any group exists.
const bool installed = [] {
  registry = new std::vector<std::pair<int, const void*>>();
  thisPid.store(getpid(), std::memory_order_relaxed);
  return pthread_atfork(lockForFork, unlockInParent, closeInChild) == 0;
}();

}  // namespace

void adopt(int fd, const void* owner) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(registryMutex);
  registry->emplace_back(fd, owner);
}

int adoptNew(const void* owner, c10::function_ref<int()> make) {
  std::lock_guard<std::mutex> lock(registryMutex);
  const int fd = make();
  if (fd >= 0) {
    const int error = errno;
    try {
      registry->emplace_back(fd, owner);
    } catch (...) {
      ::close(fd);
      throw;
    }
    errno = error;
  }
  return fd;
}

void close(int fd, const void* owner) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(registryMutex);
  for (auto it = registry->begin(); it != registry->end(); ++it) {
    if (it->first == fd && it->second == owner) {
      registry->erase(it);
      ::close(fd);  // under the mutex: no fork copies a number being closed and reused
      return;
    }
  }
}

// Relaxed: the value changes only in a child's fork handler, before any other thread exists there.
pid_t currentPid() { return thisPid.load(std::memory_order_relaxed); }

bool createdHere(pid_t creator) { return currentPid() == creator; }

}  // namespace ddplite::fork_guard
