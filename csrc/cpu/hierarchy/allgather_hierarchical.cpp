// Allgather of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders.
//
// The group's ranks need not be contiguous per host (ranks 0 and 2 on one host, 1 on another), so
// the hosts' blocks travel host-major through a staging buffer (HostHierarchy::staging) of H
// slots of M blocks (M = the most ranks any host holds; a host with fewer leaves its last slots
// unused), then land rank-major in `data`. Where host-major is rank order (every host holds M
// consecutive ranks), `data` is the staging buffer and steps 1 and 4 copy nothing.
//
// Steps (B bytes per block, L ranks on this host, H hosts):
//   1. this rank's block goes to its place in its host's slot; an allgather through the segment
//      (allgather.cpp) fills the slot on every rank of the host;
//   2. the leaders all-gather the H slots (M*B bytes each) over TCP, with the algorithm the
//      selector picks for H ranks (ring, recursive doubling);
//   3. each leader broadcasts the H slots through its segment (broadcast.cpp);
//   4. every rank copies the P blocks into rank order.
// Fingerprinted like any collective (steps 1 and 3 in the segment, 2 on the wire).
//
// Cost: memory, L*B + H*M*B per rank; network: only the leaders send, (H-1)*M*B each with a ring,
// instead of (P-1)*B by every one of the P ranks.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include <cstring>

namespace ddplite::cpu::hierarchy {

void allgatherAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const size_t block = args.count * args.elementSize;
  const size_t slot = hosts.slotBytes(block);
  const size_t slots = static_cast<size_t>(hosts.hosts());
  const bool inPlace = hosts.hostMajorIsRankOrder();  // 0,1 | 2,3: the slots are `data` itself
  char* staged = inPlace ? args.data : hosts.staging(slots * slot);
  char* mySlot = staged + static_cast<size_t>(hosts.myHost()) * slot;
  const int rank = hosts.rank();
  if (block > 0 && !inPlace) {
    std::memcpy(staged + hosts.stagedOffset(rank, block), args.data + static_cast<size_t>(rank) * block, block);
  }
  ShmGroup* group = hosts.local();
  if (group != nullptr) {
    AlgorithmArgs onHost = args;
    onHost.data = mySlot;  // L blocks in host order
    group->beginCollective(local, refusedSeq);
    shm::allgather(*group, onHost);
  }
  if (hosts.leaders() != nullptr) {
    AlgorithmArgs among = args;
    among.data = staged;
    among.count = args.count * static_cast<size_t>(hosts.maxRanksPerHost());
    hosts.runAmongLeaders(Collective::kAllgather, among, fingerprint, slots * slot, 0);
  }
  if (group != nullptr) {
    AlgorithmArgs fromLeader = args;
    fromLeader.root = 0;
    fromLeader.data = staged;
    fromLeader.count = args.count * static_cast<size_t>(hosts.maxRanksPerHost()) * slots;
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, fromLeader);
    group->endCollective();
  }
  if (block == 0 || inPlace) return;
  const int size = hosts.groupSize();
  for (int owner = 0; owner < size; ++owner) {
    if (owner == rank) continue;
    const size_t at = hosts.stagedOffset(owner, block);
    std::memcpy(args.data + static_cast<size_t>(owner) * block, staged + at, block);
  }
}

}  // namespace ddplite::cpu::hierarchy
