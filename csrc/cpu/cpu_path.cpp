#include "cpu/cpu_path.hpp"

#include "common/env.hpp"
#include "common/logging.hpp"
#include "cpu/mpi_collectives.hpp"
#include "cpu/p2p/p2p_engine.hpp"
#include "cpu/p2p/p2p_links.hpp"
#include "cpu/p2p/channels.hpp"
#include "cpu/hierarchy/host_hierarchy.hpp"
#include "cpu/shm/segment.hpp"
#include "cpu/shm/futex_wait.hpp"
#include "cpu/shm/shm_group.hpp"
#include "cpu/transport/rank_view.hpp"
#include "cpu/transport/tcp.hpp"
#include "cpu/transport/wait_policy.hpp"
#include "rendezvous/mpi.hpp"

#include <algorithm>
#include <numeric>

namespace ddplite::cpu {

CpuPath::CpuPath(Setup setup) : rank_(setup.rank), size_(setup.size), mpiData_(std::move(setup.mpiData)) {
  ranksHereAtMost_ = size_;
  if (mpiData_) mpi_ = std::make_unique<MpiCollectives>(*mpiData_);
  StoreRendezvous& rendezvous = setup.rendezvous;
  transport_ = env::connectOnDemand(size_)
                   ? TcpTransport::listenOnDemand(rendezvous, rank_, size_, "", env::fingerprintChecks())
                   : TcpTransport::connectFullMesh(rendezvous, rank_, size_, setup.connectBy, "",
                                                   env::fingerprintChecks());
  connectSharedMemory(setup);
  // TCP waits (between hosts, or every wait of a group over TCP) spin longer on a blocked caller's
  // thread, unless this host's ranks may crowd its CPUs (wait_policy.hpp), or the group is on one
  // host's segment (its few TCP collectives keep the spin of the segment's waits). The constructor
  // above made a TcpTransport.
  if (!shm_ && ranksHereAtMost_ <= kSpinRanksPerCpu * usableCpus()) {
    static_cast<TcpTransport&>(*transport_).setCallerSpin(env::callerSpin());
  }
  p2p_ = std::make_unique<P2pEngine>(rank_, size_, connectPointToPoint(setup));
}

CpuPath::~CpuPath() = default;

const char* CpuPath::collectivesName() const {
  return mpi_ ? "mpi" : shm_ ? "shm" : hosts_ ? "hierarchical" : "tcp";
}

CpuContext CpuPath::context(Deadline deadline, const OpContext& op, uint64_t refusedSeq, const KernelSet* kernels,
                            const char** algorithm) {
  return CpuContext{*transport_, scratch_, deadline, op, mpi_.get(), shm_.get(), refusedSeq, kernels, hosts_.get(),
                    algorithm};
}

bool CpuPath::segmentLeftOpen() const {
  if (shm_ && shm_->collectiveOpen()) return true;
  return hosts_ && hosts_->local() != nullptr && hosts_->local()->collectiveOpen();
}

void CpuPath::markStarted(uint64_t seq) {
  if (shm_) shm_->markStarted(seq);
}

bool CpuPath::peersStarted(uint64_t seq, std::chrono::microseconds within) const {
  return !shm_ || shm_->peersStarted(seq, within);
}

void CpuPath::settlePendingChecks(Deadline deadline) {
  for (ShmGroup* group : {shm_.get(), hosts_ ? hosts_->local() : nullptr}) {
    if (group == nullptr || !group->checkPending()) continue;
    try {
      group->settlePendingCheck(deadline);
    } catch (const TransportError& error) {
      DDPLITE_LOG(kWarn, "rank ", rank_, "/", size_, ": at shutdown, the check of this rank's last broadcast found ",
                  error.kind() == TransportError::Kind::kTimeout ? "a peer that had not reached it yet: " : "that ",
                  error.what(),
                  error.kind() == TransportError::Kind::kMismatch
                      ? ". That broadcast returned without an error here while its peers ran another collective; "
                        "every rank must issue the same collectives in the same order"
                      : "");
    }
  }
}

std::string CpuPath::hostIdentity() { return ShmSegment::hostIdentity(); }

void CpuPath::breakGroup() {
  if (shm_) shm_->breakGroup();
  if (hosts_) hosts_->breakGroup();
  transport_->abort();
}

void CpuPath::stopAfterFailure() {
  if (mpi_) mpi_->abort();
  if (shm_) shm_->abort(ShmGroup::Departure::kFailed);
  if (hosts_) hosts_->breakGroup();  // after the failure is in the store for them to quote (runAmongLeaders)
  transport_->abort();
}

void CpuPath::abortCollectives(bool exiting) {
  const auto why = exiting ? ShmGroup::Departure::kExiting : ShmGroup::Departure::kAborted;
  if (mpi_) mpi_->abort();
  if (shm_) shm_->abort(why);
  if (hosts_) hosts_->abort(why);
  transport_->abort();
}

void CpuPath::closeConnections() {
  // Once no collective runs (the worker has stopped): every flag of this rank is final, and a
  // peer that waits for another is told this rank left.
  if (shm_) shm_->abort(ShmGroup::Departure::kShutDown);
  if (hosts_) hosts_->abort(ShmGroup::Departure::kShutDown);
  transport_->abort();
}

void CpuPath::destroyP2p() { p2p_.reset(); }

void CpuPath::abandon() {
  (void)p2p_.release();
  (void)hosts_.release();
  (void)shm_.release();
  (void)transport_.release();
  (void)mpi_.release();
  (void)mpiData_.release();
}

void CpuPath::connectSharedMemory(Setup& setup) {
  const std::string requested = env::cpuTransport();
  if (requested == "tcp" || requested == "mpi") {
    why_ = strCat("DDPLITE_CPU_TRANSPORT=", requested);
    return;
  }
  if (size_ == 1) {
    why_ = "a group of one rank exchanges nothing";
    return;
  }
  std::string whyNot;
  bool spansHosts = false;
  shm_ = ShmGroup::create(setup.rendezvous, *transport_, rank_, size_, static_cast<size_t>(env::shmChunkBytes()),
                          &whyNot, &spansHosts);
  if (!shm_) {
    if (requested == "shm") {
      throwDistError(OpContext{rank_, size_, "init", 0},
                     strCat("DDPLITE_CPU_TRANSPORT=shm, but this group cannot use shared memory: ", whyNot),
                     "unset DDPLITE_CPU_TRANSPORT (or set it to tcp) to run over TCP");
    }
    why_ = strCat("DDPLITE_CPU_TRANSPORT=auto, and no shared memory: ", whyNot);
    if (spansHosts) {
      connectHostHierarchy(setup, whyNot);
    } else {
      DDPLITE_LOG(kWarn, "rank ", rank_, "/", size_, ": shared memory could not be set up, so this group's "
                  "collectives go over TCP (slower): ", whyNot, ". Set DDPLITE_CPU_TRANSPORT=tcp to silence this, "
                  "or free /dev/shm (df -h /dev/shm; docker run --shm-size=1g) to get the fast path");
    }
    return;
  }
  why_ = strCat("DDPLITE_CPU_TRANSPORT=", requested, ", and all ", size_,
                " ranks share this host; steps synchronise through ", shm_->syncDescription());
  DDPLITE_LOG(kInfo, "rank ", rank_, "/", size_, ": collectives through shared memory (", shm_->segmentName(),
              ", unlinked; ", why_, ")");
}

// A group across hosts (DDPLITE_CPU_TRANSPORT=auto): shared memory inside each host when some host
// holds several ranks (HostHierarchy), else TCP for everything.
void CpuPath::connectHostHierarchy(Setup& setup, const std::string& spansHosts) {
  std::string whyNot;
  hosts_ = HostHierarchy::create(setup.rendezvous, *transport_, rank_, size_,
                                 static_cast<size_t>(env::shmChunkBytes()), &whyNot, &ranksHereAtMost_);
  if (!hosts_) {
    why_ = strCat("DDPLITE_CPU_TRANSPORT=auto, and no shared memory: ", spansHosts, "; ", whyNot);
    DDPLITE_LOG(kInfo, "rank ", rank_, "/", size_, ": collectives over TCP: ", spansHosts, "; ", whyNot);
    return;
  }
  // gather and scatter through the leaders, all_to_all through the segments, when the pairs
  // connect on demand
  const bool exchanges = hosts_->exchangesThroughLeaders();
  const bool alltoall = hosts_->alltoallThroughProxies();
  why_ = strCat("DDPLITE_CPU_TRANSPORT=auto, and the group spans ", hosts_->layout(), ": all_reduce, broadcast, "
                "reduce, all_gather, ", exchanges ? "reduce_scatter, gather, scatter" : "reduce_scatter",
                " and barrier within each host through shared memory and across hosts over TCP among one "
                "leader per host");
  if (alltoall) {
    why_ += "; all_to_all within each host through shared memory and across hosts over TCP, one rank of each "
            "host per other host";
  } else {
    why_ += exchanges ? "; all_to_all over TCP" : "; gather, scatter and all_to_all over TCP";
  }
  if (hosts_->railsFromBytes() > 0 && hosts_->rails() <= HostHierarchy::kMaxRails) {
    why_ += strCat("; all_reduce from ", hosts_->railsFromBytes(), " bytes (DDPLITE_RAILS_BYTES) on ", hosts_->rails(),
                   " rails instead, every rank of a host carrying its share across hosts");
  }
  if (hosts_->local() != nullptr) {
    why_ += strCat("; steps in this host's segment synchronise through ", hosts_->local()->syncDescription());
  }
  DDPLITE_LOG(kInfo, "rank ", rank_, "/", size_, ": ", why_);
}

// send/recv: through shared-memory channels when the group has a segment (every rank on this
// host), else over a TCP mesh of their own; in a group across hosts with a HostHierarchy, through
// channels among the ranks of each host and that TCP mesh between hosts. A channel segment that
// cannot be made falls back to TCP for every rank it would have joined (ShmSegment::create's
// outcome is the same for all of them). One P2pEngine pump per path.
std::vector<std::unique_ptr<P2pLinks>> CpuPath::connectPointToPoint(Setup& setup) {
  std::vector<std::unique_ptr<P2pLinks>> paths;
  std::vector<int> everyRank(static_cast<size_t>(size_));
  std::iota(everyRank.begin(), everyRank.end(), 0);
  if (shm_) {
    std::string whyNot;
    StoreRendezvous channelKeys = setup.rendezvous.prefixed("p2p-shm/");
    if (auto channels = ShmChannels::create(channelKeys, *transport_, rank_, size_, &whyNot)) {
      p2pName_ = "shared-memory channels";
      paths.push_back(shmLinks(std::move(channels), everyRank, /*liveness=*/nullptr));
      return paths;
    }
    DDPLITE_LOG(kWarn, "rank ", rank_, "/", size_, ": send/recv go over TCP, their shared-memory channels could not "
                "be set up: ", whyNot);
  }
  p2pName_ = "TCP";
  auto mesh = env::connectOnDemand(size_)
                  ? TcpTransport::listenOnDemand(setup.rendezvous, rank_, size_, "p2p/", /*checkFingerprints=*/false)
                  : TcpTransport::connectFullMesh(setup.rendezvous, rank_, size_, setup.connectBy, "p2p/",
                                                  /*checkFingerprints=*/false);
  std::vector<int> remote = everyRank;
  if (hosts_ && hosts_->local()) {
    if (auto local = connectHostChannels(setup)) {
      const std::vector<int>& localRanks = hosts_->localRanks();
      remote.erase(std::remove_if(remote.begin(), remote.end(),
                                  [&](int r) {
                                    return std::find(localRanks.begin(), localRanks.end(), r) != localRanks.end();
                                  }),
                   remote.end());
      paths.push_back(std::move(local));
    }
  }
  remote.erase(std::remove(remote.begin(), remote.end(), rank_), remote.end());
  if (!remote.empty()) paths.push_back(socketLinks(std::move(mesh), remote, setup.p2pTimeout));
  return paths;
}

// Channels among the ranks of this host, in a group across hosts; null when they cannot be made.
std::unique_ptr<P2pLinks> CpuPath::connectHostChannels(Setup& setup) {
  const std::vector<int>& localRanks = hosts_->localRanks();
  auto liveness = std::make_unique<RankView>(*transport_, localRanks);
  StoreRendezvous channelKeys = setup.rendezvous.prefixed(strCat("p2p-shm/host/", localRanks.front(), "/"));
  std::string whyNot;
  auto channels =
      ShmChannels::create(channelKeys, *liveness, liveness->rank(), liveness->size(), &whyNot, localRanks);
  if (!channels) {
    DDPLITE_LOG(kWarn, "rank ", rank_, "/", size_, ": send/recv to the ranks of this host go over TCP, their "
                "shared-memory channels could not be set up: ", whyNot);
    return nullptr;
  }
  p2pName_ = "shared-memory channels within each host, TCP between hosts";
  return shmLinks(std::move(channels), localRanks, std::move(liveness));
}

}  // namespace ddplite::cpu
