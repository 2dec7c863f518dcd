#include "health/status_server.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/fork_guard.hpp"
#include "common/logging.hpp"
#include "common/process_identity.hpp"
#include "common/thread_name.hpp"
#include "cpu/transport/auth.hpp"
#include "cpu/transport/net_iface.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

namespace ddplite::health {

namespace {

constexpr char kMagic[8] = {'D', 'D', 'P', 'L', 'S', 'T', '0', '1'};
constexpr const char* kMacContext = "ddplite-status";
constexpr const char* kAnswerContext = "ddplite-status-answer";
constexpr auto kWarnEvery = std::chrono::seconds(10);
constexpr auto kClientWithin = std::chrono::seconds(2);  // an asker's whole exchange
constexpr size_t kMaxClients = 64;                        // askers served at once
constexpr int kStopLookMs = 200;  // how soon the thread sees `stop` while no query comes
// Sent instead of an answer's length to an asker whose proof was wrong, before the close: the
// asker then knows its key is not the job's. A close with nothing sent means "pushed out to make
// room" (or the process ended): the asker connects again.
constexpr uint32_t kRefusedLength = 0xFFFFFFFFu;

using Clock = std::chrono::steady_clock;

// The secret queries prove, and whether any query is answered without one.
struct Secret {
  std::string value;
  bool open = false;
};

std::string peerOf(const sockaddr_storage& address) {
  return net::describeEndpoint(reinterpret_cast<const sockaddr*>(&address));
}

std::string hostNameOrMark() {
  std::string name = hostName();
  return name.empty() ? "?" : name;
}

class Server {
 public:
  explicit Server(Secret secret) : secret_(std::move(secret)) {}
  // Any thread but the server's. Waits for a query in progress (it looks at stop between steps).
  ~Server() {
    stop_.store(true, std::memory_order_relaxed);
    if (listener_ >= 0 && fork_guard::createdHere(creator_)) ::shutdown(listener_, SHUT_RDWR);  // wakes its poll()
    if (thread_.joinable()) {
      if (fork_guard::createdHere(creator_)) {
        thread_.join();
      } else {
        thread_.detach();  // a forked child's copy: the thread is not there
      }
    }
    if (listener_ >= 0) fork_guard::close(listener_, this);
  }
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens on an ephemeral port of `host`; false (logged) when it cannot.
  bool listen(const std::string& host) {
    net::Endpoint endpoint;
    std::string problem;
    if (!net::parseEndpoint(net::joinHostPort(host, 0), 0, &endpoint, &problem)) {
      DDPLITE_LOG(kWarn, "live status off: cannot listen on ", host, ": ", problem);
      return false;
    }
    listener_ = fork_guard::adoptNew(this, [&] { return ::socket(endpoint.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0); });
    sockaddr_storage bound = {};
    socklen_t length = sizeof(bound);
    if (listener_ < 0 || ::bind(listener_, endpoint.get(), endpoint.length) != 0 || ::listen(listener_, 64) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      DDPLITE_LOG(kWarn, "live status off: cannot listen on ", host, ": ", std::strerror(errno));
      return false;
    }
    address_ = net::describeEndpoint(reinterpret_cast<const sockaddr*>(&bound));
    return true;
  }

  void start() {
    thread_ = std::thread([this] { run(); });
    nameThread(thread_, "ddplite-status");
  }

  const std::string& address() const { return address_; }

  void add(uint64_t id, std::function<std::string()> describe) {
    std::lock_guard<std::mutex> lock(groupsMutex_);
    groups_[id] = std::move(describe);
  }
  // After it returns, the callback of `id` is not running and never runs again.
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(groupsMutex_);
    groups_.erase(id);
  }

 private:
  const Secret secret_;
  const pid_t creator_ = fork_guard::currentPid();
  int listener_ = -1;    // set by listen(), before the thread starts
  std::string address_;  // likewise
  std::atomic<bool> stop_{false};  // relaxed: only a flag, no data travels with it
  std::mutex groupsMutex_;         // guards groups_; held while a callback runs
  std::map<uint64_t, std::function<std::string()>> groups_;
  std::thread thread_;

  // One asker: the server thread's own.
  struct Client {
    int fd = -1;
    sockaddr_storage from{};
    Clock::time_point deadline;
    auth::Nonce nonce{};
    auth::Digest proof{};
    size_t proofBytes = 0;  // of the proof received so far
    std::string answer;     // length and JSON, once the proof was right
    size_t sent = 0;        // of the answer
  };
  std::vector<Client> clients_;  // the server thread's; at most kMaxClients
  std::mt19937 draw_{std::random_device{}()};

  // Every asker is served at once, each within kClientWithin of its connect, so that strangers
  // that connect and say nothing delay no query. At kMaxClients, a newcomer pushes out one that
  // has not proven the secret yet, drawn at random (as the meshes' listeners do, docs/security.md).
  void run() {
    Clock::time_point acceptAgain{};  // accept() failed for lack of a resource: look again then
    std::vector<pollfd> polled;
    while (!stop_.load(std::memory_order_relaxed)) {
      try {
        serveOnce(acceptAgain, polled);
      } catch (const std::exception& error) {  // no memory, no randomness: this round's askers go unanswered
        DDPLITE_LOG(kWarn, "the status server skipped a round: ", error.what());
        while (!clients_.empty()) drop(clients_.size() - 1);
        ::poll(nullptr, 0, kStopLookMs);
      }
    }
    while (!clients_.empty()) drop(clients_.size() - 1);
  }

  void serveOnce(Clock::time_point& acceptAgain, std::vector<pollfd>& polled) {
    {
      const Clock::time_point now = Clock::now();
      const bool accepting = now >= acceptAgain;
      polled.assign(1, pollfd{accepting ? listener_ : -1, POLLIN, 0});
      auto wait = std::chrono::milliseconds(kStopLookMs);
      for (const Client& client : clients_) {
        polled.push_back(pollfd{client.fd, static_cast<short>(client.answer.empty() ? POLLIN : POLLOUT), 0});
        wait = std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(client.deadline - now) +
                                  std::chrono::milliseconds(1));
      }
      if (!accepting) wait = std::min(wait, std::chrono::milliseconds(kStopLookMs));
      ::poll(polled.data(), polled.size(), static_cast<int>(std::max<int64_t>(wait.count(), 0)));
      // Clients first (their indices match `polled` until the list changes), then newcomers.
      std::vector<bool> done(clients_.size(), false);
      for (size_t i = 0; i < clients_.size(); ++i) {
        const short events = polled[i + 1].revents;
        if (events != 0) done[i] = !progress(clients_[i]);
        if (Clock::now() > clients_[i].deadline) done[i] = true;
      }
      for (size_t i = clients_.size(); i-- > 0;) {
        if (done[i]) drop(i);
      }
      if (accepting && (polled[0].revents & POLLIN) != 0 && !acceptAll()) {
        acceptAgain = Clock::now() + std::chrono::milliseconds(kStopLookMs);
      }
    }
  }

  void drop(size_t index) {
    fork_guard::close(clients_[index].fd, this);
    clients_[index] = std::move(clients_.back());
    clients_.pop_back();
  }

  // Takes every pending connection; false when accept() failed for lack of a resource (out of
  // descriptors): the connection stays pending, and polling the listener again at once would spin.
  bool acceptAll() {
    while (true) {
      Client client;
      socklen_t length = sizeof(client.from);
      client.fd = fork_guard::adoptNew(this, [&] {
        return ::accept4(listener_, reinterpret_cast<sockaddr*>(&client.from), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
      });
      if (client.fd < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED;
      if (clients_.size() >= kMaxClients) pushOutOne();
      client.deadline = Clock::now() + kClientWithin;
      client.nonce = auth::newNonce();
      char greeting[sizeof(kMagic) + sizeof(client.nonce)];
      std::memcpy(greeting, kMagic, sizeof(kMagic));
      std::memcpy(greeting + sizeof(kMagic), client.nonce.data(), client.nonce.size());
      // A fresh connection's send buffer takes 24 bytes whole; anything else is a broken asker.
      if (::send(client.fd, greeting, sizeof(greeting), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(greeting))) {
        fork_guard::close(client.fd, this);
        continue;
      }
      clients_.push_back(std::move(client));
    }
  }

  // A refused asker is logged at most once per kWarnEvery, with how many went unlogged since: a
  // stranger sending garbage at line rate must not fill the job's log.
  void warnRefused(const sockaddr_storage& from) {
    const Clock::time_point now = Clock::now();
    if (now - lastWarned_ < kWarnEvery) {
      ++unwarned_;
      return;
    }
    DDPLITE_LOG(kWarn, "a status query from ", peerOf(from), " did not prove the job's secret; dropped unanswered",
                unwarned_ > 0 ? strCat(" (and ", unwarned_, " more since the last such warning)") : std::string());
    lastWarned_ = now;
    unwarned_ = 0;
  }
  Clock::time_point lastWarned_{};  // the server thread's
  uint64_t unwarned_ = 0;

  void pushOutOne() {
    std::vector<size_t> silent;
    for (size_t i = 0; i < clients_.size(); ++i) {
      if (clients_[i].answer.empty()) silent.push_back(i);
    }
    const size_t victim = silent.empty() ? std::uniform_int_distribution<size_t>(0, clients_.size() - 1)(draw_)
                                         : silent[std::uniform_int_distribution<size_t>(0, silent.size() - 1)(draw_)];
    drop(victim);
  }

  // Moves `client` on as far as its socket allows; false when it is finished (answered, refused
  // or gone).
  bool progress(Client& client) {
    if (client.answer.empty()) {
      const ssize_t got = ::recv(client.fd, client.proof.data() + client.proofBytes,
                                 client.proof.size() - client.proofBytes, 0);
      if (got <= 0) return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
      client.proofBytes += static_cast<size_t>(got);
      if (client.proofBytes < client.proof.size()) return true;
      const std::string nonce(reinterpret_cast<const char*>(client.nonce.data()), client.nonce.size());
      const auth::Digest expected = auth::hmacSha256(secret_.value, strCat(kMacContext, "|", address_, "|", nonce));
      if (!secret_.open && !auth::sameDigest(client.proof, expected)) {
        warnRefused(client.from);
        const uint32_t refused = htonl(kRefusedLength);  // best effort: a fresh socket's buffer takes 4 bytes
        (void)::send(client.fd, &refused, sizeof(refused), MSG_NOSIGNAL);
        return false;
      }
      const std::string json = describe();
      const uint32_t length = htonl(static_cast<uint32_t>(json.size()));
      client.answer.assign(reinterpret_cast<const char*>(&length), sizeof(length));
      client.answer += json;
      // The answer's own MAC: an asker knows it comes from a holder of the secret (zeros when open).
      const auth::Digest seal = secret_.open ? auth::Digest{}
                                             : auth::hmacSha256(secret_.value, strCat(kAnswerContext, "|", nonce, json));
      client.answer.append(reinterpret_cast<const char*>(seal.data()), seal.size());
    }
    const ssize_t sent =
        ::send(client.fd, client.answer.data() + client.sent, client.answer.size() - client.sent, MSG_NOSIGNAL);
    if (sent < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    client.sent += static_cast<size_t>(sent);
    return client.sent < client.answer.size();
  }

  std::string describe() {
    std::string groups;
    {
      std::lock_guard<std::mutex> lock(groupsMutex_);
      for (const auto& [id, callback] : groups_) {
        if (!groups.empty()) groups += ",";
        groups += callback();
      }
    }
    return strCat("{\"host\":", jsonString(hostNameOrMark()), ",\"pid\":", getpid(), ",\"address\":", jsonString(address_),
                  ",\"groups\":[", groups, "]}");
  }
};

// The process's server: leaked when a group is never destroyed (its thread then runs until the
// process ends; no destructor at exit joins it or frees what it reads). Guarded by registryMutex,
// as are the two below.
std::mutex registryMutex;
Server* server = nullptr;
int registered = 0;      // groups registered now
bool attempted = false;  // whether the groups registered now tried to start a server (the first of
                         // more than one rank does)
uint64_t nextId = 0;
std::atomic<int> notedWorldSize{0};  // relaxed: a value on its own, written before the group is created

c10::intrusive_ptr<c10d::Store> rootOf(c10::intrusive_ptr<c10d::Store> store) {
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get())) return prefixed->getUnderlyingNonPrefixStore();
  return store;
}

std::string storeHostOf(const c10::intrusive_ptr<c10d::Store>& root) {
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(root.get())) return tcp->getHost();
  return "";
}

void setText(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

// This process's own query secret and the line the tool reads to prove it (see the header). No
// rank waits for another's: each publishes its own.
std::pair<Secret, std::string> ownSecret() {
  if (!env::authenticateConnections()) return {Secret{"", true}, "none"};
  const std::string key = auth::keyFromFile();  // throws std::runtime_error for an unusable file
  if (key.empty()) {
    std::string secret = auth::newSecret();
    return {Secret{secret, false}, secret};
  }
  const std::string salt = auth::newSecret();
  return {Secret{auth::meshSecretFromKey(key, "status", salt), false},
          strCat("external ", salt, " ", auth::keyCheck(key, salt))};
}

// registryMutex held. A started, published server, or null (logged).
std::unique_ptr<Server> startServer(const GroupSetup& setup) {
  auto [secret, authLine] = ownSecret();
  const c10::intrusive_ptr<c10d::Store> root = rootOf(setup.store);
  std::string why;
  auto started = std::make_unique<Server>(std::move(secret));
  if (!started->listen(net::chooseListenAddress(&why, storeHostOf(root)))) return nullptr;
  started->start();
  setText(*root, strCat("ddplite/status/auth/", setup.globalRank), authLine);
  setText(*root, strCat("ddplite/status/rank/", setup.globalRank),
          strCat(started->address(), " ", getpid(), " ", hostNameOrMark()));
  const int noted = notedWorldSize.load(std::memory_order_relaxed);
  setText(*root, "ddplite/status/size", std::to_string(noted > 0 ? noted : setup.globalRanksUpTo));
  DDPLITE_LOG(kInfo, "rank ", setup.globalRank, " answers status queries on ", started->address(), " (", why, ")");
  return started;
}

// A forked child has none of the server's threads, and the registry's mutex may have been held
// by another thread at fork: the child starts with an empty registry (the parent's server leaked).
void resetRegistryInChild() {
  new (&registryMutex) std::mutex();
  server = nullptr;
  registered = 0;
  attempted = false;
}

}  // namespace

void noteWorldSize(int worldSize) { notedWorldSize.store(worldSize, std::memory_order_relaxed); }

std::unique_ptr<Registration> registerGroup(const GroupSetup& setup, std::function<std::string()> describe) {
  std::unique_ptr<Registration> registration;
  try {
    static std::once_flag forkHandler;
    std::call_once(forkHandler, [] { pthread_atfork(nullptr, nullptr, resetRegistryInChild); });
    std::lock_guard<std::mutex> lock(registryMutex);
    if (registered == 0) attempted = false;
    if (!attempted && setup.size > 1) {
      attempted = true;
      try {
        if (env::statusServer()) server = startServer(setup).release();
      } catch (const std::exception& error) {  // a store error, an unreadable key file
        DDPLITE_LOG(kWarn, "rank ", setup.globalRank, ": live status off: ", error.what());
      }
    }
    registration = std::make_unique<Registration>(++nextId);
    ++registered;  // from here on, the registration's destructor (after the lock is released) undoes it
    if (server != nullptr) server->add(registration->id(), std::move(describe));
  } catch (const std::exception& error) {  // no memory: the group runs without a status entry
    DDPLITE_LOG(kWarn, "rank ", setup.globalRank, ": live status off for this group: ", error.what());
  }
  return registration;
}

Registration::~Registration() {
  Server* last = nullptr;
  {
    std::lock_guard<std::mutex> lock(registryMutex);
    if (server != nullptr) server->remove(id_);
    if (--registered == 0) std::swap(last, server);
  }
  delete last;  // outside the lock: joins the thread, which may be finishing a query
}

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (const unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace ddplite::health
