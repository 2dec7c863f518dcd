// The fingerprint of one byte-level collective, checked on the wire so that no byte of one
// collective is ever consumed by another.
//
// Protocol (Transport::beginCollective): before a collective moves any data, the worker thread
// arms the transport with the collective's Fingerprint. The first message this rank then sends to
// each peer is preceded by a WireHeader (the fingerprint plus that message's length), and the
// first message it receives from each peer must be preceded by a header with an equal fingerprint
// and the length this rank expects. A stream between two ranks is ordered, so every later byte
// read from that peer in this collective was sent by the peer in the same collective; a peer in
// another collective (or one whose earlier collective left bytes behind) shows up as a header
// that differs, or as no header at all (bad magic), and the receive fails with
// TransportError(kMismatch) before any received byte is reduced or returned.
//
// What every rank must agree on, and so what is compared: the byte-level kind, the sequence
// number and part (a coalesced op runs several byte-level collectives), the algorithm, dtype, reduce op, root, the collective's agreed size, and the length of
// each first message (which checks the framing of algorithms and the split sizes of all_to_all,
// whose totals differ by rank). The user-level op name travels too, for messages only: all_gather
// and all_gather_into_tensor are the same collective on the wire.
//
// Cost: one 48-byte header on the first message to each peer, sent in the same segment as the
// payload and read with it in one readv: no extra round trip, and no extra system call up to
// 4 KB of payload (tcp.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddplite {

// Byte-level collectives (compared on the wire).
enum class WireKind : uint8_t {
  kNone = 0,
  kAllreduce,
  kBroadcast,
  kReduce,
  kAllgather,
  kReduceScatter,
  kBarrier,
  kGather,
  kScatter,
  kAlltoall,
};

// The algorithm index the fingerprint carries for the shared-memory path (cpu/shm/): beyond every
// selector index, so a rank on shared memory never agrees with one on TCP.
constexpr uint8_t kShmAlgorithmIndex = 200;

struct Fingerprint {
  uint64_t seq = 0;          // the group's collective sequence number
  WireKind kind = WireKind::kNone;
  uint8_t opName = 0;        // userOpCode() of the torch-level op, for messages
  uint8_t algorithm = 0;     // the selector's index of the algorithm (0 for exchanges and MPI)
  int8_t dtype = -1;         // c10::ScalarType, -1 for none
  uint8_t reduceOp = 0xff;   // c10d::ReduceOp::RedOpType, 0xff for data movement
  int32_t root = -1;         // rooted collectives; -1 otherwise
  uint64_t bytes = 0;        // a size every rank agrees on (see collectives.cpp), 0 for all_to_all
  uint8_t part = 0;          // which byte-level collective of the op (coalesced ops run several);
                             // numbered by the transport (TcpTransport::beginCollective)
  const char* algorithmName = "";  // not on the wire: this rank's name for `algorithm`
  // Not on the wire: beginCollective keeps `part` as given instead of numbering it. For a part
  // that ranks reach after different histories within the op (kProxiesPart).
  bool partGiven = false;

  // True when `other` describes the same collective (opName and algorithmName aside).
  bool sameCollective(const Fingerprint& other) const;
  // "allreduce #12 (ring, Float, SUM, 4000 bytes)".
  std::string describe() const;
};

// The part of the proxies' messages of a hierarchical all_to_all (alltoall_hierarchical.cpp):
// within its op, only the hosts' leaders may have armed the mesh before (the DETAIL argument
// check's all_gather), so numbering would differ between a leader and a rank that leads no host;
// the last part number, the same everywhere and above any earlier part of the op.
constexpr uint8_t kProxiesPart = 255;

// Names the algorithm a header carries (the selector's index for `kind`), for messages; "" when
// unknown. The algorithm layer registers it (cpu/algorithms/selector.cpp, at load time), so that
// the transport names algorithms without depending on them; unregistered: "algorithm N".
using AlgorithmNamer = std::string (*)(WireKind kind, uint8_t algorithm);
void registerAlgorithmNamer(AlgorithmNamer namer);

// Code of a torch-level op name ("allreduce", "allgather_into_tensor", ...); 0 when unknown.
uint8_t userOpCode(const char* name);

// The header that precedes a peer's first message in a collective. Plain bytes: both ends run the
// same build on the same kind of host (one byte order), which the magic also checks.
struct WireHeader {
  uint32_t magic;
  uint8_t kind;
  uint8_t opName;
  uint8_t algorithm;
  int8_t dtype;
  uint8_t reduceOp;
  uint8_t part;
  uint8_t reserved[2];
  int32_t root;
  uint64_t seq;
  uint64_t bytes;
  uint64_t messageBytes;  // length of the message this header precedes
  uint32_t check;         // a checksum of the fields above: stray payload never passes for a header
  uint32_t pad;           // zero
};
static_assert(sizeof(WireHeader) == 48, "WireHeader is 48 bytes on the wire");

WireHeader encodeHeader(const Fingerprint& fingerprint, uint64_t messageBytes);

// True when a received header carries `mine` and announces `expectedBytes`: the check done on
// every first message, which builds no string.
bool agrees(const WireHeader& header, const Fingerprint& mine, uint64_t expectedBytes);

// True when two headers would pass agrees() against each other's fingerprint: the same fields
// compared (the op's name aside: all_gather and all_gather_into_tensor are one collective), so
// it is an equivalence. Both must be valid headers of this build (encodeHeader).
bool sameCollectiveStep(const WireHeader& a, const WireHeader& b);

// What a received header says, checked against this rank's own fingerprint and the length of
// the receive it precedes: "" when they agree, else a sentence naming both sides, e.g.
// "rank 1 (10.0.0.2:4711) is in gather #1 (..., 4 bytes) while this rank is in allreduce #2 (...)".
std::string headerMismatch(const WireHeader& header, const Fingerprint& mine, uint64_t expectedBytes,
                           const std::string& peer);

// The same check on a header peeked at early, from a peer this rank is not receiving from yet:
// the message length is not known yet, and a header of a later collective ((seq, part) above
// this rank's) passes, since the peer may be ahead legitimately (this rank receives nothing from
// it in this collective, or in this part of a coalesced op). Equal or lower ones must describe
// this very collective.
std::string earlyHeaderMismatch(const WireHeader& header, const Fingerprint& mine, const std::string& peer);

}  // namespace ddplite
