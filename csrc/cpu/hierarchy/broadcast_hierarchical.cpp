// Broadcast of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders.
//
// Steps (root R on host h, H hosts, S bytes):
//   1. on h, R broadcasts through h's segment (broadcast.cpp, root = R's index on h): every rank
//      of h, its leader included, then holds the data (skipped when R is alone on h);
//   2. the leaders broadcast over TCP from h's leader, with the algorithm the selector picks for
//      H ranks and S bytes (tree, ring, ...; the same rule as a flat group of H ranks);
//   3. on every other host, the leader broadcasts through that host's segment.
// Each part is fingerprinted like any collective: steps 1 and 3 in the segment, step 2 on the
// wire; every rank of a host runs the same part (1 or 3), so their part numbers agree.
//
// Cost: memory, as one broadcast on L ranks per host (R = W = S per rank). Network: only the
// leaders send, as the chosen algorithm on H ranks instead of P = L*H (a tree: log2(H) steps of S
// instead of log2(P)); the loopback copies between ranks of one host disappear.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

namespace ddplite::cpu::hierarchy {

void broadcastAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          size_t bufferBytes, uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const int rootHost = hosts.hostOf(args.root);
  const bool onRootHost = hosts.myHost() == rootHost;
  ShmGroup* group = hosts.local();
  if (group != nullptr && onRootHost) {
    AlgorithmArgs fromRoot = args;
    fromRoot.root = hosts.indexOnHost(args.root);
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, fromRoot);
  }
  if (hosts.leaders() != nullptr) hosts.runAmongLeaders(Collective::kBroadcast, args, fingerprint, bufferBytes, rootHost);
  if (group != nullptr && !onRootHost) {
    AlgorithmArgs fromLeader = args;
    fromLeader.root = 0;
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, fromLeader);
  }
  if (group != nullptr) group->endCollective();  // open from the first local step (collectiveOpen)
}

}  // namespace ddplite::cpu::hierarchy
