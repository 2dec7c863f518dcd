// All-to-all, pairwise exchange.
//
// Step s = 1 .. P-1: send my span for rank (rank + s) while receiving rank (rank - s)'s span for
// me (Transport::sendRecv); my own span is copied locally. Every pair meets exactly once, each
// rank has one send and one receive in flight, and uneven spans need no padding.
//
// Cost: (P-1) alpha + (P-1)/P S beta per rank for S = this rank's total input (balanced splits).
#include "cpu/algorithms/algorithm.hpp"

#include <cstring>

namespace ddplite::cpu {

void alltoallPairwise(const ExchangeArgs& args) {
  Transport& transport = args.transport;
  const int rank = transport.rank();
  const int size = transport.size();
  const Span& own = args.sendSpans[rank];
  if (own.bytes > 0) {
    std::memcpy(args.recvData + args.recvSpans[rank].offset, args.sendData + own.offset, own.bytes);
  }
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size;
    const int from = (rank - step + size) % size;
    const Span& out = args.sendSpans[to];
    const Span& in = args.recvSpans[from];
    transport.sendRecv(to, args.sendData + out.offset, out.bytes, from, args.recvData + in.offset, in.bytes,
                       args.deadline);
  }
}

}  // namespace ddplite::cpu
