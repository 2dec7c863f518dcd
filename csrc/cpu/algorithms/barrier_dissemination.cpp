// Barrier, dissemination (Hensgen, Finkel and Manber, 1988).
//
// Round k = 1, 2, 4, ... < P: send one byte to rank + k while receiving one from rank - k.
// After ceil(log2 P) rounds every rank has heard, directly or transitively, from every other,
// so no rank leaves before all have entered.
//
// Cost: ceil(log2 P) alpha; no data.
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void barrierDissemination(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  char token = 1;
  char received = 0;
  for (int distance = 1; distance < size; distance *= 2) {
    transport.sendRecv((rank + distance) % size, &token, 1, (rank - distance + size) % size, &received, 1,
                       args.deadline);
  }
}

}  // namespace ddplite::cpu
