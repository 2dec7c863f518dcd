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

#include "cpu/reduce_kernels.hpp"
#include "cpu/transport/transport.hpp"

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

struct AlgorithmArgs {
  Transport& transport;
  Deadline deadline;
  Scratch& scratch;
  char* data;               // in/out buffer; for allgather, P blocks of `count` elements
  size_t count;             // elements (per rank for allgather)
  size_t elementSize;       // bytes per element
  ReduceFn reduce = nullptr; // for reductions
  int root = 0;             // for rooted collectives
};

using Algorithm = void (*)(const AlgorithmArgs&);

// broadcast_tree.cpp
void broadcastBinaryTree(const AlgorithmArgs& args);
// reduce_tree.cpp
void reduceBinaryTree(const AlgorithmArgs& args);
// allreduce_ring.cpp
void allreduceRing(const AlgorithmArgs& args);
// allgather_ring.cpp
void allgatherRing(const AlgorithmArgs& args);
// barrier_dissemination.cpp
void barrierDissemination(const AlgorithmArgs& args);

// Helpers shared by the algorithms (algorithm_util.cpp).
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

}  // namespace ddplite::cpu
