// Allreduce, naive: reduce everything at rank 0, then send the result back out.
//
// Steps: reduceNaive to rank 0 (every other rank sends its buffer; rank 0 receives them in rank
// order, chunk by chunk, reducing each into its own), then broadcastNaive from rank 0 (rank 0
// sends the result to each rank in turn).
//
// Cost: 2 (P-1) (alpha + S beta) + (P-1) S gamma, all of it serialised through rank 0. The fewest
// messages per rank (2) for everyone but rank 0, which is why it can win for tiny buffers on 2
// ranks; it loses to every other algorithm as P or S grows.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void allreduceNaive(const AlgorithmArgs& args) {
  if (args.transport.size() == 1 || args.count == 0) {
    return;
  }
  AlgorithmArgs atRoot = args;
  atRoot.root = 0;
  reduceNaive(atRoot);
  broadcastNaive(atRoot);
}

}  // namespace ddplite::cpu
