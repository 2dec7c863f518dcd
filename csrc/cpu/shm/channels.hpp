// Point-to-point byte streams between the ranks of one host through shared memory: the
// Transport the P2pEngine (send/recv, tags, any source) runs on when its group has a segment,
// in place of a TCP mesh of its own.
//
// Layout of the segment (one per group, its own; segment.hpp): a RankState per rank, then one
// Ring per ordered pair (from, to): a control block (producer and consumer halves on their own
// cache lines) and `ringBytes` of data. Each ring has exactly one producer, the sending rank's
// sender thread for that peer, and one consumer, the receiving rank's receiver thread for it
// (P2pEngine: a sender and a receiver thread per peer), so every ring is single-producer
// single-consumer.
//
// Memory ordering. `head` (bytes written) is stored by the producer only, `tail` (bytes read) by
// the consumer only, both monotone 64-bit counts. The producer copies bytes into the ring, then
// stores head with seq_cst, then bumps the 32-bit `headWord` (the futex word, seq_cst) and loads
// `consumerSleepers` (seq_cst) to decide whether to wake. The consumer loads head with acquire
// before reading the bytes it covers; to block it increments consumerSleepers, loads headWord,
// re-loads head (all seq_cst) and futex-waits on the headWord value it saw. In the single total
// order either the re-load sees the new head, or the producer's load of consumerSleepers sees
// the sleeper and its later bump of headWord makes the futex wait return (the kernel re-checks
// the value). The way back (tail, tailWord, producerSleepers) is symmetric. A ring's bytes from
// `tail` to `head` are never written by the producer until the consumer has moved `tail` past
// them.
//
// Waits: spin with a pause instruction for a while (only when every rank's sender and receiver
// threads, 2 P (P-1) in all, have a CPU each), then futex-wait in slices of at most 20 ms, checking the
// deadline, abort() and the peer: its `closed` flag (set by its abort(), seq_cst, then every
// word it could wait on is bumped and woken) and, every 100 ms, whether its process still exists
// (a pidfd; where the peer's pid cannot be watched, another PID namespace or no pidfd_open, its
// socket in the group's TCP mesh, which the kernel closes when the process exits). A send checks
// the closed flag before every message, and the process at most every 100 ms. A receiver drains what a dead peer sent before
// it reports the peer gone, as a TCP receiver reads up to the end of the stream.
//
// Threading: send/recv on one ring from its one thread at a time (the P2pEngine's contract);
// abort() from any thread.
#pragma once

#include "cpu/shm/segment.hpp"
#include "cpu/transport/transport.hpp"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace ddplite::cpu {

class ShmChannels : public Transport {
 public:
  // Collective over the group (through the store, keys of its own). Null with *whyNot when the
  // segment cannot be made; the same outcome on every rank. `liveness`: the group's TCP mesh,
  // asked whether a peer lives where its pid cannot be watched (another PID namespace, no
  // pidfd_open); it must outlive the channels. `processGroupRanks`: what errors call rank i, when
  // the channels join only some of a group's ranks (one host's, in a group across hosts);
  // empty: i itself.
  static std::unique_ptr<ShmChannels> create(StoreRendezvous& rendezvous, Transport& liveness, int rank, int size,
                                             std::string* whyNot, std::vector<int> processGroupRanks = {});
  ~ShmChannels() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  size_t ringBytes() const { return ringBytes_; }

  void send(int peer, const void* data, size_t bytes, Deadline deadline) override;
  void recv(int peer, void* data, size_t bytes, Deadline deadline) override;
  void sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData, size_t recvBytes,
                Deadline deadline) override;
  // Point-to-point only: no collective runs here, so nothing is armed and no header waits.
  void beginCollective(const Fingerprint&) override {}
  bool peerHungUp(int peer) override;
  bool peekWaitingHeader(int, WireHeader*) override { return false; }
  std::string describePeer(int peer) const override;
  // Sets this rank's `closed` flag, wakes every waiter on a ring to or from this rank, here and in
  // the peers (theirs then report this rank gone). Idempotent; any thread.
  void abort() override;

 private:
  struct RankState;
  struct Ring;
  enum class Side { kProducer, kConsumer };

  ShmChannels(std::unique_ptr<ShmSegment> segment, Transport& liveness, int rank, int size, size_t ringBytes);
  RankState& state(int owner) const;
  Ring& ring(int from, int to) const;
  char* ringData(int from, int to) const;
  // Moves as many bytes as fit now (at most `bytes`); returns how many.
  size_t pushSome(int peer, const char* data, size_t bytes);
  size_t pullSome(int peer, char* data, size_t bytes);
  // Blocks until the ring to (kProducer) or from (kConsumer) `peer` has room or data, or throws
  // on deadline, abort or the peer gone.
  void waitFor(int peer, Side side, Deadline deadline);
  bool peerGone(int peer);
  [[noreturn]] void throwPeerGone(int peer, const char* doing) const;

  std::unique_ptr<ShmSegment> segment_;
  Transport& liveness_;
  std::vector<int> processGroupRanks_;  // see create(); empty: the identity
  const int rank_;
  const int size_;
  const size_t ringBytes_;
  const std::chrono::microseconds spin_;
  std::atomic<bool> aborted_{false};
  std::vector<int> pidfds_;  // per peer, -1 where its pid cannot be watched (liveness_ then); set up once
  std::vector<Clock::time_point> nextSendCheck_;  // per peer: that peer's sender thread only
};

}  // namespace ddplite::cpu
