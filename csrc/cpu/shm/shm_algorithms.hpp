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

#include <cstring>

namespace ddplite::cpu::shm {

// out[0, count) = the elements at byte `offset` of every rank's buffer for `step`, reduced in rank
// order 0, 1, ..., P-1 (so every rank that computes them gets the same bits).
inline void reduceInRankOrder(const ShmGroup& group, const AlgorithmArgs& args, char* out, size_t offset,
                              size_t count, uint32_t step) {
  std::memcpy(out, group.buffer(0, step) + offset, count * args.elementSize);
  for (int owner = 1; owner < group.size(); ++owner) args.reduce(out, group.buffer(owner, step) + offset, count);
}

void allreduce(ShmGroup& group, const AlgorithmArgs& args);      // allreduce.cpp
void broadcast(ShmGroup& group, const AlgorithmArgs& args);      // broadcast.cpp
void reduce(ShmGroup& group, const AlgorithmArgs& args);         // reduce.cpp
void allgather(ShmGroup& group, const AlgorithmArgs& args);      // allgather.cpp
void reduceScatter(ShmGroup& group, const AlgorithmArgs& args);  // reduce_scatter.cpp
void barrier(ShmGroup& group, const AlgorithmArgs& args);        // barrier.cpp
// gather, scatter and all_to_all (`kind`); exchangeFits: whether the group's chunk leaves each
// peer a slot of at least 64 bytes (else the exchange goes over TCP).
bool exchangeFits(const ShmGroup& group);
void exchange(ShmGroup& group, const ExchangeArgs& args, WireKind kind);  // exchange.cpp

}  // namespace ddplite::cpu::shm
