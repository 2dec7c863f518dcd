// Gather of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders. The root's host takes H-1 messages instead of P-1, and a rank that
// leads no host connects to nobody for it (flat, the root connects to every rank on demand).
//
// The blocks travel host-major through a staging buffer (HostHierarchy::staging) of H slots of M
// blocks (M = the most ranks any host holds; a host with fewer leaves its last slots unused), as
// all_gather's do. Where host-major is rank order (every host holds M consecutive ranks), the
// root's output is the staging buffer and step 4 copies nothing.
//
// Steps (B bytes per block, root R on host h, L ranks on this host, H hosts):
//   1. each rank puts its block at its place in its host's slot; an allgather through the segment
//      (allgather.cpp) fills the slot on every rank of the host (skipped when alone on its host);
//   2. every other host's leader sends its L blocks to h's leader over TCP, which receives them
//      into their slots, host by host;
//   3. on h, when R does not lead it, the leader broadcasts the H slots through h's segment
//      (broadcast.cpp);
//   4. R copies the P blocks into rank order.
// Fingerprinted like any collective (steps 1 and 3 in the segment, 2 on the wire, root: h).
//
// Cost: memory, L*B per rank of a host, and H*M*B per rank of h when R does not lead it. Network:
// H-1 messages of L*B into h's leader, instead of P-1 messages of B into R.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include <cstring>

namespace ddplite::cpu::hierarchy {

void gatherAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, Scratch& scratch,
                       const Fingerprint& fingerprint, uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const int rank = hosts.rank();
  const size_t block = args.sendSpans.at(static_cast<size_t>(args.root)).bytes;
  const size_t slot = hosts.slotBytes(block);
  const size_t slots = static_cast<size_t>(hosts.hosts());
  const int rootHost = hosts.hostOf(args.root);
  const bool isRoot = rank == args.root;
  const bool inPlace = isRoot && hosts.hostMajorIsRankOrder();  // 0,1 | 2,3: the slots are the output
  char* staged = inPlace ? args.recvData : hosts.staging(slots * slot);
  char* mySlot = staged + static_cast<size_t>(hosts.myHost()) * slot;
  if (block > 0) {
    std::memcpy(staged + hosts.stagedOffset(rank, block),
                args.sendData + args.sendSpans[static_cast<size_t>(args.root)].offset, block);
  }
  // The segment's steps move bytes: elementSize 1.
  auto onHost = [&](char* data, size_t bytes, int root) {
    return AlgorithmArgs{args.transport, args.deadline, scratch, data, bytes, 1, nullptr, nullptr, root};
  };
  ShmGroup* group = hosts.local();
  if (group != nullptr) {
    group->beginCollective(local, refusedSeq);
    shm::allgather(*group, onHost(mySlot, block, 0));  // L blocks of B, in host order
  }
  if (hosts.leaders() != nullptr) {
    Transport& leaders = hosts.beginAmongLeaders(fingerprint, rootHost);
    if (hosts.myHost() != rootHost) {
      leaders.send(rootHost, mySlot, static_cast<size_t>(hosts.ranksOn(hosts.myHost())) * block, args.deadline);
    } else {
      for (int host = 0; host < hosts.hosts(); ++host) {
        if (host == rootHost) continue;
        leaders.recv(host, staged + static_cast<size_t>(host) * slot, static_cast<size_t>(hosts.ranksOn(host)) * block,
                     args.deadline);
      }
    }
  }
  if (group != nullptr && hosts.myHost() == rootHost && hosts.indexOnHost(args.root) != 0) {
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, onHost(staged, slots * slot, 0));
  }
  if (group != nullptr) group->endCollective();  // open from the first local step (collectiveOpen)
  if (!isRoot || inPlace || block == 0) return;
  for (int owner = 0; owner < hosts.groupSize(); ++owner) {
    const size_t at = hosts.stagedOffset(owner, block);
    std::memcpy(args.recvData + args.recvSpans[static_cast<size_t>(owner)].offset, staged + at, block);
  }
}

}  // namespace ddplite::cpu::hierarchy
