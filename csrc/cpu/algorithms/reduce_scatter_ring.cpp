// Reduce-scatter, ring.
//
// `data` holds P blocks (a working copy of the input); block b ends reduced at rank b.
// Step s = 0 .. P-2: send block (rank - s - 1) to next while receiving block (rank - s - 2) from
// prev into scratch, and reduce it into place. Block b starts its trip at rank b+1 and, after
// P-1 hops that each add one rank's contribution, arrives complete at rank b.
//
// Cost: (P-1) (alpha + S/P beta + S/P gamma), S = the whole input: every rank sends and receives
// (P-1)/P S bytes, the lower bound.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void reduceScatterRing(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  const size_t blockBytes = args.count * args.elementSize;
  if (size == 1 || blockBytes == 0) {
    return;
  }
  const int next = (rank + 1) % size;
  const int prev = (rank - 1 + size) % size;
  char* incoming = args.scratch.get(blockBytes);
  auto block = [&](int index) { return args.data + static_cast<size_t>((index % size + size) % size) * blockBytes; };
  for (int step = 0; step < size - 1; ++step) {
    transport.sendRecv(next, block(rank - step - 1), blockBytes, prev, incoming, blockBytes, args.deadline);
    args.reduce(block(rank - step - 2), incoming, args.count);
  }
}

}  // namespace ddplite::cpu
