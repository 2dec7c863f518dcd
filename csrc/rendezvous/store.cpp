#include "rendezvous/store.hpp"

#include <thread>

#include "common/errors.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace ddplite {

namespace {
constexpr const char* kNamespace = "ddplite/";
constexpr const char* kFailureKey = "ddplite/failure";
constexpr const char* kFailureReadKey = "ddplite/failure/read";
constexpr const char* kRendezvousHint =
    "every rank of the group must call init_process_group/new_group with the same "
    "world size; check that the rank named above started and reached it. If the store outlives "
    "runs (a file:// path, a store passed to init_process_group) and an earlier run on it "
    "crashed during set-up, its run counter (ddplite/runs/size<N>) can pair this run's ranks wrongly: "
    "start from a fresh store";
}  // namespace

void StoreRendezvous::set(const std::string& key, const std::string& value) {
  store_->set(kNamespace + prefix_ + key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string StoreRendezvous::get(const std::string& key, const std::string& waitingFor) {
  try {
    auto bytes = store_->get(kNamespace + prefix_ + key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& error) {
    throwDistError(strCat("rendezvous failed while waiting for ", waitingFor, ": ", error.what()), kRendezvousHint);
  }
}

std::optional<std::string> StoreRendezvous::getBefore(const std::string& key, const std::string& waitingFor,
                                                      std::chrono::steady_clock::time_point deadline,
                                                      const std::atomic<bool>* stop) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kLongestPause = std::chrono::milliseconds(50);
  auto pause = std::chrono::milliseconds(1);
  const std::string full = kNamespace + prefix_ + key;
  while (true) {
    bool present = false;
    try {
      present = store_->check({full});
    } catch (const std::exception& error) {
      throwDistError(strCat("rendezvous failed while waiting for ", waitingFor, ": ", error.what()), kRendezvousHint);
    }
    if (present) return get(key, waitingFor);
    const auto now = Clock::now();
    if (now >= deadline || (stop != nullptr && stop->load())) return std::nullopt;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, kLongestPause);
  }
}

std::vector<std::string> StoreRendezvous::gatherAll(const std::string& key, int size, const std::string& waitingFor) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) keys.push_back(strCat(kNamespace, prefix_, key, r));
  std::vector<std::string> values;
  values.reserve(keys.size());
  try {
    if (store_->hasExtendedApi()) {
      for (auto& bytes : store_->multiGet(keys)) values.emplace_back(bytes.begin(), bytes.end());
    } else {
      for (const auto& one : keys) {
        auto bytes = store_->get(one);
        values.emplace_back(bytes.begin(), bytes.end());
      }
    }
    return values;
  } catch (const std::exception& error) {
    throwRoundFailed(key, size, waitingFor, error);
  }
}

void StoreRendezvous::throwRoundFailed(const std::string& key, int size, const std::string& waitingFor,
                                       const std::exception& error) {
  std::string missing;  // the error path only: one check per rank
  int listed = 0;
  for (int r = 0; r < size; ++r) {
    std::optional<bool> present = has(strCat(key, r));
    if (present.value_or(true)) continue;
    if (listed++ < 8) missing += strCat(missing.empty() ? "" : ", ", r);
  }
  if (listed > 8) missing += strCat(" and ", listed - 8, " more");
  throwDistError(strCat("rendezvous failed while waiting for ", waitingFor,
                        missing.empty() ? std::string() : strCat(" (missing: rank ", missing, ")"), ": ", error.what()),
                 kRendezvousHint);
}

std::vector<std::string> StoreRendezvous::allGather(const std::string& key, int rank, int size,
                                                    const std::string& value, const std::string& waitingFor) {
  set(strCat(key, rank), value);
  return gatherAll(key, size, waitingFor);
}

std::string StoreRendezvous::getAfterRound(const std::string& key, const std::string& roundKey, int size,
                                           const std::string& waitingFor) {
  try {
    auto bytes = store_->get(kNamespace + prefix_ + key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& error) {
    throwRoundFailed(roundKey, size, waitingFor, error);
  }
}

std::string StoreRendezvous::barrier(const std::string& key, int rank, int size, const std::string& failure,
                                     const std::string& waitingFor) {
  // "<key>done" holds "ok" or "failed <first failure>".
  const std::string ok = "ok";
  const std::string failed = "failed ";
  const std::string base = kNamespace + prefix_ + key;
  auto text = [](const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); };
  auto bytesOf = [](const std::string& value) { return std::vector<uint8_t>(value.begin(), value.end()); };
  try {
    store_->set(strCat(base, rank), bytesOf(failure.empty() ? ok : failure));
    if (!failure.empty()) store_->compareSet(base + "failure", {}, bytesOf(failure));
    if (store_->add(base + "count", 1) == size) {
      const std::string first = store_->check({base + "failure"}) ? text(store_->get(base + "failure")) : "";
      store_->set(base + "done", bytesOf(first.empty() ? ok : failed + first));
    }
    const std::string verdict = text(store_->get(base + "done"));  // waits up to the store's timeout
    return verdict == ok ? std::string() : verdict.substr(failed.size());
  } catch (const std::exception& error) {
    throwRoundFailed(key, size, waitingFor, error);
  }
}

std::string StoreRendezvous::compareSet(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  auto bytes = store_->compareSet(kNamespace + prefix_ + key, std::vector<uint8_t>(expected.begin(), expected.end()),
                                  std::vector<uint8_t>(desired.begin(), desired.end()));
  return std::string(bytes.begin(), bytes.end());
}

std::optional<bool> StoreRendezvous::has(const std::string& key) {
  try {
    return store_->check({kNamespace + prefix_ + key});
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

int64_t StoreRendezvous::add(const std::string& key, int64_t amount) {
  try {
    return store_->add(kNamespace + prefix_ + key, amount);
  } catch (const std::exception& error) {
    throwDistError(strCat("rendezvous failed while counting '", key, "' in the store: ", error.what()),
                   "the store (MASTER_ADDR:MASTER_PORT, or the file:// path) must stay reachable during set-up");
  }
}

void StoreRendezvous::erase(const std::string& key) {
  try {
    store_->deleteKey(kNamespace + prefix_ + key);
  } catch (const std::exception&) {
  }
}

std::string StoreRendezvous::storeHost() const {
  c10::intrusive_ptr<c10d::Store> store = store_;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get())) store = prefixed->getUnderlyingNonPrefixStore();
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get())) return tcp->getHost();
  return "";
}

void StoreRendezvous::recordFailure(const std::string& reason) {
  try {
    // compareSet keeps the first reason: later ones are usually the cascade.
    store_->compareSet(kFailureKey, {}, std::vector<uint8_t>(reason.begin(), reason.end()));
  } catch (const std::exception&) {
  }
}

std::optional<std::string> StoreRendezvous::recordedFailure() {
  try {
    if (!store_->check({kFailureKey})) {
      return std::nullopt;
    }
    auto bytes = store_->get(kFailureKey);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void StoreRendezvous::countFailureRead() {
  try {
    store_->add(kFailureReadKey, 1);
  } catch (const std::exception&) {
  }
}

void StoreRendezvous::awaitFailureReadByAll(int size, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  try {
    while (store_->add(kFailureReadKey, 0) < size && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
  }
}

}  // namespace ddplite
