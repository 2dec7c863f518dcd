#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

TreePosition binaryTreePosition(int rank, int size, int root) {
  TreePosition position;
  const int virtualRank = (rank - root + size) % size;
  auto realRank = [&](int v) { return (v + root) % size; };
  if (virtualRank > 0) {
    position.parent = realRank((virtualRank - 1) / 2);
  }
  for (int child = 2 * virtualRank + 1; child <= 2 * virtualRank + 2 && child < size; ++child) {
    position.children.push_back(realRank(child));
  }
  return position;
}

}  // namespace ddplite::cpu
