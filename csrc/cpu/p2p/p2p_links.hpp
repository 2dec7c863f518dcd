// The byte streams a P2pEngine pump thread drives (p2p_engine.hpp): one path to some of the
// group's peers, seen without blocking, with one way to sleep until any of them may have moved.
// Two kinds: the shared-memory channels among the ranks of this host (one doorbell futex per
// rank), and a TCP mesh (poll() over its sockets and an eventfd).
//
// Sleeping without a lost wake-up: armWait(); then the pump looks at every link once more; then
// wait() when that look moved nothing, else disarm(). A peer that moves data or room, a local
// thread that calls wake(), and abort() all end a wait() that armed before them.
//
// Threading: everything on the links' one pump thread, except wake() and abort() (any thread).
#pragma once

#include "cpu/transport/transport.hpp"

#include <memory>
#include <string>
#include <vector>

namespace ddplite {
class TcpTransport;
}

namespace ddplite::cpu {

class ShmChannels;

class P2pLinks {
 public:
  virtual ~P2pLinks() = default;

  // The group ranks reached through these links, in ascending order; never this rank.
  const std::vector<int>& peers() const { return peers_; }
  // "shm" or "tcp": names the pump thread (ddplite-p2p-<kind>).
  virtual const char* kind() const = 0;

  // Moves what can move now, at most `bytes` (> 0); returns how many (0: none now). Throws
  // TransportError when the peer is gone; a receiver first gets every byte the peer sent.
  virtual size_t trySend(int peer, const void* data, size_t bytes) = 0;
  virtual size_t tryRecv(int peer, void* data, size_t bytes) = 0;
  // Throws TransportError(kPeerClosed) when `peer` is known to be gone and nothing it sent is
  // left to read; at most one system call, made at most every 100 ms per peer. For a peer the
  // pump has work for (a posted recv, a send) while nothing moves.
  virtual void checkAlive(int peer) = 0;
  // For a peer a posted recv names, after checkAlive: links whose pairs connect on demand connect
  // a pair the peer has not connected yet (at most once a second per peer), so that a peer gone
  // before it ever connected is seen by its refusing listener, not at the recv's deadline.
  virtual void reachAwaited(int) {}
  // The engine reads nothing more from `peer` (its stream ended or broke): stop watching it.
  virtual void stopReceiving(int peer) = 0;

  virtual void armWait() = 0;
  // Sleeps until something may have moved, wake(), abort() or `until`. `sending`: peers with
  // bytes waiting for room (a socket is then watched for it).
  virtual void wait(const std::vector<int>& sending, Deadline until) = 0;
  virtual void disarm() = 0;
  virtual void wake() = 0;

  virtual std::string describePeer(int peer) const = 0;
  // Stops every link: the peers see this rank gone; later calls here throw kAborted. Any thread.
  virtual void abort() = 0;

 protected:
  explicit P2pLinks(std::vector<int> peers) : peers_(std::move(peers)) {}

 private:
  std::vector<int> peers_;
};

// The channels among this host's ranks: channel index i is the group's rank groupRanks[i].
// `liveness` is what the channels were created with (they ask it where a pid cannot be watched):
// owned here, destroyed after them; null when it is owned elsewhere and outlives the links.
std::unique_ptr<P2pLinks> shmLinks(std::unique_ptr<ShmChannels> channels, std::vector<int> groupRanks,
                                   std::unique_ptr<Transport> liveness);
// The TCP mesh `mesh` (an unarmed one of the whole group), for `peers` only.
// `connectTimeout` bounds the connect a first send makes on an on-demand mesh.
std::unique_ptr<P2pLinks> socketLinks(std::unique_ptr<TcpTransport> mesh, std::vector<int> peers,
                                      std::chrono::milliseconds connectTimeout);

}  // namespace ddplite::cpu
