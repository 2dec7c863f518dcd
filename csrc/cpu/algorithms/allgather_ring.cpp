// Allgather, ring.
//
// `data` holds P blocks of `count` elements; on entry block `rank` holds this rank's input.
// Step s = 0 .. P-2: send block (rank - s) to next while receiving block (rank - s - 1) from prev
// straight into place.
//
// Cost: (P-1) alpha + (P-1)/P S beta, S = the gathered size; every rank sends (P-1) blocks.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void allgatherRing(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  const size_t blockBytes = args.count * args.elementSize;
  if (size == 1 || blockBytes == 0) {
    return;
  }
  const int next = (rank + 1) % size;
  const int prev = (rank - 1 + size) % size;
  for (int step = 0; step < size - 1; ++step) {
    const int sendBlock = (rank - step + size) % size;
    const int recvBlock = (rank - step - 1 + size) % size;
    transport.sendRecv(next, args.data + sendBlock * blockBytes, blockBytes, prev, args.data + recvBlock * blockBytes,
                       blockBytes, args.deadline);
  }
}

}  // namespace ddplite::cpu
