// A Transport over some of another transport's ranks: view rank i is base rank ranks[i]. Lets the
// algorithms, and a ShmGroup's liveness probe, run among a subset of a group's ranks (the leaders
// of the hosts, the ranks of one host) over the group's own connections.
//
// Every call forwards to the base with the peer mapped; errors name base ranks (describePeer
// forwards too). Same threading contract as the base: one worker thread, abort() from anywhere.
#pragma once

#include "cpu/transport/transport.hpp"

#include <vector>

namespace ddplite {

class RankView : public Transport {
 public:
  // `ranks` in view order; must hold base.rank().
  RankView(Transport& base, std::vector<int> ranks);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  // The base rank of view rank `peer`.
  int baseRank(int peer) const { return ranks_.at(static_cast<size_t>(peer)); }

  void send(int peer, const void* data, size_t bytes, Deadline deadline) override;
  void recv(int peer, void* data, size_t bytes, Deadline deadline) override;
  void sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData, size_t recvBytes,
                Deadline deadline) override;
  // Arms the whole base mesh, not only the view's sockets: a header from a rank outside the view
  // that is already in a later op is tolerated there, and one from another op is reported early.
  void beginCollective(const Fingerprint& fingerprint) override { base_.beginCollective(fingerprint); }
  bool peerHungUp(int peer) override { return base_.peerHungUp(baseRank(peer)); }
  bool peekWaitingHeader(int peer, WireHeader* header) override {
    return base_.peekWaitingHeader(baseRank(peer), header);
  }
  std::string describePeer(int peer) const override { return base_.describePeer(baseRank(peer)); }
  // Aborts the base mesh: a view has no connections of its own to stop.
  void abort() override { base_.abort(); }

 private:
  Transport& base_;
  std::vector<int> ranks_;
  int rank_ = -1;
};

}  // namespace ddplite
