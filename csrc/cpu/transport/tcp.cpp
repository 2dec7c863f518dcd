#include "cpu/transport/tcp.hpp"
#include "cpu/transport/tcp_setup.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/fd_limits.hpp"
#include "common/fork_guard.hpp"
#include "common/logging.hpp"
#include "cpu/transport/auth.hpp"
#include "cpu/transport/net_iface.hpp"
#include "cpu/transport/wait_policy.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <utility>

namespace ddplite {

namespace tcp_detail {

std::string bytesOf(const void* data, size_t bytes) { return std::string(static_cast<const char*>(data), bytes); }

// Binds the listener's rank too: a process that took over a published port cannot relay a
// genuine listener's challenge and pass the answer off as a connection to itself.
auth::Digest helloMac(const std::string& secret, const auth::Nonce& challenge, const Hello& hello, int listenerRank) {
  const int32_t listener = listenerRank;
  return auth::hmacSha256(secret, "ddplite-hello" + bytesOf(challenge.data(), challenge.size()) +
                                      bytesOf(&hello.rank, sizeof(hello.rank)) + bytesOf(&hello.size, sizeof(hello.size)) +
                                      bytesOf(hello.nonce.data(), hello.nonce.size()) + bytesOf(&listener, sizeof(listener)));
}

auth::Digest ackMac(const std::string& secret, const auth::Nonce& challenge, const Hello& hello, int listenerRank) {
  const int32_t rank = listenerRank;
  return auth::hmacSha256(secret, "ddplite-ack" + bytesOf(hello.nonce.data(), hello.nonce.size()) +
                                      bytesOf(challenge.data(), challenge.size()) + bytesOf(&rank, sizeof(rank)));
}

auth::Digest rejectMac(const std::string& secret, const auth::Nonce& challenge, const Hello& hello, int listenerRank) {
  const int32_t rank = listenerRank;
  return auth::hmacSha256(secret, "ddplite-reject" + bytesOf(hello.nonce.data(), hello.nonce.size()) +
                                      bytesOf(challenge.data(), challenge.size()) + bytesOf(&rank, sizeof(rank)));
}

int millisUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, kPollSliceMs));
}

// A failed socket call during set-up or tuning: a DistBackendError naming the rank, the call,
// what it was for and the errno text (set-up never leaves a foreign exception or a half-made socket).
// `groupSize` (0: unknown) sizes the descriptor count an EMFILE message gives.
[[noreturn]] void throwSocketError(int rank, const char* call, const std::string& about, int error,
                                   int groupSize) {
  if (outOfDescriptors(error)) {
    throwDistError(strCat("rank ", rank, ": ", call, " failed ", about, ": ", descriptorShortage(error, groupSize)),
                   descriptorHint());
  }
  throwDistError(strCat("rank ", rank, ": ", call, " failed ", about, ": ", std::strerror(error)),
                 "the machine may be out of ports, or the interface DDPLITE_SOCKET_IFNAME selects may be down");
}

void checkCall(int result, int rank, const char* call, const std::string& about, int groupSize) {
  if (result < 0) throwSocketError(rank, call, about, errno, groupSize);
}

void setBlocking(int fd, bool blocking, int rank, const std::string& about) {
  const int flags = fcntl(fd, F_GETFL, 0);
  checkCall(flags, rank, "fcntl(F_GETFL)", about);
  checkCall(fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK)), rank, "fcntl(F_SETFL)", about);
}

void setIntOption(int fd, int level, int option, int value, int rank, const char* call, const std::string& about) {
  checkCall(setsockopt(fd, level, option, &value, sizeof(value)), rank, call, about);
}

// Data sockets: no Nagle delay, the configured buffer sizes, non-blocking from now on.
void tuneDataSocket(int fd, int rank, const std::string& about) {
  setIntOption(fd, IPPROTO_TCP, TCP_NODELAY, 1, rank, "setsockopt(TCP_NODELAY)", about);
  if (int64_t bytes = env::socketBufferBytes(); bytes > 0) {
    const int value = static_cast<int>(std::min<int64_t>(bytes, INT32_MAX));
    setIntOption(fd, SOL_SOCKET, SO_SNDBUF, value, rank, "setsockopt(SO_SNDBUF)", about);
    setIntOption(fd, SOL_SOCKET, SO_RCVBUF, value, rank, "setsockopt(SO_RCVBUF)", about);
  }
  setBlocking(fd, false, rank, about);
}

// "a.b.c.d:port" or "[ipv6]:port" as published in the store; a malformed one (a foreign key, a
// corrupted store) is a DistBackendError, not std::stoi's exception. A link-local IPv6 address is
// reached through `localScope` (this rank's own interface on that link) when non-zero.
net::Endpoint parseAddress(const std::string& hostPort, int rank, unsigned localScope) {
  net::Endpoint address;
  std::string problem;
  if (!net::parseEndpoint(hostPort, localScope, &address, &problem)) {
    throwDistError(strCat("rank ", rank, ": ", problem),
                   "the store holds a bad address for a rank; check that no other job shares this store's keys");
  }
  return address;
}

// Set-up I/O on a non-blocking socket: all `bytes` before `deadline`, or false with errno set
// (ETIMEDOUT past the deadline, ECONNRESET when the other end closed).
bool transferBefore(int fd, char* cursor, size_t bytes, bool sending, Deadline deadline,
                    const std::atomic<bool>* stop) {
  while (bytes > 0) {
    if (stop != nullptr && stop->load()) {
      errno = ECANCELED;
      return false;
    }
    const ssize_t n = sending ? ::send(fd, cursor, bytes, MSG_NOSIGNAL) : ::recv(fd, cursor, bytes, 0);
    if (n > 0) {
      cursor += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      errno = ECONNRESET;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (Clock::now() >= deadline) {
      errno = ETIMEDOUT;
      return false;
    }
    pollfd entry = {fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    if (poll(&entry, 1, millisUntil(deadline)) < 0 && errno != EINTR) return false;
  }
  return true;
}

bool writeBefore(int fd, const void* data, size_t bytes, Deadline deadline, const std::atomic<bool>* stop) {
  return transferBefore(fd, static_cast<char*>(const_cast<void*>(data)), bytes, /*sending=*/true, deadline, stop);
}

bool readBefore(int fd, void* data, size_t bytes, Deadline deadline, const std::atomic<bool>* stop) {
  return transferBefore(fd, static_cast<char*>(data), bytes, /*sending=*/false, deadline, stop);
}

uint16_t portOf(const sockaddr_storage& address) {
  return ntohs(address.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(address).sin6_port
                                             : reinterpret_cast<const sockaddr_in&>(address).sin_port);
}

// Waits for a non-blocking connect; returns 0 or the socket error (ECANCELED once `stop` is set).
int finishConnect(int fd, Deadline deadline, const std::atomic<bool>* stop) {
  while (true) {
    if (stop != nullptr && stop->load()) return ECANCELED;
    pollfd entry = {fd, POLLOUT, 0};
    const int ready = poll(&entry, 1, millisUntil(deadline));
    if (ready < 0 && errno != EINTR) return errno;
    if (ready > 0) {
      int error = 0;
      socklen_t length = sizeof(error);
      return getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 ? error : errno;
    }
    if (Clock::now() >= deadline) return ETIMEDOUT;
  }
}

// How often a rank waiting for higher ranks to connect looks for a set-up failure recorded in the
// store (one store request each time).
constexpr auto kFailureCheckInterval = std::chrono::milliseconds(250);
// How long a rank that quotes a peer's set-up failure waits for every rank to have read it before
// raising (its process may host the store: see StoreRendezvous::awaitFailureReadByAll).
constexpr auto kFailureReadLinger = std::chrono::milliseconds(2000);

// A set-up failure recorded by a peer (its connect gave up at about the same deadline), waited for
// briefly: it names the address the peer could not reach, which this rank cannot know otherwise.
std::string peerReport(StoreRendezvous& rendezvous) {
  const auto until = Clock::now() + std::chrono::seconds(2);
  while (true) {
    if (auto report = rendezvous.recordedFailure()) return strCat("; first failure reported: ", *report);
    if (Clock::now() >= until) return "";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The iovecs of what is left of a transfer: the rest of the header (if any), then the payload.
int pendingIovecs(char* header, size_t headerLeft, char* cursor, size_t left, iovec* out) {
  int count = 0;
  if (headerLeft > 0) out[count++] = {header, headerLeft};
  if (left > 0) out[count++] = {cursor, left};
  return count;
}

// When a rank cannot reach a peer's address of the other family: what each published, for the
// error (a host without IPv6 cannot reach a rank that publishes only IPv6, and the other way round).
std::string familyMismatch(int rank, const std::string& myAddress, int mine, int peer, const std::string& peerAddress,
                           int peerFamily) {
  if (peerFamily == mine) return "";
  return strCat("; rank ", peer, " published an ", net::familyName(peerFamily), " address (", peerAddress, ") and rank ",
                rank, " an ", net::familyName(mine), " one (", myAddress, "): the ranks chose addresses of different "
                "families, and rank ", rank, "'s host cannot reach rank ", peer, "'s over ",
                net::familyName(peerFamily));
}

bool closedByPeer(int fd) {
  pollfd entry = {fd, POLLRDHUP, 0};
  return poll(&entry, 1, 0) > 0 && (entry.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

std::string familyHint() {
  return "give every rank addresses of one family: the same MASTER_ADDR (or init_method host) on every host, or "
         "DDPLITE_SOCKET_IFNAME naming interfaces that carry that family (IPv4 or IPv6) on every host";
}

std::string unreachableHint() {
  return "the address above must be reachable from this host; if the rank listens on the wrong "
         "interface, set DDPLITE_SOCKET_IFNAME (NCCL syntax, e.g. DDPLITE_SOCKET_IFNAME=eth0 or "
         "^docker,lo) on every rank";
}

// DDPLITE_TCP_SEND_CHUNK_BYTES as the bound of std::min: its 0 (no limit) is SIZE_MAX.
size_t sendCap() {
  const size_t bytes = env::tcpSendChunkBytes();
  return bytes == 0 ? SIZE_MAX : bytes;
}

}  // namespace tcp_detail

using namespace tcp_detail;

TcpTransport::TcpTransport(int rank, int size, bool checkFingerprints)
    : rank_(rank),
      size_(size),
      fds_(new std::atomic<int>[static_cast<size_t>(size)]),
      addresses_(size),
      spin_(env::tcpSpin()),
      sendChunk_(sendCap()),
      checkFingerprints_(checkFingerprints),
      sendHeaderDue_(size, 0),
      recvHeaderDue_(size, 0),
      headerPeeked_(size, 0) {
  for (int peer = 0; peer < size; ++peer) fds_[static_cast<size_t>(peer)].store(-1, std::memory_order_relaxed);
}

TcpTransport::~TcpTransport() {
  stopAcceptor();  // no thread publishes a descriptor from here on
  for (int peer = 0; peer < size_; ++peer) {
    fork_guard::close(fdOf(peer), this);  // in a forked child: already closed at fork, nothing to do
  }
}


std::unique_ptr<TcpTransport> TcpTransport::connectFullMesh(StoreRendezvous& rendezvous, int rank, int size,
                                                            Deadline deadline, const std::string& purpose,
                                                            bool checkFingerprints) {
  std::unique_ptr<TcpTransport> transport(new TcpTransport(rank, size, checkFingerprints));
  if (size == 1) {
    return transport;
  }
  MeshSetup setup{rendezvous, rank, size, deadline, purpose, "", "", "", ""};
  setup.fdOwner = transport.get();
  setup.failureRecordedBefore = rendezvous.recordedFailure().has_value();
  setup.secret = shareSecret(setup, /*onDemand=*/false);
  setup.host = net::chooseListenAddress(&setup.why, rendezvous.storeHost());
  setup.scope = net::scopeOf(setup.host);
  UniqueFd listener(openListener(setup), setup.fdOwner);
  transport->addresses_[rank] = setup.myAddress;
  for (int peer = 0; peer < rank; ++peer) {
    transport->addresses_[peer] = setup.peerAddress(peer);
    const int fd = connectToLowerRank(setup, peer, transport->addresses_[peer]);  // registered at creation
    transport->fds_[static_cast<size_t>(peer)].store(fd, std::memory_order_release);
  }
  acceptHigherRanks(setup, listener.get(), *transport);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    tuneDataSocket(transport->fdOf(peer), rank, strCat("on the socket to rank ", peer));
    if (transport->addresses_[peer].empty()) transport->addresses_[peer] = setup.peerAddress(peer);
  }
  return transport;
}

// The mesh's secret (auth.hpp): rank 0 draws it and writes it to the store before it publishes
// its address (so no rank can connect before the secret is there); the others read it. With
// DDPLITE_AUTH_KEY_FILE, rank 0 writes a salt and a check value instead, and every rank derives
// the secret from its key. "" when DDPLITE_AUTH=0 (a group-wide knob: every rank agrees, checked
// before the mesh is built).
std::string TcpTransport::shareSecret(const MeshSetup& setup, bool onDemand) {
  if (!env::authenticateConnections()) {
    warnUnauthenticated(setup, onDemand);
    return "";
  }
  const std::string storeKey = strCat(setup.purpose, "auth/secret");
  const char* keyHint = "give every rank the same DDPLITE_AUTH_KEY_FILE (or none: then rank 0 shares a secret "
                        "through the store)";
  std::string key;
  try {
    key = auth::keyFromFile();
    if (setup.rank == 0) {
      if (key.empty()) {
        const std::string secret = auth::newSecret();
        setup.rendezvous.set(storeKey, secret);
        return secret;
      }
      const std::string salt = auth::newSecret();
      setup.rendezvous.set(storeKey, strCat("external ", salt, " ", auth::keyCheck(key, salt)));
      return auth::meshSecretFromKey(key, setup.purpose, salt);
    }
  } catch (const std::runtime_error& error) {
    throwDistError(strCat("rank ", setup.rank, " cannot set up its connection secret: ", error.what()),
                   "fix DDPLITE_AUTH_KEY_FILE, or set DDPLITE_AUTH=0 on every rank to run without authenticated "
                   "connections");
  }
  const std::string shared = setup.rendezvous.get(storeKey, "the group's connection secret (from rank 0)");
  constexpr const char* kExternal = "external ";
  if (shared.rfind(kExternal, 0) != 0) {
    if (!key.empty()) {
      throwDistError(strCat("rank ", setup.rank, " has DDPLITE_AUTH_KEY_FILE='", env::authKeyFile(),
                            "' but rank 0 has none (it shares a secret through the store)"),
                     keyHint);
    }
    return shared;
  }
  const std::string salt = shared.substr(std::strlen(kExternal), shared.find(' ', std::strlen(kExternal)) -
                                                                      std::strlen(kExternal));
  const std::string check = shared.substr(shared.rfind(' ') + 1);
  if (key.empty()) {
    throwDistError(strCat("rank 0 authenticates connections with a key from DDPLITE_AUTH_KEY_FILE; rank ", setup.rank,
                          " has none"),
                   keyHint);
  }
  if (auth::keyCheck(key, salt) != check) {
    throwDistError(strCat("rank ", setup.rank, "'s DDPLITE_AUTH_KEY_FILE='", env::authKeyFile(),
                          "' holds another key than rank 0's"),
                   keyHint);
  }
  return auth::meshSecretFromKey(key, setup.purpose, salt);
}

// Listens on an ephemeral port of setup.host and publishes host:port in the store. The listener
// is registered with fork_guard under setup.fdOwner.
int TcpTransport::openListener(MeshSetup& setup) {
  const std::string about = strCat("to listen on ", setup.host);
  const net::Endpoint bindAddress = parseAddress(net::joinHostPort(setup.host, 0), setup.rank);
  UniqueFd listener(
      fork_guard::adoptNew(setup.fdOwner, [&] { return socket(bindAddress.family(), SOCK_STREAM | SOCK_CLOEXEC, 0); }),
      setup.fdOwner);
  checkCall(listener.get(), setup.rank, "socket", about, setup.size);
  if (bind(listener.get(), bindAddress.get(), bindAddress.length) != 0 ||
      listen(listener.get(), SOMAXCONN) != 0) {  // strangers must not fill a backlog sized for the peers
    throwDistError(strCat("rank ", setup.rank, " cannot listen on ", setup.host, ": ", std::strerror(errno)),
                   "choose another interface with DDPLITE_SOCKET_IFNAME");
  }
  sockaddr_storage bound = {};
  socklen_t length = sizeof(bound);
  checkCall(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &length), setup.rank, "getsockname",
            about);
  setup.myAddress = net::joinHostPort(setup.host, portOf(bound));
  DDPLITE_LOG(kInfo, "rank ", setup.rank, "/", setup.size, " listens on ", setup.myAddress, " (", setup.why, ")");
  setup.rendezvous.set(setup.addressKey(setup.rank), setup.myAddress);
  return listener.release();
}

// One connection attempt: a connected socket (non-blocking) that has completed the handshake
// with `peer`, or -1 with *error set when the attempt may be retried (connect refused or timed
// out, the listener closed before acknowledging). A listener that answers but fails to prove it
// holds the group's secret is not retried: that throws.
int TcpTransport::tryConnect(const MeshSetup& setup, int peer, const net::Endpoint& target, int* error, bool* kept) {
  const std::string about = "to connect to a lower rank";
  UniqueFd fd(fork_guard::adoptNew(setup.fdOwner, [&] { return socket(target.family(), SOCK_STREAM | SOCK_CLOEXEC, 0); }),
              setup.fdOwner);
  if (fd.get() < 0 && errno == EAFNOSUPPORT) {  // no IPv6 (or IPv4) in this kernel: not worth retrying
    *error = errno;
    return -1;
  }
  checkCall(fd.get(), setup.rank, "socket", strCat(about, " (rank ", peer, ")"), setup.size);
  const bool onDemand = kept != nullptr;
  // On demand the socket is ready for data before the handshake: once the listener keeps it,
  // nothing here may fail and leave the two ranks holding different connections.
  if (onDemand) {
    tuneDataSocket(fd.get(), setup.rank, strCat("on the socket to rank ", peer));  // non-blocking too
  } else {
    setBlocking(fd.get(), false, setup.rank, about);
  }
  const std::atomic<bool>* stop = setup.aborted;
  const int result = connect(fd.get(), target.get(), target.length);
  *error = (result == 0) ? 0 : (errno == EINPROGRESS ? finishConnect(fd.get(), setup.deadline, stop) : errno);
  if (*error != 0) return -1;
  if (setup.helloDelay.count() > 0) std::this_thread::sleep_for(setup.helloDelay);  // DDPLITE_TEST_HOOKS
  // Once the Hello is out the listener may keep this connection: its verdict is awaited past the
  // transfer's deadline (up to kHandshakeLimit), so that a peer that kept it is not left with a
  // connection this rank closed. Only abort() cuts it short (the group is over then).
  const Deadline verdictBy = onDemand ? std::max(setup.deadline, Clock::now() + kHandshakeLimit) : setup.deadline;
  Hello hello = {setup.authenticates() ? (onDemand ? kOnDemandAuthHelloMagic : kAuthHelloMagic)
                                       : (onDemand ? kOnDemandHelloMagic : kHelloMagic),
                 setup.rank, setup.size, {}, {}};
  if (!setup.authenticates()) {
    Ack verdict = {};
    if (!writeBefore(fd.get(), &hello, sizeof(hello), setup.deadline, stop) ||
        (onDemand && !readBefore(fd.get(), &verdict, sizeof(verdict), verdictBy, stop))) {
      *error = errno;
      return -1;
    }
    if (onDemand) {
      if (verdict.magic != kAckMagic && verdict.magic != kRejectMagic) {
        throwImpostor(setup, peer, net::describeEndpoint(target.get()), "its answer is not a ddplite verdict");
      }
      *kept = verdict.magic == kAckMagic;
    }
    return fd.release();
  }
  Challenge challenge = {};
  if (!readBefore(fd.get(), &challenge, sizeof(challenge), setup.deadline, stop)) {
    *error = errno;
    return -1;
  }
  const std::string where = net::describeEndpoint(target.get());
  if (challenge.magic != kChallengeMagic) throwImpostor(setup, peer, where, "its first bytes are not a ddplite challenge");
  hello.nonce = auth::newNonce();
  hello.mac = helloMac(setup.secret, challenge.nonce, hello, peer);
  Ack ack = {};
  if (!writeBefore(fd.get(), &hello, sizeof(hello), setup.deadline, stop) ||
      !readBefore(fd.get(), &ack, sizeof(ack), verdictBy, stop)) {
    *error = errno;
    return -1;
  }
  const bool refused = onDemand && ack.magic == kRejectMagic &&
                       auth::sameDigest(ack.mac, rejectMac(setup.secret, challenge.nonce, hello, peer));
  if (!refused &&
      (ack.magic != kAckMagic || !auth::sameDigest(ack.mac, ackMac(setup.secret, challenge.nonce, hello, peer)))) {
    throwImpostor(setup, peer, where, "its answer to the handshake does not prove it holds the group's secret");
  }
  if (onDemand) *kept = !refused;
  return fd.release();
}

void TcpTransport::warnUnauthenticated(const MeshSetup& setup, bool onDemand) {
  // Once per process and kind of mesh: every group and mesh of a job has the same knob.
  static std::atomic<bool> warnedAtInit{false}, warnedOnDemand{false};
  if ((onDemand ? warnedOnDemand : warnedAtInit).exchange(true)) return;
  DDPLITE_LOG(kWarn, "rank ", setup.rank, "/", setup.size, ": DDPLITE_AUTH=0: ddplite's TCP connections are not "
              "authenticated, so anyone who reaches a rank's listener and sends a plain hello claiming rank r is "
              "taken for rank r",
              onDemand ? ". This group connects on demand (DDPLITE_CONNECT; past 16 ranks by default), so that "
                         "window is the whole job, not only set-up: whoever first claims rank r to a rank takes that "
                         "pair for the rest of the job (the real rank r is refused and times out, and the stranger "
                         "receives what this rank sends to r)"
                       : " during set-up",
              ". Use it only on a network you trust; docs/security.md");
}

void TcpTransport::throwImpostor(const MeshSetup& setup, int peer, const std::string& where, const std::string& why) {
  const std::string failure = strCat("rank ", setup.rank, " connected to ", where, ", the address rank ", peer,
                                     " published, but ", why);
  setup.rendezvous.recordFailure(failure);
  setup.rendezvous.countFailureRead();
  throwDistError(failure,
                 "another process may have taken that port, or the ranks do not share one store; check that every "
                 "rank of the job was started with the same MASTER_ADDR/MASTER_PORT (or init_method)");
}

// Connects to `peer` (a lower rank), retrying refusals until the deadline (a peer's backlog may
// be full for a moment). Past the deadline, or at once when the peer published the other address
// family and this host has no address or route in it: records the failure in the store, so the
// ranks waiting for this one quote it, and throws.
int TcpTransport::connectToLowerRank(const MeshSetup& setup, int peer, const std::string& peerAddress) {
  const net::Endpoint target = parseAddress(peerAddress, setup.rank, setup.scope);
  Deadline nextFailureCheck = Clock::now() + kFailureCheckInterval;
  while (true) {
    int error = 0;
    const int fd = tryConnect(setup, peer, target, &error);
    if (fd >= 0) return fd;
    // A rank whose set-up failed (its listener may be closed: refused) will not accept: say so now.
    if (!setup.failureRecordedBefore && Clock::now() >= nextFailureCheck) {
      nextFailureCheck = Clock::now() + kFailureCheckInterval;
      if (auto report = setup.rendezvous.recordedFailure()) {
        setup.rendezvous.countFailureRead();
        throwDistError(strCat("rank ", setup.rank, " gave up connecting to rank ", peer, " at ", peerAddress, " (",
                              std::strerror(error), "; rank ", setup.rank, " listens on ", setup.myAddress, ", ",
                              setup.why, "): a rank's set-up failed; first failure reported: ", *report),
                       unreachableHint());
      }
    }
    const std::string mismatch = familyMismatch(setup.rank, setup.myAddress, net::literalFamily(setup.host), peer,
                                                peerAddress, target.family());
    // The peer published the other family and this host has no address or route in it: retrying
    // cannot help, and the ranks waiting for this one quote the failure at once instead of at the deadline.
    const bool noRouteInThatFamily =
        !mismatch.empty() && (error == EAFNOSUPPORT || error == EADDRNOTAVAIL || error == ENETUNREACH);
    if (Clock::now() >= setup.deadline || error == EAFNOSUPPORT || noRouteInThatFamily) {
      const std::string failure = strCat("rank ", setup.rank, " could not connect to rank ", peer, " at ", peerAddress,
                                         ": ", std::strerror(error), " (rank ", setup.rank, " listens on ",
                                         setup.myAddress, ", ", setup.why, ")", mismatch);
      setup.rendezvous.recordFailure(failure);
      setup.rendezvous.countFailureRead();
      throwDistError(failure, mismatch.empty() ? unreachableHint() : familyHint());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Accepts one authenticated connection from every higher rank. Connections are accepted as they
// come and their handshakes advance side by side (non-blocking), so a connection that is not a
// peer (silent, garbage, a replay, a rank already connected) holds up nothing: it is dropped with
// a warning naming its address when its handshake fails or takes longer than kHandshakeLimit.
void TcpTransport::acceptHigherRanks(const MeshSetup& setup, int listener, TcpTransport& transport) {
  setBlocking(listener, false, setup.rank, "to accept higher ranks");
  std::vector<PendingHandshake> pending;
  Deadline nextFailureCheck = Clock::now() + kFailureCheckInterval;
  for (int accepted = 0; accepted < setup.size - 1 - setup.rank;) {
    std::vector<pollfd> entries = {{listener, POLLIN, 0}};
    for (const PendingHandshake& connection : pending) entries.push_back({connection.fd.get(), POLLIN, 0});
    const int ready = poll(entries.data(), entries.size(), millisUntil(std::min(setup.deadline, nextFailureCheck)));
    if (ready < 0 && errno != EINTR) throwSocketError(setup.rank, "poll", "waiting for higher ranks to connect", errno);
    if (Clock::now() >= setup.deadline) throwMissingHigherRanks(setup, transport, peerReport(setup.rendezvous), true);
    if (Clock::now() >= nextFailureCheck) {
      nextFailureCheck = Clock::now() + kFailureCheckInterval;
      // A rank that failed its set-up (and recorded why) will never connect: say so now, not at the deadline.
      if (!setup.failureRecordedBefore) {
        if (auto report = setup.rendezvous.recordedFailure()) {
          throwMissingHigherRanks(setup, transport, strCat("; first failure reported: ", *report), false);
        }
      }
    }
    // Existing handshakes first (entries[1..] are theirs), then the new connections.
    for (size_t i = entries.size() - 1; i >= 1; --i) {
      PendingHandshake& connection = pending[i - 1];
      if (entries[i].revents == 0 && Clock::now() < connection.until) continue;
      const std::optional<std::string> refusal = advanceHandshake(setup, connection, transport);
      if (!refusal) continue;  // still under way
      if (refusal->empty()) {
        ++accepted;
      } else {
        warnDropped(setup, connection.from, *refusal);
      }
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i - 1));
    }
    if (entries[0].revents != 0) {
      acceptWaitingConnections(setup, listener, static_cast<size_t>(setup.size - 1 - setup.rank - accepted), pending);
    }
  }
  for (const PendingHandshake& connection : pending) {
    warnDropped(setup, connection.from, "set-up ended before it completed the handshake");
  }
}

// accept()s the connections the kernel holds, at most kAcceptsPerPass: then the caller polls
// again, so the handshakes under way advance (and a stop is seen) however fast connections come.
// With authentication, sends each its challenge.
void TcpTransport::acceptWaitingConnections(const MeshSetup& setup, int listener, size_t stillExpected,
                                            std::vector<PendingHandshake>& pending) {
  for (int pass = 0; pass < kAcceptsPerPass; ++pass) {
    sockaddr_storage from = {};
    socklen_t length = sizeof(from);
    UniqueFd fd(fork_guard::adoptNew(setup.fdOwner,
                                     [&] {
                                       return accept4(listener, reinterpret_cast<sockaddr*>(&from), &length,
                                                      SOCK_CLOEXEC | SOCK_NONBLOCK);
                                     }),
                setup.fdOwner);
    if (fd.get() < 0) {
      // EAGAIN: nothing more waiting. ECONNABORTED: that connection gave up. Anything else (out
      // of descriptors: the connection stays queued and the listener readable) is warned about
      // once and retried after a pause, not in a tight loop; the deadline reports the ranks
      // that could not connect.
      const int error = errno;
      if (error == EINTR || error == ECONNABORTED) continue;
      // Out of descriptors: it would not get better by the deadline (this rank holds what it
      // has), so say so now instead of retrying for the whole set-up timeout.
      if (outOfDescriptors(error)) {
        throwSocketError(setup.rank, "accept", strCat("on ", setup.myAddress, " (", stillExpected,
                                                      " higher ranks still to connect)"), error, setup.size);
      }
      if (error != EAGAIN && error != EWOULDBLOCK) {
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
          DDPLITE_LOG(kWarn, "rank ", setup.rank, ": accept failed on ", setup.myAddress, ": ", std::strerror(error),
                      "; retrying every 100 ms until the set-up deadline");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return;
    }
    // Room for every peer still to come (set-up: in a large group all higher ranks connect at
    // once), plus kMaxPendingHandshakes strangers; past that, the newcomer is taken and a pending
    // connection drawn at random gives way (pendingToDrop). No more than the cap are held.
    if (pending.size() >= stillExpected + kMaxPendingHandshakes) {
      const size_t dropped = pendingToDrop(pending);
      warnDropped(setup, pending[dropped].from,
                  strCat("more than ", kMaxPendingHandshakes, " connections were waiting to complete a handshake, and "
                         "it was drawn to make room for a newcomer"));
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(dropped));
    }
    PendingHandshake connection{std::move(fd), net::describeEndpoint(reinterpret_cast<sockaddr*>(&from)),
                                std::min<Deadline>(setup.deadline, Clock::now() + kHandshakeLimit)};
    if (setup.authenticates()) {
      connection.challenge = auth::newNonce();
      const Challenge challenge = {kChallengeMagic, connection.challenge};
      // A fresh socket's buffer takes 20 bytes at once; if it does not, the peer will retry.
      if (!writeBefore(connection.fd.get(), &challenge, sizeof(challenge), Clock::now())) {
        warnDropped(setup, connection.from, strCat("the challenge could not be sent: ", std::strerror(errno)));
        continue;
      }
    }
    pending.push_back(std::move(connection));
  }
}

size_t TcpTransport::pendingToDrop(const std::vector<PendingHandshake>& pending) {
  // Drawn at random, among those that have sent nothing yet if there are any. Not the oldest:
  // strangers that reconnect as soon as they are dropped would then push any newcomer, a rank's
  // connection too, to the front in a chain of 64 evictions within a round trip. Not "refuse the
  // newcomer": strangers that keep the slots full would then lock the ranks out. At random, a
  // rank's connection outlives each eviction with odds of at least 63 in 64 until its hello is
  // read (a round trip; then it is preferred to the silent ones), and a rank whose connection
  // was dropped connects again. The acceptor's thread (or set-up's) only.
  thread_local std::minstd_rand draw(std::random_device{}());
  const size_t silent = static_cast<size_t>(
      std::count_if(pending.begin(), pending.end(), [](const PendingHandshake& c) { return c.received == 0; }));
  size_t pick = std::uniform_int_distribution<size_t>(0, (silent > 0 ? silent : pending.size()) - 1)(draw);
  for (size_t i = 0; i < pending.size(); ++i) {
    if (silent > 0 && pending[i].received != 0) continue;
    if (pick-- == 0) return i;
  }
  return 0;  // not reached: pick < the count walked
}

// Reads what has arrived of the connection's Hello. Nothing while the handshake is still under
// way; once it is decided, "" when the connection is a peer (recorded in transport.fds_,
// acknowledged), else why it is refused.
std::optional<std::string> TcpTransport::advanceHandshake(const MeshSetup& setup, PendingHandshake& connection,
                                                          TcpTransport& transport) {
  char* into = reinterpret_cast<char*>(&connection.hello) + connection.received;
  const ssize_t n = ::recv(connection.fd.get(), into, sizeof(Hello) - connection.received, 0);
  if (n == 0) return "it closed the connection before completing the handshake";
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    return strCat("reading its handshake failed: ", std::strerror(errno));
  }
  if (n > 0) connection.received += static_cast<size_t>(n);
  if (connection.received < sizeof(Hello)) {
    if (Clock::now() < connection.until) return std::nullopt;
    return strCat("it sent ", connection.received, " of the ", sizeof(Hello), " handshake bytes within ",
                  std::chrono::duration_cast<std::chrono::seconds>(kHandshakeLimit).count(), " s");
  }
  const Hello& hello = connection.hello;
  const bool onDemand = transport.onDemand();
  const uint32_t expected = setup.authenticates() ? (onDemand ? kOnDemandAuthHelloMagic : kAuthHelloMagic)
                                                  : (onDemand ? kOnDemandHelloMagic : kHelloMagic);
  if (hello.magic != expected) return "its handshake is not a ddplite hello";
  if (setup.authenticates() &&
      !auth::sameDigest(hello.mac, helloMac(setup.secret, connection.challenge, hello, setup.rank))) {
    return "its handshake does not prove it holds the group's secret (a stranger, a replayed handshake, or a rank "
           "of another job)";
  }
  if (onDemand) {
    if (hello.size != setup.size || hello.rank < 0 || hello.rank == setup.rank || hello.rank >= setup.size) {
      return strCat("it claims to be rank ", hello.rank, " of ", hello.size, ", not another rank of this group of ",
                    setup.size);
    }
    return answerOnDemand(setup, connection, transport);
  }
  if (hello.size != setup.size || hello.rank <= setup.rank || hello.rank >= setup.size) {
    return strCat("it claims to be rank ", hello.rank, " of ", hello.size, ", not a higher rank of this group of ",
                  setup.size);
  }
  if (transport.fdOf(hello.rank) >= 0) return strCat("rank ", hello.rank, " is already connected");
  if (setup.authenticates()) {
    const Ack ack = {kAckMagic, ackMac(setup.secret, connection.challenge, hello, setup.rank)};
    if (!writeBefore(connection.fd.get(), &ack, sizeof(ack), std::min(setup.deadline, connection.until))) {
      return strCat("the acknowledgement could not be sent: ", std::strerror(errno));
    }
  }
  const int fd = connection.fd.release();  // registered with fork_guard since accept4
  transport.fds_[static_cast<size_t>(hello.rank)].store(fd, std::memory_order_release);
  return "";
}

void TcpTransport::warnDropped(const MeshSetup& setup, const std::string& from, const std::string& why) {
  // Strangers that reconnect as soon as they are dropped would flood the log: at most
  // kWarningsPerWindow such warnings per process every kWindow, the next one saying how many were
  // left out. Any thread (every acceptor of the process shares the budget).
  constexpr int kWarningsPerWindow = 32;
  constexpr auto kWindow = std::chrono::seconds(10);
  static std::mutex mutex;
  static Clock::time_point windowStart{};
  static int warned = 0;
  static uint64_t leftOut = 0;
  uint64_t leftOutBefore = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto now = Clock::now();
    if (now - windowStart >= kWindow) {
      windowStart = now;
      warned = 0;
    }
    if (warned >= kWarningsPerWindow) {
      ++leftOut;
      return;
    }
    ++warned;
    leftOutBefore = std::exchange(leftOut, 0);
  }
  DDPLITE_LOG(kWarn, "rank ", setup.rank, " dropped a connection from ", from, " to its ddplite port ",
              setup.myAddress, ": ", why, ". It is not a rank of this group; the group goes on without it",
              leftOutBefore > 0 ? strCat(" (", leftOutBefore, " more such warnings were left out before this one: "
                                         "at most ", kWarningsPerWindow, " every 10 s)")
                                : std::string());
}

void TcpTransport::throwMissingHigherRanks(const MeshSetup& setup, const TcpTransport& transport,
                                           const std::string& report, bool timedOut) {
  std::string missing;
  for (int peer = setup.rank + 1; peer < setup.size; ++peer) {
    if (transport.fdOf(peer) < 0) missing += strCat(missing.empty() ? "" : ", ", peer);
  }
  if (!report.empty()) {
    setup.rendezvous.countFailureRead();
    setup.rendezvous.awaitFailureReadByAll(setup.size, kFailureReadLinger);
  }
  const bool families = report.find("addresses of different families") != std::string::npos;
  const std::string what = timedOut ? strCat("Timed out waiting for rank(s) ", missing, " to connect")
                                    : strCat("Gave up waiting for rank(s) ", missing, " to connect: a rank's set-up failed");
  throwDistError(strCat("rank ", setup.rank, " (listening on ", setup.myAddress, ", ", setup.why, "): ", what, report),
                 families ? familyHint() : "those ranks may not reach this address; " + unreachableHint());
}

std::vector<int> exchangeRanksOverNewMesh(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                          std::chrono::milliseconds timeout) {
  StoreRendezvous rendezvous(store);
  const Deadline deadline = Clock::now() + timeout;
  auto mesh = TcpTransport::connectFullMesh(rendezvous, rank, size, deadline, "mesh-check/", /*checkFingerprints=*/false);
  std::vector<int> received(static_cast<size_t>(size), rank);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    const int32_t mine = rank;
    int32_t theirs = -1;
    mesh->sendRecv(peer, &mine, sizeof(mine), peer, &theirs, sizeof(theirs), deadline);
    received[static_cast<size_t>(peer)] = theirs;
  }
  return received;
}

std::string TcpTransport::describePeer(int peer) const {
  if (peer < 0 || peer >= size_) return strCat("rank ", peer);
  if (onDemand_) {
    std::lock_guard<std::mutex> lock(onDemand_->mutex);
    if (addresses_[peer].empty()) return strCat("rank ", peer, " (not connected)");
    return strCat("rank ", peer, " (", addresses_[peer], ")");
  }
  return strCat("rank ", peer, " (", addresses_[peer], ")");
}

void TcpTransport::checkPeer(int peer) const {
  DDPLITE_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "bad peer ", peer, " for rank ", rank_);
}

bool TcpTransport::peerHungUp(int peer) {
  checkPeer(peer);
  const int fd = fdOf(peer);
  return fd >= 0 && closedByPeer(fd);  // not connected (on demand): nothing to say
}

bool TcpTransport::peekWaitingHeader(int peer, WireHeader* header) {
  checkPeer(peer);
  const int fd = fdOf(peer);
  if (fd < 0) return false;
  const ssize_t n = ::recv(fd, header, sizeof(*header), MSG_PEEK | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(sizeof(*header));
}

size_t TcpTransport::sendSome(int peer, const void* data, size_t bytes, Deadline connectBy) {
  ensureConnected(peer, connectBy);
  while (true) {
    const ssize_t n = ::send(fdOf(peer), data, std::min(bytes, sendChunk_), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, peer, "the group was aborted");
    throwIoError(peer, "send", errno);
  }
}

size_t TcpTransport::recvSome(int peer, void* data, size_t bytes) {
  if (bytes == 0) return 0;  // recv() of nothing would read as the end of the stream
  const int fd = fdOf(peer);
  if (fd < 0) return 0;  // on demand: the peer has not connected yet (the acceptor wakes the pump when it does)
  while (true) {
    const ssize_t n = ::recv(fd, data, bytes, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, peer, "the group was aborted");
    throwIoError(peer, "recv", n == 0 ? 0 : errno);
  }
}

void TcpTransport::abort() {
  if (aborted_.exchange(true)) return;
  // In a forked child the sockets were closed at fork; shutdown() on the parent's copy would end
  // the parent's connections.
  if (!fork_guard::createdHere(creatorPid_)) return;
  // On demand: after this, no socket is published that the loop below misses (publication checks
  // aborted_ under the mutex), and connectors waiting for a peer's connection give up.
  wakeConnectors();
  // shutdown() wakes a poll blocked in the worker thread; the fds are closed in the destructor,
  // so no descriptor is reused while another thread may still hold it.
  for (int peer = 0; peer < size_; ++peer) {
    if (const int fd = fdOf(peer); fd >= 0) shutdown(fd, SHUT_RDWR);
  }
  // On demand, a peer that never connected to this rank learns that it left from the closed
  // listener (its connect is refused: kPeerClosed within kRefusedMeansGone), not at its deadline.
  stopAcceptor();
}

void TcpTransport::throwIoError(int peer, const char* syscall, int error) const {
  if (error == 0 || error == ECONNRESET || error == EPIPE) {
    throw TransportError(TransportError::Kind::kPeerClosed, peer,
                         strCat(describePeer(peer), " closed the connection (", syscall, ": ",
                                error == 0 ? "end of stream" : std::strerror(error),
                                "); that rank probably exited or crashed"));
  }
  throw TransportError(TransportError::Kind::kIo, peer,
                       strCat(syscall, " with ", describePeer(peer), " failed: ", std::strerror(error)));
}

void TcpTransport::throwTimeout(const Progress* sending, const Progress* receiving) const {
  auto remaining = [](const Progress* p) {
    return p == nullptr ? 0 : p->left + (p->header ? sizeof(WireHeader) - p->headerDone : 0);
  };
  const Progress* stuck = remaining(receiving) > 0 ? receiving : sending;
  throw TransportError(TransportError::Kind::kTimeout, stuck->peer,
                       strCat("Timed out ", stuck == receiving ? "waiting to receive from " : "waiting to send to ",
                              describePeer(stuck->peer), " (", remaining(stuck), " bytes still to go)"));
}

void TcpTransport::beginCollective(const Fingerprint& fingerprint) {
  if (!checkFingerprints_) return;
  // The byte-level collectives of one op (a coalesced op has several) share its sequence
  // number and are told apart by their part, numbered here in the order they run.
  const bool nextPart = armed_ && fingerprint.seq == fingerprint_.seq;
  const uint8_t part = fingerprint.partGiven ? fingerprint.part : nextPart ? static_cast<uint8_t>(fingerprint_.part + 1) : 0;
  armed_ = true;
  fingerprint_ = fingerprint;
  fingerprint_.part = part;
  std::fill(headerPeeked_.begin(), headerPeeked_.end(), 0);
  std::fill(sendHeaderDue_.begin(), sendHeaderDue_.end(), 1);
  std::fill(recvHeaderDue_.begin(), recvHeaderDue_.end(), 1);
}

void TcpTransport::prepareSend(Progress& progress, WireHeader& header) {
  if (!sendHeaderDue_[progress.peer]) return;
  sendHeaderDue_[progress.peer] = 0;
  header = encodeHeader(fingerprint_, progress.left);
  progress.header = &header;
}

void TcpTransport::prepareRecv(Progress& progress, WireHeader& header) {
  if (!recvHeaderDue_[progress.peer]) return;
  recvHeaderDue_[progress.peer] = 0;
  progress.header = &header;
  progress.payloadBytes = progress.left;
}

// Moves `moved` bytes through the header first, then the payload. A received header is checked
// the moment it is complete, before the payload read with it is reduced or returned.
void TcpTransport::advance(Progress& progress, size_t moved, bool receiving) {
  if (progress.header != nullptr && progress.headerDone < sizeof(WireHeader)) {
    const size_t head = std::min(moved, sizeof(WireHeader) - progress.headerDone);
    progress.headerDone += head;
    moved -= head;
    if (receiving && progress.headerDone == sizeof(WireHeader) &&
        !agrees(*progress.header, fingerprint_, progress.payloadBytes)) {
      throw TransportError(TransportError::Kind::kMismatch, progress.peer,
                           headerMismatch(*progress.header, fingerprint_, progress.payloadBytes,
                                          describePeer(progress.peer)));
    }
  }
  progress.cursor += moved;
  progress.left -= moved;
}

// A header goes out with its payload in one send when the payload is small (one copy of at
// most kCoalesceBytes into a stack buffer); before a larger payload it is sent with MSG_MORE, so
// the kernel holds it for the payload's first segment. Either way the peer gets one segment where
// it got one before: a sendmsg of two iovecs measured ~8% slower on 8-byte all_reduce.
bool TcpTransport::trySend(Progress& progress) {
  while (true) {
    const size_t headerLeft = progress.header ? sizeof(WireHeader) - progress.headerDone : 0;
    if (headerLeft + progress.left == 0) return true;
    const char* headerCursor = reinterpret_cast<const char*>(progress.header) + progress.headerDone;
    ssize_t n;
    if (headerLeft == 0) {
      n = ::send(fdOf(progress.peer), progress.cursor, std::min(progress.left, sendChunk_), MSG_NOSIGNAL);
    } else if (progress.left <= kCoalesceBytes) {
      char joined[sizeof(WireHeader) + kCoalesceBytes];
      std::memcpy(joined, headerCursor, headerLeft);
      if (progress.left > 0) std::memcpy(joined + headerLeft, progress.cursor, progress.left);
      n = ::send(fdOf(progress.peer), joined, headerLeft + progress.left, MSG_NOSIGNAL);
    } else {
      n = ::send(fdOf(progress.peer), headerCursor, headerLeft, MSG_NOSIGNAL | MSG_MORE);
    }
    if (n > 0) {
      advance(progress, static_cast<size_t>(n), /*receiving=*/false);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, progress.peer, "the group was aborted");
    throwIoError(progress.peer, "send", errno);
  }
}

bool TcpTransport::tryRecv(Progress& progress) {
  while (true) {
    const size_t headerLeft = progress.header ? sizeof(WireHeader) - progress.headerDone : 0;
    if (headerLeft + progress.left == 0) return true;
    ssize_t n;
    if (headerLeft == 0) {
      n = ::recv(fdOf(progress.peer), progress.cursor, progress.left, 0);
    } else {
      iovec parts[2];
      const int count = pendingIovecs(reinterpret_cast<char*>(progress.header) + progress.headerDone, headerLeft,
                                      progress.cursor, progress.left, parts);
      n = ::readv(fdOf(progress.peer), parts, count);
    }
    if (n > 0) {
      advance(progress, static_cast<size_t>(n), /*receiving=*/true);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, progress.peer, "the group was aborted");
    throwIoError(progress.peer, "recv", n == 0 ? 0 : errno);
  }
}

// Progresses one send and/or one receive until both are done. Either may be null.
void TcpTransport::transfer(Progress* sending, Progress* receiving, Deadline deadline) {
  // A small transfer retries its sockets for up to spin_ (DDPLITE_TCP_SPIN_US; on a blocked
  // caller's thread DDPLITE_CALLER_SPIN_US where set: wait_policy.hpp) before its first poll():
  // a peer's small message usually lands within microseconds, and a sleep in poll() costs
  // a wake-up (tens of microseconds) on top. sched_yield between tries lets a rank that shares
  // this core run. Measured by scripts/crosshost_bench.py (docs/benchmarks.md, "Across hosts").
  std::optional<Deadline> spinUntil;
  while (true) {
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, -1, "the group was aborted");
    bool sent = sending == nullptr || trySend(*sending);
    bool received = receiving == nullptr || tryRecv(*receiving);
    if (sent && received) return;
    if (!spinUntil) {
      const size_t left = (sent ? 0 : sending->left) + (received ? 0 : receiving->left);
      const auto spin = spinFor(spin_, callerSpin_);
      spinUntil = spin.count() > 0 && left <= env::kTcpSpinMaxBytes ? std::min(deadline, Clock::now() + spin)
                                                                    : Deadline::min();
    }
    if (Clock::now() < *spinUntil) {
      sched_yield();
      continue;
    }

    // The transfer's own sockets, then the peers whose first message of this collective is due
    // but not yet looked at (watchedPeers): a stray header from one of them is reported now,
    // not after a timeout, even though this rank is waiting for another peer.
    pollfd fixed[2];
    std::vector<pollfd> many;
    const std::vector<int> watched = watchedPeers(received ? -1 : receiving->peer);
    pollfd* entries = fixed;
    if (!watched.empty()) {
      many.resize(2 + watched.size());
      entries = many.data();
    }
    nfds_t count = 0;
    if (!sent) entries[count++] = {fdOf(sending->peer), POLLOUT, 0};
    if (!received) {
      if (count == 1 && entries[0].fd == fdOf(receiving->peer)) {
        entries[0].events |= POLLIN;
      } else {
        entries[count++] = {fdOf(receiving->peer), POLLIN, 0};
      }
    }
    const nfds_t own = count;
    for (int peer : watched) entries[count++] = {fdOf(peer), POLLIN, 0};
    int ready = poll(entries, count, millisUntil(deadline));
    if (Clock::now() >= deadline) {  // even when a watched socket keeps poll returning at once
      throwTimeout(sent ? nullptr : sending, received ? nullptr : receiving);
    }
    if (ready < 0 && errno != EINTR) {
      throw TransportError(TransportError::Kind::kIo, -1, strCat("poll failed: ", std::strerror(errno)));
    }
    for (nfds_t i = own; ready > 0 && i < count; ++i) {
      if (entries[i].revents != 0) peekHeader(watched[i - own]);
    }
  }
}

std::vector<int> TcpTransport::watchedPeers(int receivingFrom) const {
  std::vector<int> peers;
  if (!armed_) return peers;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && peer != receivingFrom && recvHeaderDue_[peer] && !headerPeeked_[peer] && fdOf(peer) >= 0) {
      peers.push_back(peer);  // an on-demand peer not connected yet has sent nothing
    }
  }
  return peers;
}

void TcpTransport::peekHeader(int peer) {
  WireHeader header;
  const ssize_t n = ::recv(fdOf(peer), &header, sizeof(header), MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  // Looked at: a whole header, or a short or closed stream (left to the recv that needs it, so
  // that a peer that stalls mid-header cannot keep poll() returning at once).
  headerPeeked_[peer] = 1;
  if (n <= 0 || static_cast<size_t>(n) < sizeof(header)) return;
  if (agrees(header, fingerprint_, header.messageBytes)) return;
  const std::string mismatch = earlyHeaderMismatch(header, fingerprint_, describePeer(peer));
  if (!mismatch.empty()) throw TransportError(TransportError::Kind::kMismatch, peer, mismatch);
}

void TcpTransport::send(int peer, const void* data, size_t bytes, Deadline deadline) {
  checkPeer(peer);
  ensureConnected(peer, deadline);
  Progress sending{peer, static_cast<char*>(const_cast<void*>(data)), bytes};
  WireHeader header;
  prepareSend(sending, header);
  transfer(&sending, nullptr, deadline);
}

void TcpTransport::recv(int peer, void* data, size_t bytes, Deadline deadline) {
  checkPeer(peer);
  ensureConnected(peer, deadline);
  Progress receiving{peer, static_cast<char*>(data), bytes};
  WireHeader header;
  prepareRecv(receiving, header);
  transfer(nullptr, &receiving, deadline);
}

void TcpTransport::sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                            size_t recvBytes, Deadline deadline) {
  checkPeer(sendPeer);
  checkPeer(recvPeer);
  ensureConnected(sendPeer, deadline);
  ensureConnected(recvPeer, deadline);
  Progress sending{sendPeer, static_cast<char*>(const_cast<void*>(sendData)), sendBytes};
  Progress receiving{recvPeer, static_cast<char*>(recvData), recvBytes};
  WireHeader outgoing;
  WireHeader incoming;
  prepareSend(sending, outgoing);
  prepareRecv(receiving, incoming);
  transfer(&sending, &receiving, deadline);
}

}  // namespace ddplite
