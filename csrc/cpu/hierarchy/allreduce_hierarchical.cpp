// Allreduce of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders.
//
// Steps (L ranks on this host, H hosts, S bytes):
//   1. reduce to the host's leader through the host's segment (reduce.cpp; rank order inside
//      the host);
//   2. the leaders all-reduce over TCP with the algorithm the selector picks for H ranks and S
//      bytes (ring, butterfly, ...; the same rule as a flat group of H ranks);
//   3. the leader broadcasts the result through the segment (broadcast.cpp).
// Every rank ends with the leader's bits, so every rank of the group holds the same result.
// Each part is fingerprinted like any collective: steps 1 and 3 in the segment, step 2 on the
// wire; a rank in another collective is reported, never mixed in.
//
// Cost: memory, as reduce + broadcast on L ranks (leader R = (L+1)S + S, W = 2S; others R = S,
// W = 2S). Network: only the leaders send, each as the chosen algorithm on H ranks (ring:
// 2(H-1)/H * S each way) instead of every rank as on P = L*H ranks; the loopback copies of the
// ranks on one host disappear.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

namespace ddplite::cpu::hierarchy {

void allreduceAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          size_t bufferBytes, uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  if (ShmGroup* group = hosts.local()) {
    AlgorithmArgs toLeader = args;
    toLeader.root = 0;
    group->beginCollective(local, refusedSeq);
    shm::reduce(*group, toLeader);
  }
  if (hosts.leaders() != nullptr) hosts.runAmongLeaders(Collective::kAllreduce, args, fingerprint, bufferBytes, 0);
  if (ShmGroup* group = hosts.local()) {
    AlgorithmArgs fromLeader = args;
    fromLeader.root = 0;
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, fromLeader);
    group->endCollective();  // open from the local reduce, across the leaders' part (collectiveOpen)
  }
}

}  // namespace ddplite::cpu::hierarchy
