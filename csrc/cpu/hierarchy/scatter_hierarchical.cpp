// Scatter of a group across hosts (HostHierarchy): shared memory inside each host, TCP only
// between the hosts' leaders. The root's host sends H-1 messages instead of P-1, and a rank that
// leads no host connects to nobody for it.
//
// The blocks travel host-major through a staging buffer (HostHierarchy::staging) of H slots of M
// blocks, as gather's do (gather_hierarchical.cpp). Where host-major is rank order, the root's
// input is the staging buffer (only ever read: steps 1-3 read the root's copy).
//
// Steps (B bytes per block, root R on host h, L ranks on this host, H hosts):
//   1. R puts the P blocks host-major; on h, when R does not lead it, R broadcasts the H slots
//      through h's segment (broadcast.cpp), so that h's leader holds them;
//   2. h's leader sends each other host's leader its host's L blocks over TCP;
//   3. on every host but h when R does not lead it (whose ranks hold every slot after step 1),
//      the leader broadcasts its host's slot through the segment;
//   4. every rank copies its block out of its host's slot.
// Fingerprinted like any collective (steps 1 and 3 in the segment, 2 on the wire, root: h).
//
// Cost: memory, L*B per rank of a host, or H*M*B per rank of h when R does not lead it. Network:
// H-1 messages of L*B out of h's leader, instead of P-1 messages of B out of R.
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include <cstring>

namespace ddplite::cpu::hierarchy {

void scatterAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, Scratch& scratch,
                        const Fingerprint& fingerprint, uint64_t refusedSeq) {
  const Fingerprint local = shm::segmentPartOf(fingerprint);
  const int rank = hosts.rank();
  const size_t block = args.recvSpans.at(static_cast<size_t>(args.root)).bytes;
  const size_t slot = hosts.slotBytes(block);
  const size_t slots = static_cast<size_t>(hosts.hosts());
  const int rootHost = hosts.hostOf(args.root);
  const bool onRootHost = hosts.myHost() == rootHost;
  const bool rootLeads = hosts.indexOnHost(args.root) == 0;
  const bool isRoot = rank == args.root;
  const bool inPlace = isRoot && hosts.hostMajorIsRankOrder();
  // In place, the root's input is staged, and only read below (broadcast's root, the leaders'
  // sends, the last copy): the const_cast never leads to a write.
  char* staged = inPlace ? const_cast<char*>(args.sendData) : hosts.staging(slots * slot);
  char* mySlot = staged + static_cast<size_t>(hosts.myHost()) * slot;
  if (isRoot && !inPlace && block > 0) {
    for (int owner = 0; owner < hosts.groupSize(); ++owner) {
      const size_t at = hosts.stagedOffset(owner, block);
      std::memcpy(staged + at, args.sendData + args.sendSpans[static_cast<size_t>(owner)].offset, block);
    }
  }
  auto onHost = [&](char* data, size_t bytes, int root) {  // the segment's steps move bytes: elementSize 1
    return AlgorithmArgs{args.transport, args.deadline, scratch, data, bytes, 1, nullptr, nullptr, root};
  };
  ShmGroup* group = hosts.local();
  const bool everySlotOnHost = onRootHost && !rootLeads;  // step 1 runs here
  if (group != nullptr && everySlotOnHost) {
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, onHost(staged, slots * slot, hosts.indexOnHost(args.root)));
  }
  if (hosts.leaders() != nullptr) {
    Transport& leaders = hosts.beginAmongLeaders(fingerprint, rootHost);
    if (onRootHost) {
      for (int host = 0; host < hosts.hosts(); ++host) {
        if (host == rootHost) continue;
        leaders.send(host, staged + static_cast<size_t>(host) * slot, static_cast<size_t>(hosts.ranksOn(host)) * block,
                     args.deadline);
      }
    } else {
      leaders.recv(rootHost, mySlot, static_cast<size_t>(hosts.ranksOn(hosts.myHost())) * block, args.deadline);
    }
  }
  if (group != nullptr && !everySlotOnHost) {
    group->beginCollective(local, refusedSeq);
    shm::broadcast(*group, onHost(mySlot, static_cast<size_t>(hosts.ranksOn(hosts.myHost())) * block, 0));
  }
  if (group != nullptr) group->endCollective();  // open from the first local step (collectiveOpen)
  if (block > 0) {
    std::memcpy(args.recvData + args.recvSpans[static_cast<size_t>(args.root)].offset,
                staged + hosts.stagedOffset(rank, block), block);
  }
}

}  // namespace ddplite::cpu::hierarchy
