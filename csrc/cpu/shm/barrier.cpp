// Barrier through shared memory: one step with no data.
//
// Steps: post the step (with this rank's fingerprint); wait until every rank has posted it;
// mark it consumed. No rank leaves before every rank has arrived.
//
// Cost: R = W = 0 bytes; one synchronisation (P-1 flag reads, one flag write).
#include "cpu/shm/shm_algorithms.hpp"

namespace ddplite::cpu::shm {

void barrier(ShmGroup& group, const AlgorithmArgs& args) {
  const uint32_t step = group.beginStep(args.deadline);
  group.post(step, 0);
  group.waitAllPosted(step, 0, args.deadline);
  group.markConsumed(step);
}

}  // namespace ddplite::cpu::shm
