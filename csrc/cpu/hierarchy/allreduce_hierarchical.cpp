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
// On rails (HostHierarchy::allreduceOnRails: from DDPLITE_RAILS_BYTES, and claimParts found the
// op's wire parts room for them), every rank of a host
// carries a share between hosts instead of the leader alone (NCCL's and Open MPI HAN's shape). The
// buffer is R balanced parts, R = the most ranks any host holds; part j belongs to rail j, which
// on each host is its rank of index j mod L:
//   1. the host reduces the buffer through its segment, each rank ending with its parts
//      (shm::reduceToParts: the reduction spread over the L ranks);
//   2. each rank all-reduces each of its parts over TCP among its rail's H ranks, one per host,
//      rail after rail in ascending order, with the algorithm the selector picks for H ranks and
//      the part's bytes;
//   3. the host gathers the parts through its segment (shm::gatherParts).
// Every element is still reduced in rank order inside a host and by the rail's algorithm between
// hosts, so every rank holds the same bits (not the leaders' path's: the order across hosts
// differs).
//
// Cost: memory, R = 2S + S/L + S, W = S + 2S/L + S per rank. Network: every rank sends, each its
// parts as the chosen algorithm on H ranks (ring: 2(H-1)/H * S/L each way when R = L): the bytes
// that cross hosts are the leaders' path's, spread over L connections and L cores per host.
//
// Cost: memory, as reduce + broadcast on L ranks (leader R = (L+1)S + S, W = 2S; others R = S,
// W = 2S). Network: only the leaders send, each as the chosen algorithm on H ranks (ring:
// 2(H-1)/H * S each way) instead of every rank as on P = L*H ranks; the loopback copies of the
// ranks on one host disappear.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

namespace ddplite::cpu::hierarchy {

namespace {

void allreduceOnRails(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                      uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const int rails = hosts.rails();
  ShmGroup* group = hosts.local();
  if (group != nullptr) {
    group->beginCollective(local, refusedSeq);
    shm::reduceToParts(*group, args, rails);
  }
  for (int rail : hosts.myRails()) {
    const size_t begin = partBegin(args.count, static_cast<size_t>(rails), static_cast<size_t>(rail));
    AlgorithmArgs part = args;
    part.data = args.data + begin * args.elementSize;
    part.count = partBegin(args.count, static_cast<size_t>(rails), static_cast<size_t>(rail) + 1) - begin;
    hosts.allreduceOnRail(rail, part, fingerprint);
  }
  if (group != nullptr) {
    group->beginCollective(local, refusedSeq);
    shm::gatherParts(*group, args, rails);
    group->endCollective();  // open from step 1, across the rails (collectiveOpen)
  }
}

}  // namespace

void allreduceAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          size_t bufferBytes, uint64_t refusedSeq) {
  if (hosts.onRails()) return allreduceOnRails(hosts, args, fingerprint, refusedSeq);  // runAcrossHosts decided
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
