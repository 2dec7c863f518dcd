// Collectives through the group's shared memory (shm_group.hpp), one per file, each with its
// steps and cost. They take the same AlgorithmArgs as the byte-stream algorithms (args.transport
// is unused: data moves through the segment) and the group's ShmGroup, already armed with the
// collective's fingerprint (ShmGroup::beginCollective).
//
// Cost notation: P ranks, S bytes, C = the chunk (ShmGroup::chunkBytes). Memory traffic is the
// cost here, so each header counts the bytes every rank reads (R) and writes (W), and the
// synchronisations per chunk (each one a flag store plus, at worst, a futex wake).
#pragma once

#include "cpu/algorithms/algorithm.hpp"
#include "cpu/shm/shm_group.hpp"

namespace ddplite::cpu::shm {

void allreduce(ShmGroup& group, const AlgorithmArgs& args);      // allreduce.cpp
void broadcast(ShmGroup& group, const AlgorithmArgs& args);      // broadcast.cpp
void reduce(ShmGroup& group, const AlgorithmArgs& args);         // reduce.cpp
void allgather(ShmGroup& group, const AlgorithmArgs& args);      // allgather.cpp
void reduceScatter(ShmGroup& group, const AlgorithmArgs& args);  // reduce_scatter.cpp
void barrier(ShmGroup& group, const AlgorithmArgs& args);        // barrier.cpp

}  // namespace ddplite::cpu::shm
