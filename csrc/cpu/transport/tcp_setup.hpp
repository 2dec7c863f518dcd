// Internal to the TCP transport (tcp.cpp, tcp_on_demand.cpp): the set-up handshake's wire
// format, the state of a mesh being built, and the socket helpers both files use.
#pragma once

#include "common/env.hpp"
#include "common/errors.hpp"
#include "common/fd_limits.hpp"
#include "common/fork_guard.hpp"
#include "cpu/transport/auth.hpp"
#include "cpu/transport/net_iface.hpp"
#include "cpu/transport/tcp.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace ddplite {
namespace tcp_detail {

constexpr int kPollSliceMs = 100;
constexpr size_t kCoalesceBytes = 4096;
// Set-up handshake (auth.hpp). With DDPLITE_AUTH=0 the connector only sends a plain Hello.
constexpr uint32_t kHelloMagic = 0xdd911e01;      // Hello without a MAC (DDPLITE_AUTH=0)
constexpr uint32_t kAuthHelloMagic = 0xdd911e02;  // Hello with a MAC
constexpr uint32_t kChallengeMagic = 0xdd911e03;
constexpr uint32_t kAckMagic = 0xdd911e04;
// On demand (tcp_on_demand.cpp): the Hello says so (a listener of either kind refuses the other's),
// and the listener always answers with an Ack (it keeps the connection) or a Reject (it keeps its
// own connection to this rank), with a MAC when authenticating, zeros without.
constexpr uint32_t kOnDemandHelloMagic = 0xdd911e05;      // without a MAC (DDPLITE_AUTH=0)
constexpr uint32_t kOnDemandAuthHelloMagic = 0xdd911e06;  // with a MAC
constexpr uint32_t kRejectMagic = 0xdd911e07;
// How long an accepted connection may take to complete its handshake, and how many may be
// pending at once beyond the peers still expected (none on demand): a stranger holds up nothing
// but its slot. Past the cap, one drawn at random is dropped (TcpTransport::pendingToDrop). At
// most kAcceptsPerPass are accepted before the handshakes under way advance again.
constexpr auto kHandshakeLimit = std::chrono::seconds(10);
constexpr size_t kMaxPendingHandshakes = 64;
constexpr int kAcceptsPerPass = 16;

struct Challenge {
  uint32_t magic;
  auth::Nonce nonce;
};

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t size;
  auth::Nonce nonce;
  auth::Digest mac;
};

struct Ack {
  uint32_t magic;
  auth::Digest mac;
};

// The handshake's bytes are the structs' bytes: no padding may creep in.
static_assert(sizeof(Challenge) == 20 && sizeof(Hello) == 60 && sizeof(Ack) == 36, "handshake layout");

auth::Digest helloMac(const std::string& secret, const auth::Nonce& challenge, const Hello& hello, int listenerRank);
auth::Digest ackMac(const std::string& secret, const auth::Nonce& challenge, const Hello& hello, int listenerRank);
// The listener's refusal of an on-demand connection (it keeps its own): proven like an Ack.
auth::Digest rejectMac(const std::string& secret, const auth::Nonce& challenge, const Hello& hello, int listenerRank);

int millisUntil(Deadline deadline);
[[noreturn]] void throwSocketError(int rank, const char* call, const std::string& about, int error, int groupSize = 0);
void checkCall(int result, int rank, const char* call, const std::string& about, int groupSize = 0);
void setBlocking(int fd, bool blocking, int rank, const std::string& about);
void tuneDataSocket(int fd, int rank, const std::string& about);
net::Endpoint parseAddress(const std::string& hostPort, int rank, unsigned localScope = 0);
// Set-up I/O on a non-blocking socket: all `bytes` before `deadline`, or false with errno set
// (ETIMEDOUT past the deadline, ECONNRESET when the other end closed, ECANCELED once `stop`).
bool writeBefore(int fd, const void* data, size_t bytes, Deadline deadline, const std::atomic<bool>* stop = nullptr);
bool readBefore(int fd, void* data, size_t bytes, Deadline deadline, const std::atomic<bool>* stop = nullptr);
std::string familyMismatch(int rank, const std::string& myAddress, int mine, int peer, const std::string& peerAddress,
                           int peerFamily);
std::string familyHint();
// Whether the other end of a connection has closed it (or it failed), without reading from it.
bool closedByPeer(int fd);
std::string unreachableHint();

// Owns a descriptor during set-up, so that every exit path, exceptions included, closes it. One
// made with a `guardOwner` is registered with fork_guard under that owner (adoptNew, at its
// creation) and closed through it; release() hands it over still registered.
class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1, const void* guardOwner = nullptr) : fd_(fd), guardOwner_(guardOwner) {}
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  UniqueFd(UniqueFd&& other) noexcept : guardOwner_(other.guardOwner_) { fd_ = other.release(); }
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      guardOwner_ = other.guardOwner_;
      fd_ = other.release();
    }
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  void reset() {
    if (fd_ < 0) return;
    if (guardOwner_ != nullptr) {
      fork_guard::close(fd_, guardOwner_);
    } else {
      close(fd_);
    }
    fd_ = -1;
  }

  int fd_;
  const void* guardOwner_;
};

}  // namespace tcp_detail

// What every step of building the mesh needs to know and to say in its errors.
struct TcpTransport::MeshSetup {
  StoreRendezvous& rendezvous;
  int rank;
  int size;
  Deadline deadline;
  std::string purpose;    // store-key prefix of this mesh ("" or "p2p/")
  std::string host;       // the address this rank listens on, and why it was chosen
  std::string why;
  std::string myAddress;  // host:port ("[host]:port" for IPv6), once listening
  std::string secret;     // the mesh's shared secret (auth.hpp); "" with DDPLITE_AUTH=0
  unsigned scope = 0;     // interface index of `host` when it is IPv6 link-local (0 otherwise)
  // Whether the store held a set-up failure before this mesh began (a failure recorded earlier in
  // the group's life, e.g. a mesh built for a check on a group that has failed): only a failure
  // recorded after that ends the wait for higher ranks early.
  bool failureRecordedBefore = false;
  // On demand: the transport's abort flag; every wait of a connect ends when it is set.
  const std::atomic<bool>* aborted = nullptr;
  // The transport the mesh's descriptors belong to: each is registered with fork_guard under it
  // as it is created (socket(), accept4()), so that a child forked during a handshake (a
  // DataLoader worker, while a pair connects on demand) holds no copy of it.
  const void* fdOwner = nullptr;
  // DDPLITE_TEST_HOOKS=tcp_hello_delay=<ms>: an on-demand connect sleeps this long between its
  // connect and its Hello (two ranks connecting to each other race for sure). Tests only.
  std::chrono::milliseconds helloDelay{0};

  std::string addressKey(int peer) const { return strCat(purpose, "addr/", peer); }
  std::string peerAddress(int peer) const {
    return rendezvous.get(addressKey(peer), strCat("the address of rank ", peer));
  }
  bool authenticates() const { return !secret.empty(); }
};

// A connection accepted by the listener whose handshake is not complete yet.
struct TcpTransport::PendingHandshake {
  tcp_detail::UniqueFd fd;
  std::string from;  // the connecting end's address, for warnings
  Deadline until;    // dropped when its Hello is not complete by then
  auth::Nonce challenge{};
  tcp_detail::Hello hello{};
  size_t received = 0;  // bytes of `hello` read so far
};


// The on-demand state of a transport (tcp_on_demand.cpp).
struct TcpTransport::OnDemand {
  explicit OnDemand(MeshSetup meshSetup) : setup(std::move(meshSetup)) {}
  MeshSetup setup;               // deadline unused (each connect has its transfer's)
  int listener = -1;              // registered with fork_guard; closed by stopAcceptor
  int wakeFd = -1;                // eventfd that ends the acceptor's poll (stop); likewise
  std::atomic<bool> stop{false};
  std::mutex mutex;               // guards connecting, addresses_, and each fds_ write
  std::condition_variable connected;  // notified under `mutex` when a peer's fd is published
  std::vector<char> connecting;   // by peer: this rank's own connect to it is under way
  std::function<void()> onAccepted;
  // Heap-held so that a forked child, where the thread does not exist, can leak it.
  std::unique_ptr<std::thread> acceptor;
};

}  // namespace ddplite
