// TCP transport: one full-duplex socket per pair of ranks, set up through the store: every rank
// listens on the address net::chooseListenAddress picks (IPv4 or IPv6) and publishes "ip:port" or
// "[ipv6]:port". Two ways to make the pairs (DDPLITE_CONNECT):
//   * at set-up (connectFullMesh): every rank connects to every lower rank (in the family that
//     rank published) and accepts every higher one before returning: a full mesh.
//   * on demand (listenOnDemand, tcp_on_demand.cpp): set-up only listens and publishes; a pair
//     connects the first time either rank sends to or receives from the other. A thread per
//     transport (ddplite-accept) answers the peers' handshakes, so a rank busy elsewhere never
//     holds up a peer's connect. When both ranks of a pair connect at once, each listener keeps
//     the connection made by the lower rank and refuses the other; the refused connector then
//     waits for the kept one, which its own acceptor has taken or is about to take.
//
// Sockets are non-blocking with TCP_NODELAY. A transfer first tries the syscall directly (the
// common case for small messages costs one syscall); when the kernel would block, a transfer of
// at most env::kTcpSpinMaxBytes retries for DDPLITE_TCP_SPIN_US (yielding between tries), then
// it sleeps in poll(), which wakes at least every kPollSliceMs to notice abort() and deadlines.
// One send() hands the kernel at most DDPLITE_TCP_SEND_CHUNK_BYTES (32 KiB): the kernel owns the
// socket's lock through a whole send(), and what the peer sends the other way on the same socket
// (its bytes, and the acknowledgements that open this side's window) waits in the socket's backlog
// until the call ends (Linux lets it in every 16 new socket buffers of a send(), about 1 MB here). A 2-rank all_reduce sends both ways on one socket: whole-buffer sends made
// it 1.6-1.9x slower from 1 to 64 MB between two namespace hosts, 1.2-1.35x at 4 hosts x 2 ranks,
// in one run (docs/benchmarks.md, "Across hosts").
//
// Fingerprints (fingerprint.hpp): once armed by beginCollective, the first message to each peer
// goes out with its header in front (in one send up to 4 KB, with MSG_MORE above), and the first
// one from each peer is read with one readv into header + payload; the header is checked as soon as it is complete. While a transfer
// waits in poll(), the sockets of the other peers whose header is due are watched too, and a
// header waiting there is peeked at: a peer in another collective is reported at once even when
// this rank is blocked on a third rank (three ranks in two different collectives, each waiting
// for the next, would otherwise only time out).
#pragma once

#include "common/fork_guard.hpp"
#include "cpu/transport/net_iface.hpp"
#include "cpu/transport/transport.hpp"
#include "rendezvous/store.hpp"

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddplite {

// A mesh on its own (no backend): builds it under the store's "mesh-check/" keys, swaps each
// rank's number with every peer over it, and returns what each peer sent (index = peer; this
// rank's own slot holds its rank). For tests of set-up (strangers on the port, authentication)
// and diagnostics; collective over `size` processes.
std::vector<int> exchangeRanksOverNewMesh(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout);

class TcpTransport final : public Transport {
 public:
  // Collective over the group: returns once every pair is connected. Throws DistBackendError
  // naming the unreachable peer if a connection cannot be made before `deadline`. `purpose`
  // keeps the store keys of several meshes of one group apart ("" for the collectives' mesh).
  static std::unique_ptr<TcpTransport> connectFullMesh(StoreRendezvous& rendezvous, int rank, int size,
                                                       Deadline deadline, const std::string& purpose = "",
                                                       bool checkFingerprints = true);
  // On demand: listens and publishes this rank's address, then returns; pairs connect on first
  // use, each connect bounded by the deadline of the transfer that needs it. Reads no peer's
  // address. Not collective (no rank waits for another here).
  static std::unique_ptr<TcpTransport> listenOnDemand(StoreRendezvous& rendezvous, int rank, int size,
                                                      const std::string& purpose = "",
                                                      bool checkFingerprints = true);
  ~TcpTransport() override;

  bool onDemand() const { return onDemand_ != nullptr; }
  // A small transfer on a blocked caller's thread spins up to `spin` instead of spin_ when longer
  // (wait_policy.hpp); 0, the default: spin_ everywhere. Set once by the CPU path, before the
  // first transfer, where this host holds at most kSpinRanksPerCpu of the group's ranks per CPU.
  void setCallerSpin(std::chrono::microseconds spin) { callerSpin_ = spin; }
  // Called on the acceptor thread each time it takes a peer's connection (on demand only): the
  // send/recv pump's wake-up, so it starts watching that socket. Set before the first transfer.
  void setOnAccepted(std::function<void()> callback);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void send(int peer, const void* data, size_t bytes, Deadline deadline) override;
  void recv(int peer, void* data, size_t bytes, Deadline deadline) override;
  void sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                size_t recvBytes, Deadline deadline) override;
  void beginCollective(const Fingerprint& fingerprint) override;
  std::string describePeer(int peer) const override;
  bool peerHungUp(int peer) override;
  bool peekWaitingHeader(int peer, WireHeader* header) override;
  void abort() override;

  // For a progress thread that drives an unarmed mesh itself (the P2pEngine's socket links):
  // `peer`'s socket (non-blocking), to poll on; and moves of what the kernel takes or holds now,
  // at most `bytes` (a send at most DDPLITE_TCP_SEND_CHUNK_BYTES), returning how many (0: none now). They throw TransportError kPeerClosed at
  // the end of the stream or a reset, kAborted after abort(), kIo on any other error.
  // -1 while an on-demand pair is not connected (poll() skips it). sendSome connects first (up to
  // `connectBy`); recvSome returns 0 until the peer has connected.
  int socketOf(int peer) const { return fdOf(peer); }
  size_t sendSome(int peer, const void* data, size_t bytes, Deadline connectBy = Deadline::max());
  size_t recvSome(int peer, void* data, size_t bytes);
  // On demand: connects to `peer` now if the pair is not connected (by `connectBy`), as a first
  // send would; the same errors (kPeerClosed when its listener keeps refusing: the peer is gone).
  void connectNow(int peer, Deadline connectBy) { ensureConnected(peer, connectBy); }

 private:
  TcpTransport(int rank, int size, bool checkFingerprints);

  // Building the mesh, one job per function (tcp.cpp): listen and publish the address; connect
  // to each lower rank (with retries until the deadline); accept each higher rank.
  // Every connection is authenticated first (auth.hpp) unless DDPLITE_AUTH=0.
  struct MeshSetup;
  struct PendingHandshake;
  static std::string shareSecret(const MeshSetup& setup, bool onDemand);
  // The warning of DDPLITE_AUTH=0 (once per process and kind of mesh): who can take a rank's place, and when.
  static void warnUnauthenticated(const MeshSetup& setup, bool onDemand);
  static int openListener(MeshSetup& setup);
  // `kept`: null at set-up; on demand, set to the listener's verdict (false: it keeps its own
  // connection to this rank and refuses this one).
  static int tryConnect(const MeshSetup& setup, int peer, const net::Endpoint& target, int* error,
                        bool* kept = nullptr);
  [[noreturn]] static void throwImpostor(const MeshSetup& setup, int peer, const std::string& where,
                                         const std::string& why);
  static int connectToLowerRank(const MeshSetup& setup, int peer, const std::string& peerAddress);
  static void acceptHigherRanks(const MeshSetup& setup, int listener, TcpTransport& transport);
  static void acceptWaitingConnections(const MeshSetup& setup, int listener, size_t stillExpected,
                                       std::vector<PendingHandshake>& pending);
  static std::optional<std::string> advanceHandshake(const MeshSetup& setup, PendingHandshake& connection,
                                                     TcpTransport& transport);
  // A stranger's connection dropped, and why (at most 32 warnings per process every 10 s).
  static void warnDropped(const MeshSetup& setup, const std::string& from, const std::string& why);
  // At the cap of pending handshakes: the index of the one to drop for a newcomer.
  static size_t pendingToDrop(const std::vector<PendingHandshake>& pending);
  // `report`: "; first failure reported: ..." or ""; `timedOut`: at the deadline, else on a failure recorded by a peer.
  [[noreturn]] static void throwMissingHigherRanks(const MeshSetup& setup, const TcpTransport& transport,
                                                   const std::string& report, bool timedOut);

  // On demand (tcp_on_demand.cpp): the listener, its acceptor thread and the pairs' state.
  struct OnDemand;
  int fdOf(int peer) const { return fds_[static_cast<size_t>(peer)].load(std::memory_order_acquire); }
  // Returns once `peer` is connected; throws TransportError (kTimeout, kAborted, kIo) naming the
  // peer and its address when it cannot be by `deadline`. A no-op when connected or at set-up.
  void ensureConnected(int peer, Deadline deadline) {
    if (onDemand_ && fdOf(peer) < 0) ensureConnectedSlow(peer, deadline);
  }
  // Throws only TransportError (a store, socket or handshake failure becomes kIo naming the peer).
  void ensureConnectedSlow(int peer, Deadline deadline);
  void connectOnDemand(int peer, Deadline deadline);
  // The acceptor thread's loop: takes connections, advances their handshakes, answers them.
  void acceptLoop();
  // The acceptor's verdict on a peer's complete, authenticated on-demand Hello: keeps it (the
  // peer's socket from now on; answered with an Ack, returns "") or refuses it (this rank keeps
  // its own connection to that peer; answered with a Reject, returns why).
  static std::optional<std::string> answerOnDemand(const MeshSetup& setup, PendingHandshake& connection,
                                                   TcpTransport& transport);
  // Stops and joins the acceptor thread (in a forked child, where it does not run, forgets it).
  void stopAcceptor();
  // Ends the waits of connecting threads (abort).
  void wakeConnectors();
  // `peer`'s published address, read from the store the first time (the connecting thread); by
  // `deadline` and abort(), else TransportError kTimeout / kAborted.
  std::string addressOf(int peer, Deadline deadline);
  // Records `fd` as `peer`'s socket, under OnDemand::mutex (release: its set-up happens before
  // any thread's acquire load of it in fdOf), and wakes connectors waiting for it.
  void publishFd(int peer, int fd);

  // One direction of a transfer in progress: an optional fingerprint header, then the payload.
  struct Progress {
    int peer;
    char* cursor;
    size_t left;
    WireHeader* header = nullptr;  // non-null when a header precedes the payload
    size_t headerDone = 0;         // header bytes moved so far
    size_t payloadBytes = 0;       // the payload's whole length (a received header must announce it)
  };
  // Whether a header is due on this rank's next message to (from) `peer`; if so clears it and
  // fills `header` (sending) or prepares to check it (receiving).
  void prepareSend(Progress& progress, WireHeader& header);
  void prepareRecv(Progress& progress, WireHeader& header);
  void advance(Progress& progress, size_t moved, bool receiving);
  // Peers whose header is due and not yet peeked at, other than `receivingFrom`.
  std::vector<int> watchedPeers(int receivingFrom) const;
  // Looks at the header waiting on `peer`'s socket without consuming it (MSG_PEEK) and throws
  // kMismatch if it cannot belong to a collective this rank will run (earlyHeaderMismatch).
  void peekHeader(int peer);
  void transfer(Progress* sending, Progress* receiving, Deadline deadline);
  bool trySend(Progress& progress);
  bool tryRecv(Progress& progress);
  [[noreturn]] void throwIoError(int peer, const char* syscall, int error) const;
  [[noreturn]] void throwTimeout(const Progress* sending, const Progress* receiving) const;
  void checkPeer(int peer) const;

  const int rank_;
  const int size_;
  // fds_[peer]: -1 for self and for an on-demand pair not connected yet; each registered with
  // fork_guard. Written once per peer (set-up, the acceptor thread or the connecting thread, under
  // OnDemand::mutex) before any transfer with that peer reads it; closed only in the destructor.
  std::unique_ptr<std::atomic<int>[]> fds_;
  std::unique_ptr<OnDemand> onDemand_;  // null for a mesh made at set-up
  const pid_t creatorPid_ = fork_guard::currentPid();  // a forked child's copy neither shuts down nor closes them
  // "ip:port" or "[ipv6]:port" each rank listens on; on demand, read from the store when first
  // needed ("" until then) under OnDemand::mutex.
  std::vector<std::string> addresses_;
  std::atomic<bool> aborted_{false};

  // Fingerprint state: worker thread only (beginCollective and the transfers run there). The p2p
  // mesh, used by several threads at once, is never armed, so its transfers never touch it.
  // How long a small transfer retries its sockets before it sleeps in poll() (transfer()).
  const std::chrono::microseconds spin_;
  std::chrono::microseconds callerSpin_{0};  // setCallerSpin: before the first transfer
  // The most bytes one send() hands the kernel (DDPLITE_TCP_SEND_CHUNK_BYTES; SIZE_MAX for its 0,
  // no limit): the kernel holds the socket's lock through a send(), and the peer's bytes on the
  // same socket wait.
  const size_t sendChunk_;
  const bool checkFingerprints_;
  bool armed_ = false;
  Fingerprint fingerprint_;
  std::vector<char> sendHeaderDue_;  // per peer: the next message to it carries a header
  std::vector<char> recvHeaderDue_;  // per peer: the next message from it must carry one
  std::vector<char> headerPeeked_;   // per peer: its due header was looked at early (peekHeader)
};

}  // namespace ddplite
