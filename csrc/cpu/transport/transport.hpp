// The CPU transport interface: point-to-point byte streams between the ranks of one group.
//
// Algorithms (cpu/algorithms/) are written only against this interface, so a second transport
// (shared memory, MPI) drops in beside tcp.cpp without touching them.
//
// Threading contract: one thread (the backend's worker) issues send/recv/sendRecv; abort() may be
// called from any thread at any time and makes blocked calls fail promptly.
#pragma once

#include "cpu/transport/fingerprint.hpp"

#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>

namespace ddplite {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// A failure of the transport. The backend turns it into a DistBackendError with op context.
class TransportError : public std::runtime_error {
 public:
  // kMismatch: a peer's message belongs to another collective (see fingerprint.hpp).
  enum class Kind { kPeerClosed, kTimeout, kIo, kAborted, kMismatch };

  TransportError(Kind kind, int peer, const std::string& what)
      : std::runtime_error(what), kind_(kind), peer_(peer) {}

  Kind kind() const { return kind_; }
  int peer() const { return peer_; }  // -1 when no single peer is involved

 private:
  Kind kind_;
  int peer_;
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Blocking transfers of exactly `bytes` bytes. Throw TransportError on failure or deadline.
  virtual void send(int peer, const void* data, size_t bytes, Deadline deadline) = 0;
  virtual void recv(int peer, void* data, size_t bytes, Deadline deadline) = 0;

  // Sends to sendPeer while receiving from recvPeer, progressing both at once, so that a ring
  // step in which every rank sends and receives cannot deadlock on full socket buffers.
  virtual void sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer,
                        void* recvData, size_t recvBytes, Deadline deadline) = 0;

  // Arms the fingerprint check for the collective about to run (fingerprint.hpp): the first
  // message sent to each peer from now on carries `fingerprint`, and the first message received
  // from each peer must carry an equal one and the expected length, else that recv throws
  // TransportError(kMismatch). Worker thread only, like send/recv. A transport that was never
  // armed (the p2p mesh) sends and expects no headers.
  virtual void beginCollective(const Fingerprint& fingerprint) = 0;

  // Whether `peer` has closed its end (it exited or crashed): a liveness probe that neither
  // blocks nor consumes data, for paths that wait on something other than this transport
  // (shared memory). Worker thread only.
  virtual bool peerHungUp(int peer) = 0;
  // Whether a whole collective header from `peer` waits unread on this transport (it is in a
  // collective over this transport that this rank has not entered); copies it to *header without
  // consuming it. Neither blocks nor consumes data. Same thread as the collectives.
  virtual bool peekWaitingHeader(int peer, WireHeader* header) = 0;

  // "rank 3 (10.0.0.5:41234)": used in every error that names a peer.
  virtual std::string describePeer(int peer) const = 0;

  // Stops all traffic: blocked and later calls throw TransportError(kAborted). Idempotent.
  virtual void abort() = 0;
};

}  // namespace ddplite
