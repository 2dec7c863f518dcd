// The live status query (`python -m torch_ddp_lite.status`, torch_ddp_lite/status.py): each
// process of a job answers, while it runs, what each of its ddplite groups is doing.
//
// One server per process, started by the process's first ddplite group of more than one rank
// (DDPLITE_STATUS=1, the default) and stopped when its last group is destroyed: one listening
// socket on the address the TCP meshes would choose (net::chooseListenAddress), one thread
// ("ddplite-status") that sleeps in poll() until a query comes; no store traffic and nothing on
// the collective path (the groups' describe callbacks read what the ops store with relaxed and
// release stores).
//
// Where the tool finds it, in the job's store with every torch prefix removed (the store torch's
// init_process_group was given: MASTER_ADDR:MASTER_PORT, the file:// path):
//   "ddplite/status/rank/<global rank>" = "<host:port> <pid> <host name>"  (each process)
//   "ddplite/status/auth/<global rank>" = how its queries are authenticated (each process)
//   "ddplite/status/size"               = how many global ranks to ask: the world's size (each
//                                         process writes it, the same value in one job, noted by
//                                         the package: _ddplite_autoload, torchft.py; a later,
//                                         smaller job on the same store overwrites it)
// Each process draws its own secret; no rank waits for another's. The auth value is "none"
// (DDPLITE_AUTH=0: any query is answered), a 64-hex-digit secret (the default: whoever reads the
// store may ask, the trust model of the TCP meshes), or "external <salt> <check>"
// (DDPLITE_AUTH_KEY_FILE: the secret is HMAC(key, "ddplite-mesh|status|" salt) and only holders of
// the key may ask; docs/security.md).
//
// Protocol (one query per connection, read-only: there is no other request):
//   server -> client: "DDPLST01" (8 bytes), nonce (16 random bytes)
//   client -> server: HMAC-SHA256(secret, "ddplite-status|" address "|" nonce)   (32 bytes)
//                     address: the "<host:port>" the client dialled, as published; a proof made
//                     for another address (a relay that rewrote the store) is refused
//   server -> client: length (4 bytes, big-endian), the process's state as JSON (that many bytes),
//                     HMAC-SHA256(secret, "ddplite-status-answer|" nonce JSON) (32 bytes)
// With "none" the proof is not checked and the answer's MAC is zeros. A wrong proof gets the
// length 0xFFFFFFFF and no answer, and is logged (WARN, at most once per 10 s with a count) with
// the asker's address. Every asker is served at once (non-blocking sockets, one poll() over
// all), each within 2 s of its connect, at most 64: a newcomer then pushes out one that has not
// proven the secret, drawn at random, closing it with nothing sent (the tool connects again).
// So strangers that connect and say nothing delay no query.
//
// Threading: registerGroup and ~Registration from any thread (creation and destruction of
// groups); the describe callbacks run on the server thread under the registry's mutex, which
// ~Registration takes too: once it returns, its callback is never called again.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <functional>
#include <memory>
#include <string>

namespace ddplite::health {

struct GroupSetup {
  c10::intrusive_ptr<c10d::Store> store;  // as torch gave it (prefixes are removed here)
  int size = 0;                            // of the group
  int globalRank = 0;                      // of this process
  int globalRanksUpTo = 0;                 // the group's highest global rank, plus one
};

// The world's size as torch.distributed sees it (the default group's size; the group's own when
// there is no default group), noted by the package before it creates each group
// (_ddplite_autoload._create_backend); the published size. Without it, the first group's highest
// global rank plus one. Any thread.
void noteWorldSize(int worldSize);

class Registration {
 public:
  explicit Registration(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

 private:
  const uint64_t id_;
};

// Registers a group's state for the status query: `describe` returns one JSON object. Starts and
// publishes the process's server on the first registration of a group of more than one rank; a
// server that cannot start (no address, a store error, an unreadable key file) is logged and
// left off: the job runs on. Never throws, never waits for another rank.
std::unique_ptr<Registration> registerGroup(const GroupSetup& setup, std::function<std::string()> describe);

// `text` as a JSON string literal (quotes included).
std::string jsonString(const std::string& text);

}  // namespace ddplite::health
