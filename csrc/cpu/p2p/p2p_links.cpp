#include "cpu/p2p/p2p_links.hpp"

#include "common/errors.hpp"
#include "common/fd_limits.hpp"
#include "cpu/p2p/channels.hpp"
#include "cpu/transport/tcp.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace ddplite::cpu {

namespace {

constexpr auto kLivenessInterval = std::chrono::milliseconds(100);
constexpr auto kLongestSleep = std::chrono::hours(1);  // "no deadline", in a form a timeout can take

std::chrono::nanoseconds timeUntil(Deadline until) {
  const Deadline now = Clock::now();
  if (until <= now) return std::chrono::nanoseconds(0);
  if (until - now > kLongestSleep) return kLongestSleep;
  return until - now;
}

// ---- shared-memory channels ---------------------------------------------------------------------

class ShmLinks final : public P2pLinks {
 public:
  ShmLinks(std::unique_ptr<ShmChannels> channels, std::vector<int> groupRanks, std::unique_ptr<Transport> liveness)
      : P2pLinks(othersThan(groupRanks, groupRanks.at(static_cast<size_t>(channels->rank())))),
        liveness_(std::move(liveness)),
        channels_(std::move(channels)),
        groupRanks_(std::move(groupRanks)),
        nextCheck_(groupRanks_.size()) {
    const int highest = *std::max_element(groupRanks_.begin(), groupRanks_.end());
    indexOf_.assign(static_cast<size_t>(highest) + 1, -1);
    for (size_t i = 0; i < groupRanks_.size(); ++i) indexOf_[static_cast<size_t>(groupRanks_[i])] = static_cast<int>(i);
  }
  ~ShmLinks() override { channels_->abort(); }

  const char* kind() const override { return "shm"; }

  size_t trySend(int peer, const void* data, size_t bytes) override {
    const int index = indexOf(peer);
    // Checked before every piece, not only when the ring is full: a message that fits would
    // otherwise be "sent" to a peer that is already gone.
    if (channels_->peerClosed(index)) throwGone(peer, "receive");
    return channels_->pushSome(index, static_cast<const char*>(data), bytes);
  }

  size_t tryRecv(int peer, void* data, size_t bytes) override {
    const int index = indexOf(peer);
    const size_t n = channels_->pullSome(index, static_cast<char*>(data), bytes);
    if (n == 0 && channels_->peerClosed(index) && channels_->unread(index) == 0) throwGone(peer, "send a message");
    return n;
  }

  void checkAlive(int peer) override {
    const int index = indexOf(peer);
    Clock::time_point& next = nextCheck_[static_cast<size_t>(index)];
    const auto now = Clock::now();
    if (now < next) return;
    next = now + kLivenessInterval;
    if (channels_->peerGone(index) && channels_->unread(index) == 0) throwGone(peer, "exchange messages");
  }
  void stopReceiving(int) override {}  // a ring wakes the pump only when its producer moves

  void armWait() override { channels_->armWait(); }
  void wait(const std::vector<int>&, Deadline until) override { channels_->waitDoorbell(timeUntil(until)); }
  void disarm() override { channels_->disarm(); }
  void wake() override { channels_->ringOwnDoorbell(); }

  std::string describePeer(int peer) const override { return channels_->describePeer(indexOf(peer)); }
  void abort() override { channels_->abort(); }

 private:
  static std::vector<int> othersThan(std::vector<int> ranks, int mine) {
    ranks.erase(std::remove(ranks.begin(), ranks.end(), mine), ranks.end());
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  }
  int indexOf(int peer) const { return indexOf_.at(static_cast<size_t>(peer)); }
  [[noreturn]] void throwGone(int peer, const char* doing) const {
    throw TransportError(TransportError::Kind::kPeerClosed, peer,
                         strCat(describePeer(peer), " closed its point-to-point channels (it exited, crashed or "
                                "destroyed its group) while this rank waited for it to ", doing));
  }

  std::unique_ptr<Transport> liveness_;  // first: destroyed after the channels that use it
  std::unique_ptr<ShmChannels> channels_;
  std::vector<int> groupRanks_;  // by channel index
  std::vector<int> indexOf_;     // by group rank: channel index, or -1
  std::vector<Clock::time_point> nextCheck_;  // by channel index: checkAlive's next system call
};

// ---- a TCP mesh ---------------------------------------------------------------------------------

class SocketLinks final : public P2pLinks {
 public:
  SocketLinks(std::unique_ptr<TcpTransport> mesh, std::vector<int> peers, std::chrono::milliseconds connectTimeout)
      : P2pLinks(std::move(peers)),
        mesh_(std::move(mesh)),
        connectTimeout_(connectTimeout),
        ended_(static_cast<size_t>(mesh_->size()), 0),
        nextReach_(static_cast<size_t>(mesh_->size())) {
    wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakeFd_ < 0) {
      const int error = errno;
      if (outOfDescriptors(error)) {
        throwDistError(strCat("eventfd for the send/recv pump failed: ", descriptorShortage(error, mesh_->size())),
                       descriptorHint());
      }
      throwDistError(strCat("eventfd for the send/recv pump failed: ", std::strerror(error)),
                     "this kernel must support eventfd");
    }
    // On demand: a peer's connection taken by the acceptor is watched from the next wait() on.
    mesh_->setOnAccepted([this] { wake(); });
  }
  ~SocketLinks() override {
    mesh_.reset();  // its acceptor thread calls wake() until then
    close(wakeFd_);
  }

  const char* kind() const override { return "tcp"; }

  // On demand, the first send to a peer connects (this thread waits for the handshake, which the
  // peer's acceptor thread answers; at most the group's timeout).
  size_t trySend(int peer, const void* data, size_t bytes) override {
    return mesh_->sendSome(peer, data, bytes, Clock::now() + connectTimeout_);
  }

  size_t tryRecv(int peer, void* data, size_t bytes) override {
    try {
      return mesh_->recvSome(peer, data, bytes);
    } catch (const TransportError&) {
      ended_[static_cast<size_t>(peer)] = 1;  // its socket stays readable (end of stream): stop watching it
      throw;
    }
  }

  // A peer that exits closes its socket, which the next tryRecv reads as the end of the stream.
  void checkAlive(int) override {}
  // On demand, a pair a recv waits on may never have connected: then no socket can end. Connect
  // it (this thread waits for the handshake, milliseconds with a live peer, whose first send
  // would have connected it anyway). A peer whose listener refuses for a second is gone
  // (kPeerClosed, thrown); one that cannot be reached within kReachWithin is tried again later.
  void reachAwaited(int peer) override {
    if (!mesh_->onDemand() || mesh_->socketOf(peer) >= 0) return;
    Clock::time_point& next = nextReach_[static_cast<size_t>(peer)];
    const auto now = Clock::now();
    if (now < next) return;
    next = now + kReachEvery;
    try {
      mesh_->connectNow(peer, now + std::min<Clock::duration>(kReachWithin, connectTimeout_));
    } catch (const TransportError& error) {
      if (error.kind() != TransportError::Kind::kTimeout) throw;
    }
  }
  void stopReceiving(int peer) override { ended_[static_cast<size_t>(peer)] = 1; }

  void armWait() override {}  // the eventfd keeps a wake() made before wait() until wait() reads it
  void wait(const std::vector<int>& sending, Deadline until) override {
    entries_.clear();
    entries_.push_back(pollfd{wakeFd_, POLLIN, 0});
    for (int peer : peers()) {
      short events = ended_[static_cast<size_t>(peer)] ? 0 : POLLIN;
      if (std::find(sending.begin(), sending.end(), peer) != sending.end()) events |= POLLOUT;
      if (events != 0) entries_.push_back(pollfd{mesh_->socketOf(peer), events, 0});
    }
    const auto timeout = std::chrono::ceil<std::chrono::milliseconds>(timeUntil(until));
    poll(entries_.data(), entries_.size(), static_cast<int>(timeout.count()));
    if (entries_[0].revents != 0) {
      uint64_t count;
      [[maybe_unused]] const ssize_t n = read(wakeFd_, &count, sizeof(count));  // resets the counter
    }
  }
  void disarm() override {}
  void wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wakeFd_, &one, sizeof(one));  // fails only when the count is full
  }

  std::string describePeer(int peer) const override { return mesh_->describePeer(peer); }
  void abort() override {
    mesh_->abort();
    wake();
  }

 private:
  std::unique_ptr<TcpTransport> mesh_;
  const std::chrono::milliseconds connectTimeout_;
  static constexpr auto kReachEvery = std::chrono::seconds(1);
  static constexpr auto kReachWithin = std::chrono::seconds(2);
  std::vector<char> ended_;  // by group rank: its stream ended or failed (pump thread)
  std::vector<Clock::time_point> nextReach_;  // by group rank: reachAwaited's next try (pump thread)
  int wakeFd_ = -1;
  std::vector<pollfd> entries_;  // wait()'s, kept to spare an allocation per sleep
};

}  // namespace

std::unique_ptr<P2pLinks> shmLinks(std::unique_ptr<ShmChannels> channels, std::vector<int> groupRanks,
                                   std::unique_ptr<Transport> liveness) {
  return std::make_unique<ShmLinks>(std::move(channels), std::move(groupRanks), std::move(liveness));
}

std::unique_ptr<P2pLinks> socketLinks(std::unique_ptr<TcpTransport> mesh, std::vector<int> peers,
                                      std::chrono::milliseconds connectTimeout) {
  return std::make_unique<SocketLinks>(std::move(mesh), std::move(peers), connectTimeout);
}

}  // namespace ddplite::cpu
