#include "cpu/transport/rank_view.hpp"

#include "common/errors.hpp"

#include <algorithm>

namespace ddplite {

RankView::RankView(Transport& base, std::vector<int> ranks) : base_(base), ranks_(std::move(ranks)) {
  const auto mine = std::find(ranks_.begin(), ranks_.end(), base.rank());
  DDPLITE_ENFORCE(mine != ranks_.end(), "a rank view must hold its own rank");
  rank_ = static_cast<int>(mine - ranks_.begin());
}

void RankView::send(int peer, const void* data, size_t bytes, Deadline deadline) {
  base_.send(baseRank(peer), data, bytes, deadline);
}

void RankView::recv(int peer, void* data, size_t bytes, Deadline deadline) {
  base_.recv(baseRank(peer), data, bytes, deadline);
}

void RankView::sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                        size_t recvBytes, Deadline deadline) {
  base_.sendRecv(baseRank(sendPeer), sendData, sendBytes, baseRank(recvPeer), recvData, recvBytes, deadline);
}

}  // namespace ddplite
