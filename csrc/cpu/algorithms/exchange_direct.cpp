// Gather and scatter, direct: the root talks to every other rank itself (what gloo does).
//
// gather:  every non-root rank sends its span to the root; the root receives them in rank order
//          straight into place and copies its own.
// scatter: the root sends each rank its span in rank order and copies its own; the others
//          receive once.
//
// Cost: (P-1) alpha + (P-1)/P S beta at the root, S = the gathered (scattered) size. The root's
// link is the bottleneck whatever the algorithm, so no tree is offered.
#include "cpu/algorithms/algorithm.hpp"

#include <cstring>

namespace ddplite::cpu {

namespace {

void copyOwnSpan(const ExchangeArgs& args, int rank) {
  const Span& from = args.sendSpans[rank];
  if (from.bytes > 0) {
    std::memcpy(args.recvData + args.recvSpans[rank].offset, args.sendData + from.offset, from.bytes);
  }
}

}  // namespace

void gatherDirect(const ExchangeArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  if (rank != args.root) {
    const Span& mine = args.sendSpans[args.root];
    transport.send(args.root, args.sendData + mine.offset, mine.bytes, args.deadline);
    return;
  }
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer == rank) {
      copyOwnSpan(args, rank);
      continue;
    }
    const Span& into = args.recvSpans[peer];
    transport.recv(peer, args.recvData + into.offset, into.bytes, args.deadline);
  }
}

void scatterDirect(const ExchangeArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  if (rank != args.root) {
    const Span& into = args.recvSpans[args.root];
    transport.recv(args.root, args.recvData + into.offset, into.bytes, args.deadline);
    return;
  }
  for (int peer = 0; peer < transport.size(); ++peer) {
    if (peer == rank) {
      copyOwnSpan(args, rank);
      continue;
    }
    const Span& from = args.sendSpans[peer];
    transport.send(peer, args.sendData + from.offset, from.bytes, args.deadline);
  }
}

}  // namespace ddplite::cpu
