// Allreduce, ring: reduce-scatter then allgather (bandwidth-optimal), in rounds of segments.
//
// The buffer is processed in rounds of at most P * G elements (G = DDPLITE_RING_SEGMENT_BYTES
// worth of elements), each round split into P balanced segments. With next = rank+1 and
// prev = rank-1 (mod P):
//   reduce-scatter, step s = 0 .. P-2: send segment (rank - s) to next while receiving segment
//     (rank - s - 1) from prev into scratch; reduce it into place. After P-1 steps this rank
//     holds the fully reduced segment (rank + 1).
//   allgather, step s = 0 .. P-2: send segment (rank + 1 - s) to next while receiving segment
//     (rank - s) from prev straight into place.
// Sends and receives of a step progress together (Transport::sendRecv), so the ring cannot
// deadlock on full socket buffers.
//
// Cost: 2 (P-1) alpha + 2 (P-1)/P S beta + (P-1)/P S gamma per round; every rank sends and
// receives 2 (P-1)/P S bytes in all, the lower bound for allreduce.
#include "common/env.hpp"
#include "cpu/algorithms/algorithm.hpp"

#include <algorithm>

namespace ddplite::cpu {

void allreduceRing(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  if (size == 1 || args.count == 0) {
    return;
  }
  const int next = (rank + 1) % size;
  const int prev = (rank - 1 + size) % size;
  const size_t es = args.elementSize;
  const size_t segmentElements = std::max<size_t>(1, static_cast<size_t>(env::ringSegmentBytes()) / es);
  const size_t roundElements = segmentElements * size;
  char* incoming = args.scratch.get((std::min(roundElements, args.count) / size + 1) * es);

  for (size_t roundBegin = 0; roundBegin < args.count; roundBegin += roundElements) {
    const size_t n = std::min(roundElements, args.count - roundBegin);
    char* base = args.data + roundBegin * es;
    auto segment = [&](int index) { return base + partBegin(n, size, index) * es; };
    auto segmentCount = [&](int index) { return partBegin(n, size, index + 1) - partBegin(n, size, index); };

    for (int step = 0; step < size - 1; ++step) {
      const int sendIndex = (rank - step + size) % size;
      const int recvIndex = (rank - step - 1 + size) % size;
      const size_t recvCount = segmentCount(recvIndex);
      transport.sendRecv(next, segment(sendIndex), segmentCount(sendIndex) * es, prev, incoming, recvCount * es,
                         args.deadline);
      args.reduce(segment(recvIndex), incoming, recvCount);
    }
    for (int step = 0; step < size - 1; ++step) {
      const int sendIndex = (rank - step + 1 + size) % size;
      const int recvIndex = (rank - step + size) % size;
      transport.sendRecv(next, segment(sendIndex), segmentCount(sendIndex) * es, prev, segment(recvIndex),
                         segmentCount(recvIndex) * es, args.deadline);
    }
  }
}

}  // namespace ddplite::cpu
