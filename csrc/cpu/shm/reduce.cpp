// Reduce through shared memory: every rank copies its chunk in; the root reduces all P buffers in
// rank order into its own output.
//
// Steps, per chunk of at most C bytes: copy the chunk into this rank's buffer and post; the root
// waits for every post and reduces buffer 0, 1, ..., P-1 into its output; every rank marks the
// step consumed (a non-root may run one chunk ahead: its buffer for the next chunk is the other one).
//
// Cost: root R = P*S + S, W = S + S; others R = S, W = S; one synchronisation per chunk.
#include "cpu/shm/shm_algorithms.hpp"

#include <algorithm>
#include <cstring>

namespace ddplite::cpu::shm {

void reduce(ShmGroup& group, const AlgorithmArgs& args) {
  const size_t es = args.elementSize;
  const size_t chunkCount = std::max<size_t>(1, group.chunkBytes() / es);
  const bool root = group.rank() == args.root;
  for (size_t first = 0; first < args.count; first += chunkCount) {
    const size_t count = std::min(chunkCount, args.count - first);
    char* data = args.data + first * es;
    const uint32_t step = group.beginStep(args.deadline);
    std::memcpy(group.buffer(group.rank(), step), data, count * es);
    group.post(step, count * es);
    if (root) {
      group.waitAllPosted(step, count * es, args.deadline);
      reduceInRankOrder(group, args, data, 0, count, step);
    } else {
      // only the root's data is read, but the root's fingerprint is checked here too, so that
      // a rank in another collective is caught on both sides
      group.waitPosted(args.root, step, count * es, args.deadline);
    }
    group.markConsumed(step);
  }
}

}  // namespace ddplite::cpu::shm
