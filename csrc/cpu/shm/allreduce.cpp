// Allreduce through shared memory, chunk by chunk (C bytes at most per step). Every element is
// reduced in rank order 0, 1, ..., P-1 by exactly one rank, so every rank ends with the same bits.
//
// Small chunks (S <= kReduceAllBytes), one synchronisation: every rank copies its chunk into its
// buffer and posts; once all have posted, every rank reduces all P buffers, in rank order, into
// its own output; marks the step consumed.
//   Cost per rank: R = P*S, W = 2*S (copy-in, output); 1 synchronisation.
// With an arrival tree (from 3 ranks on a host by default), combined on arrival instead: every
// rank copies its chunk in and posts; the rank whose arrival completes the tree reduces all P
// buffers, in rank order, into its output and its own buffer before it releases the step
// (ShmGroup::postCombining); the others copy the result out of that one buffer. Same bits as above.
//   Cost: the combiner R = P*S, W = 3*S; the others R = S, W = 2*S; 1 synchronisation. So the host
//   reads (2P-1)*S bytes per step instead of P*P*S.
//
// Large chunks, reduce-scatter then allgather in place, two synchronisations per chunk:
//   1. copy the chunk into this rank's buffer; post;
//   2. once all have posted: reduce this rank's slice (1/P of the chunk, partBegin) over all
//      buffers into this rank's own buffer, in place; mark reduced;
//   3. once all have reduced: copy every rank's reduced slice out of its buffer into the output;
//      mark consumed. Two buffers per rank let step 1 of chunk k+1 overlap steps 2-3 of chunk k
//      on the slower ranks.
//   Cost per rank: R = S (copy-in) + S (slices of all buffers) + S (copy-out) = 3S,
//   W = S + S/P + S; 2 synchronisations per chunk. Reduction work per rank: S/P * (P-1).
//
// reduceToParts (the rails' first step across hosts, cpu/hierarchy/allreduce_hierarchical.cpp):
// the large-chunk steps above, but in step 3 each rank copies out only what falls in the parts it
// owns (part j of `parts` balanced parts of the buffer, owned by rank j mod P), whatever the size.
//   Cost per rank: R = S + S + S/P (one part of P), W = S + S/P + S/P; the reduction is spread
//   over the P ranks as above.
#include "cpu/shm/shm_algorithms.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddplite::cpu::shm {

namespace {

constexpr size_t kReduceAllBytes = 16 * 1024;

// The elements [begin, end) of the whole buffer (not of a chunk).
struct ElementRange {
  size_t begin = 0;
  size_t end = 0;
};

// The parts of `parts` balanced parts of `count` elements that rank `rank` of `size` owns: j = rank,
// rank + size, ...
std::vector<ElementRange> ownedParts(size_t count, int parts, int size, int rank) {
  std::vector<ElementRange> owned;
  for (int part = rank; part < parts; part += size) {
    owned.push_back({partBegin(count, static_cast<size_t>(parts), static_cast<size_t>(part)),
                     partBegin(count, static_cast<size_t>(parts), static_cast<size_t>(part) + 1)});
  }
  return owned;
}

// Steps 2 and 3 of the large chunks, for the chunk of `count` elements that starts at element
// `first` of the buffer: every element of the chunk is copied out, or (`keep` non-null) only
// those in `keep`'s ranges.
void reduceScatterAllgather(ShmGroup& group, const AlgorithmArgs& args, char* out, size_t count, uint32_t step,
                            size_t first = 0, const std::vector<ElementRange>* keep = nullptr) {
  const int size = group.size();
  const int rank = group.rank();
  const size_t es = args.elementSize;
  const size_t begin = partBegin(count, size, rank);
  const size_t sliceCount = partBegin(count, size, rank + 1) - begin;
  char* mine = group.buffer(rank, step) + begin * es;
  if (sliceCount > 0) {
    reduceInRankOrder(group, args, out + begin * es, begin * es, sliceCount, step);
    std::memcpy(mine, out + begin * es, sliceCount * es);
  }
  group.markReduced(step);
  group.waitAllReduced(step, args.deadline);
  for (int owner = 0; owner < size; ++owner) {
    if (owner == rank) continue;
    const size_t from = partBegin(count, size, owner);
    const size_t to = partBegin(count, size, owner + 1);
    if (keep == nullptr) {
      std::memcpy(out + from * es, group.buffer(owner, step) + from * es, (to - from) * es);
      continue;
    }
    for (const ElementRange& range : *keep) {  // in the buffer's numbering; the chunk's starts at `first`
      const size_t lo = std::max(first + from, range.begin);
      const size_t hi = std::min(first + to, range.end);
      if (lo < hi) std::memcpy(out + (lo - first) * es, group.buffer(owner, step) + (lo - first) * es, (hi - lo) * es);
    }
  }
}

// This rank's chunk is in its buffer for `step`. Posts it; whichever rank completes the step
// reduces for everyone (on its collective thread, inside its post); the others copy its result.
void combinedOnArrival(ShmGroup& group, const AlgorithmArgs& args, char* out, size_t count, uint32_t step) {
  const size_t bytes = count * args.elementSize;
  group.postCombining(step, bytes, [&] {
    reduceInRankOrder(group, args, out, 0, count, step);
    std::memcpy(group.buffer(group.rank(), step), out, bytes);  // the input is no longer needed
  });
  group.waitAllPosted(step, bytes, args.deadline);
  const int combiner = group.combinedBy(step);
  if (combiner != group.rank()) std::memcpy(out, group.buffer(combiner, step), bytes);
}

}  // namespace

void reduceToParts(ShmGroup& group, const AlgorithmArgs& args, int parts) {
  const size_t es = args.elementSize;
  const size_t chunkCount = std::max<size_t>(1, group.chunkBytes() / es);
  const std::vector<ElementRange> owned = ownedParts(args.count, parts, group.size(), group.rank());
  for (size_t first = 0; first < args.count; first += chunkCount) {
    const size_t count = std::min(chunkCount, args.count - first);
    char* out = args.data + first * es;
    const uint32_t step = group.beginStep(args.deadline);
    std::memcpy(group.buffer(group.rank(), step), out, count * es);
    group.post(step, count * es);
    group.waitAllPosted(step, count * es, args.deadline);
    reduceScatterAllgather(group, args, out, count, step, first, &owned);
    group.markConsumed(step);
  }
}

void allreduce(ShmGroup& group, const AlgorithmArgs& args) {
  const size_t es = args.elementSize;
  const size_t total = args.count * es;
  const size_t chunkCount = std::max<size_t>(1, group.chunkBytes() / es);
  const bool small = total <= kReduceAllBytes;
  for (size_t first = 0; first < args.count; first += chunkCount) {
    const size_t count = std::min(chunkCount, args.count - first);
    char* out = args.data + first * es;
    const uint32_t step = group.beginStep(args.deadline);
    std::memcpy(group.buffer(group.rank(), step), out, count * es);
    if (small && group.combinesOnArrival()) {
      combinedOnArrival(group, args, out, count, step);
    } else {
      group.post(step, count * es);
      group.waitAllPosted(step, count * es, args.deadline);
      if (small) {
        reduceInRankOrder(group, args, out, 0, count, step);
      } else {
        reduceScatterAllgather(group, args, out, count, step);
      }
    }
    group.markConsumed(step);
  }
}

}  // namespace ddplite::cpu::shm
