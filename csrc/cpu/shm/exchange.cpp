// gather, scatter and all_to_all through shared memory: one algorithm, since each is a set of
// blocks from rank i to rank j (s_ij bytes; gather: only to the root, scatter: only from it).
//
// Step 0 also carries each rank's outgoing block sizes, so a receiver whose split does not match
// its sender's raises a mismatch naming both lengths instead of reading stale bytes.
//
// Slots: with P ranks and chunk C, piece size c = C / P rounded down to 64 bytes; rank i's buffer
// for a step is P slots of c bytes, slot j carrying rank i's next piece for rank j.
//   0. one step to agree on the number of steps: every rank posts the pieces its own blocks need,
//      max over j of ceil(s_ij / c) and ceil(s_ji / c); K = the largest (all_to_all's sizes
//      differ per rank, so no rank knows K alone).
//   k = 1..K: copy piece k of each outgoing block into its slot; post; once all have posted,
//      copy piece k of each incoming block out of slot i of its sender's buffer; mark consumed.
//   A rank's block to itself is one memcpy.
// Cost per rank: R = W = (bytes sent + bytes received), plus 8P bytes for step 0; K + 1
// synchronisations. Every rank checks every peer's fingerprint at every step (waitAllPosted), so
// a rank in another collective is named by all of them.
#include "cpu/shm/shm_algorithms.hpp"

#include "common/errors.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddplite::cpu::shm {

namespace {

constexpr size_t kSlotAlignment = 64;

size_t pieceBytes(const ShmGroup& group) {
  return group.chunkBytes() / static_cast<size_t>(group.size()) / kSlotAlignment * kSlotAlignment;
}

ExchangeBlocks blocksOf(const ExchangeArgs& args, WireKind kind, int rank, int size) {
  ExchangeBlocks blocks;
  blocks.resize(size);
  for (int peer = 0; peer < size; ++peer) {
    const bool sends = kind == WireKind::kAlltoall || (kind == WireKind::kGather ? peer == args.root : rank == args.root);
    const bool receives = kind == WireKind::kAlltoall || (kind == WireKind::kGather ? rank == args.root : peer == args.root);
    if (sends) blocks.setSend(peer, args.sendData + args.sendSpans[peer].offset, args.sendSpans[peer].bytes);
    if (receives) blocks.setRecv(peer, args.recvData + args.recvSpans[peer].offset, args.recvSpans[peer].bytes);
  }
  return blocks;
}

// Step 0: every rank posts [its piece count, the bytes it sends to rank 0, ..., to rank P-1];
// each checks that every peer sends it what it expects (all_to_all splits that do not match
// would otherwise read a slot's stale bytes) and returns the largest piece count.
uint64_t agreeOnSteps(ShmGroup& group, const ExchangeBlocks& blocks, size_t piece, Deadline deadline) {
  const int rank = group.rank();
  const int size = group.size();
  std::vector<uint64_t> mine(static_cast<size_t>(size) + 1, 0);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    mine[peer + 1] = blocks.sendBytes[peer];
    mine[0] = std::max<uint64_t>(mine[0], (std::max(blocks.sendBytes[peer], blocks.recvBytes[peer]) + piece - 1) / piece);
  }
  const size_t bytes = mine.size() * sizeof(uint64_t);
  const uint32_t step = group.beginStep(deadline);
  std::memcpy(group.buffer(rank, step), mine.data(), bytes);
  group.post(step, bytes);
  group.waitAllPosted(step, bytes, deadline);
  uint64_t steps = mine[0];
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    uint64_t theirs[2];  // their piece count, and the bytes they send to this rank
    std::memcpy(&theirs[0], group.buffer(peer, step), sizeof(uint64_t));
    std::memcpy(&theirs[1], group.buffer(peer, step) + (rank + 1) * sizeof(uint64_t), sizeof(uint64_t));
    if (theirs[1] != blocks.recvBytes[peer]) {
      throw TransportError(TransportError::Kind::kMismatch, peer,
                           strCat("collective mismatch: ", group.describePeer(peer), " sends ", theirs[1],
                                  " bytes to this rank, which expects ", blocks.recvBytes[peer], " [message length: ",
                                  blocks.recvBytes[peer], " bytes expected here, ", theirs[1],
                                  " bytes sent by the peer (all_to_all split sizes that do not match)]"));
    }
    steps = std::max(steps, theirs[0]);
  }
  group.markConsumed(step);
  return steps;
}

// The part of a block of `bytes` that piece `k` carries: [k * piece, k * piece + length).
size_t pieceLength(size_t bytes, uint64_t k, size_t piece) {
  const size_t begin = static_cast<size_t>(k) * piece;
  return bytes > begin ? std::min(piece, bytes - begin) : 0;
}

}  // namespace

bool exchangeFits(size_t chunkBytes, int ranks) {
  const size_t piece = chunkBytes / static_cast<size_t>(ranks) / kSlotAlignment * kSlotAlignment;
  return piece >= kSlotAlignment && (static_cast<size_t>(ranks) + 1) * sizeof(uint64_t) <= chunkBytes;
}

bool exchangeFits(const ShmGroup& group) { return exchangeFits(group.chunkBytes(), group.size()); }

void exchangeBlocks(ShmGroup& group, const ExchangeBlocks& blocks, Deadline deadline) {
  const int rank = group.rank();
  const int size = group.size();
  const size_t piece = pieceBytes(group);
  const uint64_t steps = agreeOnSteps(group, blocks, piece, deadline);
  const uint64_t stepBytes = piece * static_cast<size_t>(size);
  for (uint64_t k = 0; k < steps; ++k) {
    const uint32_t step = group.beginStep(deadline);
    char* slots = group.buffer(rank, step);
    for (int peer = 0; peer < size; ++peer) {
      const size_t length = peer == rank ? 0 : pieceLength(blocks.sendBytes[peer], k, piece);
      if (length > 0) std::memcpy(slots + peer * piece, blocks.sendAt[peer] + k * piece, length);
    }
    group.post(step, stepBytes);
    group.waitAllPosted(step, stepBytes, deadline);
    for (int peer = 0; peer < size; ++peer) {
      const size_t length = peer == rank ? 0 : pieceLength(blocks.recvBytes[peer], k, piece);
      if (length > 0) std::memcpy(blocks.recvAt[peer] + k * piece, group.buffer(peer, step) + rank * piece, length);
    }
    group.markConsumed(step);
  }
}

void exchange(ShmGroup& group, const ExchangeArgs& args, WireKind kind) {
  const int rank = group.rank();
  exchangeBlocks(group, blocksOf(args, kind, rank, group.size()), args.deadline);
  const bool ownBlock = kind == WireKind::kAlltoall || rank == args.root;
  if (ownBlock && args.sendSpans[rank].bytes > 0) {
    std::memcpy(args.recvData + args.recvSpans[rank].offset, args.sendData + args.sendSpans[rank].offset,
                args.sendSpans[rank].bytes);
  }
}

}  // namespace ddplite::cpu::shm
