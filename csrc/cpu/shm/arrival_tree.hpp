// The shape of the arrival tree a shared-memory group synchronises through (DDPLITE_SHM_SYNC):
// a combining tree of counters, after the software combining-tree barrier (Yew, Tzeng and Lawrie,
// 1987), with one counter per node and step parity in shared memory (shm_group.cpp owns the memory).
//
// Level 0 groups the ranks by fan-in k (ranks 0..k-1 share node 0, k..2k-1 node 1, ...); level
// l+1 groups the nodes of level l the same way, up to a single root. A rank arriving at a step adds
// one to its level-0 node; the arrival that completes a node carries on to the node's parent; the one
// that completes the root has seen, through the chain of read-modify-writes, every rank's arrival.
//
// Cost per rank and step: one read-modify-write on a line shared by k ranks (the completers: one per
// level, log_k P in all), and one read of the release word; against P-1 flag reads when flat. Nobody
// waits at an inner node: the last to arrive carries the count up, so ranks that sleep are woken
// once, as with the flat wait.
#pragma once

#include <vector>

namespace ddplite::cpu {

class ArrivalTree {
 public:
  // `fanIn` 0: no tree (the group reads every flag instead).
  ArrivalTree(int ranks, int fanIn) : fanIn_(fanIn) {
    if (fanIn_ < 2) return;
    int count = ranks;
    int span = 1;
    while (count > 1) {
      const int nodes = (count + fanIn_ - 1) / fanIn_;
      levels_.push_back(Level{nodeCount_, count, span});
      nodeCount_ += nodes;
      count = nodes;
      span *= fanIn_;
    }
  }

  bool enabled() const { return fanIn_ >= 2; }
  int fanIn() const { return fanIn_; }
  int levels() const { return static_cast<int>(levels_.size()); }
  int nodeCount() const { return nodeCount_; }

  // At `level`, the node that member `member` (a rank at level 0, a node of level-1 above) arrives at,
  // as an index into every level's nodes laid end to end.
  int nodeOf(int level, int member) const { return levels_[level].firstNode + member / fanIn_; }
  // The index (as nodeOf's) of node `node` of `level`: a member of level + 1.
  int nodeIndex(int level, int node) const { return levels_[level].firstNode + node; }
  // How many members that node has (k, or fewer for the last node of a level).
  int membersOf(int level, int member) const {
    const int first = member / fanIn_ * fanIn_;
    const int left = levels_[level].members - first;
    return left < fanIn_ ? left : fanIn_;
  }
  // The first member of that node, and the member's index at the next level up.
  int firstMemberOf(int member) const { return member / fanIn_ * fanIn_; }
  int parentMember(int member) const { return member / fanIn_; }
  // The lowest rank under `member` of `level`: all ranks below a completed node posted the same
  // fingerprint as this one, or a mismatch was recorded (shm_group.cpp).
  int representative(int level, int member) const { return member * levels_[level].span; }

 private:
  struct Level {
    int firstNode;  // index of the level's first node
    int members;    // ranks (level 0) or nodes of the level below
    int span;       // ranks under each member: k^level
  };
  int fanIn_;
  int nodeCount_ = 0;
  std::vector<Level> levels_;
};

}  // namespace ddplite::cpu
