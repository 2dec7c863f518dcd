// Names for ddplite's threads, so that top -H, ps -L, gdb and py-spy tell them apart:
// "ddplite-worker", "ddplite-p2p-shm", ... (the list: docs/observability.md "Threads").
#pragma once

#include <pthread.h>

#include <cstdio>
#include <thread>

namespace ddplite {

// Names `thread`, by the thread that started it, right after starting it: the name is in place
// when the starter returns (a thread that named itself could still be seen by its old name).
// Linux keeps 15 characters; a longer name is cut, never refused.
inline void nameThread(std::thread& thread, const char* name) {
  char cut[16];
  std::snprintf(cut, sizeof(cut), "%s", name);
  ::pthread_setname_np(thread.native_handle(), cut);
}


}  // namespace ddplite
