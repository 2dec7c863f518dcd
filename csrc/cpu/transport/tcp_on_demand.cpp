// On-demand connections of the TCP transport (DDPLITE_CONNECT; tcp.hpp gives the scheme).
//
// A pair's state, as each of its ranks sees it (OnDemand::mutex guards all of it):
//   fds_[peer] < 0 and connecting[peer] == 0: no connection, none being made by this rank;
//   connecting[peer] == 1: this rank's own connect to `peer` is under way (its Hello is in flight);
//   fds_[peer] >= 0: connected; the descriptor never changes again (closed by the destructor).
// The acceptor's verdict on `peer`'s Hello (answerOnDemand), taken and answered under the mutex:
//   no socket and no connect of this rank's        -> keep it (Ack);
//   this rank's own connect to `peer` under way    -> keep it only if peer < this rank (Ack), else
//                                                     refuse it (Reject): on both sides, the
//                                                     connection made by the lower rank wins;
//   a socket already                               -> refuse it (Reject).
// A connector that gets a Reject waits (OnDemand::connected) for the connection the peer keeps,
// which this rank's acceptor has taken or is about to take: the peer refuses only while it has a
// connect of its own under way or made, and that connect reaches this rank's acceptor, which
// keeps it by the same rule. Each side decides and answers under its own mutex, so a rank's
// acceptor and its connecting thread never both win.
//
// Cost: set-up writes this rank's address (and rank 0 the secret) and reads only the secret; a
// pair costs one store read of the address, one connect and the handshake's round trips at its
// first use. Threads: one acceptor per on-demand transport (ddplite-accept).
#include "common/fork_guard.hpp"
#include "common/logging.hpp"
#include "common/thread_name.hpp"
#include "cpu/transport/tcp.hpp"
#include "cpu/transport/tcp_setup.hpp"

#include <poll.h>
#include <sys/eventfd.h>

#include <cstring>
#include <system_error>

namespace ddplite {

using namespace tcp_detail;

namespace {
// How long a connector waits between attempts at a peer that is not listening yet (its address
// is published only once it listens, so: a backlog that was full, a transient error).
constexpr auto kConnectRetry = std::chrono::milliseconds(20);
// How long a refused connector waits for the peer's own connection before trying again.
constexpr auto kRefusedWait = std::chrono::milliseconds(200);
// A published listener that refuses connections this long is closed for good.
constexpr auto kRefusedMeansGone = std::chrono::seconds(1);
}  // namespace

std::unique_ptr<TcpTransport> TcpTransport::listenOnDemand(StoreRendezvous& rendezvous, int rank, int size,
                                                           const std::string& purpose, bool checkFingerprints) {
  std::unique_ptr<TcpTransport> transport(new TcpTransport(rank, size, checkFingerprints));
  if (size == 1) return transport;
  MeshSetup setup{rendezvous, rank, size, Deadline::max(), purpose, "", "", "", ""};
  setup.fdOwner = transport.get();
  setup.helloDelay = std::chrono::milliseconds(env::testHooks().tcpHelloDelayMs);
  setup.failureRecordedBefore = true;  // set-up failures are reported by the transfer that meets them
  setup.secret = shareSecret(setup, /*onDemand=*/true);
  setup.host = net::chooseListenAddress(&setup.why, rendezvous.storeHost());
  setup.scope = net::scopeOf(setup.host);
  auto onDemand = std::make_unique<OnDemand>(std::move(setup));
  onDemand->connecting.assign(static_cast<size_t>(size), 0);
  onDemand->listener = openListener(onDemand->setup);  // registered with fork_guard
  transport->addresses_[rank] = onDemand->setup.myAddress;
  TcpTransport* raw = transport.get();
  transport->onDemand_ = std::move(onDemand);  // from here the destructor closes what it holds
  OnDemand& state = *raw->onDemand_;
  setBlocking(state.listener, false, rank, "to accept connections on demand");
  state.wakeFd = fork_guard::adoptNew(raw, [] { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); });
  checkCall(state.wakeFd, rank, "eventfd", "for the connection acceptor", size);
  try {
    state.acceptor = std::make_unique<std::thread>([raw] { raw->acceptLoop(); });
    nameThread(*state.acceptor, "ddplite-accept");
  } catch (const std::system_error& error) {
    throwDistError(strCat("rank ", rank, " cannot start its connection acceptor thread: ", error.what()),
                   "the process may have reached its thread limit (ulimit -u)");
  }
  return transport;
}

void TcpTransport::setOnAccepted(std::function<void()> callback) {
  if (!onDemand_) return;
  std::lock_guard<std::mutex> lock(onDemand_->mutex);
  onDemand_->onAccepted = std::move(callback);
}

// Acceptor thread. Handshakes advance side by side (non-blocking), so a stranger holds up only
// its own slot; it is dropped with a warning when its handshake fails or outlasts kHandshakeLimit.
// Nothing thrown here leaves the thread: a failed pass is warned about (at most every 10 s) and
// the loop goes on after a pause; a connection whose handshake could not finish is dropped and
// its connector tries again.
void TcpTransport::acceptLoop() {
  OnDemand& state = *onDemand_;
  std::vector<PendingHandshake> pending;
  std::vector<pollfd> entries;
  Clock::time_point lastWarning{};
  while (!state.stop.load(std::memory_order_acquire)) {
    try {
      entries.assign({pollfd{state.listener, POLLIN, 0}, pollfd{state.wakeFd, POLLIN, 0}});
      for (const PendingHandshake& connection : pending) entries.push_back({connection.fd.get(), POLLIN, 0});
      // Without handshakes under way nothing has a deadline: sleep until a connection or stop().
      const int timeoutMs = pending.empty() ? -1 : kPollSliceMs;
      if (poll(entries.data(), entries.size(), timeoutMs) < 0 && errno != EINTR) {
        throw std::runtime_error(strCat("poll failed: ", std::strerror(errno)));
      }
      if (state.stop.load(std::memory_order_acquire)) break;
      for (size_t i = entries.size(); i-- > 2;) {
        PendingHandshake& connection = pending[i - 2];
        if (entries[i].revents == 0 && Clock::now() < connection.until) continue;
        std::optional<std::string> refusal;
        try {
          refusal = advanceHandshake(state.setup, connection, *this);
        } catch (const std::exception& error) {
          refusal = strCat("its handshake failed here: ", error.what());
        }
        if (!refusal) continue;  // still under way
        if (!refusal->empty()) warnDropped(state.setup, connection.from, *refusal);
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i - 2));
      }
      // On demand no peer is expected at any given moment: the cap is kMaxPendingHandshakes.
      if (entries[0].revents != 0) acceptWaitingConnections(state.setup, state.listener, 0, pending);
    } catch (...) {
      // Out of descriptors (accept) or memory: the connection stays queued and its connector
      // retries until its deadline.
      if (Clock::now() - lastWarning >= std::chrono::seconds(10)) {
        lastWarning = Clock::now();
        try {
          std::rethrow_exception(std::current_exception());
        } catch (const std::exception& error) {
          DDPLITE_LOG(kWarn, "rank ", rank_, ": the connection acceptor could not take a connection: ", error.what());
        } catch (...) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollSliceMs));
    }
  }
}

std::optional<std::string> TcpTransport::answerOnDemand(const MeshSetup& setup, PendingHandshake& connection,
                                                        TcpTransport& transport) {
  const Hello& hello = connection.hello;
  const int peer = hello.rank;
  OnDemand& state = *transport.onDemand_;
  std::function<void()> onAccepted;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    // After abort() nothing is published (its shutdown loop has run): the connector sees the
    // connection close without an answer.
    if (transport.aborted_.load()) return "";
    bool keep = transport.fdOf(peer) < 0 && (!state.connecting[static_cast<size_t>(peer)] || peer < setup.rank);
    // A connector that gave up waiting (its Hello sat in the backlog past its verdict wait) has
    // closed its end: keeping that connection would leave this rank with a dead socket and the
    // peer refused for good.
    if (keep && closedByPeer(connection.fd.get())) return "it closed the connection before the answer";
    // Ready for data before the answer: once it is sent, nothing may fail on this side.
    if (keep) tuneDataSocket(connection.fd.get(), setup.rank, strCat("on the socket from rank ", peer));
    Ack verdict = {keep ? kAckMagic : kRejectMagic, {}};
    if (setup.authenticates()) {
      verdict.mac = keep ? ackMac(setup.secret, connection.challenge, hello, setup.rank)
                         : rejectMac(setup.secret, connection.challenge, hello, setup.rank);
    }
    // A fresh socket takes 36 bytes at once; answered under the mutex, so that this rank's own
    // connect cannot start between the verdict and the socket's publication.
    if (!writeBefore(connection.fd.get(), &verdict, sizeof(verdict), Clock::now())) {
      return strCat("the answer to its handshake could not be sent: ", std::strerror(errno));
    }
    if (!keep) return "";  // refused: the connection closes as `connection` is dropped
    const int fd = connection.fd.release();  // registered with fork_guard since accept4
    transport.fds_[static_cast<size_t>(peer)].store(fd, std::memory_order_release);
    // Its listening address is read only by a connect of this rank's; meanwhile errors name the
    // address the connection came from.
    if (transport.addresses_[static_cast<size_t>(peer)].empty()) {
      transport.addresses_[static_cast<size_t>(peer)] = connection.from;
    }
    onAccepted = state.onAccepted;
  }
  state.connected.notify_all();
  if (onAccepted) onAccepted();
  return "";
}

std::string TcpTransport::addressOf(int peer, Deadline deadline) {
  OnDemand& state = *onDemand_;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    // An address taken from an accepted connection is its ephemeral port, not the listener's.
    if (fdOf(peer) < 0 && !addresses_[static_cast<size_t>(peer)].empty()) return addresses_[static_cast<size_t>(peer)];
  }
  // The peer publishes it as it listens, during its init: a peer that died before is waited for
  // until the transfer's deadline or abort(), not the store's timeout.
  const MeshSetup& setup = state.setup;
  const std::optional<std::string> address =
      setup.rendezvous.getBefore(setup.addressKey(peer), strCat("the address of rank ", peer), deadline, &aborted_);
  if (!address) {
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, peer, "the group was aborted");
    throw TransportError(TransportError::Kind::kTimeout, peer,
                         strCat("Timed out waiting for rank ", peer, " to publish its address in the store, so rank ",
                                rank_, " could not connect to it: rank ", peer,
                                " has not finished its init of this group (it may have failed or exited during it)"));
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  addresses_[static_cast<size_t>(peer)] = *address;
  return *address;
}

void TcpTransport::publishFd(int peer, int fd) {
  {
    std::lock_guard<std::mutex> lock(onDemand_->mutex);
    onDemand_->connecting[static_cast<size_t>(peer)] = 0;
    if (fdOf(peer) >= 0) {  // the acceptor took the peer's own connection meanwhile: one socket per pair
      fork_guard::close(fd, this);
      return;
    }
    fds_[static_cast<size_t>(peer)].store(fd, std::memory_order_release);
    // abort()'s shutdown loop may have run before this publication: end the socket here too.
    if (aborted_.load() && fork_guard::createdHere(creatorPid_)) shutdown(fd, SHUT_RDWR);
  }
  onDemand_->connected.notify_all();
}

void TcpTransport::ensureConnectedSlow(int peer, Deadline deadline) {
  try {
    connectOnDemand(peer, deadline);
  } catch (const TransportError&) {
    throw;
  } catch (const c10::Error& error) {  // the store, a socket call, an impostor: this transfer's failure
    throw TransportError(TransportError::Kind::kIo, peer,
                         strCat("rank ", rank_, " could not connect to rank ", peer, ": ", error.what_without_backtrace()));
  } catch (const std::exception& error) {
    throw TransportError(TransportError::Kind::kIo, peer,
                         strCat("rank ", rank_, " could not connect to rank ", peer, ": ", error.what()));
  }
}

// Tries until `peer` is connected (by this rank's connect or by the peer's, which this rank's
// acceptor takes), `deadline`, abort(), or a listener that keeps refusing (the peer is gone).
// `connecting[peer]` is set only while an attempt is under way: between attempts, and while the
// address is read from the store, the acceptor keeps the peer's own connection.
void TcpTransport::connectOnDemand(int peer, Deadline deadline) {
  OnDemand& state = *onDemand_;
  const std::string address = addressOf(peer, deadline);
  const net::Endpoint target = parseAddress(address, rank_, state.setup.scope);
  MeshSetup attempt = state.setup;
  attempt.deadline = deadline;
  attempt.aborted = &aborted_;
  std::optional<Clock::time_point> refusedSince;
  const auto connectedOrAborted = [&] { return fdOf(peer) >= 0 || aborted_.load(); };
  while (true) {
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      if (fdOf(peer) >= 0) return;  // taken by the acceptor meanwhile
      if (aborted_) throw TransportError(TransportError::Kind::kAborted, peer, "the group was aborted");
      state.connecting[static_cast<size_t>(peer)] = 1;
    }
    int error = 0;
    bool kept = false;
    int fd = -1;
    try {
      fd = tryConnect(attempt, peer, target, &error, &kept);
    } catch (...) {
      std::lock_guard<std::mutex> lock(state.mutex);
      state.connecting[static_cast<size_t>(peer)] = 0;
      throw;
    }
    if (fd >= 0 && kept) {
      publishFd(peer, fd);  // clears connecting
      return;
    }
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      state.connecting[static_cast<size_t>(peer)] = 0;
    }
    if (fd >= 0) {
      // Refused: `peer` keeps a connection of its own to this rank (made, or under way). Wait a
      // moment for this rank's acceptor to take it, then try again: a peer whose own connect
      // failed refuses no more.
      fork_guard::close(fd, this);
      refusedSince.reset();
      std::unique_lock<std::mutex> lock(state.mutex);
      state.connected.wait_until(lock, std::min(deadline, Clock::now() + kRefusedWait), connectedOrAborted);
      if (fdOf(peer) >= 0) return;
      if (aborted_) throw TransportError(TransportError::Kind::kAborted, peer, "the group was aborted");
      if (Clock::now() >= deadline) {
        throw TransportError(TransportError::Kind::kTimeout, peer,
                             strCat("Timed out waiting for rank ", peer, " (", address, ") to connect: it refused rank ",
                                    rank_, "'s connections, keeping its own, which never arrived"));
      }
      continue;
    }
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, peer, "the group was aborted");
    // A published listener that refuses is closed: its rank exited or destroyed this group.
    if (error == ECONNREFUSED) {
      if (!refusedSince) refusedSince = Clock::now();
      if (Clock::now() - *refusedSince >= kRefusedMeansGone) {
        throw TransportError(TransportError::Kind::kPeerClosed, peer,
                             strCat("rank ", peer, "'s listener at ", address, " refuses connections (",
                                    std::strerror(error), "): that rank left this group (abort(), "
                                    "destroy_process_group(), a failure of its own) or exited or crashed"));
      }
    } else {
      refusedSince.reset();
    }
    const std::string mismatch = familyMismatch(rank_, state.setup.myAddress, net::literalFamily(state.setup.host),
                                                peer, address, target.family());
    if (Clock::now() >= deadline || error == EAFNOSUPPORT) {
      throw TransportError(
          error == EAFNOSUPPORT ? TransportError::Kind::kIo : TransportError::Kind::kTimeout, peer,
          strCat("rank ", rank_, " could not connect to rank ", peer, " at ", address, ": ", std::strerror(error),
                 " (rank ", rank_, " listens on ", state.setup.myAddress, ", ", state.setup.why, ")", mismatch,
                 ". Hint: ", mismatch.empty() ? unreachableHint() : familyHint()));
    }
    std::unique_lock<std::mutex> lock(state.mutex);
    state.connected.wait_until(lock, std::min(deadline, Clock::now() + kConnectRetry), connectedOrAborted);
  }
}

void TcpTransport::wakeConnectors() {
  if (!onDemand_) return;
  { std::lock_guard<std::mutex> lock(onDemand_->mutex); }  // a waiter between its check and its wait gets the notify
  onDemand_->connected.notify_all();
}

void TcpTransport::stopAcceptor() {
  if (!onDemand_) return;
  OnDemand& state = *onDemand_;
  state.stop.store(true, std::memory_order_release);
  if (state.acceptor) {
    if (!fork_guard::createdHere(creatorPid_)) {
      (void)state.acceptor.release();  // a forked child: the thread runs only in the parent
    } else {
      const uint64_t one = 1;
      [[maybe_unused]] const ssize_t n = write(state.wakeFd, &one, sizeof(one));
      state.acceptor->join();
      state.acceptor.reset();
    }
  }
  fork_guard::close(state.listener, this);
  fork_guard::close(state.wakeFd, this);
  state.listener = -1;
  state.wakeFd = -1;
}

}  // namespace ddplite
