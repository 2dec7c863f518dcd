// Allreduce, butterfly (recursive doubling).
//
// Steps (participants and the fold for P not a power of two: see Fold in algorithm.hpp):
//   fold:      an even rank r < 2*extra sends its buffer to r+1, which reduces it into its own;
//   butterfly: for distance d = 1, 2, 4, ... < p2, participant v swaps its whole buffer with
//              participant v XOR d and reduces what it receives;
//   unfold:    rank r+1 sends the result back to r.
// Both sides of every swap reduce the same two values, and the reduction ops are commutative, so
// every rank ends with bit-identical results.
//
// Cost: log2(p2) (alpha + S beta + S gamma), plus 2 (alpha + S beta) + S gamma when P is not a
// power of two. The fewest latency terms of any allreduce here, but it moves S per step instead
// of S/P: the choice for small buffers.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

namespace {

void recursiveDoubling(const AlgorithmArgs& args, const Fold& fold, char* incoming) {
  const size_t bytes = args.count * args.elementSize;
  for (int distance = 1; distance < fold.p2; distance *= 2) {
    const int partner = fold.realRank(fold.participant ^ distance);
    args.transport.sendRecv(partner, args.data, bytes, partner, incoming, bytes, args.deadline);
    args.reduce(args.data, incoming, args.count);
  }
}

}  // namespace

void allreduceButterfly(const AlgorithmArgs& args) {
  foldedAllreduce(args, &recursiveDoubling);
}

}  // namespace ddplite::cpu
