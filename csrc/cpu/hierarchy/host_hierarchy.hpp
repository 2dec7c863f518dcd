// A group whose ranks span hosts, seen as hosts: the ranks of each host share a segment (a
// ShmGroup over just them), and one leader per host (its lowest rank) talks to the other hosts'
// leaders over the group's TCP mesh. The *_hierarchical.cpp files run all_reduce, broadcast,
// reduce, all_gather, reduce_scatter and barrier on it, and gather and scatter when the group
// connects on demand (exchangesThroughLeaders; else they run over TCP among all ranks); all_to_all
// then too, with one rank of each host per other host on TCP instead of the leader. Its send/recv
// go through channels among each host's ranks (CpuPath::connectHostChannels).
//
// Threading: like ShmGroup (the thread that runs the group's collectives; abort() from any);
// staging() belongs to that thread too.
#pragma once

#include "cpu/algorithms/selector.hpp"
#include "cpu/shm/shm_group.hpp"
#include "cpu/transport/rank_view.hpp"

#include <memory>
#include <string>
#include <vector>

namespace ddplite::cpu {

class HostHierarchy {
 public:
  // Collective over the group, after ShmGroup::create() found that it spans hosts (every rank
  // has published its host identity in the group's store then). Null, with *whyNot, when it is
  // not worth it (every host holds one rank) or cannot be (a host's segment failed); every rank
  // gets the same outcome. *ranksOnThisHost: how many of the group's ranks share this rank's
  // host, whatever the outcome.
  static std::unique_ptr<HostHierarchy> create(StoreRendezvous& rendezvous, Transport& mesh, int rank, int size,
                                               size_t chunkBytes, std::string* whyNot, int* ranksOnThisHost);

  // The ranks of this host as a group (null when this rank is alone on its host); local rank 0
  // is the host's leader.
  ShmGroup* local() const { return local_.get(); }
  // The hosts' leaders as a group over TCP; null unless this rank leads its host.
  Transport* leaders() const { return leaders_.get(); }
  int hosts() const { return hosts_; }
  // This rank (the group's numbering), and the most ranks any host holds.
  int rank() const { return rank_; }
  int groupSize() const { return static_cast<int>(hostOfRank_.size()); }
  int maxRanksPerHost() const { return maxRanksPerHost_; }
  // How many of the group's ranks host `host` holds.
  int ranksOn(int host) const { return static_cast<int>(ranksOf(host).size()); }
  // Whether rank r sits at block hostOf(r) * maxRanksPerHost() + indexOnHost(r) (every host holds
  // as many ranks, consecutive: 0,1 | 2,3): then the host-major order of all_gather and
  // reduce_scatter is the rank order, and their data needs no staging copy.
  bool hostMajorIsRankOrder() const { return hostMajorIsRankOrder_; }
  // The group's ranks on this host, ascending (this rank included; the first is the leader).
  const std::vector<int>& localRanks() const { return localRanks_; }
  // The group's ranks on host `host`, ascending.
  const std::vector<int>& ranksOf(int host) const { return ranksByHost_.at(static_cast<size_t>(host)); }
  // The host of group rank `rank`, numbered as the leaders' view numbers them (hosts in the order
  // of their lowest rank), and that of this rank.
  int hostOf(int rank) const { return hostOfRank_.at(static_cast<size_t>(rank)); }
  int myHost() const { return hostOf(localRanks_.front()); }
  // `rank`'s index among its host's ranks (its rank in that host's ShmGroup).
  int indexOnHost(int rank) const { return indexOnHost_.at(static_cast<size_t>(rank)); }
  // "2 hosts: ranks 0,1 | 2,3"
  const std::string& layout() const { return layout_; }
  // Whether gather and scatter go through the leaders too (gather_hierarchical.cpp), and
  // all_to_all through the segments (alltoall_hierarchical.cpp): when the group's TCP pairs
  // connect on demand (DDPLITE_CONNECT, the same on every rank). Then the root
  // holds sockets to a few leaders instead of one per rank. With every pair connected at init,
  // they go flat over TCP: on this 2-core VM the flat path measured 1.3-2.6x faster at 4 and 8
  // namespace hosts x 2 ranks (docs/history/scale.md), since the hierarchy adds a sync in each segment.
  bool exchangesThroughLeaders() const { return exchangesThroughLeaders_; }
  // Whether all_to_all goes through the segments, with one rank per pair of hosts on TCP (its
  // proxies): when gather and scatter go through the leaders, and each rank of the most crowded
  // host gets a slot of at least 64 bytes in a chunk (shm::exchangeFits), which every rank
  // computes alike.
  bool alltoallThroughProxies() const { return alltoallThroughProxies_; }
  // The host-major staging of P blocks of `block` bytes (all_gather, reduce_scatter, gather,
  // scatter): one slot of maxRanksPerHost() blocks per host. The bytes of a slot, and where
  // `rank`'s block sits among all the slots.
  size_t slotBytes(size_t block) const { return static_cast<size_t>(maxRanksPerHost_) * block; }
  size_t stagedOffset(int rank, size_t block) const {
    return static_cast<size_t>(hostOf(rank)) * slotBytes(block) + static_cast<size_t>(indexOnHost(rank)) * block;
  }
  // A buffer of at least `bytes` for a hierarchical collective's host-major copy of its data
  // (all_gather, reduce_scatter): apart from AlgorithmArgs::scratch, which the leaders' TCP
  // algorithm uses meanwhile. Valid until the next call; grows, never shrinks.
  char* staging(size_t bytes) { return staging_.get(bytes); }

  // A leader's part of a hierarchical collective: `collective` among the leaders over TCP, with
  // the algorithm the selector picks for that many leaders and `bufferBytes`, the wire
  // fingerprint naming it, and `root` (a host number; 0 when unrooted). Only on a leader
  // (leaders() non-null). If it throws, the caller must breakGroup() once it has recorded the
  // failure in the store: the host's ranks wait for their leader in the segment, and they then
  // fail at once, quoting that first failure (DdpliteBackend::failureFromTransport).
  void runAmongLeaders(Collective collective, const AlgorithmArgs& args, Fingerprint fingerprint, size_t bufferBytes,
                       int root);

  // Rails: an all_reduce of at least DDPLITE_RAILS_BYTES (read when the group is created; 0:
  // never) runs on rails() rails, part j of the data on rail j (allreduce_hierarchical.cpp).
  // rails() is the most ranks any host holds; on host h, rail j is carried by its rank of index
  // j mod ranksOn(h), so every rank of the most crowded host carries one rail and a rank of a
  // smaller host carries several, always in ascending order: the lowest rail not yet done has
  // every member in it, so the rails cannot wait on each other in a cycle.
  int rails() const { return maxRanksPerHost_; }
  // Whether an all_reduce of `count` elements and `bufferBytes` bytes runs on rails: from
  // DDPLITE_RAILS_BYTES, with at least one element per rail and at most kMaxRails rails. The same
  // answer on every rank.
  bool allreduceOnRails(size_t count, size_t bufferBytes) const;
  static constexpr int kMaxRails = 64;
  int64_t railsFromBytes() const { return railsFromBytes_; }
  // The rails this rank carries, ascending.
  const std::vector<int>& myRails() const { return myRails_; }
  // all_reduce of `args` (the rail's part of the data) among the hosts over rail `rail`, one of
  // myRails(), with the algorithm the selector picks for hosts() ranks and the part's bytes. The
  // same contract as runAmongLeaders on failure.
  void allreduceOnRail(int rail, const AlgorithmArgs& args, Fingerprint fingerprint);

  // The wire part numbers of the byte-level collective that begins (every rank calls it for every
  // collective of the group over TCP, across hosts or flat, in the op's order, so every rank
  // numbers alike; runAmongLeaders and beginAmongLeaders use them): rails() parts when
  // `railsWanted` (allreduceOnRails) and the op has that many left, else 1 (the leaders). The TCP
  // transport would number each rank's parts by its own history in the op, which differs between
  // a leader, a rank that carries one rail and a rank that carries several. Within an op the parts
  // only grow (a peer already in a later collective of the op is told apart by its higher part),
  // so rails that would not fit below kProxiesPart give way to the leaders. Returns whether the
  // collective runs on rails (onRails() until the next call). Collective thread.
  bool claimParts(uint64_t seq, bool railsWanted);
  bool onRails() const { return onRails_; }
  // The first part claimParts gave the collective that began last.
  uint8_t claimedPart() const { return static_cast<uint8_t>(claimedPart_); }

  // A leader's part of a hierarchical gather or scatter, whose steps among the leaders the caller
  // runs itself: the leaders' transport, armed with `fingerprint` (root: `rootHost`). The same
  // contract as runAmongLeaders on failure.
  Transport& beginAmongLeaders(Fingerprint fingerprint, int rootHost);

  // This rank leaves this host's segment (ShmGroup::abort: its waits end, the host's ranks that
  // wait for it raise); breakGroup: every rank of this host's segment raises at once.
  void abort(ShmGroup::Departure why);
  void breakGroup();

 private:
  HostHierarchy() = default;

  std::unique_ptr<RankView> localView_;  // the liveness probe of local_
  std::unique_ptr<ShmGroup> local_;
  std::unique_ptr<RankView> leaders_;
  int hosts_ = 0;
  int rank_ = 0;
  int maxRanksPerHost_ = 0;
  bool hostMajorIsRankOrder_ = false;
  bool exchangesThroughLeaders_ = false;
  bool alltoallThroughProxies_ = false;
  Scratch staging_;
  int64_t railsFromBytes_ = 0;  // DDPLITE_RAILS_BYTES when the group was created
  std::vector<int> myRails_;
  std::vector<std::unique_ptr<RankView>> railViews_;  // by position in myRails_
  uint64_t partsSeq_ = 0;  // claimParts: the op, its next part and the collective's first part
  int nextPart_ = 0;
  int claimedPart_ = 0;
  bool onRails_ = false;
  std::vector<int> localRanks_;
  std::vector<std::vector<int>> ranksByHost_;
  std::vector<int> hostOfRank_;   // by group rank
  std::vector<int> indexOnHost_;  // by group rank
  std::string layout_;
};

}  // namespace ddplite::cpu
