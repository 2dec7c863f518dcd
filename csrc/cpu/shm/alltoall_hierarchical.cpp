// all_to_all of a group across hosts (HostHierarchy): blocks between two ranks of a host move
// through its segment; blocks between hosts travel in one message per pair of hosts, between the
// hosts' leaders, instead of one per pair of ranks. A rank that leads no host opens no socket for
// it (flat, each rank connects on demand to every other: P-1 sockets per rank).
//
// Notation: P ranks, H hosts, L ranks on this host, s(i,j) the bytes rank i sends rank j (its
// input split; rank j's output split must say the same). "Remote": on another host.
// Steps:
//   1. sizes: every rank sends its leader its row of 2P sizes, s(me,j) and s(j,me) for every j,
//      through the segment (a gather by exchangeBlocks);
//   2. on the host (one all_to_all of uneven blocks by exchangeBlocks): each rank sends each other
//      rank of its host its block directly, and its leader a package: its block for the leader,
//      then its blocks for the remote ranks in rank order;
//   3. leaders, pairwise over TCP (step t = 1..H-1: send to host h+t, receive from host h-t): the
//      message from host h to host g holds s(i,j) for i on h, j on g, ordered by i then j, after
//      an 8-byte hash of those sizes;
//   4. on the host (a scatter by exchangeBlocks): the leader sends each other rank of its host a
//      package of its blocks from the remote ranks in rank order; each rank copies them out.
// The leader's own blocks go into the messages and out of them directly, without packages.
//
// Checks: blocks between ranks of a host are checked pair by pair (steps 1-2; a mismatch names
// both lengths); a message between leaders must have the length and the size hash that the
// receiving host's splits expect, else the leader raises a mismatch naming the sending host.
//
// Cost, with B = the bytes a rank sends to remote ranks (and receives from them): network, H-1
// messages in and out per leader, of L B / (H-1) bytes on average, instead of P-L messages of B/(P-L)
// per rank; memory, a non-leader copies B twice more (its packages), the leader L B three times
// more (packages in, messages, packages out). Segment syncs: 1 + K in each of steps 1, 2 and 4,
// K = the pieces of the largest transfer of the step through slots of C/L bytes: 16P bytes of
// sizes in step 1; a package of about B bytes (plus a block) in steps 2 and 4. So the syncs grow
// with B / (C/L): with 64 KB blocks at 16 hosts x 4 ranks (B about 3.9 MB, C/L = 128 KiB), about
// 31 per step, where flat TCP sends 63 messages; past such sizes flat TCP measured faster
// (docs/scale.md, "all_to_all across hosts").
#include "common/errors.hpp"
#include "cpu/shm/host_hierarchy.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

namespace ddplite::cpu::shm {

namespace {

// The sizes one rank contributes (step 1): what it sends every rank, then what it receives from
// every rank.
class SizeRows {
 public:
  SizeRows(int rows, int ranks) : ranks_(ranks), sizes_(static_cast<size_t>(rows) * 2 * ranks, 0) {}
  uint64_t& sends(int row, int to) { return sizes_[index(row, to)]; }
  uint64_t& receives(int row, int from) { return sizes_[index(row, from) + static_cast<size_t>(ranks_)]; }
  char* rowAt(int row) { return reinterpret_cast<char*>(&sizes_[index(row, 0)]); }
  size_t rowBytes() const { return 2 * static_cast<size_t>(ranks_) * sizeof(uint64_t); }

 private:
  size_t index(int row, int rank) const { return static_cast<size_t>(row) * 2 * ranks_ + static_cast<size_t>(rank); }
  int ranks_;
  std::vector<uint64_t> sizes_;
};

// FNV-1a over a sequence of block sizes: what a message between leaders carries first, so that
// splits whose totals agree but whose blocks do not are still a mismatch.
class SizeHash {
 public:
  void add(uint64_t size) {
    for (int byte = 0; byte < 8; ++byte) {
      hash_ ^= (size >> (8 * byte)) & 0xff;
      hash_ *= 1099511628211ull;
    }
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

void copyBytes(char* to, const char* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

std::string describeRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size(); ++i) text += strCat(i == 0 ? "" : ",", ranks[i]);
  return text;
}

// What a leader does (steps 1-4 from the leader's side); `rows` holds row j for local rank j.
class LeaderPart {
 public:
  LeaderPart(HostHierarchy& hosts, const ExchangeArgs& args, SizeRows& rows)
      : hosts_(hosts), args_(args), rows_(rows), locals_(hosts.localRanks()), size_(hosts.groupSize()) {}

  // Step 2's receives: each local rank's package, after checking that its block for this rank
  // has the length this rank expects. Lays out every buffer of the steps in hosts.staging().
  void prepare(ExchangeBlocks& onHost) {
    const int local = static_cast<int>(locals_.size());
    packageOffset_.assign(static_cast<size_t>(local) * size_, 0);
    deliverOffset_.assign(static_cast<size_t>(local) * size_, 0);
    std::vector<size_t> packageBytes(static_cast<size_t>(local), 0), deliverBytes(static_cast<size_t>(local), 0);
    for (int j = 1; j < local; ++j) {
      checkBlockForLeader(j);
      size_t in = rows_.sends(j, hosts_.rank()), out = 0;
      for (int peer = 0; peer < size_; ++peer) {
        if (isLocal(peer)) continue;
        packageOffset_[at(j, peer)] = in;
        in += rows_.sends(j, peer);
        deliverOffset_[at(j, peer)] = out;
        out += rows_.receives(j, peer);
      }
      packageBytes[static_cast<size_t>(j)] = in;
      deliverBytes[static_cast<size_t>(j)] = out;
    }
    size_t messageOut = 0, messageIn = 0;  // the largest of each: one message at a time each way
    for (int host = 0; host < hosts_.hosts(); ++host) {
      if (host == hosts_.myHost()) continue;
      messageOut = std::max(messageOut, messageBytes(host, /*outgoing=*/true));
      messageIn = std::max(messageIn, messageBytes(host, /*outgoing=*/false));
    }
    size_t total = messageOut + messageIn;
    for (int j = 1; j < local; ++j) total += packageBytes[static_cast<size_t>(j)] + deliverBytes[static_cast<size_t>(j)];
    char* staged = hosts_.staging(total);
    messageOutAt_ = staged;
    messageInAt_ = staged + messageOut;
    char* next = messageInAt_ + messageIn;
    packages_.assign(static_cast<size_t>(local), nullptr);
    deliveries_.assign(static_cast<size_t>(local), nullptr);
    deliveryBytes_ = deliverBytes;
    for (int j = 1; j < local; ++j) {
      packages_[static_cast<size_t>(j)] = next;
      next += packageBytes[static_cast<size_t>(j)];
      deliveries_[static_cast<size_t>(j)] = next;
      next += deliverBytes[static_cast<size_t>(j)];
      onHost.setRecv(j, packages_[static_cast<size_t>(j)], packageBytes[static_cast<size_t>(j)]);
    }
  }

  // After step 2: each local rank's block for this rank, from the front of its package.
  void takeOwnBlocks() {
    for (int j = 1; j < static_cast<int>(locals_.size()); ++j) {
      const Span& span = args_.recvSpans[static_cast<size_t>(locals_[static_cast<size_t>(j)])];
      copyBytes(args_.recvData + span.offset, packages_[static_cast<size_t>(j)], span.bytes);
    }
  }

  // Step 3.
  void exchangeWithLeaders(const Fingerprint& fingerprint) {
    Transport& leaders = hosts_.beginAmongLeaders(fingerprint, -1);
    const int hostCount = hosts_.hosts();
    const int mine = hosts_.myHost();
    for (int step = 1; step < hostCount; ++step) {
      const int to = (mine + step) % hostCount;
      const int from = (mine - step + hostCount) % hostCount;
      const size_t outBytes = packMessageFor(to);
      leaders.sendRecv(to, messageOutAt_, outBytes, from, messageInAt_, messageBytes(from, false), args_.deadline);
      unpackMessageFrom(from, messageInAt_);
    }
  }

  // Step 4's sends: each other local rank's blocks from the remote ranks.
  void addDeliveries(ExchangeBlocks& onHost) const {
    for (int j = 1; j < static_cast<int>(locals_.size()); ++j) {
      onHost.setSend(j, deliveries_[static_cast<size_t>(j)], deliveryBytes_[static_cast<size_t>(j)]);
    }
  }

 private:
  bool isLocal(int rank) const { return hosts_.hostOf(rank) == hosts_.myHost(); }
  size_t at(int localIndex, int rank) const { return static_cast<size_t>(localIndex) * size_ + static_cast<size_t>(rank); }

  // Local rank j's block for this rank must be as long as this rank's split for j says (the
  // segment checks the pairs that do not involve the leader's package itself).
  void checkBlockForLeader(int j) const {
    const int peer = locals_[static_cast<size_t>(j)];
    const uint64_t sent = rows_.sends(j, hosts_.rank());
    const uint64_t expected = args_.recvSpans[static_cast<size_t>(peer)].bytes;
    if (sent == expected) return;
    throw TransportError(TransportError::Kind::kMismatch, peer,
                         strCat("collective mismatch: ", hosts_.local()->describePeer(j), " sends ", sent,
                                " bytes to this rank, which expects ", expected, " [message length: ", expected,
                                " bytes expected here, ", sent,
                                " bytes sent by the peer (all_to_all split sizes that do not match)]"));
  }

  // The message between this host and `host`, hash included: outgoing, by this host's input
  // splits; incoming, by its output splits.
  size_t messageBytes(int host, bool outgoing) const {
    size_t bytes = sizeof(uint64_t);
    for (int j = 0; j < static_cast<int>(locals_.size()); ++j) {
      for (int peer : hosts_.ranksOf(host)) bytes += outgoing ? rows_.sends(j, peer) : rows_.receives(j, peer);
    }
    return bytes;
  }

  const char* blockFrom(int j, int peer) const {
    if (j == 0) return args_.sendData + args_.sendSpans[static_cast<size_t>(peer)].offset;
    return packages_[static_cast<size_t>(j)] + packageOffset_[at(j, peer)];
  }

  char* blockTo(int j, int peer) const {
    if (j == 0) return args_.recvData + args_.recvSpans[static_cast<size_t>(peer)].offset;
    return deliveries_[static_cast<size_t>(j)] + deliverOffset_[at(j, peer)];
  }

  // The message to `host`: the size hash, then s(i,j) for i here, j there, by i then j.
  size_t packMessageFor(int host) {
    SizeHash hash;
    size_t offset = sizeof(uint64_t);
    for (int j = 0; j < static_cast<int>(locals_.size()); ++j) {
      for (int peer : hosts_.ranksOf(host)) {
        const size_t bytes = rows_.sends(j, peer);
        hash.add(bytes);
        copyBytes(messageOutAt_ + offset, blockFrom(j, peer), bytes);
        offset += bytes;
      }
    }
    const uint64_t value = hash.value();
    std::memcpy(messageOutAt_, &value, sizeof(value));
    return offset;
  }

  // The message from `host` (s(i,j) for i there, j here, by i then j), checked, then each block
  // to this rank's output or to its local rank's delivery.
  void unpackMessageFrom(int host, const char* message) {
    SizeHash hash;
    for (int peer : hosts_.ranksOf(host)) {
      for (int j = 0; j < static_cast<int>(locals_.size()); ++j) hash.add(rows_.receives(j, peer));
    }
    uint64_t sent = 0;
    std::memcpy(&sent, message, sizeof(sent));
    if (sent != hash.value()) throwSplitsDiffer(host);
    size_t offset = sizeof(uint64_t);
    for (int peer : hosts_.ranksOf(host)) {
      for (int j = 0; j < static_cast<int>(locals_.size()); ++j) {
        const size_t bytes = rows_.receives(j, peer);
        copyBytes(blockTo(j, peer), message + offset, bytes);
        offset += bytes;
      }
    }
  }

  [[noreturn]] void throwSplitsDiffer(int host) const {
    const std::vector<int>& there = hosts_.ranksOf(host);
    throw TransportError(
        TransportError::Kind::kMismatch, there.front(),
        strCat("collective mismatch: all_to_all split sizes differ between the ranks of another host (ranks ",
               describeRanks(there), ", led by rank ", there.front(), ") and the ranks of this one (ranks ",
               describeRanks(locals_), "): the message between the two leaders has the length this host expects, "
               "but the sizes of its blocks differ [hint: rank i's input_split_sizes[j] must equal rank j's "
               "output_split_sizes[i] on every rank]"));
  }

  HostHierarchy& hosts_;
  const ExchangeArgs& args_;
  SizeRows& rows_;
  const std::vector<int>& locals_;
  const int size_;
  std::vector<size_t> packageOffset_;  // [j * P + peer]: where j's block for remote `peer` sits in its package
  std::vector<size_t> deliverOffset_;  // [j * P + peer]: where remote `peer`'s block for j sits in j's delivery
  std::vector<char*> packages_;        // by local rank (0: none)
  std::vector<char*> deliveries_;      // by local rank (0: none)
  std::vector<size_t> deliveryBytes_;
  char* messageOutAt_ = nullptr;
  char* messageInAt_ = nullptr;
};

}  // namespace

void alltoallAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, const Fingerprint& fingerprint,
                         uint64_t refusedSeq) {
  const int size = hosts.groupSize();
  const int rank = hosts.rank();
  const int local = static_cast<int>(hosts.localRanks().size());
  const int leaderRank = hosts.localRanks().front();
  const bool leads = rank == leaderRank;
  auto isLocal = [&](int peer) { return hosts.hostOf(peer) == hosts.myHost(); };

  SizeRows rows(leads ? local : 1, size);  // row 0: this rank's
  for (int peer = 0; peer < size; ++peer) {
    rows.sends(0, peer) = args.sendSpans[static_cast<size_t>(peer)].bytes;
    rows.receives(0, peer) = args.recvSpans[static_cast<size_t>(peer)].bytes;
  }
  copyBytes(args.recvData + args.recvSpans[static_cast<size_t>(rank)].offset,
            args.sendData + args.sendSpans[static_cast<size_t>(rank)].offset,
            args.sendSpans[static_cast<size_t>(rank)].bytes);

  ShmGroup* group = hosts.local();
  if (group != nullptr) group->beginCollective(segmentPartOf(fingerprint), refusedSeq);
  if (group != nullptr) {  // step 1
    ExchangeBlocks sizes;
    sizes.resize(local);
    for (int j = 1; j < local && leads; ++j) sizes.setRecv(j, rows.rowAt(j), rows.rowBytes());
    if (!leads) sizes.setSend(0, rows.rowAt(0), rows.rowBytes());
    exchangeBlocks(*group, sizes, args.deadline);
  }

  std::unique_ptr<LeaderPart> leader;
  char* outPackage = nullptr;  // a non-leader's: its block for the leader, then those for remote ranks
  char* inPackage = nullptr;   // a non-leader's: its blocks from the remote ranks
  size_t inBytes = 0;
  ExchangeBlocks onHost;
  onHost.resize(local);
  if (leads) {
    leader = std::make_unique<LeaderPart>(hosts, args, rows);
    leader->prepare(onHost);
  } else {
    size_t outBytes = args.sendSpans[static_cast<size_t>(leaderRank)].bytes;
    for (int peer = 0; peer < size; ++peer) {
      if (isLocal(peer)) continue;
      outBytes += args.sendSpans[static_cast<size_t>(peer)].bytes;
      inBytes += args.recvSpans[static_cast<size_t>(peer)].bytes;
    }
    outPackage = hosts.staging(outBytes + inBytes);
    inPackage = outPackage + outBytes;
    const Span& forLeader = args.sendSpans[static_cast<size_t>(leaderRank)];
    copyBytes(outPackage, args.sendData + forLeader.offset, forLeader.bytes);
    size_t offset = forLeader.bytes;  // then the blocks for the remote ranks, in rank order
    for (int peer = 0; peer < size; ++peer) {
      if (isLocal(peer)) continue;
      const Span& span = args.sendSpans[static_cast<size_t>(peer)];
      copyBytes(outPackage + offset, args.sendData + span.offset, span.bytes);
      offset += span.bytes;
    }
    onHost.setSend(0, outPackage, outBytes);
    const Span& fromLeader = args.recvSpans[static_cast<size_t>(leaderRank)];
    onHost.setRecv(0, args.recvData + fromLeader.offset, fromLeader.bytes);
  }
  const int me = hosts.indexOnHost(rank);
  for (int j = 1; j < local; ++j) {  // direct blocks between ranks of the host other than the leader
    if (j == me) continue;
    const int peer = hosts.localRanks()[static_cast<size_t>(j)];
    const Span& out = args.sendSpans[static_cast<size_t>(peer)];
    onHost.setSend(j, args.sendData + out.offset, out.bytes);
    if (!leads) {
      const Span& in = args.recvSpans[static_cast<size_t>(peer)];
      onHost.setRecv(j, args.recvData + in.offset, in.bytes);
    }
  }
  if (group != nullptr) exchangeBlocks(*group, onHost, args.deadline);  // step 2
  if (leads) {
    leader->takeOwnBlocks();
    if (hosts.leaders() != nullptr) leader->exchangeWithLeaders(fingerprint);  // step 3
  }
  if (group != nullptr) {  // step 4
    ExchangeBlocks deliveries;
    deliveries.resize(local);
    if (leads) {
      leader->addDeliveries(deliveries);
    } else {
      deliveries.setRecv(0, inPackage, inBytes);
    }
    exchangeBlocks(*group, deliveries, args.deadline);
    group->endCollective();  // open from step 1 (collectiveOpen)
  }
  if (leads) return;
  size_t offset = 0;
  for (int peer = 0; peer < size; ++peer) {
    if (isLocal(peer)) continue;
    const Span& span = args.recvSpans[static_cast<size_t>(peer)];
    copyBytes(args.recvData + span.offset, inPackage + offset, span.bytes);
    offset += span.bytes;
  }
}

}  // namespace ddplite::cpu::shm
