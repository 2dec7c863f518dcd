// Point-to-point messages with tags (send, recv, recv from any source) on a TCP mesh of their
// own, so they never interleave with the collectives on the worker thread's sockets and never
// wait behind them.
//
// Protocol: eager. A send writes a header {magic, tag, bytes} and the payload to its peer. A
// receiver thread per peer reads every message as it arrives: if a matching recv is posted
// (same source or any source, same tag; the earliest posted wins) the payload goes straight
// into its tensor, otherwise it is kept as an unexpected message until a recv claims it. So a
// send completes once its bytes are on the wire, whatever the receiver is doing, and sends and
// recvs in any order cannot deadlock. Messages from one peer with one tag arrive in the order
// they were sent (MPI's and gloo's rule).
//
// Threads: a sender and a receiver per peer, and a timer that fails recvs whose deadline passes.
// Completions run on those threads, outside the engine's lock.
#pragma once

#include "cpu/transport/transport.hpp"

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddplite::cpu {

class P2pEngine {
 public:
  static constexpr int kAnySource = -1;
  // error is null on success; source is the rank the message came from (recv) or this rank (send).
  using Completion = std::function<void(std::exception_ptr error, int source)>;

  explicit P2pEngine(std::unique_ptr<Transport> transport);
  ~P2pEngine();  // abort(), then joins every thread

  // `data` must be contiguous; the engine holds a reference until `done` has run.
  void send(int peer, int tag, at::Tensor data, Deadline deadline, Completion done);
  // `into` must be contiguous; the matching message must carry exactly into.nbytes() bytes.
  // peer may be kAnySource.
  void recv(int peer, int tag, at::Tensor into, Deadline deadline, Completion done);

  // Fails every pending send and recv (TransportError kAborted) and stops. Idempotent.
  void abort();
  // abort(), then joins every thread (the destructor's work, done early). Not on an engine thread.
  void stop();

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

  void sendLoop(int peer);
  void receiveLoop(int peer);
  void timerLoop();
  // Caller holds mutex_. Removes and returns the earliest posted recv matching (peer, tag).
  bool takePosted(int peer, int tag, PostedRecv* out);
  // Ends the receiver for `peer`: later recvs that only it could satisfy fail with `reason`.
  void peerGone(int peer, std::exception_ptr reason);
  bool everyPeerGoneLocked() const;
  static void deliver(PostedRecv& recv, const std::vector<char>& payload, int source);

  std::unique_ptr<Transport> transport_;
  const int rank_;
  const int size_;

  std::mutex mutex_;
  std::condition_variable wake_;                  // new sends, new recvs, stopping
  bool stopping_ = false;
  std::list<PostedRecv> posted_;                  // in the order recv() was called
  std::list<Unexpected> unexpected_;              // in arrival order
  std::vector<std::deque<PendingSend>> sends_;    // per peer, FIFO
  std::vector<std::exception_ptr> gone_;          // per peer: why its receiver ended (null: alive)
  std::vector<std::exception_ptr> sendBroken_;    // per peer: why its send stream is unusable

  std::vector<std::thread> threads_;
};

}  // namespace ddplite::cpu
