// Broadcast, naive: the root sends the whole buffer to every other rank, one after another.
//
// Steps: the root sends S bytes to each rank in rank order; every other rank receives once.
//
// Cost: (P-1) (alpha + S beta) at the root. One hop of latency for everyone, which suits tiny
// buffers on few ranks; the root's link carries (P-1) S bytes, so it loses as S or P grows.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void broadcastNaive(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const size_t bytes = args.count * args.elementSize;
  if (transport.size() == 1 || bytes == 0) {
    return;
  }
  if (transport.rank() != args.root) {
    transport.recv(args.root, args.data, bytes, args.deadline);
    return;
  }
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer != args.root) transport.send(peer, args.data, bytes, args.deadline);
  }
}

}  // namespace ddplite::cpu
