// Point-to-point byte streams between the ranks of one host through shared memory: what the
// P2pEngine (send/recv, tags, any source) drives for the peers on its host (p2p_links.hpp), in
// place of a TCP mesh of its own.
//
// Layout of the segment (one per group, its own; segment.hpp): a RankState per rank, then one
// Ring per ordered pair (from, to): a control block (producer and consumer halves on their own
// cache lines) and `ringBytes` of data. Each ring has exactly one producer, the sending rank's
// pump thread, and one consumer, the receiving rank's pump thread (one per rank and group,
// p2p_engine.hpp), so every ring is single-producer single-consumer.
//
// Memory ordering. `head` (bytes written) is stored by the producer only, `tail` (bytes read) by
// the consumer only, both monotone 64-bit counts. The producer copies bytes into the ring, then
// stores head with seq_cst; the consumer loads head with acquire before reading the bytes it
// covers, and stores tail with seq_cst once it has copied them out. A ring's bytes from `tail` to
// `head` are never written by the producer until the consumer has moved `tail` past them.
//
// Sleeping. Each rank has one doorbell (RankState: `doorbell`, its futex word, and `sleeping`),
// whatever the number of its peers. Its pump arms (stores sleeping = 1, then loads the doorbell
// as its ticket, seq_cst), looks at every ring once more, and futex-waits on the ticket unless
// that look moved something. A producer that stored head, a consumer that stored tail, a local
// thread that queued work and an aborting rank load the other side's `sleeping` (seq_cst) and,
// when it is set, bump its doorbell and wake it. In the single total order either the pump's
// look sees the store, or the storer sees `sleeping` and its bump comes after the ticket (the
// futex wait then returns at once). An idle rank sleeps without a timeout: no wake-up costs a
// core when nothing moves, however many ranks share the host.
//
// Liveness: a peer is gone once its `closed` flag is set (its abort(): seq_cst, then its peers'
// doorbells) or its process has ended (its ProcessIdentity, published in the segment and checked
// in /proc: no descriptor per peer; where that cannot be checked, another PID namespace or no
// /proc, its socket in the group's TCP mesh, which the kernel closes when the process exits). The pump asks (peerGone) at most every 100 ms per peer while it has
// work for that peer, and a receiver drains what a dead peer sent before it reports the peer
// gone, as a TCP receiver reads up to the end of the stream.
//
// Threading: pushSome/pullSome/armWait/waitDoorbell/peerGone on the rank's one pump thread;
// ringOwnDoorbell() and abort() from any thread.
#pragma once

#include "cpu/shm/segment.hpp"
#include "cpu/transport/transport.hpp"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace ddplite::cpu {

class ShmChannels {
 public:
  // Collective over the group (through the store, keys of its own). Null with *whyNot when the
  // segment cannot be made; the same outcome on every rank. `liveness`: the group's TCP mesh,
  // asked whether a peer lives where its process cannot be checked (another PID namespace, no
  // /proc); it must outlive the channels. `processGroupRanks`: what errors call rank i, when
  // the channels join only some of a group's ranks (one host's, in a group across hosts);
  // empty: i itself.
  static std::unique_ptr<ShmChannels> create(StoreRendezvous& rendezvous, Transport& liveness, int rank, int size,
                                             std::string* whyNot, std::vector<int> processGroupRanks = {});
  ~ShmChannels();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t ringBytes() const { return ringBytes_; }

  // Moves as many bytes as fit (have arrived) now, at most `bytes`; returns how many. Wakes the
  // peer's pump when it sleeps. Never blocks.
  size_t pushSome(int peer, const char* data, size_t bytes);
  size_t pullSome(int peer, char* data, size_t bytes);
  // Whether `peer` has closed its channels or its process has ended (a system call: the caller
  // rate-limits it).
  bool peerGone(int peer);
  bool peerClosed(int peer) const;  // its `closed` flag alone: one load
  // Bytes `peer` has written to this rank that are not read yet (pump thread).
  size_t unread(int peer) const;

  // The sleep protocol (header): armWait(), look at every ring, then waitDoorbell() unless the
  // look moved something, else disarm().
  void armWait();
  void waitDoorbell(std::chrono::nanoseconds timeout);
  void disarm();
  // Wakes this rank's pump (another thread of this process queued work for it). Any thread.
  void ringOwnDoorbell() { ring(rank_); }

  std::string describePeer(int peer) const;
  // Sets this rank's `closed` flag and rings every rank's doorbell (theirs then report this rank
  // gone). Idempotent; any thread.
  void abort();

 private:
  struct RankState;
  struct Ring;

  ShmChannels(std::unique_ptr<ShmSegment> segment, Transport& liveness, int rank, int size, size_t ringBytes);
  RankState& state(int owner) const;
  Ring& ringOf(int from, int to) const;
  char* ringData(int from, int to) const;
  // Bumps `owner`'s doorbell and wakes its pump, when it sleeps or is about to.
  void ring(int owner) const;

  std::unique_ptr<ShmSegment> segment_;
  Transport& liveness_;
  std::vector<int> processGroupRanks_;  // see create(); empty: the identity
  const int rank_;
  const int size_;
  const size_t ringBytes_;
  std::atomic<bool> aborted_{false};
  uint32_t ticket_ = 0;      // the pump's, between armWait and waitDoorbell
};

}  // namespace ddplite::cpu
