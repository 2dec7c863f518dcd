// all_to_all of a group across hosts (HostHierarchy): blocks between two ranks of a host move
// through its segment; blocks between two hosts travel in one message per pair of hosts, carried
// by one rank of each host, its proxy for the other host, instead of one message per pair of
// ranks. The ranks of a host share the other hosts between them (as NCCL's PXN spreads its
// proxies): on host h, with L ranks, the proxy for host h+t (t = 1..H-1, modulo H) is local rank
// (t-1) mod L. So a rank holds about (H-1)/L sockets for it (flat: P-1), and no one rank carries
// all of its host's bytes.
//
// Notation: P ranks, H hosts, L ranks on this host, s(i,j) the bytes rank i sends rank j (its
// input split; rank j's output split must say the same). "Remote": on another host. R_p: the
// remote ranks of the hosts local rank p is the proxy for, ascending.
// Steps:
//   1. sizes: the host's ranks all_gather their rows of 2P sizes (s(me,j), then s(j,me), for every
//      j) through the segment;
//   2. on the host (an all_to_all of uneven blocks, exchangeBlocks): each rank sends each other
//      local rank p its block for p, then its blocks for R_p (its package for proxy p);
//   3. proxies, over the group's TCP mesh, step t = 1..H-1: host h's proxy for host h+t sends that
//      host's proxy for h one message: s(i,j) for i on h, j on h+t, by i then j, after an 8-byte
//      hash of those sizes; host h's proxy for host h-t receives the message from there (one
//      sendRecv when both are the same rank). Every rank takes the steps in the same order, so
//      the pair of a step is always at that step together: no cycle of waits.
//   4. on the host (exchangeBlocks): each proxy sends each other local rank its blocks from R_p;
//      each rank copies them into place.
// A rank's own blocks go into its messages and out of them directly, without packages.
//
// Checks: blocks between ranks of a host are checked pair by pair (a mismatch names both lengths);
// a message between proxies must have the length and the size hash that the receiving host's
// splits expect, else the receiving proxy raises a mismatch naming the sending host.
//
// Cost, with B = the bytes a rank sends to remote ranks (and receives from them): network, about
// (H-1)/L messages in and out per rank, of L B / (H-1) bytes on average, instead of P-L messages
// of B/(P-L) per rank; memory, each rank copies about 3B more (package out and in, message,
// delivery out and in). Segment syncs: 1 + K in each of steps 1, 2 and 4, K = the pieces of the
// largest transfer of the step in slots of C/L bytes (16P bytes per rank in step 1, a package of
// about B/L in steps 2 and 4).
#include "common/errors.hpp"
#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddplite::cpu::hierarchy {

namespace {

// The host's size rows (step 1): row j is local rank j's, s(j,k) then s(k,j) for every group rank k.
class SizeRows {
 public:
  SizeRows(int rows, int ranks) : ranks_(ranks), sizes_(static_cast<size_t>(rows) * 2 * ranks, 0) {}
  uint64_t& sends(int row, int to) { return sizes_[index(row, to)]; }
  uint64_t& receives(int row, int from) { return sizes_[index(row, from) + static_cast<size_t>(ranks_)]; }
  uint64_t sends(int row, int to) const { return sizes_[index(row, to)]; }
  uint64_t receives(int row, int from) const { return sizes_[index(row, from) + static_cast<size_t>(ranks_)]; }
  char* data() { return reinterpret_cast<char*>(sizes_.data()); }
  size_t rowBytes() const { return 2 * static_cast<size_t>(ranks_) * sizeof(uint64_t); }

 private:
  size_t index(int row, int rank) const { return static_cast<size_t>(row) * 2 * ranks_ + static_cast<size_t>(rank); }
  int ranks_;
  std::vector<uint64_t> sizes_;
};

// FNV-1a over a sequence of block sizes: what a message between proxies carries first, so that
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

// One rank's part, steps 2 to 4, once the rows are known. Buffers: hosts.staging(), laid out once.
class AlltoallAcrossHosts {
 public:
  AlltoallAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, const SizeRows& rows)
      : hosts_(hosts),
        args_(args),
        rows_(rows),
        locals_(hosts.localRanks()),
        local_(static_cast<int>(hosts.localRanks().size())),
        me_(hosts.indexOnHost(hosts.rank())),
        size_(hosts.groupSize()) {
    proxied_.assign(static_cast<size_t>(local_), {});
    for (int peer = 0; peer < size_; ++peer) {
      if (hosts_.hostOf(peer) != hosts_.myHost()) proxied_[static_cast<size_t>(proxyFor(hosts_.hostOf(peer)))].push_back(peer);
    }
    layOut();
  }

  // Step 2: the blocks between this host's ranks, and the packages for their proxies.
  shm::ExchangeBlocks packagesAndOwnBlocks() {
    shm::ExchangeBlocks blocks;
    blocks.resize(local_);
    for (int j = 0; j < local_; ++j) {
      if (j == me_) continue;
      char* out = packageOut_[static_cast<size_t>(j)];
      const Span& direct = args_.sendSpans[static_cast<size_t>(locals_[static_cast<size_t>(j)])];
      copyBytes(out, args_.sendData + direct.offset, direct.bytes);
      size_t offset = direct.bytes;  // then the blocks for R_j
      for (int peer : proxied_[static_cast<size_t>(j)]) {
        const Span& span = args_.sendSpans[static_cast<size_t>(peer)];
        copyBytes(out + offset, args_.sendData + span.offset, span.bytes);
        offset += span.bytes;
      }
      blocks.setSend(j, out, offset);
      blocks.setRecv(j, packageIn_[static_cast<size_t>(j)], packageBytes(j, me_));
    }
    return blocks;
  }

  // After step 2: each local rank's block for this rank, from the front of its package.
  void takeOwnBlocks() {
    for (int j = 0; j < local_; ++j) {
      if (j == me_) continue;
      const Span& span = args_.recvSpans[static_cast<size_t>(locals_[static_cast<size_t>(j)])];
      copyBytes(args_.recvData + span.offset, packageIn_[static_cast<size_t>(j)], span.bytes);
    }
  }

  // Step 3.
  void exchangeWithProxies(const Fingerprint& fingerprint) {
    Transport& mesh = args_.transport;
    Fingerprint proxies = fingerprint;
    proxies.part = kProxiesPart;  // the same on a leader, which may have armed the mesh in this op, and on the others
    proxies.partGiven = true;
    mesh.beginCollective(proxies);
    const int hostCount = hosts_.hosts();
    const int mine = hosts_.myHost();
    for (int step = 1; step < hostCount; ++step) {
      const int to = (mine + step) % hostCount;
      const int from = (mine - step + hostCount) % hostCount;
      const bool sends = proxyFor(to) == me_;
      const bool receives = proxyFor(from) == me_;
      const size_t outBytes = sends ? packMessageFor(to) : 0;
      const size_t inBytes = receives ? messageBytes(from, /*outgoing=*/false) : 0;
      if (sends && receives) {
        mesh.sendRecv(partnerOn(to), messageOutAt_, outBytes, partnerOn(from), messageInAt_, inBytes, args_.deadline);
      } else if (sends) {
        mesh.send(partnerOn(to), messageOutAt_, outBytes, args_.deadline);
      } else if (receives) {
        mesh.recv(partnerOn(from), messageInAt_, inBytes, args_.deadline);
      }
      if (receives) unpackMessageFrom(from);
    }
  }

  // Step 4: to each other local rank, its blocks from R_me; from each, this rank's from R_j.
  shm::ExchangeBlocks deliveries() {
    shm::ExchangeBlocks blocks;
    blocks.resize(local_);
    for (int j = 0; j < local_; ++j) {
      if (j == me_) continue;
      blocks.setSend(j, deliveryOut_[static_cast<size_t>(j)], deliveryBytes(me_, j));
      blocks.setRecv(j, deliveryIn_[static_cast<size_t>(j)], deliveryBytes(j, me_));
    }
    return blocks;
  }

  // After step 4: the blocks from the remote ranks other proxies carried, into place.
  void takeDeliveries() {
    for (int j = 0; j < local_; ++j) {
      if (j == me_) continue;
      size_t offset = 0;
      for (int peer : proxied_[static_cast<size_t>(j)]) {
        const Span& span = args_.recvSpans[static_cast<size_t>(peer)];
        copyBytes(args_.recvData + span.offset, deliveryIn_[static_cast<size_t>(j)] + offset, span.bytes);
        offset += span.bytes;
      }
    }
  }

 private:
  // This host's proxy for host `host` (a local index), and the rank `host` talks to this host through:
  // the t-th host after this one (t = 1..H-1) is local rank (t-1) mod L's, on either side.
  int proxyFor(int host) const { return proxyOn(hosts_.myHost(), host, local_); }
  int partnerOn(int host) const {
    const std::vector<int>& there = hosts_.ranksOf(host);
    return there[static_cast<size_t>(proxyOn(host, hosts_.myHost(), static_cast<int>(there.size())))];
  }
  int proxyOn(int host, int forHost, int ranks) const {
    const int after = (forHost - host + hosts_.hosts()) % hosts_.hosts();  // 1..H-1
    return (after - 1) % ranks;
  }

  // Local rank i's package for local proxy j (step 2: its block for j, then those for R_j), and
  // proxy p's delivery to local rank j (step 4).
  size_t packageBytes(int i, int j) const {
    size_t bytes = rows_.sends(i, locals_[static_cast<size_t>(j)]);
    for (int peer : proxied_[static_cast<size_t>(j)]) bytes += rows_.sends(i, peer);
    return bytes;
  }
  size_t deliveryBytes(int p, int j) const {
    size_t bytes = 0;
    for (int peer : proxied_[static_cast<size_t>(p)]) bytes += rows_.receives(j, peer);
    return bytes;
  }

  // The message between this host and `host`, hash included: outgoing, by this host's input
  // splits; incoming, by its output splits.
  size_t messageBytes(int host, bool outgoing) const {
    size_t bytes = sizeof(uint64_t);
    for (int j = 0; j < local_; ++j) {
      for (int peer : hosts_.ranksOf(host)) bytes += outgoing ? rows_.sends(j, peer) : rows_.receives(j, peer);
    }
    return bytes;
  }

  // Every buffer of steps 2 to 4 in one staging allocation, and where each block sits in them.
  void layOut() {
    size_t messageOut = 0, messageIn = 0;
    for (int host = 0; host < hosts_.hosts(); ++host) {
      if (host == hosts_.myHost() || proxyFor(host) != me_) continue;
      messageOut = std::max(messageOut, messageBytes(host, true));
      messageIn = std::max(messageIn, messageBytes(host, false));
    }
    size_t total = messageOut + messageIn;
    for (int j = 0; j < local_; ++j) {
      if (j == me_) continue;
      total += packageBytes(me_, j) + packageBytes(j, me_) + deliveryBytes(me_, j) + deliveryBytes(j, me_);
    }
    char* next = hosts_.staging(total);
    auto take = [&next](size_t bytes) {
      char* at = next;
      next += bytes;
      return at;
    };
    messageOutAt_ = take(messageOut);
    messageInAt_ = take(messageIn);
    packageOut_.assign(static_cast<size_t>(local_), nullptr);
    packageIn_.assign(static_cast<size_t>(local_), nullptr);
    deliveryOut_.assign(static_cast<size_t>(local_), nullptr);
    deliveryIn_.assign(static_cast<size_t>(local_), nullptr);
    const std::vector<int>& mine = proxied_[static_cast<size_t>(me_)];
    positionInMine_.assign(static_cast<size_t>(size_), -1);
    for (size_t k = 0; k < mine.size(); ++k) positionInMine_[static_cast<size_t>(mine[k])] = static_cast<int>(k);
    packageOffset_.assign(static_cast<size_t>(local_) * mine.size(), 0);
    deliveryOffset_.assign(static_cast<size_t>(local_) * mine.size(), 0);
    for (int j = 0; j < local_; ++j) {
      if (j == me_) continue;
      packageOut_[static_cast<size_t>(j)] = take(packageBytes(me_, j));
      packageIn_[static_cast<size_t>(j)] = take(packageBytes(j, me_));
      deliveryOut_[static_cast<size_t>(j)] = take(deliveryBytes(me_, j));
      deliveryIn_[static_cast<size_t>(j)] = take(deliveryBytes(j, me_));
      size_t in = rows_.sends(j, hosts_.rank()), out = 0;
      for (int peer : mine) {
        packageOffset_[at(j, peer)] = in;
        in += rows_.sends(j, peer);
        deliveryOffset_[at(j, peer)] = out;
        out += rows_.receives(j, peer);
      }
    }
  }

  // Where local rank j's entry for `peer` (in R_me) sits in packageOffset_ and deliveryOffset_.
  size_t at(int j, int peer) const {
    return static_cast<size_t>(j) * proxied_[static_cast<size_t>(me_)].size() +
           static_cast<size_t>(positionInMine_[static_cast<size_t>(peer)]);
  }

  const char* blockFrom(int j, int peer) const {
    if (j == me_) return args_.sendData + args_.sendSpans[static_cast<size_t>(peer)].offset;
    return packageIn_[static_cast<size_t>(j)] + packageOffset_[at(j, peer)];
  }

  char* blockTo(int j, int peer) const {
    if (j == me_) return args_.recvData + args_.recvSpans[static_cast<size_t>(peer)].offset;
    return deliveryOut_[static_cast<size_t>(j)] + deliveryOffset_[at(j, peer)];
  }

  // The message to `host`: the size hash, then s(i,j) for i here, j there, by i then j.
  size_t packMessageFor(int host) {
    SizeHash hash;
    size_t offset = sizeof(uint64_t);
    for (int j = 0; j < local_; ++j) {
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
  // to this rank's output or to a local rank's delivery.
  void unpackMessageFrom(int host) {
    SizeHash hash;
    for (int peer : hosts_.ranksOf(host)) {
      for (int j = 0; j < local_; ++j) hash.add(rows_.receives(j, peer));
    }
    uint64_t sent = 0;
    std::memcpy(&sent, messageInAt_, sizeof(sent));
    if (sent != hash.value()) throwSplitsDiffer(host);
    size_t offset = sizeof(uint64_t);
    for (int peer : hosts_.ranksOf(host)) {
      for (int j = 0; j < local_; ++j) {
        const size_t bytes = rows_.receives(j, peer);
        copyBytes(blockTo(j, peer), messageInAt_ + offset, bytes);
        offset += bytes;
      }
    }
  }

  [[noreturn]] void throwSplitsDiffer(int host) const {
    const std::vector<int>& there = hosts_.ranksOf(host);
    const int sender = partnerOn(host);
    throw TransportError(
        TransportError::Kind::kMismatch, sender,
        strCat("collective mismatch: all_to_all split sizes differ between the ranks of another host (ranks ",
               describeRanks(there), ", through rank ", sender, ") and the ranks of this one (ranks ",
               describeRanks(locals_), "): the message between the two hosts has the length this host expects, "
               "but the sizes of its blocks differ [hint: rank i's input_split_sizes[j] must equal rank j's "
               "output_split_sizes[i] on every rank]"));
  }

  HostHierarchy& hosts_;
  const ExchangeArgs& args_;
  const SizeRows& rows_;
  const std::vector<int>& locals_;
  const int local_;
  const int me_;
  const int size_;
  std::vector<std::vector<int>> proxied_;  // by local rank p: R_p
  std::vector<char*> packageOut_, packageIn_, deliveryOut_, deliveryIn_;  // by local rank (none for this one)
  std::vector<int> positionInMine_;     // by group rank: its index in R_me, -1 when not in it
  std::vector<size_t> packageOffset_;   // [at(j, peer)]: where j's block for `peer` in R_me sits in its package
  std::vector<size_t> deliveryOffset_;  // [at(j, peer)]: where `peer`'s block for j sits in j's delivery
  char* messageOutAt_ = nullptr;
  char* messageInAt_ = nullptr;
};

// Splits that do not match between two ranks of this host, which every rank of the host sees in
// the rows: each raises the same mismatch (the first pair in local order), naming both lengths.
void checkLocalSplits(const HostHierarchy& hosts, const SizeRows& rows) {
  const std::vector<int>& locals = hosts.localRanks();
  const int local = static_cast<int>(locals.size());
  for (int i = 0; i < local; ++i) {
    for (int j = 0; j < local; ++j) {
      const uint64_t sent = rows.sends(i, locals[static_cast<size_t>(j)]);
      const uint64_t expected = rows.receives(j, locals[static_cast<size_t>(i)]);
      if (i == j || sent == expected) continue;
      const std::string receiver = locals[static_cast<size_t>(j)] == hosts.rank()
                                       ? std::string("this rank")
                                       : strCat("rank ", locals[static_cast<size_t>(j)]);
      const std::string detail =
          locals[static_cast<size_t>(j)] == hosts.rank()
              ? strCat(" [message length: ", expected, " bytes expected here, ", sent,
                       " bytes sent by the peer (all_to_all split sizes that do not match)]")
              : std::string(" [all_to_all split sizes that do not match]");
      throw TransportError(TransportError::Kind::kMismatch, locals[static_cast<size_t>(i)],
                           strCat("collective mismatch: ", hosts.local()->describePeer(i), " sends ", sent, " bytes to ",
                                  receiver, ", which expects ", expected, detail));
    }
  }
}

}  // namespace

void alltoallAcrossHosts(HostHierarchy& hosts, const ExchangeArgs& args, const Fingerprint& fingerprint,
                         uint64_t refusedSeq) {
  const int size = hosts.groupSize();
  const int rank = hosts.rank();
  const int local = static_cast<int>(hosts.localRanks().size());
  const int me = hosts.indexOnHost(rank);
  const Span& own = args.sendSpans[static_cast<size_t>(rank)];
  copyBytes(args.recvData + args.recvSpans[static_cast<size_t>(rank)].offset, args.sendData + own.offset, own.bytes);

  SizeRows rows(local, size);
  for (int peer = 0; peer < size; ++peer) {
    rows.sends(me, peer) = args.sendSpans[static_cast<size_t>(peer)].bytes;
    rows.receives(me, peer) = args.recvSpans[static_cast<size_t>(peer)].bytes;
  }
  ShmGroup* group = hosts.local();
  if (group != nullptr) {  // step 1
    group->beginCollective(shm::segmentPartOf(fingerprint), refusedSeq);
    Scratch unused;  // allgather through the segment needs no scratch
    shm::allgather(*group, AlgorithmArgs{args.transport, args.deadline, unused, rows.data(), rows.rowBytes(), 1});
    checkLocalSplits(hosts, rows);
  }
  AlltoallAcrossHosts part(hosts, args, rows);
  if (group != nullptr) {  // step 2
    shm::exchangeBlocks(*group, part.packagesAndOwnBlocks(), args.deadline);
    part.takeOwnBlocks();
  }
  part.exchangeWithProxies(fingerprint);  // step 3
  if (group != nullptr) {                 // step 4
    shm::exchangeBlocks(*group, part.deliveries(), args.deadline);
    group->endCollective();  // open from step 1 (collectiveOpen)
    part.takeDeliveries();
  }
}

}  // namespace ddplite::cpu::hierarchy
