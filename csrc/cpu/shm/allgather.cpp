// Allgather through shared memory: block by block, in chunks of at most C bytes per rank.
//
// Steps, per chunk k of the blocks (each rank's block is split alike): copy chunk k of this
// rank's block into its buffer and post; once all have posted, copy chunk k of every other
// rank's block out of its buffer into place; mark consumed.
//
// Cost per rank, B = the block (S = P*B gathered): R = B + (P-1)*B = S, W = B + (P-1)*B = S;
// one synchronisation per chunk.
//
// gatherParts (the rails' last step across hosts, cpu/hierarchy/allreduce_hierarchical.cpp): the
// buffer is `parts` balanced parts, part j valid at its owner, rank j mod P; every rank ends with
// all of them. Per step each owner copies a piece of each part it owns (the same piece of every
// part, at most C bytes in all) into its buffer and posts; once all have posted, every rank
// copies the pieces of the parts it does not own out; mark consumed.
//   Cost per rank, S the buffer: R = S, W = S; one synchronisation per step, as many steps as
//   the longest part needs.
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

void gatherParts(ShmGroup& group, const AlgorithmArgs& args, int parts) {
  const int size = group.size();
  const int rank = group.rank();
  const size_t es = args.elementSize;
  const size_t partsPerRank = (static_cast<size_t>(parts) + size - 1) / size;  // the most one rank owns
  const size_t piece = std::max<size_t>(1, group.chunkBytes() / es / partsPerRank);  // elements per part and step
  const size_t longest = partBegin(args.count, parts, 1);  // part 0 is never shorter than another
  auto partAt = [&](int part) { return partBegin(args.count, parts, part); };
  auto partLength = [&](int part) { return partAt(part + 1) - partAt(part); };
  for (size_t first = 0; first < longest; first += piece) {
    const uint32_t step = group.beginStep(args.deadline);
    const size_t stepBytes = std::min(piece, longest - first) * partsPerRank * es;  // alike on every rank
    char* mine = group.buffer(rank, step);
    for (int part = rank; part < parts; part += size) {  // the k-th part a rank owns: slot k = part / size
      const size_t length = partLength(part);
      const size_t count = first < length ? std::min(piece, length - first) : 0;
      if (count == 0) continue;
      std::memcpy(mine + static_cast<size_t>(part / size) * piece * es, args.data + (partAt(part) + first) * es,
                  count * es);
    }
    group.post(step, stepBytes);
    group.waitAllPosted(step, stepBytes, args.deadline);
    for (int part = 0; part < parts; ++part) {
      const int owner = part % size;
      const size_t length = partLength(part);
      if (owner == rank || first >= length) continue;
      std::memcpy(args.data + (partAt(part) + first) * es,
                  group.buffer(owner, step) + static_cast<size_t>(part / size) * piece * es,
                  std::min(piece, length - first) * es);
    }
    group.markConsumed(step);
  }
}

}  // namespace ddplite::cpu::shm
