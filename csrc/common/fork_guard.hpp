// What a forked child (a DataLoader worker, os.fork) must not keep of ddplite.
//
// fork() copies every descriptor. A child that keeps a copy of a rank's sockets keeps those
// connections open after the rank dies, and its peers see no end of stream until the child exits
// too (a DataLoader worker notices a dead parent after about 5 s). A pthread_atfork child handler
// therefore closes, in the child, every socket registered here; the parent's are untouched.
//
// The child also inherits the backends' memory but none of their threads. Teardown paths that
// would join those threads, shut sockets down (shutdown() acts on the socket the parent shares)
// or unlink segments check createdHere() and leak instead (the child's exit frees its memory).
//
// Thread-safety: every call takes the registry's mutex; the prepare handler holds it across
// fork(), so no registration or close is half-done in the child.
#pragma once

#include <c10/util/FunctionRef.h>

#include <sys/types.h>

namespace ddplite::fork_guard {

// Registers `fd` (owned by `owner`) to be closed in forked children. Any thread.
void adopt(int fd, const void* owner);

// Runs `make` (socket(), accept4(), eventfd(): a new descriptor, or -1 with errno set) and
// registers what it returns to `owner`, both under the registry's mutex, so that no fork() falls
// between the descriptor's birth and its registration. errno is make's. `make` must not block
// (every fork of the process waits for it). Any thread.
int adoptNew(const void* owner, c10::function_ref<int()> make);

// Closes `fd` if `owner` registered it in this process (and unregisters it); in a forked child,
// whose copies were closed at fork, does nothing: the number may belong to another descriptor by now.
void close(int fd, const void* owner);

// getpid(), without a system call (cached, refreshed by the fork handler). Any thread.
pid_t currentPid();

// Whether `creator` (a currentPid() taken earlier) is this process: false in a forked child.
bool createdHere(pid_t creator);

}  // namespace ddplite::fork_guard
