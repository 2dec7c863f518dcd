// A group's CPU path: everything its CPU tensors travel through, built once per group and owned
// here, so that the backend talks to this one object and not to transports, segments and
// engines:
//   * the collectives' TCP mesh (every pair at init, or on demand: DDPLITE_CONNECT), which is also
//     the liveness probe of the segments;
//   * the shared-memory segment of a group whose ranks all share this host (ShmGroup), or the
//     HostHierarchy of a group across hosts (a segment per host, one leader per host on TCP);
//   * MPI's collectives, when DDPLITE_CPU_TRANSPORT=mpi;
//   * the send/recv engine (P2pEngine: one pump thread per kind of link, the links themselves),
//     its progress loop in a room of its own (p2p_engine.hpp).
//
// Which path: DDPLITE_CPU_TRANSPORT=auto: shared memory when every rank is on this host and the
// segment can be made; else TCP (a group across hosts through the hierarchy when some host holds
// several of its ranks; a segment that could not be made, with a warning naming why). =shm: shared
// memory or an error (no silent fallback). =tcp, =mpi: no segment. The outcome is the same on
// every rank (ShmGroup::create decides collectively), so no rank runs a collective over a path its
// peers did not take.
//
// Threading: built and destroyed on the caller's thread (collective over the group). context(),
// markStarted(), peersStarted(), segmentLeftOpen() and settlePendingChecks(): on the thread that runs the collectives (the
// backend's worker, or the caller's for an op run inline while the worker is claimed). p2p(), the
// break/stop/abort calls and the names: any thread.
#pragma once

#include "common/errors.hpp"
#include "cpu/algorithms/algorithm.hpp"
#include "cpu/collectives.hpp"
#include "rendezvous/store.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace ddplite::mpi {
class GroupComm;
}  // namespace ddplite::mpi

namespace ddplite::cpu {

class HostHierarchy;
class MpiCollectives;
class P2pEngine;
class P2pLinks;
class ShmGroup;
struct KernelSet;

class CpuPath {
 public:
  struct Setup {
    StoreRendezvous& rendezvous;  // the group's keys (run-scoped)
    int rank = 0;
    int size = 1;
    Deadline connectBy;                    // a mesh connected at init must be up by then
    std::chrono::milliseconds p2pTimeout;  // the group's timeout, for the send/recv engine's links
    // A communicator of its own for MPI's collectives (DDPLITE_CPU_TRANSPORT=mpi in one MPI job),
    // else null.
    std::unique_ptr<mpi::GroupComm> mpiData;
  };

  // Collective over the group: every rank builds the same path, or every rank throws.
  explicit CpuPath(Setup setup);
  ~CpuPath();  // the send/recv engine first (its pumps use the links), then the collectives' path
  CpuPath(const CpuPath&) = delete;
  CpuPath& operator=(const CpuPath&) = delete;

  // "mpi", "shm", "hierarchical" or "tcp": what carries the collectives; why (cpu_path()); and
  // what carries send/recv ("shared-memory channels", "TCP", ...). Fixed at construction.
  const char* collectivesName() const;
  const std::string& why() const { return why_; }
  const char* p2pName() const { return p2pName_; }

  // The collectives' context for one op (collectives.hpp). `algorithm`: see CpuContext.
  CpuContext context(Deadline deadline, const OpContext& op, uint64_t refusedSeq, const KernelSet* kernels,
                     const char** algorithm);
  // Whether every collective goes through one segment (all ranks on this host): only then may an
  // op run on the caller's thread. markStarted / peersStarted: the segment's started marks
  // (ShmGroup); without a segment, markStarted does nothing and peersStarted is true.
  bool throughOneSegment() const { return shm_ != nullptr; }
  void markStarted(uint64_t seq);
  bool peersStarted(uint64_t seq, std::chrono::microseconds within) const;
  // Whether a collective began on a segment this rank shares and did not end (an exception
  // between two steps): the caller must then break the group (breakGroup).
  bool segmentLeftOpen() const;
  // At shutdown, once no collective runs: settles a pending broadcast check on each segment this
  // rank shares (ShmGroup::settlePendingCheck) by `deadline`, warning with what it finds.
  void settlePendingChecks(Deadline deadline);
  // This host as the segments tell hosts apart (ShmSegment::hostIdentity).
  static std::string hostIdentity();

  P2pEngine& p2p() { return *p2p_; }

  // A collective was left part-way: every rank of each segment stops at once (breakGroup) and the
  // TCP connections close, so the ranks of other hosts learn it too.
  void breakGroup();
  // Each of the three below leaves the group for good, so that every peer learns it within about
  // a second whichever way it waits for this rank: in a segment (ShmGroup::abort: its waits for
  // a flag this rank never stores end, naming this rank and why), on a TCP connection (closed),
  // or connecting on demand (the listener closes: refused).
  // After a transport failure recorded in the group's store: this process's waits end (MPI, the
  // segment), this host's ranks stop (they may wait for this rank, their leader, in the segment),
  // and the TCP connections close.
  void stopAfterFailure();
  // abort() (`exiting`: the process exits with ops pending): every collective wait of this
  // process ends, TCP closed.
  void abortCollectives(bool exiting = false);
  // shutdown(), once no collective runs: TCP closed; the segments stay mapped for the others'
  // last reads of this rank's buffers until this object goes.
  void closeConnections();
  // The send/recv engine's pumps are joined and its links closed now (the backend's destructor
  // does it before the CUDA path goes).
  void destroyP2p();
  // In a forked child: let go of everything without running a destructor (its threads do not
  // exist here, its sockets were closed at fork, the segments are the parent's).
  void abandon();

 private:
  void connectSharedMemory(Setup& setup);
  void connectHostHierarchy(Setup& setup, const std::string& spansHosts);
  std::vector<std::unique_ptr<P2pLinks>> connectPointToPoint(Setup& setup);
  std::unique_ptr<P2pLinks> connectHostChannels(Setup& setup);

  int rank_ = 0;
  int size_ = 1;
  // Declared in the order of use (members are destroyed bottom-up): the engine's links and the
  // segments use the mesh as their liveness probe, so they go before it; MPI's collectives and
  // their communicator go last.
  std::unique_ptr<mpi::GroupComm> mpiData_;
  std::unique_ptr<MpiCollectives> mpi_;  // null unless DDPLITE_CPU_TRANSPORT=mpi
  std::unique_ptr<Transport> transport_;
  // The most of the group's ranks this host may hold: the host layout's count once a group
  // across hosts has read it (connectHostHierarchy), else the group's size (DDPLITE_CPU_TRANSPORT
  // =tcp or mpi reads no layout). Ranks of other hosts on the same machine (containers, network
  // namespaces) are not counted.
  int ranksHereAtMost_ = 0;
  std::unique_ptr<ShmGroup> shm_;         // set when every rank shares this host
  std::unique_ptr<HostHierarchy> hosts_;  // set when the group spans hosts and some host holds several ranks
  std::unique_ptr<P2pEngine> p2p_;
  Scratch scratch_;  // the collectives' thread only
  std::string why_;
  const char* p2pName_ = "TCP";
};

}  // namespace ddplite::cpu
