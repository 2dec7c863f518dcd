// Bootstrap through the c10d::Store that torch hands the backend.
//
// The store torch passes is already a PrefixStore unique to this process group, so every key
// below is per group; StoreRendezvous adds a "ddplite/" namespace of its own so that nothing
// collides with torch's keys in the same prefix.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace ddplite {

class StoreRendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  // The same store with every set/get key under `prefix` as well (a subset of the group's ranks
  // running a set-up of their own); the failure record stays the group's.
  StoreRendezvous prefixed(const std::string& prefix) const {
    StoreRendezvous view(store_);
    view.prefix_ = prefix_ + prefix;
    return view;
  }

  void set(const std::string& key, const std::string& value);
  // Blocks until the key exists or the store's timeout passes (then throws DistBackendError).
  std::string get(const std::string& key, const std::string& waitingFor);
  // get() bounded by `deadline` and `stop` instead of the store's timeout: looks (Store::check)
  // every 1 ms at first, backing off to every 50 ms, until the key exists; nothing once the
  // deadline passed or *stop is set. A store that cannot be reached throws as get() does. The
  // bound holds between looks: one look at a store host that stopped answering lasts up to the
  // store's own timeout.
  std::optional<std::string> getBefore(const std::string& key, const std::string& waitingFor,
                                       std::chrono::steady_clock::time_point deadline,
                                       const std::atomic<bool>* stop);
  // Every rank's value of "<key><r>", r = 0 .. size-1, once all are set: one request where the
  // store serves several keys at once (Store::multiGet: TCPStore, torchrun's store), else one get
  // per rank. So a round of set-up costs each rank O(1) store requests, not one per peer (issue
  // 27). A timeout names the ranks whose key is missing. gatherAll only reads; allGather sets
  // this rank's value first.
  std::vector<std::string> gatherAll(const std::string& key, int size, const std::string& waitingFor);
  std::vector<std::string> allGather(const std::string& key, int rank, int size, const std::string& value,
                                     const std::string& waitingFor);
  // get(key) for a value one rank publishes after reading a gatherAll round on `roundKey`: a
  // timeout names the ranks missing from that round, as gatherAll's does.
  std::string getAfterRound(const std::string& key, const std::string& roundKey, int size,
                            const std::string& waitingFor);
  // A set-up round that only needs to know whether every rank got through: O(1) requests and
  // bytes per rank at any size (gatherAll's multiGet returns P values to each of P ranks). Each
  // rank sets "<key><rank>" (so that a timeout can name the missing ranks), records `failure` if
  // it has one (compareSet on "<key>failure": the first one stays), then adds 1 to "<key>count".
  // The rank whose add brings the count to `size` publishes "<key>done" = the first recorded
  // failure, or nothing; every rank waits for that key. Returns the first failure ("" for none),
  // the same on every rank. A rank's writes before the call are visible to every rank after it
  // (each store request is a round trip to the one store, in order).
  std::string barrier(const std::string& key, int rank, int size, const std::string& failure,
                      const std::string& waitingFor);
  // Store::compareSet: sets `desired` if the key holds `expected` ("" for absent) and returns the
  // value the key holds afterwards: with expected "", the first caller's value, for every caller.
  // Store errors propagate as the store raised them (the caller names its op).
  std::string compareSet(const std::string& key, const std::string& expected, const std::string& desired);
  // Whether the key exists, without waiting; nothing when the store cannot be reached.
  std::optional<bool> has(const std::string& key);
  // Store::add (creates the counter at 0): the value after adding.
  int64_t add(const std::string& key, int64_t amount);
  // Store::deleteKey; store errors are swallowed (cleanup must not fail a run that worked).
  void erase(const std::string& key);

  // The host of the TCPStore under this store's prefixes ("::1", "10.0.0.1", a name), "" when it is
  // not a TCPStore (file://, a HashStore): the address family ranks listen in may follow it.
  std::string storeHost() const;

  // Failure broadcast: the first rank that sees a peer fail records the root cause here before
  // it tears its connections down, so that ranks which only see the cascade can name the rank
  // that really failed. Both calls swallow store errors: the store host may be the rank that died.
  void recordFailure(const std::string& reason);
  std::optional<std::string> recordedFailure();
  // Set-up failures: each rank that raises one counts itself here once it has read (or recorded)
  // the first failure. A rank that may host the store (rank 0 under env:// or tcp://) waits, up to
  // `limit`, until every rank of the group has counted, so its exit does not take the record away
  // from ranks still about to read it. Store errors are swallowed.
  void countFailureRead();
  void awaitFailureReadByAll(int size, std::chrono::milliseconds limit);

 private:
  // The error of a round that timed out, naming (up to 8 of) the ranks whose "<key><r>" is missing.
  [[noreturn]] void throwRoundFailed(const std::string& key, int size, const std::string& waitingFor,
                                     const std::exception& error);

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
};

}  // namespace ddplite
