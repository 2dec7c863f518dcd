// Reduce-scatter of a group across hosts (HostHierarchy): shared memory inside each host, TCP
// only between the hosts' leaders.
//
// `data` is a working copy of P blocks, rank-major; rank r ends with block r reduced over every
// rank (cpu::reduceScatterWorking). Ranks need not be contiguous per host, so the blocks are first
// put host-major into a staging buffer (HostHierarchy::staging): H slots of M blocks (M = the most
// ranks any host holds; unused blocks are zero and never read). Where host-major is rank order
// (every host holds M consecutive ranks), `data` is the staging buffer: no copy in or out.
//
// Steps (B bytes per block, L ranks on this host, H hosts):
//   1. every rank copies its P blocks host-major into staging; the host reduces staging to its
//      leader through the segment (reduce.cpp; rank order inside the host);
//   2. the leaders reduce-scatter the H slots (M*B bytes each) over TCP, with the algorithm the
//      selector picks for H ranks (ring, recursive halving): each leader ends with its host's slot
//      reduced over every host;
//   3. each leader broadcasts its host's slot (L blocks) through the segment (broadcast.cpp), and
//      every rank copies its own block to block r of `data`.
// Fingerprinted like any collective (steps 1 and 3 in the segment, 2 on the wire).
//
// Cost: memory, as a reduce of H*M*B bytes on L ranks plus a broadcast of L*B; network: only the
// leaders send, (H-1)*M*B each with a ring, instead of (P-1)*B by every one of the P ranks.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include <cstring>

namespace ddplite::cpu::hierarchy {

void reduceScatterAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                              uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const size_t block = args.count * args.elementSize;
  const size_t perHost = static_cast<size_t>(hosts.maxRanksPerHost());
  const size_t slot = perHost * block;
  const size_t slots = static_cast<size_t>(hosts.hosts());
  const bool inPlace = hosts.hostMajorIsRankOrder();  // 0,1 | 2,3: the slots are `data` itself
  char* staged = inPlace ? args.data : hosts.staging(slots * slot);
  const int size = hosts.groupSize();
  for (int owner = 0; owner < size && block > 0 && !inPlace; ++owner) {
    const size_t at = hosts.stagedOffset(owner, block);
    std::memcpy(staged + at, args.data + static_cast<size_t>(owner) * block, block);
  }
  for (size_t host = 0; host < slots && block > 0 && !inPlace; ++host) {  // the unused blocks: reduced, never read
    const size_t used = static_cast<size_t>(hosts.ranksOn(static_cast<int>(host)));
    std::memset(staged + host * slot + used * block, 0, (perHost - used) * block);
  }
  ShmGroup* group = hosts.local();
  if (group != nullptr) {
    AlgorithmArgs toLeader = args;
    toLeader.root = 0;
    toLeader.data = staged;
    toLeader.count = args.count * perHost * slots;
    group->beginCollective(local, refusedSeq);
    shm::reduce(*group, toLeader);
  }
  char* mySlot = staged + static_cast<size_t>(hosts.myHost()) * slot;
  if (hosts.leaders() != nullptr) {
    AlgorithmArgs among = args;
    among.data = staged;
    among.count = args.count * perHost;
    hosts.runAmongLeaders(Collective::kReduceScatter, among, fingerprint, slots * slot, 0);
  }
  if (group != nullptr) {
    AlgorithmArgs fromLeader = args;
    fromLeader.root = 0;
    fromLeader.data = mySlot;
    fromLeader.count = args.count * hosts.localRanks().size();
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, fromLeader);
    group->endCollective();
  }
  const int rank = hosts.rank();
  if (block > 0 && !inPlace) {
    std::memcpy(args.data + static_cast<size_t>(rank) * block, staged + hosts.stagedOffset(rank, block), block);
  }
}

}  // namespace ddplite::cpu::hierarchy
