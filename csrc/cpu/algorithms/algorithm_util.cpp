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

Fold Fold::of(int rank, int size) {
  Fold fold;
  while (fold.p2 * 2 <= size) fold.p2 *= 2;
  fold.extra = size - fold.p2;
  if (rank < 2 * fold.extra) {
    fold.participant = (rank % 2 == 1) ? rank / 2 : -1;
  } else {
    fold.participant = rank - fold.extra;
  }
  return fold;
}

void foldedAllreduce(const AlgorithmArgs& args, FoldedCore core) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const size_t bytes = args.count * args.elementSize;
  if (transport.size() == 1 || bytes == 0) {
    return;
  }
  const Fold fold = Fold::of(rank, transport.size());
  if (fold.participant < 0) {
    transport.send(rank + 1, args.data, bytes, args.deadline);
    transport.recv(rank + 1, args.data, bytes, args.deadline);
    return;
  }
  char* incoming = args.scratch.get(bytes);
  const bool foldedPair = rank < 2 * fold.extra;
  if (foldedPair) {
    transport.recv(rank - 1, incoming, bytes, args.deadline);
    args.reduce(args.data, incoming, args.count);
  }
  core(args, fold, incoming);
  if (foldedPair) {
    transport.send(rank - 1, args.data, bytes, args.deadline);
  }
}

void halvingReduceScatter(const AlgorithmArgs& args, const Fold& fold, const std::vector<size_t>& offsets,
                          char* incoming) {
  const int me = fold.participant;
  int low = 0;
  int high = fold.p2;
  while (high - low > 1) {
    const int half = (high - low) / 2;
    const int middle = low + half;
    const bool lower = me < middle;
    const int partner = fold.realRank(lower ? me + half : me - half);
    const int keepLow = lower ? low : middle;
    const int keepHigh = lower ? middle : high;
    const int giveLow = lower ? middle : low;
    const int giveHigh = lower ? high : middle;
    const size_t keepBytes = offsets[keepHigh] - offsets[keepLow];
    args.transport.sendRecv(partner, args.data + offsets[giveLow], offsets[giveHigh] - offsets[giveLow], partner,
                            incoming, keepBytes, args.deadline);
    args.reduce(args.data + offsets[keepLow], incoming, keepBytes / args.elementSize);
    low = keepLow;
    high = keepHigh;
  }
}

void doublingAllgather(const AlgorithmArgs& args, const Fold& fold, const std::vector<size_t>& offsets) {
  const int me = fold.participant;
  for (int distance = 1; distance < fold.p2; distance *= 2) {
    const int partner = me ^ distance;
    const int myLow = (me / distance) * distance;
    const int partnerLow = (partner / distance) * distance;
    const size_t myBegin = offsets[myLow];
    const size_t partnerBegin = offsets[partnerLow];
    args.transport.sendRecv(fold.realRank(partner), args.data + myBegin, offsets[myLow + distance] - myBegin,
                            fold.realRank(partner), args.data + partnerBegin,
                            offsets[partnerLow + distance] - partnerBegin, args.deadline);
  }
}

}  // namespace ddplite::cpu
