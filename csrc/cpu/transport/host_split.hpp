// A Transport for send/recv in a group across hosts: each peer on this host through `local` (the
// host's shared-memory channels, whose rank i is the group's rank localRanks[i]), every other
// peer through `remote` (a TCP mesh over the whole group). The P2pEngine runs on it as on any
// Transport; which path a peer takes is fixed when the group is made.
//
// Errors: a TransportError from `local` names the group's rank (its message already does, as
// the channels are told the group's ranks; its peer index is mapped back here).
// Threading: as the transports it routes to (one thread per ring or socket; abort() from any).
#pragma once

#include "cpu/transport/transport.hpp"

#include <memory>
#include <vector>

namespace ddplite {

class HostSplitTransport final : public Transport {
 public:
  // `liveness` is what `local` was created with (it must outlive it): owned here, destroyed last.
  HostSplitTransport(std::unique_ptr<Transport> liveness, std::unique_ptr<Transport> local, std::vector<int> localRanks,
                     std::unique_ptr<Transport> remote);

  int rank() const override { return remote_->rank(); }
  int size() const override { return remote_->size(); }
  void send(int peer, const void* data, size_t bytes, Deadline deadline) override;
  void recv(int peer, void* data, size_t bytes, Deadline deadline) override;
  // Both peers must take the same path (the P2pEngine never calls it; nothing else runs here).
  void sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData, size_t recvBytes,
                Deadline deadline) override;
  void beginCollective(const Fingerprint& fingerprint) override { remote_->beginCollective(fingerprint); }
  bool peerHungUp(int peer) override;
  bool peekWaitingHeader(int peer, WireHeader* header) override;
  std::string describePeer(int peer) const override;
  void abort() override;

 private:
  // `peer`'s index among the local ranks, or -1 when it is on another host.
  int localIndex(int peer) const;
  // Runs `call` on `local`, mapping a TransportError's peer back to the group's rank.
  template <typename Call>
  void onLocal(Call&& call);

  std::unique_ptr<Transport> liveness_;
  std::unique_ptr<Transport> local_;
  std::vector<int> localIndex_;  // by group rank: index among the local ranks, or -1
  std::vector<int> localRanks_;
  std::unique_ptr<Transport> remote_;
};

}  // namespace ddplite
