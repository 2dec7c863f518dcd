// Broadcast through shared memory, chunk by chunk.
//
// Steps, for each chunk of at most C bytes: the root copies it into its buffer and posts; every
// other rank posts (its fingerprint only), waits for the root's post, copies the chunk out of the
// root's buffer and marks the step consumed. For the first chunk, every rank checks every other
// rank's post (same broadcast, same root) without waiting for it now: at its next step, or at
// shutdown when the broadcast was its last op (ShmGroup::checkAllPostedLater). With two buffers
// the root copies chunk k+1 in while the others still copy chunk k out.
//
// Cost per rank: root R = W = S; others R = W = S; one synchronisation per chunk.
#include "cpu/shm/shm_algorithms.hpp"

#include <algorithm>
#include <cstring>

namespace ddplite::cpu::shm {

void broadcast(ShmGroup& group, const AlgorithmArgs& args) {
  const size_t total = args.count * args.elementSize;
  const size_t chunk = group.chunkBytes();
  for (size_t offset = 0; offset < total; offset += chunk) {
    const size_t bytes = std::min(chunk, total - offset);
    const uint32_t step = group.beginStep(args.deadline);
    if (group.rank() == args.root) {
      std::memcpy(group.buffer(args.root, step), args.data + offset, bytes);
      group.post(step, bytes);
      // The root reads no one's data, but it checks that every rank is in the same broadcast
      // (same root): a rank that believes itself root too would otherwise keep its own tensor
      // without an error. It checks the first chunk at its next step, without waiting now.
      // Later chunks carry the same fingerprint, which the others check against the root's.
      if (offset == 0) {
        group.checkAllPostedLater(step, bytes);
        continue;
      }
    } else {
      group.post(step, bytes);
      group.waitPosted(args.root, step, bytes, args.deadline);
      std::memcpy(args.data + offset, group.buffer(args.root, step), bytes);
      // The other non-roots' posts too, the same way: a second rank that believes itself root
      // is found here as well, not only by the roots.
      if (offset == 0) {
        group.checkAllPostedLater(step, bytes);
        continue;
      }
    }
    group.markConsumed(step);
  }
}

}  // namespace ddplite::cpu::shm
