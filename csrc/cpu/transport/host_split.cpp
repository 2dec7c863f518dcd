#include "cpu/transport/host_split.hpp"

#include "common/errors.hpp"

namespace ddplite {

HostSplitTransport::HostSplitTransport(std::unique_ptr<Transport> liveness, std::unique_ptr<Transport> local,
                                       std::vector<int> localRanks, std::unique_ptr<Transport> remote)
    : liveness_(std::move(liveness)),
      local_(std::move(local)),
      localIndex_(static_cast<size_t>(remote->size()), -1),
      localRanks_(std::move(localRanks)),
      remote_(std::move(remote)) {
  for (size_t i = 0; i < localRanks_.size(); ++i) localIndex_.at(static_cast<size_t>(localRanks_[i])) = static_cast<int>(i);
  DDPLITE_ENFORCE(localIndex(remote_->rank()) == local_->rank(), "rank ", remote_->rank(),
                  " is not where the local ranks say it is");
}

int HostSplitTransport::localIndex(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(localIndex_.size())) return -1;
  return localIndex_[static_cast<size_t>(peer)];
}

template <typename Call>
void HostSplitTransport::onLocal(Call&& call) {
  try {
    call();
  } catch (const TransportError& error) {
    const int peer = error.peer() >= 0 && error.peer() < static_cast<int>(localRanks_.size())
                         ? localRanks_[static_cast<size_t>(error.peer())]
                         : -1;
    throw TransportError(error.kind(), peer, error.what());
  }
}

void HostSplitTransport::send(int peer, const void* data, size_t bytes, Deadline deadline) {
  const int index = localIndex(peer);
  if (index < 0) return remote_->send(peer, data, bytes, deadline);
  onLocal([&] { local_->send(index, data, bytes, deadline); });
}

void HostSplitTransport::recv(int peer, void* data, size_t bytes, Deadline deadline) {
  const int index = localIndex(peer);
  if (index < 0) return remote_->recv(peer, data, bytes, deadline);
  onLocal([&] { local_->recv(index, data, bytes, deadline); });
}

void HostSplitTransport::sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                                  size_t recvBytes, Deadline deadline) {
  const int sendIndex = localIndex(sendPeer);
  const int recvIndex = localIndex(recvPeer);
  DDPLITE_ENFORCE((sendIndex < 0) == (recvIndex < 0), "sendRecv between rank ", sendPeer, " and rank ", recvPeer,
                  ": one is on this host, the other is not");
  if (sendIndex < 0) return remote_->sendRecv(sendPeer, sendData, sendBytes, recvPeer, recvData, recvBytes, deadline);
  onLocal([&] { local_->sendRecv(sendIndex, sendData, sendBytes, recvIndex, recvData, recvBytes, deadline); });
}

bool HostSplitTransport::peerHungUp(int peer) {
  const int index = localIndex(peer);
  return index < 0 ? remote_->peerHungUp(peer) : local_->peerHungUp(index);
}

bool HostSplitTransport::peekWaitingHeader(int peer, WireHeader* header) {
  const int index = localIndex(peer);
  return index < 0 ? remote_->peekWaitingHeader(peer, header) : local_->peekWaitingHeader(index, header);
}

std::string HostSplitTransport::describePeer(int peer) const {
  const int index = localIndex(peer);
  return index < 0 ? remote_->describePeer(peer) : local_->describePeer(index);
}

void HostSplitTransport::abort() {
  local_->abort();
  remote_->abort();
}

}  // namespace ddplite
