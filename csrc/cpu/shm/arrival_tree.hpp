// The shape of the arrival tree a shared-memory group synchronises through (DDPLITE_SHM_SYNC):
// a combining tree of counters, after the software combining-tree barrier (Yew, Tzeng and Lawrie,
// 1987), with one counter per node and step parity in shared memory (shm_group.cpp owns the memory).
//
// Level 0 groups the ranks' positions by fan-in k (positions 0..k-1 share node 0, k..2k-1 node 1,
// ...; position = rank unless NUMA nodes reorder them, below); level
// l+1 groups the nodes of level l the same way, up to a single root. A rank arriving at a step adds
// one to its level-0 node; the arrival that completes a node carries on to the node's parent; the one
// that completes the root has seen, through the chain of read-modify-writes, every rank's arrival.
//
// NUMA: when every rank of the host is pinned to a NUMA node (numaNodeOfThisProcess) and they use
// several, level 0 is formed within each node: the ranks are ordered by (node, rank) into
// positions, and each node's ranks start at a multiple of k (the gap is no one's), so the counters
// of level 0 are shared only by ranks of one NUMA node and the lines cross between nodes only from
// level 1 up, once per k ranks. With any rank unpinned (node -1: the kernel may move it) the
// ranks keep their order, as on a host of one node.
//
// Cost per rank and step: one read-modify-write on a line shared by k ranks (the completers: one per
// level, log_k P in all), and one read of the release word; against P-1 flag reads when flat. Nobody
// waits at an inner node: the last to arrive carries the count up, so ranks that sleep are woken
// once, as with the flat wait.
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

namespace ddplite::cpu {

class ArrivalTree {
 public:
  // `fanIn` 0: no tree (the group reads every flag instead). `domains`: each rank's NUMA node
  // (-1: not pinned to one), or empty: all in one. Grouped by node only when every rank is pinned.
  ArrivalTree(int ranks, int fanIn, const std::vector<int>& domains = {}) : fanIn_(fanIn) {
    if (fanIn_ < 2) return;
    placeRanks(ranks, domains);
    int count = static_cast<int>(rankAt_.size());
    int span = 1;
    while (count > 1) {
      const int nodes = (count + fanIn_ - 1) / fanIn_;
      levels_.push_back(Level{nodeCount_, count, span});
      nodeCount_ += nodes;
      count = nodes;
      span *= fanIn_;
    }
  }

  // The most nodes a tree of `ranks` and `fanIn` can have, whatever their domains (every rank on
  // a node of its own: each but the first adds up to k-1 gap positions). The segment is laid out
  // for this before the ranks' domains are known.
  static int nodeCapacity(int ranks, int fanIn) {
    if (fanIn < 2) return 0;
    int count = ranks + (fanIn - 1) * std::max(ranks - 1, 0);
    int nodes = 0;
    while (count > 1) {
      count = (count + fanIn - 1) / fanIn;
      nodes += count;
    }
    return nodes;
  }

  bool enabled() const { return fanIn_ >= 2; }
  int fanIn() const { return fanIn_; }
  int levels() const { return static_cast<int>(levels_.size()); }
  int nodeCount() const { return nodeCount_; }
  // How many NUMA nodes level 0 was formed within (1: no grouping).
  int domainCount() const { return domainCount_; }

  // Where rank `rank` sits at level 0 (its member index there), and the rank at `position` (-1 for
  // a gap; never for the first position under a node of any level).
  int positionOf(int rank) const { return positionOf_[rank]; }
  int rankAt(int position) const { return rankAt_[position]; }

  // At `level`, the node that member `member` (a position at level 0, a node of level-1 above)
  // arrives at, as an index into every level's nodes laid end to end.
  int nodeOf(int level, int member) const { return levels_[level].firstNode + member / fanIn_; }
  // How many members `level` has: positions at level 0 (gaps included), nodes of the level below above.
  int membersAt(int level) const { return levels_[level].members; }
  // The index (as nodeOf's) of node `node` of `level`: a member of level + 1.
  int nodeIndex(int level, int node) const { return levels_[level].firstNode + node; }
  // How many members arrive at that node (k, or fewer: the last node of a level, or at level 0 the
  // last node of a NUMA node's ranks). They are the node's first members: gaps only trail.
  int membersOf(int level, int member) const {
    const int first = member / fanIn_ * fanIn_;
    int end = std::min(first + fanIn_, levels_[level].members);
    if (level == 0) {
      while (end > first && rankAt_[end - 1] < 0) --end;
    }
    return end - first;
  }
  // The first member of that node, and the member's index at the next level up.
  int firstMemberOf(int member) const { return member / fanIn_ * fanIn_; }
  int parentMember(int member) const { return member / fanIn_; }
  // A rank under `member` of `level` (the one at its first position): all ranks below a completed
  // node posted the same fingerprint as this one, or a mismatch was recorded (shm_group.cpp).
  int representative(int level, int member) const { return rankAt_[member * levels_[level].span]; }

 private:
  struct Level {
    int firstNode;  // index of the level's first node
    int members;    // positions (level 0) or nodes of the level below
    int span;       // positions under each member: k^level
  };

  void placeRanks(int ranks, const std::vector<int>& domains) {
    std::vector<int> order(ranks);
    std::iota(order.begin(), order.end(), 0);
    const bool grouped = static_cast<int>(domains.size()) == ranks &&
                         std::all_of(domains.begin(), domains.end(), [](int d) { return d >= 0; }) &&
                         std::any_of(domains.begin(), domains.end(), [&](int d) { return d != domains[0]; });
    if (grouped) {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return domains[a] < domains[b]; });
    }
    positionOf_.assign(ranks, 0);
    int position = 0;
    for (int i = 0; i < ranks; ++i) {
      const int rank = order[i];
      if (grouped && i > 0 && domains[rank] != domains[order[i - 1]]) {
        position = (position + fanIn_ - 1) / fanIn_ * fanIn_;  // a NUMA node starts a level-0 node
        ++domainCount_;
      }
      rankAt_.resize(position + 1, -1);
      rankAt_[position] = rank;
      positionOf_[rank] = position++;
    }
  }

  int fanIn_;
  int nodeCount_ = 0;
  int domainCount_ = 1;
  std::vector<int> positionOf_;
  std::vector<int> rankAt_;
  std::vector<Level> levels_;
};

}  // namespace ddplite::cpu
