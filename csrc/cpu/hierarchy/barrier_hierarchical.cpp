// Barrier of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders.
//
// Steps: 1. a barrier in each host's segment (barrier.cpp): the leader knows its host has
// arrived; 2. the leaders' barrier over TCP (dissemination on H ranks); 3. a second barrier in
// each segment, which the leader reaches only after step 2: no rank leaves before every rank of
// every host has arrived. Fingerprinted like any collective (steps 1 and 3 in the segment, 2 on
// the wire).
//
// Cost: 2 synchronisations in shared memory, and ceil(log2(H)) message rounds between the leaders
// instead of ceil(log2(P)) among all P ranks.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

namespace ddplite::cpu::hierarchy {

void barrierAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                        uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  ShmGroup* group = hosts.local();
  if (group != nullptr) {
    group->beginCollective(local, refusedSeq);
    shm::barrier(*group, args);
  }
  if (hosts.leaders() != nullptr) hosts.runAmongLeaders(Collective::kBarrier, args, fingerprint, 0, 0);
  if (group != nullptr) {
    group->beginCollective(local, refusedSeq);
    shm::barrier(*group, args);
    group->endCollective();
  }
}

}  // namespace ddplite::cpu::hierarchy
