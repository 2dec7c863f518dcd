#include "cpu/p2p_engine.hpp"

#include "common/errors.hpp"
#include "common/logging.hpp"
#include "common/thread_name.hpp"

#include <cstring>

namespace ddplite::cpu {

namespace {

constexpr uint32_t kMessageMagic = 0x64703270;  // "dp2p"
constexpr Deadline kNoDeadline = Deadline::max();

struct MessageHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t bytes;
};

template <typename... Args>
std::exception_ptr transportError(TransportError::Kind kind, int peer, const Args&... what) {
  return std::make_exception_ptr(TransportError(kind, peer, strCat(what...)));
}

bool matches(int wantedPeer, int wantedTag, int peer, int tag) {
  return (wantedPeer == P2pEngine::kAnySource || wantedPeer == peer) && wantedTag == tag;
}

}  // namespace

P2pEngine::P2pEngine(std::unique_ptr<Transport> transport)
    : transport_(std::move(transport)),
      rank_(transport_->rank()),
      size_(transport_->size()),
      sends_(size_),
      gone_(size_),
      sendBroken_(size_) {
  nameThread(threads_.emplace_back([this] { timerLoop(); }), "ddplite-timer");
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    nameThread(threads_.emplace_back([this, peer] { sendLoop(peer); }), "tx", peer);
    nameThread(threads_.emplace_back([this, peer] { receiveLoop(peer); }), "rx", peer);
  }
}

P2pEngine::~P2pEngine() {
  stop();
}

void P2pEngine::stop() {
  abort();
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

void P2pEngine::send(int peer, int tag, at::Tensor data, Deadline deadline, Completion done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      sends_[peer].push_back(PendingSend{tag, std::move(data), deadline, std::move(done)});
      wake_.notify_all();
      return;
    }
  }
  done(transportError(TransportError::Kind::kAborted, peer, "the group was aborted"), rank_);
}

void P2pEngine::recv(int peer, int tag, at::Tensor into, Deadline deadline, Completion done) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (matches(peer, tag, it->peer, it->tag)) {
      Unexpected message = std::move(*it);
      unexpected_.erase(it);
      lock.unlock();
      PostedRecv claimed{peer, tag, std::move(into), deadline, std::move(done)};
      deliver(claimed, message.payload, message.peer);
      return;
    }
  }
  std::exception_ptr failure;
  if (stopping_) {
    failure = transportError(TransportError::Kind::kAborted, peer, "the group was aborted");
  } else if (peer != kAnySource && gone_[peer]) {
    failure = gone_[peer];
  } else if (peer == kAnySource && everyPeerGoneLocked()) {
    failure = transportError(TransportError::Kind::kPeerClosed, -1, "every other rank has closed its connection");
  }
  if (!failure) {
    posted_.push_back(PostedRecv{peer, tag, std::move(into), deadline, std::move(done)});
    wake_.notify_all();
    return;
  }
  lock.unlock();
  done(failure, peer);
}

void P2pEngine::abort() {
  std::list<PostedRecv> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    pending.swap(posted_);
  }
  transport_->abort();  // fails the sends in progress and wakes the receivers
  wake_.notify_all();
  for (auto& posted : pending) {
    posted.done(transportError(TransportError::Kind::kAborted, posted.peer, "the group was aborted"), posted.peer);
  }
}

void P2pEngine::sendLoop(int peer) {
  while (true) {
    PendingSend item;
    std::exception_ptr broken;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !sends_[peer].empty(); });
      if (sends_[peer].empty()) return;  // stopping, nothing left to fail
      item = std::move(sends_[peer].front());
      sends_[peer].pop_front();
      broken = stopping_ ? transportError(TransportError::Kind::kAborted, peer, "the group was aborted")
                         : sendBroken_[peer];
    }
    if (broken) {
      item.done(broken, rank_);
      continue;
    }
    try {
      const MessageHeader header{kMessageMagic, item.tag, item.data.nbytes()};
      transport_->send(peer, &header, sizeof(header), item.deadline);
      transport_->send(peer, item.data.data_ptr(), item.data.nbytes(), item.deadline);
    } catch (const TransportError&) {
      // A message cut short leaves the stream unreadable: later sends to this peer fail too.
      broken = std::current_exception();
      std::lock_guard<std::mutex> lock(mutex_);
      sendBroken_[peer] = broken;
    }
    item.done(broken, rank_);
  }
}

void P2pEngine::receiveLoop(int peer) {
  while (true) {
    MessageHeader header{};
    PostedRecv match;
    bool matched = false;
    try {
      transport_->recv(peer, &header, sizeof(header), kNoDeadline);
      if (header.magic != kMessageMagic) {
        throw TransportError(TransportError::Kind::kIo, peer,
                             strCat("corrupt message header from ", transport_->describePeer(peer)));
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        matched = takePosted(peer, header.tag, &match);
      }
      if (matched && match.into.nbytes() == header.bytes) {
        transport_->recv(peer, match.into.data_ptr(), header.bytes, kNoDeadline);
        match.done(nullptr, peer);
        continue;
      }
      std::vector<char> payload(header.bytes);
      transport_->recv(peer, payload.data(), header.bytes, kNoDeadline);
      if (!matched) {
        std::lock_guard<std::mutex> lock(mutex_);
        matched = takePosted(peer, header.tag, &match);  // a recv may have been posted meanwhile
        if (!matched) {
          unexpected_.push_back(Unexpected{peer, header.tag, std::move(payload)});
          continue;
        }
      }
      deliver(match, payload, peer);
    } catch (const TransportError&) {
      std::exception_ptr reason = std::current_exception();
      if (matched) match.done(reason, peer);
      peerGone(peer, reason);
      return;
    }
  }
}

void P2pEngine::timerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    Deadline earliest = kNoDeadline;
    for (const auto& posted : posted_) earliest = std::min(earliest, posted.deadline);
    if (earliest == kNoDeadline) {
      wake_.wait(lock);
    } else {
      wake_.wait_until(lock, earliest);
    }
    std::vector<PostedRecv> expired;
    const Deadline now = Clock::now();
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (it->deadline <= now) {
        expired.push_back(std::move(*it));
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (auto& posted : expired) {
      const std::string from =
          posted.peer == kAnySource ? std::string("any rank") : transport_->describePeer(posted.peer);
      posted.done(transportError(TransportError::Kind::kTimeout, posted.peer, "Timed out waiting for a message from ",
                                 from, " with tag ", posted.tag),
                  posted.peer);
    }
    lock.lock();
  }
}

bool P2pEngine::takePosted(int peer, int tag, PostedRecv* out) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (matches(it->peer, it->tag, peer, tag)) {
      *out = std::move(*it);
      posted_.erase(it);
      return true;
    }
  }
  return false;
}

void P2pEngine::peerGone(int peer, std::exception_ptr reason) {
  std::vector<PostedRecv> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gone_[peer] = reason;
    const bool allGone = everyPeerGoneLocked();
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (it->peer == peer || (it->peer == kAnySource && allGone)) {
        failed.push_back(std::move(*it));
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& posted : failed) posted.done(reason, peer);
}

bool P2pEngine::everyPeerGoneLocked() const {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank_ && !gone_[peer]) return false;
  }
  return true;
}

void P2pEngine::deliver(PostedRecv& recv, const std::vector<char>& payload, int source) {
  if (payload.size() != recv.into.nbytes()) {
    recv.done(std::make_exception_ptr(std::length_error(
                  strCat("the message from rank ", source, " with tag ", recv.tag, " has ", payload.size(),
                         " bytes but the receiving tensor has ", recv.into.nbytes()))),
              source);
    return;
  }
  if (!payload.empty()) std::memcpy(recv.into.data_ptr(), payload.data(), payload.size());
  recv.done(nullptr, source);
}

}  // namespace ddplite::cpu
