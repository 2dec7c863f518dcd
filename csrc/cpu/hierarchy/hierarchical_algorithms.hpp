// The collectives of a group whose ranks span hosts (HostHierarchy, host_hierarchy.hpp), one per
// *_hierarchical.cpp file, each with its steps and cost in its header comment: shared memory
// inside each host (cpu/shm/, the segment's steps), TCP among the hosts' leaders (or, for
// all_to_all, among one proxy per pair of hosts). This layer uses cpu/shm/ and cpu/transport/;
// neither includes it (tests/test_layering.py).
//
// Threading: the thread that runs the group's collectives (as ShmGroup).
#pragma once

#include "cpu/algorithms/algorithm.hpp"
#include "cpu/hierarchy/host_hierarchy.hpp"

#include <cstddef>
#include <cstdint>

namespace ddplite::cpu::hierarchy {

// all_reduce of a group across hosts (allreduce_hierarchical.cpp). `fingerprint`: the op's, as
// on TCP; `bufferBytes` as in selectAlgorithm; `refusedSeq` as in ShmGroup::beginCollective.
void allreduceAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          size_t bufferBytes, uint64_t refusedSeq);
// broadcast of a group across hosts (broadcast_hierarchical.cpp), arguments as above; args.root
// is the group's rank.
void broadcastAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          size_t bufferBytes, uint64_t refusedSeq);
// reduce, all_gather, reduce_scatter and barrier of a group across hosts (*_hierarchical.cpp),
// arguments as above (args.root of reduce is the group's rank; all_gather and reduce_scatter take
// P blocks rank-major, as on TCP).
void reduceAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                       size_t bufferBytes, uint64_t refusedSeq);
void allgatherAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                          uint64_t refusedSeq);
void reduceScatterAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                              uint64_t refusedSeq);
void barrierAcrossHosts(HostHierarchy& hosts, const AlgorithmArgs& args, const Fingerprint& fingerprint,
                        uint64_t refusedSeq);
// gather and scatter of a group across hosts (gather_hierarchical.cpp, scatter_hierarchical.cpp):
// P blocks of equal size (gather: sendSpans[0].bytes; scatter: recvSpans[0].bytes), the root's
// rank-major, as cpu::gather and cpu::scatter build them; args.root is the group's rank and
// args.transport is not used. `scratch` backs the AlgorithmArgs of the segment's steps.
void gatherAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, Scratch& scratch,
                       const Fingerprint& fingerprint, uint64_t refusedSeq);
void scatterAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, Scratch& scratch,
                        const Fingerprint& fingerprint, uint64_t refusedSeq);
// all_to_all of a group across hosts (alltoall_hierarchical.cpp), when the hierarchy says
// alltoallThroughProxies(): uneven spans as on TCP; args.transport is the group's TCP mesh, which
// one rank per pair of hosts uses.
void alltoallAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, const Fingerprint& fingerprint,
                         uint64_t refusedSeq);

}  // namespace ddplite::cpu::hierarchy
