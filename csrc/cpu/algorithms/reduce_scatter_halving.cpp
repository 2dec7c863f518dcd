// Reduce-scatter, recursive halving.
//
// `data` holds P blocks (a working copy of the input); block b ends reduced at rank b.
// Steps (participants and the fold: see Fold in algorithm.hpp): an even rank r < 2*extra sends
// all P blocks to r+1, which reduces them into its own; the participants then halve (each step
// sends the half of the current block range that the partner's side keeps and reduces the half
// received), so participant v ends with the blocks of its ranks reduced; rank r+1 finally sends
// block r back to r.
//
// Cost: log2(p2) alpha + (p2-1)/p2 S beta + (p2-1)/p2 S gamma (+ alpha + S beta + S gamma when P is
// not a power of two). Fewer messages than the ring, the same bytes: better for small blocks.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void reduceScatterHalving(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  const size_t blockBytes = args.count * args.elementSize;
  const size_t totalBytes = blockBytes * size;
  if (size == 1 || blockBytes == 0) {
    return;
  }
  const Fold fold = Fold::of(rank, size);
  if (fold.participant < 0) {
    transport.send(rank + 1, args.data, totalBytes, args.deadline);
    transport.recv(rank + 1, args.data + rank * blockBytes, blockBytes, args.deadline);
    return;
  }
  char* incoming = args.scratch.get(totalBytes);
  const bool foldedPair = rank < 2 * fold.extra;
  if (foldedPair) {
    transport.recv(rank - 1, incoming, totalBytes, args.deadline);
    args.reduce(args.data, incoming, args.count * size);
  }
  std::vector<size_t> offsets(fold.p2 + 1);
  for (int v = 0; v <= fold.p2; ++v) offsets[v] = static_cast<size_t>(fold.firstRank(v)) * blockBytes;
  halvingReduceScatter(args, fold, offsets, incoming);
  if (foldedPair) {
    transport.send(rank - 1, args.data + (rank - 1) * blockBytes, blockBytes, args.deadline);
  }
}

}  // namespace ddplite::cpu
