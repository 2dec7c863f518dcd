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

void setNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void tuneDataSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (int64_t bytes = env::socketBufferBytes(); bytes > 0) {
    int value = static_cast<int>(bytes);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof(value));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &value, sizeof(value));
  }
  setNonBlocking(fd);
}

sockaddr_in parseAddress(const std::string& hostPort) {
  auto colon = hostPort.rfind(':');
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::stoi(hostPort.substr(colon + 1))));
  inet_pton(AF_INET, hostPort.substr(0, colon).c_str(), &address.sin_addr);
  return address;
}

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
    int ready = poll(&entry, 1, millisUntil(deadline));
    if (ready > 0) {
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      return error;
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

std::unique_ptr<TcpTransport> TcpTransport::connectFullMesh(StoreRendezvous& rendezvous, int rank, int size,
                                                            Deadline deadline, const std::string& purpose,
                                                            bool checkFingerprints) {
  std::unique_ptr<TcpTransport> transport(new TcpTransport(rank, size, checkFingerprints));
  if (size == 1) {
    return transport;
  }
  std::string why;
  const std::string host = net::chooseListenAddress(&why);

  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in bindAddress = parseAddress(host + ":0");
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&bindAddress), sizeof(bindAddress)) != 0 ||
      listen(listener, size) != 0) {
    int error = errno;
    if (listener >= 0) close(listener);
    throwDistError(strCat("rank ", rank, " cannot listen on ", host, ": ", std::strerror(error)),
                   "choose another interface with DDPLITE_SOCKET_IFNAME");
  }
  sockaddr_in bound = {};
  socklen_t length = sizeof(bound);
  getsockname(listener, reinterpret_cast<sockaddr*>(&bound), &length);
  const std::string myAddress = strCat(host, ":", ntohs(bound.sin_port));
  DDPLITE_LOG(kInfo, "rank ", rank, "/", size, " listens on ", myAddress, " (", why, ")");
  rendezvous.set(strCat(purpose, "addr/", rank), myAddress);
  transport->addresses_[rank] = myAddress;

  // Connect to every lower rank; retry refusals until the deadline (a peer may be slow to
  // accept only if its backlog is full, which the retry covers).
  for (int peer = 0; peer < rank; ++peer) {
    const std::string peerAddress = rendezvous.get(strCat(purpose, "addr/", peer), strCat("the address of rank ", peer));
    transport->addresses_[peer] = peerAddress;
    sockaddr_in target = parseAddress(peerAddress);
    int lastError = 0;
    while (true) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      setNonBlocking(fd);
      int result = connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target));
      lastError = (result == 0) ? 0 : (errno == EINPROGRESS ? finishConnect(fd, deadline) : errno);
      if (lastError == 0) {
        int flags = fcntl(fd, F_GETFL, 0);
        fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
        Hello hello = {kHelloMagic, rank, size};
        if (writeAll(fd, &hello, sizeof(hello))) {
          transport->fds_[peer] = fd;
          break;
        }
        lastError = errno;
      }
      close(fd);
      if (Clock::now() >= deadline) {
        close(listener);
        const std::string failure = strCat("rank ", rank, " could not connect to rank ", peer, " at ", peerAddress,
                                           ": ", std::strerror(lastError), " (rank ", rank, " listens on ",
                                           myAddress, ", ", why, ")");
        rendezvous.recordFailure(failure);  // the ranks waiting for this one to connect quote it
        throwDistError(failure, unreachableHint());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Accept every higher rank.
  for (int accepted = 0; accepted < size - 1 - rank;) {
    pollfd entry = {listener, POLLIN, 0};
    if (poll(&entry, 1, millisUntil(deadline)) <= 0) {
      if (Clock::now() < deadline) continue;
      std::string missing;
      for (int peer = rank + 1; peer < size; ++peer) {
        if (transport->fds_[peer] < 0) missing += strCat(missing.empty() ? "" : ", ", peer);
      }
      close(listener);
      throwDistError(strCat("rank ", rank, " (listening on ", myAddress, ", ", why, ") timed out waiting for rank(s) ",
                            missing, " to connect", peerReport(rendezvous)),
                     "those ranks may not reach this address; " + unreachableHint());
    }
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Hello hello = {};
    if (!readAll(fd, &hello, sizeof(hello)) || hello.magic != kHelloMagic || hello.size != size ||
        hello.rank <= rank || hello.rank >= size || transport->fds_[hello.rank] >= 0) {
      DDPLITE_LOG(kWarn, "rank ", rank, " dropped an unexpected connection on ", myAddress);
      close(fd);
      continue;
    }
    transport->fds_[hello.rank] = fd;
    ++accepted;
  }
  close(listener);

  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    tuneDataSocket(transport->fds_[peer]);
    if (transport->addresses_[peer].empty()) {
      transport->addresses_[peer] = rendezvous.get(strCat(purpose, "addr/", peer), strCat("the address of rank ", peer));
    }
  }
  return transport;
}

std::string TcpTransport::describePeer(int peer) const {
  if (peer < 0 || peer >= size_) return strCat("rank ", peer);
  return strCat("rank ", peer, " (", addresses_[peer], ")");
}

void TcpTransport::checkPeer(int peer) const {
  DDPLITE_ENFORCE(peer >= 0 && peer < size_ && peer != rank_, "bad peer ", peer, " for rank ", rank_);
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
