// Allgather through shared memory: block by block, in chunks of at most C bytes per rank.
//
// Steps, per chunk k of the blocks (each rank's block is split alike): copy chunk k of this
// rank's block into its buffer and post; once all have posted, copy chunk k of every other
// rank's block out of its buffer into place; mark consumed.
//
// Cost per rank, B = the block (S = P*B gathered): R = B + (P-1)*B = S, W = B + (P-1)*B = S;
// one synchronisation per chunk.
#include "cpu/shm/shm_algorithms.hpp"

#include <algorithm>
#include <cstring>

namespace ddplite::cpu::shm {

void allgather(ShmGroup& group, const AlgorithmArgs& args) {
  const size_t block = args.count * args.elementSize;
  const int rank = group.rank();
  for (size_t offset = 0; offset < block; offset += group.chunkBytes()) {
    const size_t bytes = std::min(group.chunkBytes(), block - offset);
    const uint32_t step = group.beginStep(args.deadline);
    std::memcpy(group.buffer(rank, step), args.data + rank * block + offset, bytes);
    group.post(step, bytes);
    group.waitAllPosted(step, bytes, args.deadline);
    for (int owner = 0; owner < group.size(); ++owner) {
      if (owner != rank) std::memcpy(args.data + owner * block + offset, group.buffer(owner, step), bytes);
    }
    group.markConsumed(step);
  }
}

}  // namespace ddplite::cpu::shm
