// Allgather, recursive doubling.
//
// `data` holds P blocks; block `rank` is filled on entry, all of them on exit.
// Steps (participants and the fold: see Fold in algorithm.hpp): an even rank r < 2*extra sends its
// block to r+1; participants then exchange, at distance d = 1, 2, 4, ... < p2, the d participants'
// worth of blocks they hold with participant v XOR d; rank r+1 finally sends everything to r.
//
// Cost: log2(p2) alpha + (p2-1)/p2 S beta, S = the gathered size (+ 2 alpha + S beta when P is not
// a power of two). Fewer messages than the ring for the same bytes: better for small blocks.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void allgatherDoubling(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  const size_t blockBytes = args.count * args.elementSize;
  if (size == 1 || blockBytes == 0) {
    return;
  }
  const Fold fold = Fold::of(rank, size);
  if (fold.participant < 0) {
    transport.send(rank + 1, args.data + rank * blockBytes, blockBytes, args.deadline);
    transport.recv(rank + 1, args.data, blockBytes * size, args.deadline);
    return;
  }
  const bool foldedPair = rank < 2 * fold.extra;
  if (foldedPair) {
    transport.recv(rank - 1, args.data + (rank - 1) * blockBytes, blockBytes, args.deadline);
  }
  std::vector<size_t> offsets(fold.p2 + 1);
  for (int v = 0; v <= fold.p2; ++v) offsets[v] = static_cast<size_t>(fold.firstRank(v)) * blockBytes;
  doublingAllgather(args, fold, offsets);
  if (foldedPair) {
    transport.send(rank - 1, args.data, blockBytes * size, args.deadline);
  }
}

}  // namespace ddplite::cpu
