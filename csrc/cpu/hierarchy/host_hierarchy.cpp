#include "cpu/hierarchy/host_hierarchy.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "cpu/shm/shm_algorithms.hpp"
#include "rendezvous/host_layout.hpp"

#include <c10/util/StringUtil.h>

#include <algorithm>

namespace ddplite::cpu {

namespace {

// Wire parts given by claimParts: from 1 (0 is where the transport's own numbering starts, for a
// TCP collective of the op that does not go through the hierarchy) to 254 (255 is kProxiesPart);
// past that, one-part collectives start from 1 again, as the transport's own numbering wraps.
constexpr int kFirstGivenPart = 1;
constexpr int kLastGivenPart = kProxiesPart - 1;

// The ranks of rail `rail`, one per host in host order: host h's rank of index rail mod ranksOn(h).
std::vector<int> railRanks(const std::vector<std::vector<int>>& hosts, int rail) {
  std::vector<int> ranks;
  for (const auto& onHost : hosts) ranks.push_back(onHost[static_cast<size_t>(rail) % onHost.size()]);
  return ranks;
}

// The group's ranks by host, hosts in the order of their lowest rank, ranks ascending: the layout
// rank 0 published in ShmSegment::create (rendezvous/host_layout.hpp).
std::vector<std::vector<int>> ranksByHost(StoreRendezvous& rendezvous, int size) {
  return publishedHostLayout(rendezvous, size).ranksByHost();
}

std::string describeLayout(const std::vector<std::vector<int>>& hosts) {
  std::string text = strCat(hosts.size(), " hosts: ranks ");
  for (size_t host = 0; host < hosts.size(); ++host) {
    text += (host == 0 ? "" : " | ") + c10::Join(",", hosts[host]);
  }
  return text;
}

}  // namespace

std::unique_ptr<HostHierarchy> HostHierarchy::create(StoreRendezvous& rendezvous, Transport& mesh, int rank, int size,
                                                     size_t chunkBytes, std::string* whyNot, int* ranksOnThisHost) {
  const std::vector<std::vector<int>> hosts = ranksByHost(rendezvous, size);
  bool anyShared = false;
  for (const auto& ranks : hosts) {
    anyShared = anyShared || ranks.size() > 1;
    if (std::find(ranks.begin(), ranks.end(), rank) != ranks.end()) *ranksOnThisHost = static_cast<int>(ranks.size());
  }
  if (!anyShared) {
    *whyNot = strCat("every host holds one rank (", describeLayout(hosts), ")");
    return nullptr;
  }
  std::unique_ptr<HostHierarchy> hierarchy(new HostHierarchy());
  hierarchy->hosts_ = static_cast<int>(hosts.size());
  hierarchy->rank_ = rank;
  hierarchy->ranksByHost_ = hosts;
  for (const auto& ranks : hosts) {
    hierarchy->maxRanksPerHost_ = std::max(hierarchy->maxRanksPerHost_, static_cast<int>(ranks.size()));
  }
  hierarchy->layout_ = describeLayout(hosts);
  hierarchy->exchangesThroughLeaders_ = env::connectOnDemand(size);
  hierarchy->alltoallThroughProxies_ =
      hierarchy->exchangesThroughLeaders_ && shm::exchangeFits(chunkBytes, hierarchy->maxRanksPerHost_);
  std::vector<int> leaders;
  const std::vector<int>* mine = nullptr;
  for (const auto& ranks : hosts) {
    leaders.push_back(ranks.front());
    for (int member : ranks) {
      if (member == rank) mine = &ranks;
    }
  }
  DDPLITE_ENFORCE(mine != nullptr, "rank ", rank, " is on no host");
  hierarchy->localRanks_ = *mine;
  hierarchy->hostOfRank_.assign(static_cast<size_t>(size), -1);
  hierarchy->indexOnHost_.assign(static_cast<size_t>(size), -1);
  for (size_t host = 0; host < hosts.size(); ++host) {
    for (size_t index = 0; index < hosts[host].size(); ++index) {
      hierarchy->hostOfRank_[static_cast<size_t>(hosts[host][index])] = static_cast<int>(host);
      hierarchy->indexOnHost_[static_cast<size_t>(hosts[host][index])] = static_cast<int>(index);
    }
  }
  hierarchy->hostMajorIsRankOrder_ = true;
  for (int member = 0; member < size; ++member) {
    const int block = hierarchy->hostOfRank_[static_cast<size_t>(member)] * hierarchy->maxRanksPerHost_ +
                      hierarchy->indexOnHost_[static_cast<size_t>(member)];
    hierarchy->hostMajorIsRankOrder_ = hierarchy->hostMajorIsRankOrder_ && block == member;
  }
  hierarchy->hostMajorIsRankOrder_ =
      hierarchy->hostMajorIsRankOrder_ && size == hierarchy->hosts_ * hierarchy->maxRanksPerHost_;
  // This host's segment, through keys of its own (the leader names the host).
  std::string failure;
  if (mine->size() > 1) {
    StoreRendezvous local = rendezvous.prefixed(strCat("host/", mine->front(), "/"));
    hierarchy->localView_ = std::make_unique<RankView>(mesh, *mine);
    bool spansHosts = false;
    hierarchy->local_ = ShmGroup::create(local, *hierarchy->localView_, hierarchy->localView_->rank(),
                                         hierarchy->localView_->size(), chunkBytes, &failure, &spansHosts, *mine);
  }
  // Every rank learns whether every host got its segment: all use the hierarchy, or none does.
  const std::string firstFailure = rendezvous.barrier(
      "hierarchy/", rank, size,
      failure.empty() ? "" : strCat("rank ", rank, " could not share memory with its host's ranks: ", failure),
      "every rank setting up its host's shared memory");
  if (!firstFailure.empty()) {
    *whyNot = firstFailure;
    return nullptr;
  }
  if (hierarchy->local_) hierarchy->local_->setCallerSpin(env::callerSpin());  // ShmGroup::setCallerSpin
  if (rank == mine->front() && hosts.size() > 1) hierarchy->leaders_ = std::make_unique<RankView>(mesh, leaders);
  hierarchy->railsFromBytes_ = env::railsBytes();
  const int myIndex = hierarchy->indexOnHost_[static_cast<size_t>(rank)];
  for (int rail = myIndex; rail < hierarchy->maxRanksPerHost_ && hosts.size() > 1; rail += static_cast<int>(mine->size())) {
    hierarchy->myRails_.push_back(rail);
    hierarchy->railViews_.push_back(std::make_unique<RankView>(mesh, railRanks(hosts, rail)));
  }
  return hierarchy;
}

bool HostHierarchy::allreduceOnRails(size_t count, size_t bufferBytes) const {
  return railsFromBytes_ > 0 && bufferBytes >= static_cast<uint64_t>(railsFromBytes_) && hosts_ > 1 &&
         rails() <= kMaxRails && count >= static_cast<size_t>(rails());
}

bool HostHierarchy::claimParts(uint64_t seq, bool railsWanted) {
  if (seq != partsSeq_) nextPart_ = kFirstGivenPart;
  partsSeq_ = seq;
  onRails_ = railsWanted && nextPart_ + rails() - 1 <= kLastGivenPart;
  if (!onRails_ && nextPart_ > kLastGivenPart) nextPart_ = kFirstGivenPart;
  claimedPart_ = nextPart_;
  nextPart_ += onRails_ ? rails() : 1;
  return onRails_;
}

void HostHierarchy::allreduceOnRail(int rail, const AlgorithmArgs& args, Fingerprint fingerprint) {
  const auto at = std::find(myRails_.begin(), myRails_.end(), rail);
  DDPLITE_ENFORCE(at != myRails_.end(), "rank ", rank_, " does not carry rail ", rail);
  RankView& view = *railViews_[static_cast<size_t>(at - myRails_.begin())];
  const Selection selection = selectAlgorithm(Collective::kAllreduce, args.count * args.elementSize, view.size());
  fingerprint.algorithm = selection.index;
  fingerprint.algorithmName = selection.name;
  fingerprint.part = static_cast<uint8_t>(claimedPart_ + rail);
  fingerprint.partGiven = true;
  view.beginCollective(fingerprint);
  AlgorithmArgs onRail{view, args.deadline, args.scratch, args.data, args.count, args.elementSize,
                       args.reduce, args.reduceMany, 0};
  selection.run(onRail);  // a failure: the backend records it, then breakGroup() (see the header)
}

void HostHierarchy::runAmongLeaders(Collective collective, const AlgorithmArgs& args, Fingerprint fingerprint,
                                    size_t bufferBytes, int root) {
  DDPLITE_ENFORCE(leaders_ != nullptr, "runAmongLeaders on a rank that does not lead its host");
  const Selection selection = selectAlgorithm(collective, bufferBytes, leaders_->size());
  fingerprint.algorithm = selection.index;
  fingerprint.algorithmName = selection.name;
  if (fingerprint.root >= 0) fingerprint.root = root;  // the leaders' view numbers hosts
  fingerprint.part = static_cast<uint8_t>(claimedPart_);
  fingerprint.partGiven = true;
  leaders_->beginCollective(fingerprint);
  AlgorithmArgs among{*leaders_, args.deadline, args.scratch, args.data, args.count, args.elementSize,
                      args.reduce, args.reduceMany, root};
  selection.run(among);  // a failure: the backend records it, then breakGroup() (see the header)
}

Transport& HostHierarchy::beginAmongLeaders(Fingerprint fingerprint, int rootHost) {
  DDPLITE_ENFORCE(leaders_ != nullptr, "beginAmongLeaders on a rank that does not lead its host");
  if (fingerprint.root >= 0) fingerprint.root = rootHost;  // the leaders' view numbers hosts
  fingerprint.part = static_cast<uint8_t>(claimedPart_);
  fingerprint.partGiven = true;
  leaders_->beginCollective(fingerprint);
  return *leaders_;
}

void HostHierarchy::abort(ShmGroup::Departure why) {
  if (local_) local_->abort(why);
}

void HostHierarchy::breakGroup() {
  if (local_) local_->breakGroup();
}

}  // namespace ddplite::cpu
