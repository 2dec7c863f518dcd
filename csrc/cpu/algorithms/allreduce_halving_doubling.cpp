// Allreduce, halving-doubling (Rabenseifner): a recursive-halving reduce-scatter followed by a
// recursive-doubling allgather.
//
// Steps (participants and the fold: see Fold in algorithm.hpp):
//   fold:     an even rank r < 2*extra sends its buffer to r+1, which reduces it into its own;
//   halving:  the buffer is split into p2 balanced ranges; at each of log2(p2) steps a
//             participant sends half of its current range to its partner and reduces the half it
//             receives, ending with its own range fully reduced;
//   doubling: the reverse exchange pattern gathers every reduced range on every participant;
//   unfold:   rank r+1 sends the result back to r.
//
// Cost: 2 log2(p2) alpha + 2 (p2-1)/p2 S beta + (p2-1)/p2 S gamma (+ 2 (alpha + S beta) + S gamma
// when P is not a power of two). Ring's bandwidth with log instead of linear latency.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

namespace {

void halvingThenDoubling(const AlgorithmArgs& args, const Fold& fold, char* incoming) {
  std::vector<size_t> offsets(fold.p2 + 1);
  for (int v = 0; v <= fold.p2; ++v) offsets[v] = partBegin(args.count, fold.p2, v) * args.elementSize;
  halvingReduceScatter(args, fold, offsets, incoming);
  doublingAllgather(args, fold, offsets);
}

}  // namespace

void allreduceHalvingDoubling(const AlgorithmArgs& args) {
  foldedAllreduce(args, &halvingThenDoubling);
}

}  // namespace ddplite::cpu
