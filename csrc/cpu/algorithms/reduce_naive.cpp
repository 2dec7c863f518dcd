// Reduce, naive: every rank sends its buffer straight to the root.
//
// Steps: each non-root rank sends its whole buffer to the root, one message per chunk of C =
// DDPLITE_TREE_CHUNK_BYTES bytes. The root, chunk by chunk (C bounds its scratch), receives the
// chunk of every other rank in rank order and reduces it into its own buffer.
//
// Cost: (P-1) (alpha + S beta + S gamma) at the root, which receives everything: one hop of
// latency, but the root's link carries (P-1) S bytes.
#include "common/env.hpp"
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void reduceNaive(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int size = transport.size();
  if (size == 1 || args.count == 0) {
    return;
  }
  const size_t chunkElements = std::max<size_t>(1, static_cast<size_t>(env::treeChunkBytes()) / args.elementSize);
  if (transport.rank() != args.root) {
    // In the root's chunks: both ends of a stream frame it alike (fingerprint length check).
    for (size_t first = 0; first < args.count; first += chunkElements) {
      const size_t elements = std::min(chunkElements, args.count - first);
      transport.send(args.root, args.data + first * args.elementSize, elements * args.elementSize, args.deadline);
    }
    return;
  }
  char* incoming = args.scratch.get(std::min(chunkElements, args.count) * args.elementSize);
  for (size_t first = 0; first < args.count; first += chunkElements) {
    const size_t elements = std::min(chunkElements, args.count - first);
    char* piece = args.data + first * args.elementSize;
    for (int peer = 0; peer < size; ++peer) {
      if (peer == args.root) continue;
      transport.recv(peer, incoming, elements * args.elementSize, args.deadline);
      args.reduce(piece, incoming, elements);
    }
  }
}

}  // namespace ddplite::cpu
