// Reduce of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders.
//
// Steps (root R on host h, L ranks on this host, H hosts, S bytes):
//   1. every host reduces to its leader through its segment (reduce.cpp; rank order inside the
//      host);
//   2. the leaders reduce over TCP to h's leader, with the algorithm the selector picks for H
//      ranks and S bytes (the same rule as a flat group of H ranks);
//   3. on h, when R is not its leader, the leader hands the result to R: a broadcast through h's
//      segment (broadcast.cpp).
// The non-roots' `data` is an accumulator copy (cpu::reduce), so steps 1-3 may overwrite it;
// only the root's is the caller's tensor. Each part is fingerprinted like any collective: steps 1
// and 3 in the segment, step 2 on the wire.
//
// Cost: memory, as reduce on L ranks (+ a broadcast on h when R does not lead it). Network: only
// the leaders send, as the chosen algorithm on H ranks (a tree: log2(H) steps of S) instead of P =
// L*H ranks; the loopback copies between the ranks of one host disappear.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

namespace ddplite::cpu::hierarchy {

void reduceAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                       size_t bufferBytes, uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const int rootHost = hosts.hostOf(args.root);
  ShmGroup* group = hosts.local();
  AlgorithmArgs onHost = args;
  onHost.root = 0;  // the host's leader
  if (group != nullptr) {
    group->beginCollective(local, refusedSeq);
    shm::reduce(*group, onHost);
  }
  if (hosts.leaders() != nullptr) hosts.runAmongLeaders(Collective::kReduce, args, fingerprint, bufferBytes, rootHost);
  if (group != nullptr && hosts.myHost() == rootHost && hosts.indexOnHost(args.root) != 0) {
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, onHost);
  }
  if (group != nullptr) group->endCollective();  // open from the local reduce (collectiveOpen)
}

}  // namespace ddplite::cpu::hierarchy
