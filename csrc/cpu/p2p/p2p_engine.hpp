// Point-to-point messages with tags (send, recv, recv from any source) on links of their own
// (shared-memory channels among the ranks of a host, a TCP mesh to the others: p2p_links.hpp),
// so they never interleave with the collectives on the worker thread and never wait behind them.
//
// Protocol: eager. A send writes a header {magic, tag, bytes} and the payload to its peer. The
// receiving rank reads every message as it arrives: if a matching recv is posted (same source or
// any source, same tag; the earliest posted wins) the payload goes straight into its tensor,
// otherwise it is kept as an unexpected message until a recv claims it. So a send completes once
// its bytes are on their way, whatever the receiver is doing, and sends and recvs in any order
// cannot deadlock. Messages from one peer with one tag arrive in the order they were sent (MPI's
// and gloo's rule).
//
// Threads: one pump per kind of link (ddplite-p2p-shm, ddplite-p2p-tcp), whatever the number of
// peers. A pump moves every message of its peers without blocking, in both directions, and
// sleeps on its links (a doorbell futex, or poll() over the sockets) until one may move, a local
// call queues work, or the earliest deadline of a posted recv or a send in progress. An idle pump
// sleeps without a timeout; one with work for a peer that does not move looks at that peer's
// liveness every 100 ms. Completions run on the pumps, outside the engine's lock.
#pragma once

#include "cpu/p2p/p2p_links.hpp"
#include "cpu/transport/transport.hpp"

#include <ATen/ATen.h>

#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ddplite::cpu {

class P2pEngine {
 public:
  static constexpr int kAnySource = -1;
  // error is null on success; source is the rank the message came from (recv) or this rank (send).
  using Completion = std::function<void(std::exception_ptr error, int source)>;

  // Every peer of `rank` must be on exactly one of `paths`; starts one pump per path.
  P2pEngine(int rank, int size, std::vector<std::unique_ptr<P2pLinks>> paths);
  ~P2pEngine();  // stop()

  // `data` must be contiguous; the engine holds a reference until `done` has run.
  void send(int peer, int tag, at::Tensor data, Deadline deadline, Completion done);
  // `into` must be contiguous; the matching message must carry exactly into.nbytes() bytes.
  // peer may be kAnySource.
  void recv(int peer, int tag, at::Tensor into, Deadline deadline, Completion done);

  // Fails every pending send and recv (TransportError kAborted) and stops. Idempotent.
  void abort();
  // abort(), then joins the pumps (the destructor's work, done early). Not on a pump.
  void stop();

  // How many pump threads run (tests, docs/scale.md).
  size_t pumpCount() const { return pumps_.size(); }

 private:
  struct PostedRecv {
    int peer;
    int tag;
    at::Tensor into;
    Deadline deadline;
    Completion done;
  };
  struct Unexpected {
    int peer;
    int tag;
    std::vector<char> payload;
  };
  struct PendingSend {
    int tag;
    at::Tensor data;
    Deadline deadline;
    Completion done;
  };
  struct MessageHeader {
    uint32_t magic;
    int32_t tag;
    uint64_t bytes;
  };
  // One peer. `queue`, `sendBroken` and `gone` under mutex_; the rest is its pump's alone.
  struct Peer {
    std::deque<PendingSend> queue;
    std::exception_ptr sendBroken;  // why its stream can carry no more messages (one was cut short)
    std::exception_ptr gone;        // why receiving from it ended (null: it lives)
    // The message going out: header and a small payload staged together, then a large payload.
    std::optional<PendingSend> sending;
    std::vector<char> staged;
    size_t stagedDone = 0;
    size_t payloadDone = 0;
    bool payloadStaged = false;
    // The message coming in.
    MessageHeader header{};
    size_t headerDone = 0;
    bool haveHeader = false;
    bool matched = false;
    PostedRecv match;
    std::vector<char> payload;  // when no posted recv of its length took it
    char* target = nullptr;
    size_t payloadGot = 0;
    bool discard = false;   // its recv timed out part-way: read the rest into `payload`, then drop it
    bool receiving = true;  // false once `gone`
  };
  struct Pump {
    std::unique_ptr<P2pLinks> links;
    std::thread thread;
  };

  void pumpLoop(Pump& pump);
  // One look at every peer of `pump`: true when any byte moved or anything completed.
  bool pass(Pump& pump);
  bool progressSend(P2pLinks& links, int peer);
  bool progressRecv(P2pLinks& links, int peer);
  // Delivers the message read from `peer` (its payload is complete) and readies the next.
  void finishMessage(int peer);
  // Fails posted recvs whose deadline passed; returns the earliest deadline left.
  Deadline expirePostedRecvs();
  // Liveness checks for peers of `pump` with work; when to wake at the latest; who waits for room.
  Deadline checkPeersWithWork(Pump& pump, std::vector<int>* sending);
  // `peer`'s stream failed (or the peer is gone): fails the recv and the send in progress with it,
  // and every later one (peerGone; sendBroken).
  void peerLost(P2pLinks& links, int peer, std::exception_ptr reason);
  // Ends receiving from `peer`: later recvs that only it could satisfy fail with `reason`.
  void peerGone(int peer, std::exception_ptr reason);
  // Fails the recv that a message from `peer` is being read into, at its deadline.
  void expireMatchedRecv(int peer);
  // On stop: fails what `pump`'s peers still had queued or in progress.
  void failRemaining(Pump& pump);
  bool everyPeerGoneLocked() const;
  // Caller holds mutex_. Removes and returns the earliest posted recv matching (peer, tag).
  bool takePosted(int peer, int tag, PostedRecv* out);
  static void deliver(PostedRecv& recv, const std::vector<char>& payload, int source);
  std::string describePeer(int peer) const;
  void wakePumpOf(int peer);

  const int rank_;
  const int size_;

  std::mutex mutex_;
  bool stopping_ = false;
  std::list<PostedRecv> posted_;      // in the order recv() was called
  std::list<Unexpected> unexpected_;  // in arrival order
  std::vector<Peer> peers_;           // by group rank

  std::vector<Pump> pumps_;
  std::vector<int> pumpOf_;  // by group rank: index into pumps_, -1 for this rank
};

}  // namespace ddplite::cpu
