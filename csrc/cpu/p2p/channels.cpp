#include "cpu/p2p/channels.hpp"

#include "common/errors.hpp"
#include "common/process_identity.hpp"
#include "cpu/shm/futex_wait.hpp"

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

size_t ringBytesFor(int size) {
  const size_t rings = static_cast<size_t>(size) * static_cast<size_t>(size);
  const size_t share = kRingBudget / rings / 4096 * 4096;
  return std::min(kMaxRingBytes, std::max(kMinRingBytes, share));
}

}  // namespace

// The first line is written by the owner only (at set-up, and `closed` by its abort()); the
// second by any rank that rings the owner's doorbell, and `sleeping` by the owner's pump.
struct alignas(kAlignment) ShmChannels::RankState {
  std::atomic<uint32_t> closed;  // 1 once the rank's abort() ran (seq_cst store, then doorbells)
  ProcessIdentity process;       // written once at set-up, before the store exchange
  alignas(kAlignment) std::atomic<uint32_t> doorbell;  // the pump's futex word: a count, bumped by ring()
  std::atomic<uint32_t> sleeping;                      // 1 while the pump is armed (armWait .. disarm)
};

// One direction between two ranks: the producer writes `head` and the data, the consumer `tail`.
struct alignas(kAlignment) ShmChannels::Ring {
  std::atomic<uint64_t> head;                      // bytes ever written
  alignas(kAlignment) std::atomic<uint64_t> tail;  // bytes ever read
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
  channels->state(rank).process = ProcessIdentity::ofThisProcess();
  // Every rank's identity is visible to the others after this store round trip.
  rendezvous.barrier("channels/ready/", rank, size, "", "every rank to map its point-to-point channels");
  return channels;
}

ShmChannels::ShmChannels(std::unique_ptr<ShmSegment> segment, Transport& liveness, int rank, int size,
                         size_t ringBytes)
    : segment_(std::move(segment)),
      liveness_(liveness),
      rank_(rank),
      size_(size),
      ringBytes_(ringBytes) {}

ShmChannels::~ShmChannels() {
  abort();
}

ShmChannels::RankState& ShmChannels::state(int owner) const {
  return reinterpret_cast<RankState*>(segment_->base())[owner];
}

ShmChannels::Ring& ShmChannels::ringOf(int from, int to) const {
  char* rings = segment_->base() + roundUp(sizeof(RankState) * size_, kAlignment);
  return reinterpret_cast<Ring*>(rings)[static_cast<size_t>(from) * size_ + to];
}

char* ShmChannels::ringData(int from, int to) const {
  const size_t pairs = static_cast<size_t>(size_) * static_cast<size_t>(size_);
  char* data = segment_->base() + roundUp(sizeof(RankState) * size_, kAlignment) + pairs * sizeof(Ring);
  return data + (static_cast<size_t>(from) * size_ + to) * ringBytes_;
}

size_t ShmChannels::pushSome(int peer, const char* data, size_t bytes) {
  Ring& r = ringOf(rank_, peer);
  const uint64_t head = r.head.load(std::memory_order_relaxed);  // this thread's own count
  // seq_cst (acquire would do for the bytes): the pump's look after armWait must be ordered
  // with the consumer's tail store and its load of `sleeping` (header)
  const uint64_t tail = r.tail.load(std::memory_order_seq_cst);  // the consumer is done with bytes before it
  const size_t n = std::min<size_t>(bytes, ringBytes_ - static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  char* base = ringData(rank_, peer);
  const size_t at = static_cast<size_t>(head % ringBytes_);
  const size_t first = std::min(n, ringBytes_ - at);
  std::memcpy(base + at, data, first);
  std::memcpy(base, data + first, n - first);
  r.head.store(head + n, std::memory_order_seq_cst);  // then `sleeping` in ring(): see the header
  ring(peer);
  return n;
}

size_t ShmChannels::pullSome(int peer, char* data, size_t bytes) {
  Ring& r = ringOf(peer, rank_);
  const uint64_t tail = r.tail.load(std::memory_order_relaxed);  // this thread's own count
  // seq_cst, for the same reason as pushSome's tail; it also acquires the bytes before head
  const uint64_t head = r.head.load(std::memory_order_seq_cst);
  const size_t n = std::min<size_t>(bytes, static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  const char* base = ringData(peer, rank_);
  const size_t at = static_cast<size_t>(tail % ringBytes_);
  const size_t first = std::min(n, ringBytes_ - at);
  std::memcpy(data, base + at, first);
  std::memcpy(data + first, base, n - first);
  r.tail.store(tail + n, std::memory_order_seq_cst);  // then `sleeping` in ring(): the producer may wait for room
  ring(peer);
  return n;
}

void ShmChannels::ring(int owner) const {
  RankState& theirs = state(owner);
  if (theirs.sleeping.load(std::memory_order_seq_cst) == 0) return;
  theirs.doorbell.fetch_add(1, std::memory_order_seq_cst);
  futexWakeAll(&theirs.doorbell);
}

void ShmChannels::armWait() {
  RankState& mine = state(rank_);
  mine.sleeping.store(1, std::memory_order_seq_cst);
  ticket_ = mine.doorbell.load(std::memory_order_seq_cst);
}

void ShmChannels::waitDoorbell(std::chrono::nanoseconds timeout) {
  if (timeout.count() > 0) futexWait(&state(rank_).doorbell, ticket_, timeout);
  disarm();
}

void ShmChannels::disarm() {
  state(rank_).sleeping.store(0, std::memory_order_seq_cst);
}

bool ShmChannels::peerGone(int peer) {
  if (state(peer).closed.load(std::memory_order_seq_cst) != 0) return true;
  switch (stateOf(state(peer).process)) {
    case ProcessState::kEnded:
      return true;
    case ProcessState::kRunning:
      return false;
    case ProcessState::kUnknown:
      break;
  }
  // Not checkable here (another PID namespace, no /proc): the group's TCP mesh, whose socket to
  // the peer the kernel closes when the peer's process exits.
  return liveness_.peerHungUp(peer);
}

bool ShmChannels::peerClosed(int peer) const {
  return state(peer).closed.load(std::memory_order_seq_cst) != 0;
}

size_t ShmChannels::unread(int peer) const {
  const Ring& r = ringOf(peer, rank_);
  return static_cast<size_t>(r.head.load(std::memory_order_seq_cst) - r.tail.load(std::memory_order_relaxed));
}

std::string ShmChannels::describePeer(int peer) const {
  if (peer < 0 || peer >= size_) return strCat("rank ", peer);
  const int named = processGroupRanks_.empty() ? peer : processGroupRanks_[static_cast<size_t>(peer)];
  return strCat("rank ", named, " (pid ", state(peer).process.pid, ", shared memory on this host)");
}

void ShmChannels::abort() {
  if (aborted_.exchange(true)) return;
  state(rank_).closed.store(1, std::memory_order_seq_cst);  // then the doorbells: see the header
  for (int owner = 0; owner < size_; ++owner) {
    // Bumped whether or not the pump sleeps: one that armed just before `closed` was set would
    // otherwise wait on an unchanged value (its next look finds the flag).
    RankState& theirs = state(owner);
    theirs.doorbell.fetch_add(1, std::memory_order_seq_cst);
    futexWakeAll(&theirs.doorbell);
  }
}

}  // namespace ddplite::cpu
