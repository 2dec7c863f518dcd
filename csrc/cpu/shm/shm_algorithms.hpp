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

#include <c10/util/SmallVector.h>

#include <cstring>
#include <vector>

namespace ddplite::cpu::shm {

// out[0, count) = the elements at byte `offset` of every rank's buffer for `step`, reduced in rank
// order 0, 1, ..., P-1 in one pass over all P buffers (so every rank that computes them gets the
// same bits; half and bfloat16 round once, after all P). `out` is not in the segment.
inline void reduceInRankOrder(const ShmGroup& group, const AlgorithmArgs& args, char* out, size_t offset,
                              size_t count, uint32_t step) {
  c10::SmallVector<const void*, 16> sources;
  for (int owner = 0; owner < group.size(); ++owner) sources.push_back(group.buffer(owner, step) + offset);
  args.reduceMany(out, sources.data(), group.size(), count);
}

// `fingerprint` as its parts inside a host's segment name it (the path "shm"): the collectives
// across hosts (cpu/hierarchy/) fingerprint their segment steps so, and their leaders' part with
// the TCP algorithm.
inline Fingerprint segmentPartOf(Fingerprint fingerprint) {
  fingerprint.algorithm = kShmAlgorithmIndex;
  fingerprint.algorithmName = "shm";
  return fingerprint;
}

void allreduce(ShmGroup& group, const AlgorithmArgs& args);      // allreduce.cpp
void broadcast(ShmGroup& group, const AlgorithmArgs& args);      // broadcast.cpp
void reduce(ShmGroup& group, const AlgorithmArgs& args);         // reduce.cpp
void allgather(ShmGroup& group, const AlgorithmArgs& args);      // allgather.cpp
// The rails' steps inside a host (cpu/hierarchy/allreduce_hierarchical.cpp). The buffer is
// `parts` balanced parts (partBegin), part j owned by rank j mod P. reduceToParts: each rank ends
// with the parts it owns reduced over the group, in rank order (the rest of its buffer is
// undefined); gatherParts: each part is valid at its owner, and every rank ends with all of them.
void reduceToParts(ShmGroup& group, const AlgorithmArgs& args, int parts);  // allreduce.cpp
void gatherParts(ShmGroup& group, const AlgorithmArgs& args, int parts);    // allgather.cpp
void reduceScatter(ShmGroup& group, const AlgorithmArgs& args);  // reduce_scatter.cpp
// Elements per piece of reduce_scatter: P pieces of one chunk share a buffer, so a piece is at
// most C/P bytes; 0 when not even one element per rank fits a chunk (P * elementSize > C: the
// collective then goes over TCP). The same on every rank (C, P and the dtype agree).
size_t reduceScatterPieceCount(size_t chunkBytes, int size, size_t elementSize);
void barrier(ShmGroup& group, const AlgorithmArgs& args);        // barrier.cpp
// gather, scatter and all_to_all (`kind`); exchangeFits: whether the group's chunk leaves each
// peer a slot of at least 64 bytes (else the exchange goes over TCP), for this group or for a
// group of `ranks` with chunk `chunkBytes`.
bool exchangeFits(const ShmGroup& group);
bool exchangeFits(size_t chunkBytes, int ranks);
// The blocks one rank moves in an exchange through the segment, by the group's rank: sendBytes[j]
// bytes from sendAt[j] to rank j, recvBytes[j] bytes from rank j into recvAt[j]. The caller owns
// the memory; its block to itself is never moved. A receiver that expects other than what its
// sender sends raises a mismatch naming both lengths.
struct ExchangeBlocks {
  std::vector<const char*> sendAt;
  std::vector<size_t> sendBytes;
  std::vector<char*> recvAt;
  std::vector<size_t> recvBytes;
  void resize(int ranks) {
    sendAt.assign(static_cast<size_t>(ranks), nullptr);
    sendBytes.assign(static_cast<size_t>(ranks), 0);
    recvAt.assign(static_cast<size_t>(ranks), nullptr);
    recvBytes.assign(static_cast<size_t>(ranks), 0);
  }
  void setSend(int peer, const char* at, size_t bytes) {
    sendAt[static_cast<size_t>(peer)] = at;
    sendBytes[static_cast<size_t>(peer)] = bytes;
  }
  void setRecv(int peer, char* at, size_t bytes) {
    recvAt[static_cast<size_t>(peer)] = at;
    recvBytes[static_cast<size_t>(peer)] = bytes;
  }
};
void exchangeBlocks(ShmGroup& group, const ExchangeBlocks& blocks, Deadline deadline);  // exchange.cpp
void exchange(ShmGroup& group, const ExchangeArgs& args, WireKind kind);  // exchange.cpp

}  // namespace ddplite::cpu::shm
