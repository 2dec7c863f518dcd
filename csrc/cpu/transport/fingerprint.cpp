#include "cpu/transport/fingerprint.hpp"

#include "common/errors.hpp"
#include "cpu/reduce/reduce_kernels.hpp"

#include <c10/core/ScalarType.h>

#include <array>
#include <atomic>
#include <cstring>
#include <vector>

namespace ddplite {

namespace {

constexpr uint32_t kHeaderMagic = 0xdd11f900;

// Torch-level op names, in code order (code = index + 1). Append only: the codes are on the wire.
constexpr std::array<const char*, 15> kUserOps = {
    "allreduce",          "allreduce_coalesced",        "broadcast",
    "reduce",             "allgather",                  "allgather_into_tensor",
    "allgather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced", "gather",        "scatter",
    "all_to_all_single",  "all_to_all",                 "barrier",
};

const char* kindName(uint8_t kind) {
  switch (static_cast<WireKind>(kind)) {
    case WireKind::kAllreduce: return "allreduce";
    case WireKind::kBroadcast: return "broadcast";
    case WireKind::kReduce: return "reduce";
    case WireKind::kAllgather: return "allgather";
    case WireKind::kReduceScatter: return "reduce_scatter";
    case WireKind::kBarrier: return "barrier";
    case WireKind::kGather: return "gather";
    case WireKind::kScatter: return "scatter";
    case WireKind::kAlltoall: return "all_to_all";
    case WireKind::kNone: break;
  }
  return "an unknown collective";
}

// The torch-level name when known, else the byte-level kind.
std::string opLabel(uint8_t kind, uint8_t opName) {
  if (opName >= 1 && opName <= kUserOps.size()) return kUserOps[opName - 1];
  return kindName(kind);
}

std::atomic<AlgorithmNamer> algorithmNamer{nullptr};

std::string algorithmLabel(uint8_t kind, uint8_t algorithm) {
  const auto k = static_cast<WireKind>(kind);
  if (algorithm == kShmAlgorithmIndex) return "shared memory";
  if (k < WireKind::kAllreduce || k > WireKind::kBarrier) return "direct";
  const AlgorithmNamer namer = algorithmNamer.load(std::memory_order_acquire);
  std::string name = namer != nullptr ? namer(k, algorithm) : std::string();
  return name.empty() ? strCat("algorithm ", int(algorithm)) : name;
}

std::string dtypeLabel(int8_t dtype) {
  if (dtype < 0) return "no dtype";
  return c10::toString(static_cast<c10::ScalarType>(dtype));
}

std::string reduceLabel(uint8_t reduceOp) {
  if (reduceOp == 0xff) return "";
  return cpu::reduceOpName(static_cast<c10d::ReduceOp::RedOpType>(reduceOp));
}

std::string describeFields(uint8_t kind, uint8_t opName, uint64_t seq, uint8_t part, uint8_t algorithm, int8_t dtype,
                           uint8_t reduceOp, int32_t root, uint64_t bytes) {
  std::string text = strCat(opLabel(kind, opName), " #", seq);
  if (part > 0) text += strCat(" part ", part + 1);
  text += strCat(" (", algorithmLabel(kind, algorithm));
  if (dtype >= 0) text += ", " + dtypeLabel(dtype);
  if (reduceOp != 0xff) text += ", " + reduceLabel(reduceOp);
  if (root >= 0) text += strCat(", root ", root);
  if (static_cast<WireKind>(kind) != WireKind::kAlltoall && static_cast<WireKind>(kind) != WireKind::kBarrier) {
    text += strCat(", ", bytes, " bytes");
  }
  return text + ")";
}

// FNV-1a over the header's bytes before `check`.
uint32_t checksumOf(const WireHeader& header) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&header);
  uint32_t hash = 2166136261u;
  for (size_t i = 0; i < offsetof(WireHeader, check); ++i) {
    hash = (hash ^ bytes[i]) * 16777619u;
  }
  return hash;
}

}  // namespace

bool Fingerprint::sameCollective(const Fingerprint& other) const {
  return seq == other.seq && part == other.part && kind == other.kind && algorithm == other.algorithm && dtype == other.dtype &&
         reduceOp == other.reduceOp && root == other.root && bytes == other.bytes;
}

std::string Fingerprint::describe() const {
  return describeFields(static_cast<uint8_t>(kind), opName, seq, part, algorithm, dtype, reduceOp, root, bytes);
}

uint8_t userOpCode(const char* name) {
  for (size_t i = 0; i < kUserOps.size(); ++i) {
    if (std::strcmp(kUserOps[i], name) == 0) return static_cast<uint8_t>(i + 1);
  }
  return 0;
}

WireHeader encodeHeader(const Fingerprint& fingerprint, uint64_t messageBytes) {
  WireHeader header;
  std::memset(&header, 0, sizeof(header));
  header.magic = kHeaderMagic;
  header.kind = static_cast<uint8_t>(fingerprint.kind);
  header.opName = fingerprint.opName;
  header.algorithm = fingerprint.algorithm;
  header.dtype = fingerprint.dtype;
  header.reduceOp = fingerprint.reduceOp;
  header.part = fingerprint.part;
  header.root = fingerprint.root;
  header.seq = fingerprint.seq;
  header.bytes = fingerprint.bytes;
  header.messageBytes = messageBytes;
  header.check = checksumOf(header);
  return header;
}

bool agrees(const WireHeader& header, const Fingerprint& mine, uint64_t expectedBytes) {
  return header.magic == kHeaderMagic && header.check == checksumOf(header) && header.seq == mine.seq &&
         header.part == mine.part &&
         header.kind == static_cast<uint8_t>(mine.kind) && header.algorithm == mine.algorithm &&
         header.dtype == mine.dtype && header.reduceOp == mine.reduceOp && header.root == mine.root &&
         header.bytes == mine.bytes && header.messageBytes == expectedBytes;
}

bool sameCollectiveStep(const WireHeader& a, const WireHeader& b) {
  return a.seq == b.seq && a.part == b.part && a.kind == b.kind && a.algorithm == b.algorithm && a.dtype == b.dtype &&
         a.reduceOp == b.reduceOp && a.root == b.root && a.bytes == b.bytes && a.messageBytes == b.messageBytes;
}

std::string headerMismatch(const WireHeader& header, const Fingerprint& mine, uint64_t expectedBytes,
                           const std::string& peer) {
  if (agrees(header, mine, expectedBytes)) return "";  // the hot path: no string is built
  if (header.magic != kHeaderMagic || header.check != checksumOf(header)) {
    return strCat("the byte stream from ", peer, " is out of step: where the first message of ", mine.describe(),
                  " was due, it sent bytes that are not a collective header (it is still in an earlier "
                  "collective that moves more data than this rank's, or runs a different algorithm or "
                  "chunk size)");
  }
  const std::string theirs = describeFields(header.kind, header.opName, header.seq, header.part, header.algorithm,
                                            header.dtype, header.reduceOp, header.root, header.bytes);
  std::vector<std::string> diff;
  auto field = [&](bool differs, const char* what, const std::string& here, const std::string& there) {
    if (differs) diff.push_back(strCat(what, ": ", here, " here, ", there, " at the peer"));
  };
  const auto kind = static_cast<uint8_t>(mine.kind);
  field(header.seq != mine.seq, "sequence number", strCat("#", mine.seq), strCat("#", header.seq));
  field(header.seq == mine.seq && header.part != mine.part, "part of the coalesced op", strCat(mine.part + 1),
        strCat(header.part + 1));
  field(header.kind != kind, "collective", kindName(kind), kindName(header.kind));
  field(header.kind == kind && header.algorithm != mine.algorithm, "algorithm", algorithmLabel(kind, mine.algorithm),
        algorithmLabel(kind, header.algorithm));
  field(header.dtype != mine.dtype, "dtype", dtypeLabel(mine.dtype), dtypeLabel(header.dtype));
  field(header.reduceOp != mine.reduceOp, "reduce op", reduceLabel(mine.reduceOp).empty() ? "none" : reduceLabel(mine.reduceOp),
        reduceLabel(header.reduceOp).empty() ? "none" : reduceLabel(header.reduceOp));
  field(header.root != mine.root, "root", strCat(mine.root), strCat(header.root));
  field(header.bytes != mine.bytes, "size", strCat(mine.bytes, " bytes"), strCat(header.bytes, " bytes"));
  if (diff.empty() && header.messageBytes != expectedBytes) {  // the same collective, another length
    return strCat("collective mismatch: ", peer, " sends ", header.messageBytes, " bytes at once in ",
                  mine.describe(), ", where this rank expects ", expectedBytes, " [message length: ", expectedBytes,
                  " bytes expected here, ", header.messageBytes,
                  " bytes sent by the peer (all_to_all split sizes that do not match, or a "
                  "DDPLITE_RING_SEGMENT_BYTES / DDPLITE_TREE_CHUNK_BYTES that differs between ranks)]");
  }
  if (diff.empty()) return "";
  std::string text = strCat("collective mismatch: ", peer, " is in ", theirs, " while this rank is in ",
                            mine.describe(), " [");
  for (size_t i = 0; i < diff.size(); ++i) text += (i ? "; " : "") + diff[i];
  return text + "]";
}

std::string earlyHeaderMismatch(const WireHeader& header, const Fingerprint& mine, const std::string& peer) {
  const bool wellFormed = header.magic == kHeaderMagic && header.check == checksumOf(header);
  const bool later = header.seq > mine.seq || (header.seq == mine.seq && header.part > mine.part);
  if (wellFormed && later) return "";
  return headerMismatch(header, mine, header.messageBytes, peer);
}

void registerAlgorithmNamer(AlgorithmNamer namer) {
  algorithmNamer.store(namer, std::memory_order_release);
}

}  // namespace ddplite
