// Broadcast, binary tree, pipelined in chunks.
//
// Steps (virtual ranks v = (rank - root) mod P; parent (v-1)/2, children 2v+1 and 2v+2):
//   for each chunk of C bytes: receive it from the parent (unless root), then send it to each
//   child. A chunk moves down the tree while the next one arrives, so the depth is paid once.
//
// Cost: (ceil(log2 P) + S/C - 1) * (alpha + 2 C beta) for the deepest leaf; an inner node sends
// 2S bytes. Compared with gloo's unpipelined binomial tree (log2 P full-size hops), large
// messages cost about one hop instead of log2 P.
#include "common/env.hpp"
#include "cpu/algorithms/algorithm.hpp"

#include <algorithm>

namespace ddplite::cpu {

void broadcastBinaryTree(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const TreePosition tree = binaryTreePosition(transport.rank(), transport.size(), args.root);
  const size_t total = args.count * args.elementSize;
  const size_t chunk = static_cast<size_t>(env::treeChunkBytes());
  for (size_t offset = 0; offset < total; offset += chunk) {
    const size_t bytes = std::min(chunk, total - offset);
    char* piece = args.data + offset;
    if (tree.parent >= 0) {
      transport.recv(tree.parent, piece, bytes, args.deadline);
    }
    for (int child : tree.children) {
      transport.send(child, piece, bytes, args.deadline);
    }
  }
}

}  // namespace ddplite::cpu
