// Broadcast, ring (a pipelined chain): root -> root+1 -> ... -> root-1, in chunks.
//
// Steps (virtual ranks v = (rank - root) mod P; C = DDPLITE_RING_SEGMENT_BYTES): the buffer is cut
// into chunks. The root sends them in order to v = 1. Every middle rank receives chunk 0, then
// sends chunk k downstream while receiving chunk k+1 from upstream (Transport::sendRecv), then
// forwards the last chunk. The last rank only receives, chunk by chunk.
//
// Cost: (P - 1 + S/C - 1) (alpha + C beta): every link carries S bytes once, so for large S the
// time approaches S beta whatever P is; the P-1 hops of latency make it the worst choice for
// small buffers.
#include "common/env.hpp"
#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

void broadcastRing(const AlgorithmArgs& args) {
  Transport& transport = args.transport;
  const int size = transport.size();
  const size_t total = args.count * args.elementSize;
  if (size == 1 || total == 0) {
    return;
  }
  const int position = (transport.rank() - args.root + size) % size;
  const int upstream = (transport.rank() - 1 + size) % size;
  const int downstream = (transport.rank() + 1) % size;
  const size_t chunk = static_cast<size_t>(env::ringSegmentBytes());
  const size_t chunks = (total + chunk - 1) / chunk;
  auto at = [&](size_t k) { return args.data + k * chunk; };
  auto bytesOf = [&](size_t k) { return std::min(chunk, total - k * chunk); };

  if (position == 0) {
    for (size_t k = 0; k < chunks; ++k) transport.send(downstream, at(k), bytesOf(k), args.deadline);
    return;
  }
  if (position == size - 1) {
    // Chunk by chunk, as sent: both ends of a stream frame it alike (the first chunk carries the
    // fingerprint header, whose length check relies on it).
    for (size_t k = 0; k < chunks; ++k) transport.recv(upstream, at(k), bytesOf(k), args.deadline);
    return;
  }
  transport.recv(upstream, at(0), bytesOf(0), args.deadline);
  for (size_t k = 0; k + 1 < chunks; ++k) {
    transport.sendRecv(downstream, at(k), bytesOf(k), upstream, at(k + 1), bytesOf(k + 1), args.deadline);
  }
  transport.send(downstream, at(chunks - 1), bytesOf(chunks - 1), args.deadline);
}

}  // namespace ddplite::cpu
