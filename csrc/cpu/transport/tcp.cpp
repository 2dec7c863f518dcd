#include "cpu/transport/tcp.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/logging.hpp"
#include "cpu/transport/net_iface.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace ddplite {

namespace {

constexpr int kPollSliceMs = 100;
constexpr size_t kCoalesceBytes = 4096;
constexpr uint32_t kHelloMagic = 0xdd911e01;

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t size;
};

int millisUntil(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, kPollSliceMs));
}

// A failed socket call during set-up or tuning: a DistBackendError naming the rank, the call,
// what it was for and the errno text (set-up never leaves a foreign exception or a half-made socket).
[[noreturn]] void throwSocketError(int rank, const char* call, const std::string& about, int error) {
  throwDistError(strCat("rank ", rank, ": ", call, " failed ", about, ": ", std::strerror(error)),
                 "the machine may be out of file descriptors or ports (ulimit -n), or the interface "
                 "DDPLITE_SOCKET_IFNAME selects may be down");
}

void checkCall(int result, int rank, const char* call, const std::string& about) {
  if (result < 0) throwSocketError(rank, call, about, errno);
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

// "a.b.c.d:port" as published in the store; a malformed one (a foreign key, a corrupted store)
// is a DistBackendError, not std::stoi's exception.
sockaddr_in parseAddress(const std::string& hostPort, int rank) {
  const size_t colon = hostPort.rfind(':');
  const std::string portText = colon == std::string::npos ? "" : hostPort.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  const long port = portText.empty() ? -1 : std::strtol(portText.c_str(), &end, 10);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  if (port < 0 || port > 65535 || errno != 0 || *end != '\0' ||
      inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &address.sin_addr) != 1) {
    throwDistError(strCat("rank ", rank, ": '", hostPort, "' is not an IPv4 address:port"),
                   "the store holds a bad address for a rank; check that no other job shares this store's keys");
  }
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// Owns a descriptor during set-up, so that every exit path, exceptions included, closes it.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

// Blocking I/O used only during set-up (sockets are still blocking then).
bool writeAll(int fd, const void* data, size_t bytes) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, cursor, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    cursor += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool readAll(int fd, void* data, size_t bytes) {
  char* cursor = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd, cursor, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    cursor += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Waits for a non-blocking connect; returns 0 or the socket error.
int finishConnect(int fd, Deadline deadline) {
  while (true) {
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

std::string unreachableHint() {
  return "the address above must be reachable from this host; if the rank listens on the wrong "
         "interface, set DDPLITE_SOCKET_IFNAME (NCCL syntax, e.g. DDPLITE_SOCKET_IFNAME=eth0 or "
         "^docker,lo) on every rank";
}

}  // namespace

TcpTransport::TcpTransport(int rank, int size, bool checkFingerprints)
    : rank_(rank),
      size_(size),
      fds_(size, -1),
      addresses_(size),
      checkFingerprints_(checkFingerprints),
      sendHeaderDue_(size, 0),
      recvHeaderDue_(size, 0),
      headerPeeked_(size, 0) {}

TcpTransport::~TcpTransport() {
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

// What every step of building the mesh needs to know and to say in its errors.
struct TcpTransport::MeshSetup {
  StoreRendezvous& rendezvous;
  int rank;
  int size;
  Deadline deadline;
  std::string purpose;    // store-key prefix of this mesh ("" or "p2p/")
  std::string host;       // the address this rank listens on, and why it was chosen
  std::string why;
  std::string myAddress;  // host:port, once listening

  std::string addressKey(int peer) const { return strCat(purpose, "addr/", peer); }
  std::string peerAddress(int peer) const {
    return rendezvous.get(addressKey(peer), strCat("the address of rank ", peer));
  }
};

std::unique_ptr<TcpTransport> TcpTransport::connectFullMesh(StoreRendezvous& rendezvous, int rank, int size,
                                                            Deadline deadline, const std::string& purpose,
                                                            bool checkFingerprints) {
  std::unique_ptr<TcpTransport> transport(new TcpTransport(rank, size, checkFingerprints));
  if (size == 1) {
    return transport;
  }
  MeshSetup setup{rendezvous, rank, size, deadline, purpose, "", "", ""};
  setup.host = net::chooseListenAddress(&setup.why);
  UniqueFd listener(openListener(setup));
  transport->addresses_[rank] = setup.myAddress;
  for (int peer = 0; peer < rank; ++peer) {
    transport->addresses_[peer] = setup.peerAddress(peer);
    transport->fds_[peer] = connectToLowerRank(setup, peer, transport->addresses_[peer]);
  }
  acceptHigherRanks(setup, listener.get(), *transport);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    tuneDataSocket(transport->fds_[peer], rank, strCat("on the socket to rank ", peer));
    if (transport->addresses_[peer].empty()) transport->addresses_[peer] = setup.peerAddress(peer);
  }
  return transport;
}

// Listens on an ephemeral port of setup.host and publishes host:port in the store.
int TcpTransport::openListener(MeshSetup& setup) {
  const std::string about = strCat("to listen on ", setup.host);
  UniqueFd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  checkCall(listener.get(), setup.rank, "socket", about);
  sockaddr_in bindAddress = parseAddress(setup.host + ":0", setup.rank);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&bindAddress), sizeof(bindAddress)) != 0 ||
      listen(listener.get(), setup.size) != 0) {
    throwDistError(strCat("rank ", setup.rank, " cannot listen on ", setup.host, ": ", std::strerror(errno)),
                   "choose another interface with DDPLITE_SOCKET_IFNAME");
  }
  sockaddr_in bound = {};
  socklen_t length = sizeof(bound);
  checkCall(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&bound), &length), setup.rank, "getsockname",
            about);
  setup.myAddress = strCat(setup.host, ":", ntohs(bound.sin_port));
  DDPLITE_LOG(kInfo, "rank ", setup.rank, "/", setup.size, " listens on ", setup.myAddress, " (", setup.why, ")");
  setup.rendezvous.set(setup.addressKey(setup.rank), setup.myAddress);
  return listener.release();
}

// One connection attempt: a connected, blocking socket that has sent its Hello, or -1 with
// *error set (connect refused, timed out, or the Hello could not be written).
int TcpTransport::tryConnect(const MeshSetup& setup, const sockaddr_in& target, int* error) {
  const std::string about = "to connect to a lower rank";
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  checkCall(fd.get(), setup.rank, "socket", about);
  setBlocking(fd.get(), false, setup.rank, about);
  const int result = connect(fd.get(), reinterpret_cast<const sockaddr*>(&target), sizeof(target));
  *error = (result == 0) ? 0 : (errno == EINPROGRESS ? finishConnect(fd.get(), setup.deadline) : errno);
  if (*error != 0) return -1;
  setBlocking(fd.get(), true, setup.rank, about);
  const Hello hello = {kHelloMagic, setup.rank, setup.size};
  if (!writeAll(fd.get(), &hello, sizeof(hello))) {
    *error = errno != 0 ? errno : EPIPE;
    return -1;
  }
  return fd.release();
}

// Connects to `peer` (a lower rank), retrying refusals until the deadline (a peer's backlog may
// be full for a moment). Past the deadline: records the failure in the store, so the ranks
// waiting for this one quote it, and throws.
int TcpTransport::connectToLowerRank(const MeshSetup& setup, int peer, const std::string& peerAddress) {
  const sockaddr_in target = parseAddress(peerAddress, setup.rank);
  while (true) {
    int error = 0;
    const int fd = tryConnect(setup, target, &error);
    if (fd >= 0) return fd;
    if (Clock::now() >= setup.deadline) {
      const std::string failure = strCat("rank ", setup.rank, " could not connect to rank ", peer, " at ", peerAddress,
                                         ": ", std::strerror(error), " (rank ", setup.rank, " listens on ",
                                         setup.myAddress, ", ", setup.why, ")");
      setup.rendezvous.recordFailure(failure);
      throwDistError(failure, unreachableHint());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Accepts one connection from every higher rank; a connection whose Hello is not a higher rank
// of this group that has not connected yet is dropped with a warning.
void TcpTransport::acceptHigherRanks(const MeshSetup& setup, int listener, TcpTransport& transport) {
  for (int accepted = 0; accepted < setup.size - 1 - setup.rank;) {
    pollfd entry = {listener, POLLIN, 0};
    const int ready = poll(&entry, 1, millisUntil(setup.deadline));
    if (ready < 0 && errno != EINTR) throwSocketError(setup.rank, "poll", "waiting for higher ranks to connect", errno);
    if (ready <= 0) {
      if (Clock::now() < setup.deadline) continue;
      std::string missing;
      for (int peer = setup.rank + 1; peer < setup.size; ++peer) {
        if (transport.fds_[peer] < 0) missing += strCat(missing.empty() ? "" : ", ", peer);
      }
      throwDistError(strCat("rank ", setup.rank, " (listening on ", setup.myAddress, ", ", setup.why,
                            ") timed out waiting for rank(s) ", missing, " to connect", peerReport(setup.rendezvous)),
                     "those ranks may not reach this address; " + unreachableHint());
    }
    UniqueFd fd(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.get() < 0) continue;  // the connecting rank gave up or retries: poll again
    Hello hello = {};
    if (!readAll(fd.get(), &hello, sizeof(hello)) || hello.magic != kHelloMagic || hello.size != setup.size ||
        hello.rank <= setup.rank || hello.rank >= setup.size || transport.fds_[hello.rank] >= 0) {
      DDPLITE_LOG(kWarn, "rank ", setup.rank, " dropped an unexpected connection on ", setup.myAddress);
      continue;
    }
    transport.fds_[hello.rank] = fd.release();
    ++accepted;
  }
}

std::string TcpTransport::describePeer(int peer) const {
  if (peer < 0 || peer >= size_) return strCat("rank ", peer);
  return strCat("rank ", peer, " (", addresses_[peer], ")");
}

void TcpTransport::checkPeer(int peer) const {
  DDPLITE_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "bad peer ", peer, " for rank ", rank_);
}

bool TcpTransport::peerHungUp(int peer) {
  checkPeer(peer);
  pollfd entry = {fds_[peer], POLLRDHUP, 0};
  return poll(&entry, 1, 0) > 0 && (entry.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

bool TcpTransport::peekWaitingHeader(int peer, WireHeader* header) {
  checkPeer(peer);
  const ssize_t n = ::recv(fds_[peer], header, sizeof(*header), MSG_PEEK | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(sizeof(*header));
}

void TcpTransport::abort() {
  if (aborted_.exchange(true)) return;
  // shutdown() wakes a poll blocked in the worker thread; the fds are closed in the destructor,
  // so no descriptor is reused while another thread may still hold it.
  for (int fd : fds_) {
    if (fd >= 0) shutdown(fd, SHUT_RDWR);
  }
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
                       strCat("timed out ", stuck == receiving ? "waiting to receive from " : "waiting to send to ",
                              describePeer(stuck->peer), " (", remaining(stuck), " bytes still to go)"));
}

void TcpTransport::beginCollective(const Fingerprint& fingerprint) {
  if (!checkFingerprints_) return;
  // The byte-level collectives of one op (a coalesced op has several) share its sequence
  // number and are told apart by their part, numbered here in the order they run.
  const bool nextPart = armed_ && fingerprint.seq == fingerprint_.seq;
  const uint8_t part = nextPart ? static_cast<uint8_t>(fingerprint_.part + 1) : 0;
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
      n = ::send(fds_[progress.peer], progress.cursor, progress.left, MSG_NOSIGNAL);
    } else if (progress.left <= kCoalesceBytes) {
      char joined[sizeof(WireHeader) + kCoalesceBytes];
      std::memcpy(joined, headerCursor, headerLeft);
      if (progress.left > 0) std::memcpy(joined + headerLeft, progress.cursor, progress.left);
      n = ::send(fds_[progress.peer], joined, headerLeft + progress.left, MSG_NOSIGNAL);
    } else {
      n = ::send(fds_[progress.peer], headerCursor, headerLeft, MSG_NOSIGNAL | MSG_MORE);
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
      n = ::recv(fds_[progress.peer], progress.cursor, progress.left, 0);
    } else {
      iovec parts[2];
      const int count = pendingIovecs(reinterpret_cast<char*>(progress.header) + progress.headerDone, headerLeft,
                                      progress.cursor, progress.left, parts);
      n = ::readv(fds_[progress.peer], parts, count);
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
  while (true) {
    if (aborted_) throw TransportError(TransportError::Kind::kAborted, -1, "the group was aborted");
    bool sent = sending == nullptr || trySend(*sending);
    bool received = receiving == nullptr || tryRecv(*receiving);
    if (sent && received) return;

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
    if (!sent) entries[count++] = {fds_[sending->peer], POLLOUT, 0};
    if (!received) {
      if (count == 1 && entries[0].fd == fds_[receiving->peer]) {
        entries[0].events |= POLLIN;
      } else {
        entries[count++] = {fds_[receiving->peer], POLLIN, 0};
      }
    }
    const nfds_t own = count;
    for (int peer : watched) entries[count++] = {fds_[peer], POLLIN, 0};
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
    if (peer != rank_ && peer != receivingFrom && recvHeaderDue_[peer] && !headerPeeked_[peer]) peers.push_back(peer);
  }
  return peers;
}

void TcpTransport::peekHeader(int peer) {
  WireHeader header;
  const ssize_t n = ::recv(fds_[peer], &header, sizeof(header), MSG_PEEK | MSG_DONTWAIT);
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
  Progress sending{peer, static_cast<char*>(const_cast<void*>(data)), bytes};
  WireHeader header;
  prepareSend(sending, header);
  transfer(&sending, nullptr, deadline);
}

void TcpTransport::recv(int peer, void* data, size_t bytes, Deadline deadline) {
  checkPeer(peer);
  Progress receiving{peer, static_cast<char*>(data), bytes};
  WireHeader header;
  prepareRecv(receiving, header);
  transfer(nullptr, &receiving, deadline);
}

void TcpTransport::sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                            size_t recvBytes, Deadline deadline) {
  checkPeer(sendPeer);
  checkPeer(recvPeer);
  Progress sending{sendPeer, static_cast<char*>(const_cast<void*>(sendData)), sendBytes};
  Progress receiving{recvPeer, static_cast<char*>(recvData), recvBytes};
  WireHeader outgoing;
  WireHeader incoming;
  prepareSend(sending, outgoing);
  prepareRecv(receiving, incoming);
  transfer(&sending, &receiving, deadline);
}

}  // namespace ddplite
