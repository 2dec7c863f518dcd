// The one signature every CPU collective algorithm implements, and the algorithms themselves.
//
// An algorithm moves bytes between ranks through a Transport and reduces them with a ReduceFn;
// it knows nothing of tensors, dtypes or torch. It runs on the backend's worker thread, operates
// in place on `data`, and may use `scratch` (owned by the worker, reused across ops, so the
// steady state allocates nothing).
//
// Cost notation in each file's header: P ranks, S bytes, alpha = per-message latency,
// beta = per-byte transfer time, gamma = per-byte reduction time.
#pragma once

#include "cpu/reduce/reduce_kernels.hpp"
#include "cpu/transport/transport.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

namespace ddplite::cpu {

// Grows on demand, never shrinks; used by one thread at a time.
class Scratch {
 public:
  char* get(size_t bytes) {
    if (buffer_.size() < bytes) buffer_.resize(bytes);
    return buffer_.data();
  }

 private:
  std::vector<char> buffer_;
};

// What `data` and `count` mean depends on the collective:
//   allreduce, broadcast, reduce: one buffer of `count` elements;
//   allgather, reduce_scatter:    P blocks of `count` elements each, rank-major. allgather starts
//     with block `rank` filled and ends with all of them; reduce_scatter starts with every block
//     filled (a working copy: it is overwritten) and ends with block `rank` reduced over ranks.
struct AlgorithmArgs {
  Transport& transport;
  Deadline deadline;
  Scratch& scratch;
  char* data;
  size_t count;
  size_t elementSize;        // bytes per element
  ReduceFn reduce = nullptr; // for reductions
  ReduceManyFn reduceMany = nullptr;  // the same reduction over many sources at once (shared memory)
  int root = 0;              // for rooted collectives
};

using Algorithm = void (*)(const AlgorithmArgs&);

// allreduce
void allreduceNaive(const AlgorithmArgs& args);            // allreduce_naive.cpp
void allreduceRing(const AlgorithmArgs& args);             // allreduce_ring.cpp
void allreduceButterfly(const AlgorithmArgs& args);        // allreduce_butterfly.cpp
void allreduceHalvingDoubling(const AlgorithmArgs& args);  // allreduce_halving_doubling.cpp
// broadcast
void broadcastNaive(const AlgorithmArgs& args);            // broadcast_naive.cpp
void broadcastBinaryTree(const AlgorithmArgs& args);       // broadcast_tree.cpp
void broadcastRing(const AlgorithmArgs& args);             // broadcast_ring.cpp
// reduce
void reduceNaive(const AlgorithmArgs& args);               // reduce_naive.cpp
void reduceBinaryTree(const AlgorithmArgs& args);          // reduce_tree.cpp
// allgather
void allgatherRing(const AlgorithmArgs& args);             // allgather_ring.cpp
void allgatherDoubling(const AlgorithmArgs& args);         // allgather_doubling.cpp
// reduce_scatter
void reduceScatterRing(const AlgorithmArgs& args);         // reduce_scatter_ring.cpp
void reduceScatterHalving(const AlgorithmArgs& args);      // reduce_scatter_halving.cpp
// barrier
void barrierDissemination(const AlgorithmArgs& args);      // barrier_dissemination.cpp

// ---- Exchanges with a layout per peer: gather, scatter, alltoall -------------------------------

// `bytes` bytes at byte `offset` of a buffer.
struct Span {
  size_t offset = 0;
  size_t bytes = 0;
};

// sendSpans[i]: what this rank sends to rank i, within sendData; recvSpans[i]: where what rank i
// sends lands, within recvData. Entries a collective does not use are ignored.
struct ExchangeArgs {
  Transport& transport;
  Deadline deadline;
  const char* sendData;
  std::vector<Span> sendSpans;
  char* recvData;
  std::vector<Span> recvSpans;
  int root = 0;
};

void gatherDirect(const ExchangeArgs& args);      // exchange_direct.cpp
void scatterDirect(const ExchangeArgs& args);     // exchange_direct.cpp
void alltoallPairwise(const ExchangeArgs& args);  // alltoall_pairwise.cpp

// ---- Helpers shared by the algorithms (algorithm_util.cpp) -------------------------------------

// Balanced split of `count` elements into `parts`: part i is [partBegin(i), partBegin(i+1)).
inline size_t partBegin(size_t count, size_t parts, size_t i) {
  return (count / parts) * i + std::min(i, count % parts);
}

// Binary tree over virtual ranks v = (rank - root) mod P: parent (v-1)/2, children 2v+1, 2v+2.
struct TreePosition {
  int parent = -1;           // real rank, -1 at the root
  std::vector<int> children; // real ranks
};
TreePosition binaryTreePosition(int rank, int size, int root);

// How a butterfly (recursive doubling or halving, which needs a power-of-two group) runs on any
// P: p2 = the largest power of two <= P and extra = P - p2. The first 2*extra ranks pair up
// (2i, 2i+1) and act as one participant i: the even rank hands its data to the odd one before
// the butterfly and gets the result back after it. Every rank r >= 2*extra is participant
// r - extra. Participants are numbered 0 .. p2-1 in rank order, so participant v stands for
// the ranks [firstRank(v), firstRank(v+1)).
struct Fold {
  int p2 = 1;
  int extra = 0;
  int participant = -1;  // this rank's participant, or -1 when it is folded into rank + 1

  static Fold of(int rank, int size);
  int realRank(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
  int firstRank(int v) const { return v < extra ? 2 * v : v + extra; }  // firstRank(p2) == P
};

// Allreduce over any P with a power-of-two core: an even rank r < 2*extra sends its buffer to
// r+1 and receives the result from it; r+1 reduces that buffer into its own, runs
// `core(args, fold, incoming)` with the other participants, and sends the result back to r.
// `incoming` is scratch for the whole buffer.
using FoldedCore = void (*)(const AlgorithmArgs& args, const Fold& fold, char* incoming);
void foldedAllreduce(const AlgorithmArgs& args, FoldedCore core);

// The butterfly halves and doubles over participants; offsets[v] (v = 0 .. p2, offsets[p2] =
// the end) is the byte offset where participant v's range of `data` begins.
//
// Recursive halving: at each of log2(p2) steps, exchange half of the current range with the
// partner and reduce the received half into place; participant v ends holding its range
// reduced over all participants. `incoming` must hold half the buffer.
void halvingReduceScatter(const AlgorithmArgs& args, const Fold& fold, const std::vector<size_t>& offsets,
                          char* incoming);
// Recursive doubling: participant v starts with its range and, exchanging a range that doubles
// at each step, ends with all of them.
void doublingAllgather(const AlgorithmArgs& args, const Fold& fold, const std::vector<size_t>& offsets);

}  // namespace ddplite::cpu
