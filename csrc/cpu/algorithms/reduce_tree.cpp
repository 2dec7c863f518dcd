// Reduce, binary tree towards the root, pipelined in chunks.
//
// Steps (same tree as broadcastBinaryTree): for each chunk, receive the partial result of each
// child into scratch and reduce it into `data`, then send the chunk to the parent (unless root).
// `data` is the caller's accumulation buffer: the root's tensor, or a copy on other ranks (the
// caller keeps non-root inputs unchanged).
//
// Cost: (ceil(log2 P) + S/C - 1) * (alpha + 2 C beta + 2 C gamma) on the critical path.
#include "common/env.hpp"
#include "cpu/algorithms/algorithm.hpp"

#include <algorithm>

namespace ddplite::cpu {

void reduceBinaryTree(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const TreePosition tree = binaryTreePosition(transport.rank(), transport.size(), args.root);
  const size_t chunkElements = std::max<size_t>(1, static_cast<size_t>(env::treeChunkBytes()) / args.elementSize);
  char* incoming = args.scratch.get(chunkElements * args.elementSize);
  for (size_t first = 0; first < args.count; first += chunkElements) {
    const size_t elements = std::min(chunkElements, args.count - first);
    const size_t bytes = elements * args.elementSize;
    char* piece = args.data + first * args.elementSize;
    for (int child : tree.children) {
      transport.recv(child, incoming, bytes, args.deadline);
      args.reduce(piece, incoming, elements);
    }
    if (tree.parent >= 0) {
      transport.send(tree.parent, piece, bytes, args.deadline);
    }
  }
}

}  // namespace ddplite::cpu
