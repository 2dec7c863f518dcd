// Reduce-scatter through shared memory. The input is P blocks of B bytes; rank r ends with block r
// reduced over all ranks, in rank order (every element by one rank: deterministic).
//
// Steps, per chunk k (each block split into pieces of at most C/P bytes, so that the P pieces of
// one chunk fit one buffer): copy piece k of every block into this rank's buffer and post; once
// all have posted, reduce piece k of this rank's block over all buffers, in rank order, into
// place; mark consumed.
//
// Cost per rank (S = P*B): R = S (copy-in) + P*B (this rank's pieces of every buffer) = 2S,
// W = S + B; one synchronisation per chunk. Reduction work per rank: (P-1)*B.
#include "cpu/shm/shm_algorithms.hpp"

#include "common/errors.hpp"

#include <algorithm>
#include <cstring>

namespace ddplite::cpu::shm {

size_t reduceScatterPieceCount(size_t chunkBytes, int size, size_t elementSize) {
  return chunkBytes / static_cast<size_t>(size) / elementSize;
}

void reduceScatter(ShmGroup& group, const AlgorithmArgs& args) {
  const int size = group.size();
  const int rank = group.rank();
  const size_t es = args.elementSize;
  const size_t block = args.count * es;
  const size_t pieceCount = reduceScatterPieceCount(group.chunkBytes(), size, es);
  DDPLITE_ENFORCE(pieceCount > 0, "reduce_scatter through shared memory with ", size, " ranks of ", es,
                  "-byte elements in ", group.chunkBytes(), "-byte chunks (runCollective routes it over TCP)");
  char* mine = args.data + rank * block;
  for (size_t first = 0; first < args.count; first += pieceCount) {
    const size_t count = std::min(pieceCount, args.count - first);
    const size_t bytes = count * es;
    const uint32_t step = group.beginStep(args.deadline);
    char* buffer = group.buffer(rank, step);
    for (int owner = 0; owner < size; ++owner) {
      std::memcpy(buffer + owner * bytes, args.data + owner * block + first * es, bytes);
    }
    group.post(step, bytes * size);
    group.waitAllPosted(step, bytes * size, args.deadline);
    reduceInRankOrder(group, args, mine + first * es, rank * bytes, count, step);
    group.markConsumed(step);
  }
}

}  // namespace ddplite::cpu::shm
