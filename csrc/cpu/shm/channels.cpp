#include "cpu/shm/channels.hpp"

#include "common/errors.hpp"
#include "cpu/shm/futex_wait.hpp"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace ddplite::cpu {

namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kRingBudget = size_t{16} << 20;  // all rings of a group together, before the bounds below
constexpr size_t kMinRingBytes = size_t{16} << 10;
constexpr size_t kMaxRingBytes = size_t{256} << 10;
constexpr auto kSpin = std::chrono::microseconds(50);
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);

size_t ringBytesFor(int size) {
  const size_t rings = static_cast<size_t>(size) * static_cast<size_t>(size);
  const size_t share = kRingBudget / rings / 4096 * 4096;
  return std::min(kMaxRingBytes, std::max(kMinRingBytes, share));
}

// This process's PID namespace (device and inode of /proc/self/ns/pid): a pid means the same
// process to a peer only in the same namespace. 0 when it cannot be read.
uint64_t pidNamespace() {
  struct stat about = {};
  if (stat("/proc/self/ns/pid", &about) != 0) return 0;
  return (static_cast<uint64_t>(about.st_dev) << 32) ^ static_cast<uint64_t>(about.st_ino);
}

int openPidfd(uint32_t pid) {
#ifdef SYS_pidfd_open
  const long fd = syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0);
  return fd >= 0 ? static_cast<int>(fd) : -1;
#else
  return -1;
#endif
}

}  // namespace

struct alignas(kAlignment) ShmChannels::RankState {
  std::atomic<uint32_t> closed;  // 1 once the rank's abort() ran (seq_cst store, then wake-ups)
  uint32_t pid;                  // written once at set-up, before the store exchange
  uint64_t pidNamespace;         // likewise; see pidNamespace()
};

// One direction between two ranks. The producer writes `head`, `headWord` and the data; the
// consumer writes `tail` and `tailWord`; each sleeper count is incremented by the side that
// sleeps and read by the side that wakes.
struct alignas(kAlignment) ShmChannels::Ring {
  std::atomic<uint64_t> head;               // bytes ever written
  std::atomic<uint32_t> headWord;           // bumped after every head store: the consumer's futex word
  std::atomic<uint32_t> consumerSleepers;
  alignas(kAlignment) std::atomic<uint64_t> tail;  // bytes ever read
  std::atomic<uint32_t> tailWord;           // bumped after every tail store: the producer's futex word
  std::atomic<uint32_t> producerSleepers;
};

std::unique_ptr<ShmChannels> ShmChannels::create(StoreRendezvous& rendezvous, Transport& liveness, int rank, int size,
                                                 std::string* whyNot, std::vector<int> processGroupRanks) {
  const size_t ringBytes = ringBytesFor(size);
  const size_t pairs = static_cast<size_t>(size) * static_cast<size_t>(size);
  const size_t bytes = roundUp(sizeof(RankState) * size, kAlignment) + pairs * sizeof(Ring) + pairs * ringBytes;
  ShmSegment::Outcome outcome = ShmSegment::create(rendezvous, rank, size, bytes);
  if (!outcome.segment) {
    *whyNot = outcome.whyNot;
    return nullptr;
  }
  std::unique_ptr<ShmChannels> channels(new ShmChannels(std::move(outcome.segment), liveness, rank, size, ringBytes));
  channels->processGroupRanks_ = std::move(processGroupRanks);
  channels->state(rank).pid = static_cast<uint32_t>(getpid());
  channels->state(rank).pidNamespace = pidNamespace();
  // Every rank's pid is visible to the others after this store round trip.
  rendezvous.set(strCat("channels/ready/", rank), "1");
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    rendezvous.get(strCat("channels/ready/", peer), strCat("rank ", peer, " to map its point-to-point channels"));
    // A peer in another PID namespace (a container sharing /dev/shm and the network, not pids):
    // its pid names another process here, so only the TCP mesh tells whether it lives.
    const RankState& theirs = channels->state(peer);
    if (theirs.pidNamespace != 0 && theirs.pidNamespace == channels->state(rank).pidNamespace) {
      channels->pidfds_[peer] = openPidfd(theirs.pid);
    }
  }
  return channels;
}

ShmChannels::ShmChannels(std::unique_ptr<ShmSegment> segment, Transport& liveness, int rank, int size,
                         size_t ringBytes)
    : segment_(std::move(segment)),
      liveness_(liveness),
      rank_(rank),
      size_(size),
      ringBytes_(ringBytes),
      // the P2pEngine runs a sender and a receiver thread per peer in every rank: spin only when
      // all of them (2 P (P-1)) have a CPU each, else a spinner takes the core a copier needs
      // (measured: 2 ranks on 2 CPUs, spinning made 16 MB messages 2x slower)
      spin_(2 * size * (size - 1) <= usableCpus() ? kSpin : std::chrono::microseconds(0)),
      pidfds_(static_cast<size_t>(size), -1),
      nextSendCheck_(static_cast<size_t>(size)) {}

ShmChannels::~ShmChannels() {
  abort();
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

ShmChannels::RankState& ShmChannels::state(int owner) const {
  return reinterpret_cast<RankState*>(segment_->base())[owner];
}

ShmChannels::Ring& ShmChannels::ring(int from, int to) const {
  char* rings = segment_->base() + roundUp(sizeof(RankState) * size_, kAlignment);
  return reinterpret_cast<Ring*>(rings)[static_cast<size_t>(from) * size_ + to];
}

char* ShmChannels::ringData(int from, int to) const {
  const size_t pairs = static_cast<size_t>(size_) * static_cast<size_t>(size_);
  char* data = segment_->base() + roundUp(sizeof(RankState) * size_, kAlignment) + pairs * sizeof(Ring);
  return data + (static_cast<size_t>(from) * size_ + to) * ringBytes_;
}

size_t ShmChannels::pushSome(int peer, const char* data, size_t bytes) {
  Ring& r = ring(rank_, peer);
  const uint64_t head = r.head.load(std::memory_order_relaxed);  // this thread's own count
  const uint64_t tail = r.tail.load(std::memory_order_acquire);  // the consumer is done with bytes before it
  const size_t n = std::min<size_t>(bytes, ringBytes_ - static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  char* base = ringData(rank_, peer);
  const size_t at = static_cast<size_t>(head % ringBytes_);
  const size_t first = std::min(n, ringBytes_ - at);
  std::memcpy(base + at, data, first);
  std::memcpy(base, data + first, n - first);
  r.head.store(head + n, std::memory_order_seq_cst);
  r.headWord.fetch_add(1, std::memory_order_seq_cst);
  if (r.consumerSleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&r.headWord);
  return n;
}

size_t ShmChannels::pullSome(int peer, char* data, size_t bytes) {
  Ring& r = ring(peer, rank_);
  const uint64_t tail = r.tail.load(std::memory_order_relaxed);  // this thread's own count
  const uint64_t head = r.head.load(std::memory_order_acquire);  // the bytes before it are written
  const size_t n = std::min<size_t>(bytes, static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  const char* base = ringData(peer, rank_);
  const size_t at = static_cast<size_t>(tail % ringBytes_);
  const size_t first = std::min(n, ringBytes_ - at);
  std::memcpy(data, base + at, first);
  std::memcpy(data + first, base, n - first);
  r.tail.store(tail + n, std::memory_order_seq_cst);
  r.tailWord.fetch_add(1, std::memory_order_seq_cst);
  if (r.producerSleepers.load(std::memory_order_seq_cst) > 0) futexWakeAll(&r.tailWord);
  return n;
}

void ShmChannels::waitFor(int peer, Side side, Deadline deadline) {
  const bool producing = side == Side::kProducer;
  Ring& r = producing ? ring(rank_, peer) : ring(peer, rank_);
  // seq_cst loads: the re-check after announcing a sleeper must be ordered with the peer's
  // store-then-check (see the header).
  const auto ready = [&] {
    const uint64_t used = r.head.load(std::memory_order_seq_cst) - r.tail.load(std::memory_order_seq_cst);
    return producing ? used < ringBytes_ : used > 0;
  };
  const auto spinUntil = Clock::now() + spin_;
  while (Clock::now() < spinUntil) {
    if (ready()) return;
    cpuRelax();
  }
  std::atomic<uint32_t>& word = producing ? r.tailWord : r.headWord;
  std::atomic<uint32_t>& sleepers = producing ? r.producerSleepers : r.consumerSleepers;
  auto nextLivenessCheck = Clock::now();
  const char* doing = producing ? "make room for a message" : "send a message";
  while (true) {
    if (aborted_.load(std::memory_order_acquire)) {
      throw TransportError(TransportError::Kind::kAborted, peer, "abort() was called on this rank");
    }
    if (ready()) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw TransportError(TransportError::Kind::kTimeout, peer,
                           strCat("Timed out waiting for ", describePeer(peer), " to ", doing,
                                  " through shared memory"));
    }
    bool gone = state(peer).closed.load(std::memory_order_seq_cst) != 0;
    if (!gone && now >= nextLivenessCheck) {
      gone = peerGone(peer);
      nextLivenessCheck = now + kLivenessInterval;
    }
    if (gone) {
      if (ready()) return;  // a receiver drains what the peer sent before it left
      throwPeerGone(peer, doing);
    }
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = word.load(std::memory_order_seq_cst);
    if (!ready()) futexWait(&word, seen, std::min<std::chrono::nanoseconds>(kSleepSlice, deadline - now));
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmChannels::send(int peer, const void* data, size_t bytes, Deadline deadline) {
  const char* from = static_cast<const char*>(data);
  // Checked before every message, not only when the ring is full: a message that fits would
  // otherwise be "sent" to a peer that is already dead. The `closed` flag every time; the
  // process (a poll system call) at most every kLivenessInterval per peer.
  if (state(peer).closed.load(std::memory_order_seq_cst) != 0) throwPeerGone(peer, "receive");
  Clock::time_point& nextCheck = nextSendCheck_[static_cast<size_t>(peer)];
  if (const auto now = Clock::now(); now >= nextCheck) {
    nextCheck = now + kLivenessInterval;
    if (peerGone(peer)) throwPeerGone(peer, "receive");
  }
  while (bytes > 0) {
    const size_t n = pushSome(peer, from, bytes);
    from += n;
    bytes -= n;
    if (bytes > 0) waitFor(peer, Side::kProducer, deadline);
  }
}

void ShmChannels::recv(int peer, void* data, size_t bytes, Deadline deadline) {
  char* into = static_cast<char*>(data);
  while (bytes > 0) {
    const size_t n = pullSome(peer, into, bytes);
    into += n;
    bytes -= n;
    if (bytes > 0) waitFor(peer, Side::kConsumer, deadline);
  }
}

// Progresses both directions in turn (a ring in each direction: neither side can block the
// other). Not on the P2pEngine's path (it sends and receives on threads of their own).
void ShmChannels::sendRecv(int sendPeer, const void* sendData, size_t sendBytes, int recvPeer, void* recvData,
                           size_t recvBytes, Deadline deadline) {
  const char* from = static_cast<const char*>(sendData);
  char* into = static_cast<char*>(recvData);
  while (sendBytes > 0 || recvBytes > 0) {
    const size_t sent = sendBytes > 0 ? pushSome(sendPeer, from, sendBytes) : 0;
    const size_t got = recvBytes > 0 ? pullSome(recvPeer, into, recvBytes) : 0;
    from += sent;
    sendBytes -= sent;
    into += got;
    recvBytes -= got;
    if (sent > 0 || got > 0) continue;
    if (aborted_.load(std::memory_order_acquire)) {
      throw TransportError(TransportError::Kind::kAborted, -1, "abort() was called on this rank");
    }
    if (Clock::now() >= deadline) {
      throw TransportError(TransportError::Kind::kTimeout, recvBytes > 0 ? recvPeer : sendPeer,
                           "Timed out in a send and receive through shared memory");
    }
    if (sendBytes > 0 && peerGone(sendPeer)) throwPeerGone(sendPeer, "make room for a message");
    if (recvBytes > 0 && peerGone(recvPeer)) {
      const size_t drained = pullSome(recvPeer, into, recvBytes);  // what it sent before it left
      if (drained == 0) throwPeerGone(recvPeer, "send a message");
      into += drained;
      recvBytes -= drained;
      continue;
    }
    std::this_thread::yield();
  }
}

bool ShmChannels::peerGone(int peer) {
  if (state(peer).closed.load(std::memory_order_seq_cst) != 0) return true;
  const int fd = pidfds_[static_cast<size_t>(peer)];
  if (fd >= 0) {
    pollfd probe{fd, POLLIN, 0};
    return poll(&probe, 1, 0) > 0;  // a pidfd polls readable once its process has exited
  }
  // No pidfd (another PID namespace, or a kernel without pidfd_open): the group's TCP mesh, whose
  // socket to the peer the kernel closes when the peer's process exits.
  return liveness_.peerHungUp(peer);
}

bool ShmChannels::peerHungUp(int peer) {
  return peerGone(peer);
}

void ShmChannels::throwPeerGone(int peer, const char* doing) const {
  throw TransportError(TransportError::Kind::kPeerClosed, peer,
                       strCat(describePeer(peer), " closed its point-to-point channels (it exited, crashed or destroyed "
                              "its group) while this rank waited for it to ", doing));
}

std::string ShmChannels::describePeer(int peer) const {
  if (peer < 0 || peer >= size_) return strCat("rank ", peer);
  const int named = processGroupRanks_.empty() ? peer : processGroupRanks_[static_cast<size_t>(peer)];
  return strCat("rank ", named, " (pid ", state(peer).pid, ", shared memory on this host)");
}

void ShmChannels::abort() {
  if (aborted_.exchange(true)) return;
  state(rank_).closed.store(1, std::memory_order_seq_cst);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    for (Ring* r : {&ring(rank_, peer), &ring(peer, rank_)}) {
      // Bumped, not only woken: a waiter that read its word just before `closed`/`aborted_` were
      // set would otherwise sleep on an unchanged value for a whole slice.
      r->headWord.fetch_add(1, std::memory_order_seq_cst);
      r->tailWord.fetch_add(1, std::memory_order_seq_cst);
      futexWakeAll(&r->headWord);
      futexWakeAll(&r->tailWord);
    }
  }
}

}  // namespace ddplite::cpu
