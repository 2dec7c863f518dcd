// TCP transport: one full-duplex socket per pair of ranks (a full mesh), set up through the
// store: every rank listens on the address net::chooseListenAddress picks, publishes
// "ip:port", connects to every lower rank and accepts every higher one.
//
// Sockets are non-blocking with TCP_NODELAY. A transfer first tries the syscall directly (the
// common case for small messages costs one syscall) and falls back to poll() only when the
// kernel would block; poll wakes at least every kPollSliceMs to notice abort() and deadlines.
#pragma once

#include "cpu/transport/transport.hpp"
#include "rendezvous/store.hpp"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace ddplite {

class TcpTransport final : public Transport {
 public:
  // Collective over the group: returns once every pair is connected. Throws DistBackendError
  // naming the unreachable peer if a connection cannot be made before `deadline`. `purpose`
  // keeps the store keys of several meshes of one group apart ("" for the collectives' mesh).
  static std::unique_ptr<TcpTransport> connectFullMesh(StoreRendezvous& rendezvous, int rank, int size,
                                                       Deadline deadline, const std::string& purpose = "");
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* data, size_t bytes, Deadline deadline) override;
  void recv(int peer, void* data, size_t bytes, Deadline deadline) override;
  void sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                size_t recvBytes, Deadline deadline) override;
  std::string describePeer(int peer) const override;
  void abort() override;

 private:
  TcpTransport(int rank, int size);

  // One direction of a transfer in progress.
  struct Progress {
    int peer;
    char* cursor;
    size_t left;
  };
  void transfer(Progress* sending, Progress* receiving, Deadline deadline);
  bool trySend(Progress& progress);
  bool tryRecv(Progress& progress);
  [[noreturn]] void throwIoError(int peer, const char* syscall, int error) const;
  [[noreturn]] void throwTimeout(const Progress* sending, const Progress* receiving) const;
  void checkPeer(int peer) const;

  const int rank_;
  const int size_;
  std::vector<int> fds_;               // fds_[peer]; -1 for self
  std::vector<std::string> addresses_; // "ip:port" each rank listens on
  std::atomic<bool> aborted_{false};
};

}  // namespace ddplite
