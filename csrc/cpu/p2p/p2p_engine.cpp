#include "cpu/p2p/p2p_engine.hpp"

#include "common/errors.hpp"
#include "common/logging.hpp"
#include "common/thread_name.hpp"

#include <algorithm>
#include <cstring>

namespace ddplite::cpu {

namespace {

constexpr uint32_t kMessageMagic = 0x64703270;  // "dp2p"
constexpr Deadline kNoDeadline = Deadline::max();
// A payload up to this size goes out in one piece with its header (one copy, one system call or
// ring push); a larger one straight from the tensor after it.
constexpr size_t kStagedPayloadBytes = 4096;
constexpr auto kLivenessInterval = std::chrono::milliseconds(100);

template <typename... Args>
std::exception_ptr transportError(TransportError::Kind kind, int peer, const Args&... what) {
  return std::make_exception_ptr(TransportError(kind, peer, strCat(what...)));
}

std::exception_ptr abortedError(int peer) {
  return transportError(TransportError::Kind::kAborted, peer, "the group was aborted");
}

bool matches(int wantedPeer, int wantedTag, int peer, int tag) {
  return (wantedPeer == P2pEngine::kAnySource || wantedPeer == peer) && wantedTag == tag;
}

}  // namespace

P2pEngine::P2pEngine(int rank, int size, std::vector<std::unique_ptr<P2pLinks>> paths)
    : rank_(rank), size_(size), peers_(static_cast<size_t>(size)), pumpOf_(static_cast<size_t>(size), -1) {
  pumps_.reserve(paths.size());  // the pumps hold references into pumps_: no reallocation after this
  for (auto& links : paths) {
    if (!links || links->peers().empty()) continue;
    for (int peer : links->peers()) {
      DDPLITE_ENFORCE(peer >= 0 && peer < size && peer != rank && pumpOf_[static_cast<size_t>(peer)] == -1,
                      "rank ", peer, " is on two point-to-point paths, or is not a peer of rank ", rank);
      pumpOf_[static_cast<size_t>(peer)] = static_cast<int>(pumps_.size());
    }
    pumps_.push_back(Pump{std::move(links), std::thread()});
  }
  for (int peer = 0; peer < size; ++peer) {
    DDPLITE_ENFORCE(peer == rank || pumpOf_[static_cast<size_t>(peer)] >= 0, "no point-to-point path to rank ", peer);
  }
  for (Pump& pump : pumps_) {
    pump.thread = std::thread([this, &pump] { pumpLoop(pump); });
    nameThread(pump.thread, strCat("ddplite-p2p-", pump.links->kind()).c_str());
  }
}

P2pEngine::~P2pEngine() {
  stop();
}

void P2pEngine::stop() {
  abort();
  // Again here (idempotent): when another thread's abort() is still going through the pumps,
  // every pump is woken before it is joined.
  for (Pump& pump : pumps_) pump.links->abort();
  for (Pump& pump : pumps_) {
    if (pump.thread.joinable()) pump.thread.join();
  }
}

void P2pEngine::wakePumpOf(int peer) {
  if (peer == kAnySource) {
    for (Pump& pump : pumps_) pump.links->wake();
  } else {
    pumps_[static_cast<size_t>(pumpOf_[static_cast<size_t>(peer)])].links->wake();
  }
}

std::string P2pEngine::describePeer(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) return strCat("rank ", peer);
  return pumps_[static_cast<size_t>(pumpOf_[static_cast<size_t>(peer)])].links->describePeer(peer);
}

void P2pEngine::send(int peer, int tag, at::Tensor data, Deadline deadline, Completion done) {
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      peers_[static_cast<size_t>(peer)].queue.push_back(PendingSend{tag, std::move(data), deadline, std::move(done)});
      queued = true;
    }
  }
  if (!queued) {
    done(abortedError(peer), rank_);
    return;
  }
  wakePumpOf(peer);
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
    failure = abortedError(peer);
  } else if (peer != kAnySource && peers_[static_cast<size_t>(peer)].gone) {
    failure = peers_[static_cast<size_t>(peer)].gone;
  } else if (peer == kAnySource && everyPeerGoneLocked()) {
    failure = transportError(TransportError::Kind::kPeerClosed, -1, "every other rank has closed its connection");
  }
  if (!failure) {
    posted_.push_back(PostedRecv{peer, tag, std::move(into), deadline, std::move(done)});
    lock.unlock();
    wakePumpOf(peer);  // its pump now has a deadline to keep and a peer to watch
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
  for (Pump& pump : pumps_) pump.links->abort();  // the peers see this rank gone; the pumps wake
  for (auto& posted : pending) posted.done(abortedError(posted.peer), posted.peer);
}

void P2pEngine::pumpLoop(Pump& pump) {
  P2pLinks& links = *pump.links;
  std::vector<int> sending;
  const auto stopping = [this] {
    std::lock_guard<std::mutex> lock(mutex_);
    return stopping_;
  };
  try {
    while (!stopping()) {
      if (pass(pump)) continue;
      // Armed before the deadlines are read: a recv posted or a send queued from now on rings the
      // doorbell after the ticket, so its deadline and its peer are not slept through.
      links.armWait();
      const Deadline until = std::min(expirePostedRecvs(), checkPeersWithWork(pump, &sending));
      if (pass(pump) || stopping()) {  // the look after arming (p2p_links.hpp)
        links.disarm();
        continue;
      }
      links.wait(sending, until);
    }
  } catch (const std::exception& error) {
    // Not a peer's failure (those are handled per peer): a completion that threw, or memory.
    DDPLITE_LOG(kWarn, "rank ", rank_, ": the point-to-point pump stopped: ", error.what());
    links.disarm();
    abort();
  }
  failRemaining(pump);
}

bool P2pEngine::pass(Pump& pump) {
  bool moved = false;
  for (int peer : pump.links->peers()) {
    moved |= progressSend(*pump.links, peer);
    moved |= progressRecv(*pump.links, peer);
  }
  return moved;
}

bool P2pEngine::progressSend(P2pLinks& links, int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.sending) {
    std::optional<PendingSend> next;
    std::exception_ptr failure;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (p.queue.empty()) return false;
      next.emplace(std::move(p.queue.front()));
      p.queue.pop_front();
      failure = stopping_ ? abortedError(peer) : p.sendBroken;
    }
    if (failure) {
      next->done(failure, rank_);
      return true;
    }
    const size_t bytes = next->data.nbytes();
    const MessageHeader header{kMessageMagic, next->tag, bytes};
    p.payloadStaged = bytes <= kStagedPayloadBytes;
    p.staged.resize(sizeof(header) + (p.payloadStaged ? bytes : 0));
    std::memcpy(p.staged.data(), &header, sizeof(header));
    if (p.payloadStaged && bytes > 0) std::memcpy(p.staged.data() + sizeof(header), next->data.data_ptr(), bytes);
    p.stagedDone = 0;
    p.payloadDone = 0;
    p.sending = std::move(next);
  }
  bool moved = false;
  try {
    while (p.stagedDone < p.staged.size()) {
      const size_t n = links.trySend(peer, p.staged.data() + p.stagedDone, p.staged.size() - p.stagedDone);
      if (n == 0) return moved;
      p.stagedDone += n;
      moved = true;
    }
    const size_t bytes = p.payloadStaged ? 0 : p.sending->data.nbytes();
    const char* data = p.payloadStaged ? nullptr : static_cast<const char*>(p.sending->data.data_ptr());
    while (p.payloadDone < bytes) {
      const size_t n = links.trySend(peer, data + p.payloadDone, bytes - p.payloadDone);
      if (n == 0) return moved;
      p.payloadDone += n;
      moved = true;
    }
  } catch (const TransportError&) {
    const std::exception_ptr reason = std::current_exception();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      p.sendBroken = reason;  // a message cut short leaves the stream unreadable: later sends fail too
    }
    PendingSend failed = std::move(*p.sending);
    p.sending.reset();
    failed.done(reason, rank_);
    return true;
  }
  PendingSend finished = std::move(*p.sending);
  p.sending.reset();
  finished.done(nullptr, rank_);
  return true;
}

bool P2pEngine::progressRecv(P2pLinks& links, int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  if (!p.receiving) return false;
  bool moved = false;
  try {
    if (!p.haveHeader) {
      char* header = reinterpret_cast<char*>(&p.header);
      while (p.headerDone < sizeof(p.header)) {
        const size_t n = links.tryRecv(peer, header + p.headerDone, sizeof(p.header) - p.headerDone);
        if (n == 0) return moved;
        p.headerDone += n;
        moved = true;
      }
      if (p.header.magic != kMessageMagic) {
        throw TransportError(TransportError::Kind::kIo, peer, strCat("corrupt message header from ", describePeer(peer)));
      }
      p.haveHeader = true;
      p.payloadGot = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        p.matched = takePosted(peer, p.header.tag, &p.match);
      }
      if (p.matched && p.match.into.nbytes() == p.header.bytes) {
        p.target = static_cast<char*>(p.match.into.data_ptr());
      } else {
        try {
          p.payload.assign(p.header.bytes, 0);
        } catch (const std::bad_alloc&) {
          throw TransportError(TransportError::Kind::kIo, peer,
                               strCat("no memory for a message of ", p.header.bytes, " bytes from ", describePeer(peer)));
        }
        p.target = p.payload.data();
      }
    }
    while (p.payloadGot < p.header.bytes) {
      const size_t n = links.tryRecv(peer, p.target + p.payloadGot, p.header.bytes - p.payloadGot);
      if (n == 0) return moved;
      p.payloadGot += n;
      moved = true;
    }
  } catch (const TransportError&) {
    peerLost(links, peer, std::current_exception());
    return true;
  }
  finishMessage(peer);
  return true;
}

void P2pEngine::peerLost(P2pLinks& links, int peer, std::exception_ptr reason) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  p.receiving = false;
  links.stopReceiving(peer);
  if (p.haveHeader && p.matched) {
    PostedRecv cut = std::move(p.match);
    p.matched = false;
    cut.done(reason, peer);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    p.sendBroken = reason;  // nothing sent to it from now on would be read
  }
  if (p.sending) {
    PendingSend cut = std::move(*p.sending);
    p.sending.reset();
    cut.done(reason, rank_);
  }
  peerGone(peer, reason);
}

void P2pEngine::finishMessage(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  const bool discard = p.discard;
  p.discard = false;
  const bool intoTensor = p.matched && p.target != p.payload.data();
  bool matched = p.matched;
  PostedRecv match = std::move(p.match);
  std::vector<char> payload = std::move(p.payload);
  const int tag = p.header.tag;
  p.header = MessageHeader{};
  p.headerDone = 0;
  p.haveHeader = false;
  p.matched = false;
  p.match = PostedRecv{};
  p.payload.clear();
  p.target = nullptr;
  p.payloadGot = 0;
  if (discard) return;  // its recv has failed already
  if (intoTensor) {
    match.done(nullptr, peer);
    return;
  }
  if (!matched) {
    std::lock_guard<std::mutex> lock(mutex_);
    matched = takePosted(peer, tag, &match);  // a recv may have been posted meanwhile
    if (!matched) {
      unexpected_.push_back(Unexpected{peer, tag, std::move(payload)});
      return;
    }
  }
  deliver(match, payload, peer);
}

Deadline P2pEngine::expirePostedRecvs() {
  std::vector<PostedRecv> expired;
  Deadline earliest = kNoDeadline;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const Deadline now = Clock::now();
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (it->deadline <= now) {
        expired.push_back(std::move(*it));
        it = posted_.erase(it);
      } else {
        earliest = std::min(earliest, it->deadline);
        ++it;
      }
    }
  }
  for (auto& posted : expired) {
    const std::string from = posted.peer == kAnySource ? std::string("any rank") : describePeer(posted.peer);
    posted.done(transportError(TransportError::Kind::kTimeout, posted.peer, "Timed out waiting for a message from ",
                               from, " with tag ", posted.tag),
                posted.peer);
  }
  return earliest;
}

Deadline P2pEngine::checkPeersWithWork(Pump& pump, std::vector<int>* sending) {
  P2pLinks& links = *pump.links;
  sending->clear();
  std::vector<int> withWork;
  std::vector<char> awaited(static_cast<size_t>(size_), 0);  // named by a posted recv
  {
    std::lock_guard<std::mutex> lock(mutex_);
    bool anySource = false;
    for (const auto& posted : posted_) {
      if (posted.peer == kAnySource) {
        anySource = true;
      } else {
        awaited[static_cast<size_t>(posted.peer)] = 1;
      }
    }
    for (int peer : links.peers()) {
      const Peer& p = peers_[static_cast<size_t>(peer)];
      const bool receiving = p.receiving && (anySource || awaited[static_cast<size_t>(peer)] || p.headerDone > 0);
      if (receiving || p.sending || !p.queue.empty()) withWork.push_back(peer);
    }
  }
  Deadline until = kNoDeadline;
  const Deadline now = Clock::now();
  for (int peer : withWork) {
    Peer& p = peers_[static_cast<size_t>(peer)];
    if (p.sending && now >= p.sending->deadline) {
      const size_t left = p.staged.size() - p.stagedDone + (p.payloadStaged ? 0 : p.sending->data.nbytes() - p.payloadDone);
      const std::exception_ptr reason =
          transportError(TransportError::Kind::kTimeout, peer, "Timed out waiting to send to ", describePeer(peer), " (",
                         left, " bytes of the message still to go)");
      if (p.stagedDone > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        p.sendBroken = reason;  // part of it went out
      }
      PendingSend failed = std::move(*p.sending);
      p.sending.reset();
      failed.done(reason, rank_);
    }
    if (p.sending) {
      sending->push_back(peer);
      until = std::min(until, p.sending->deadline);
    }
    if (p.haveHeader && p.matched && now >= p.match.deadline) expireMatchedRecv(peer);
    if (p.haveHeader && p.matched) until = std::min(until, p.match.deadline);
    if (!p.receiving) continue;
    try {
      links.checkAlive(peer);
      if (awaited[static_cast<size_t>(peer)]) links.reachAwaited(peer);  // not for any-source: not every pair
    } catch (const TransportError&) {
      peerLost(links, peer, std::current_exception());
    }
  }
  // A peer that is gone without a word (killed) is seen by the next look at its liveness.
  if (!withWork.empty()) until = std::min(until, now + kLivenessInterval);
  return until;
}

void P2pEngine::expireMatchedRecv(int peer) {
  Peer& p = peers_[static_cast<size_t>(peer)];
  // The rest of the message is still read, into `payload` (the stream stays in step), and dropped;
  // the tensor is not written after its recv has failed.
  const size_t got = p.payloadGot;
  const bool intoTensor = p.target != p.payload.data();
  PostedRecv cut = std::move(p.match);
  p.matched = false;
  p.discard = true;
  if (intoTensor) {
    p.payload.assign(p.header.bytes, 0);
    p.target = p.payload.data();
  }
  cut.done(transportError(TransportError::Kind::kTimeout, peer, "Timed out receiving a message from ",
                          describePeer(peer), " with tag ", cut.tag, " (", p.header.bytes - got,
                          " of its bytes still to come)"),
           peer);
}

void P2pEngine::failRemaining(Pump& pump) {
  for (int peer : pump.links->peers()) {
    Peer& p = peers_[static_cast<size_t>(peer)];
    std::deque<PendingSend> queued;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queued.swap(p.queue);
    }
    if (p.sending) {
      PendingSend cut = std::move(*p.sending);
      p.sending.reset();
      cut.done(abortedError(peer), rank_);
    }
    for (auto& item : queued) item.done(abortedError(peer), rank_);
    if (p.haveHeader && p.matched) {
      PostedRecv cut = std::move(p.match);
      p.matched = false;
      cut.done(abortedError(peer), peer);
    }
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
    peers_[static_cast<size_t>(peer)].gone = reason;
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
    if (peer != rank_ && !peers_[static_cast<size_t>(peer)].gone) return false;
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
