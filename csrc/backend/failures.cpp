// Failure handling of a group, the DdpliteBackend members behind torch's view of dead ranks:
//   * failed_ranks (failedRanks, peerProcessEnded): which ranks of the group have failed, from
//     each rank's published process identity ("proc/<rank>", checked where this host can see
//     the process) and the ranks' own reports in the group's store;
//   * shrink_group (shrink, torch 2.10+): a new group of the survivors, after the exclusion
//     agreement (agreeOnExclusion: one decision per shrink, compare-set in the store) and, for
//     CUDA, the coordination of each device's ncclCommShrink (shrinkCoordination,
//     keepDevicesEverySurvivorShrunk).
// Threading: the caller's thread (torch calls these from Python); the store is the only state
// shared with the other ranks, and every wait on it has the group's deadline.
#include "backend/backend.hpp"

#include "common/logging.hpp"
#include "common/process_identity.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ddplite {

bool DdpliteBackend::peerProcessEnded(int peer) {
  const std::optional<bool> published = rendezvous_.has(strCat("proc/", peer));
  if (!published || !*published) return false;
  std::istringstream identity(rendezvous_.get(strCat("proc/", peer), strCat("rank ", peer, "'s process")));
  ProcessIdentity theirs;
  std::string host;
  if (!(identity >> theirs.pid >> theirs.startTicks >> theirs.pidNamespace) || !std::getline(identity >> std::ws, host)) {
    return false;  // not one this build writes: unknown
  }
  // Only on this host can /proc say anything of it (stateOf compares the PID namespaces).
  return host == cpu::CpuPath::hostIdentity() && stateOf(theirs) == ProcessState::kEnded;
}

std::vector<int> DdpliteBackend::failedRanks(std::chrono::milliseconds wait) {
  const OpContext ctx{rank_, size_, "failed_ranks", seq_.load()};
  refuseInForkedChild(ctx);
  const uint64_t round = ++failedRankRounds_;
  StoreRendezvous keys = rendezvous_.prefixed(strCat("failed-ranks/", round, "/"));
  const auto storeFailed = [&](const std::exception& error) {
    throwDistError(ctx, strCat("failed_ranks call #", round, ": the group's store could not be reached: ", error.what()),
                   "the store must outlive the failed ranks: torchrun's agent hosts it; under env:// or tcp:// "
                   "rank 0's process does, so rank 0's death takes it away");
  };
  try {
    keys.set(strCat("alive/", rank_), "1");
  } catch (const std::exception& error) {
    storeFailed(error);
  }
  std::vector<char> present(static_cast<size_t>(size_), 0);
  std::vector<char> ended(static_cast<size_t>(size_), 0);
  present[static_cast<size_t>(rank_)] = 1;
  const Deadline until = Clock::now() + wait;
  while (true) {
    bool settled = true;
    for (int peer = 0; peer < size_; ++peer) {
      auto i = static_cast<size_t>(peer);
      if (present[i] || ended[i]) continue;
      if (keys.has(strCat("alive/", peer)).value_or(false)) {
        present[i] = 1;
      } else if (peerProcessEnded(peer)) {
        ended[i] = 1;
      } else {
        settled = false;
      }
    }
    if (settled || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string proposal;
  for (int peer = 0; peer < size_; ++peer) {
    if (!present[static_cast<size_t>(peer)]) proposal += strCat(proposal.empty() ? "" : ",", peer);
  }
  std::string decided;
  try {
    decided = keys.compareSet("decision", "", proposal.empty() ? "none" : proposal);
  } catch (const std::exception& error) {
    storeFailed(error);
  }
  std::vector<int> failed;
  if (decided != "none") {
    std::istringstream items(decided);
    for (std::string item; std::getline(items, item, ',');) failed.push_back(std::stoi(item));
  }
  if (std::find(failed.begin(), failed.end(), rank_) != failed.end()) {
    throwDistError(ctx, strCat("the other ranks declared this rank failed (failed_ranks call #", round, ": ", decided,
                               "): it called failed_ranks after their wait ended"),
                   "this rank should leave the job (the survivors may shrink the group without it); give failed_ranks "
                   "a longer wait on every rank if live ranks are slow to notice a failure");
  }
  return failed;
}

#if DDPLITE_TORCH_HAS_SHRINK
namespace {
constexpr int kShrinkAbort = 0x01;  // torch.distributed.SHRINK_ABORT

std::string listOf(const std::vector<int>& ranks) {
  std::string listed;
  for (int r : ranks) listed += strCat(listed.empty() ? "" : ", ", r);
  return strCat("[", listed, "]");
}

// Whether a list written by listOf names `rank`.
bool listNames(const std::string& listed, int rank) {
  const std::string inner = listed.size() >= 2 ? listed.substr(1, listed.size() - 2) : std::string();
  size_t start = 0;
  while (start < inner.size()) {
    size_t comma = inner.find(',', start);
    if (comma == std::string::npos) comma = inner.size();
    if (std::stoi(inner.substr(start, comma - start)) == rank) return true;
    start = comma + 1;
  }
  return false;
}
}  // namespace

c10::intrusive_ptr<c10d::Backend> DdpliteBackend::shrink(const std::vector<int64_t>& excluded, int flags,
                                                         const c10::intrusive_ptr<Options>& opts) {
  const OpContext ctx{rank_, size_, "shrink_group", seq_.load()};
  refuseInForkedChild(ctx);
  std::lock_guard<std::mutex> lock(splitMutex_);
  std::vector<int> gone(excluded.begin(), excluded.end());
  std::sort(gone.begin(), gone.end());
  const bool distinct = std::adjacent_find(gone.begin(), gone.end()) == gone.end();
  if (gone.empty() || !distinct || gone.front() < 0 || gone.back() >= size_ ||
      static_cast<int>(gone.size()) >= size_) {
    throwValueError(ctx, strCat("ranks to exclude ", listOf(gone), " are not distinct ranks of this group of ", size_,
                                ", or leave no rank"),
                    "pass the ranks that failed (torch_ddp_lite reports them in its errors), each once");
  }
  if (std::binary_search(gone.begin(), gone.end(), rank_)) {
    throwDistError(ctx, strCat("rank ", rank_, " is among the ranks to exclude ", listOf(gone)),
                   "only the ranks that stay call shrink_group; an excluded rank should exit");
  }
  if (opts && opts->backend != kName) {
    throwValueError(ctx, strCat("pg_options are ", opts->backend, "'s options; a ddplite group takes ddplite's"),
                    "pass torch_ddp_lite.Options(timeout=...) or no pg_options (the group's are kept)");
  }
  const uint64_t epoch = ++shrinks_;
  const bool abortPending = (flags & kShrinkAbort) != 0;
  std::unique_ptr<CudaSplit> cudaShrunk;
  std::vector<int> survivors;
  try {
    std::vector<int> cudaAgreed;  // the devices every survivor can shrink the communicator of
    survivors = agreeOnExclusion(ctx, epoch, gone, cuda_ ? cuda_->shrinkReadiness(abortPending) : std::string(),
                                 &cudaAgreed);
    // Among the agreed survivors, before abort() would abort the communicators it shrinks.
    if (cuda_ && !cudaAgreed.empty()) {  // the same set on every survivor: all or none go on
      cudaShrunk = cuda_->shrink(gone, abortPending, cudaAgreed, shrinkCoordination(epoch));
      keepDevicesEverySurvivorShrunk(ctx, epoch, survivors, cudaShrunk);
    }
  } catch (...) {
    if (abortPending) abort();  // the pending ops fail now, not at their timeout
    throw;
  }
  if (abortPending) abort();
  const int newRank = static_cast<int>(std::lower_bound(survivors.begin(), survivors.end(), rank_) - survivors.begin());
  auto childStore = c10::make_intrusive<c10d::PrefixStore>(strCat("ddplite-shrink/", epoch, "/"), store_);
  TraceGroupIdentity trace{opts ? compat::groupName(*opts) : std::string(), opts ? compat::groupDesc(*opts) : std::string(), {}};
  for (int r : survivors) trace.globalRanks.push_back(globalRanks_[r]);
  const auto timeout = opts ? opts->timeout : std::chrono::milliseconds(timeoutMs_.load());
  DDPLITE_LOG(kInfo, "rank ", rank_, "/", size_, ": shrink #", epoch, " without ", listOf(gone), ": rank ", newRank,
              "/", survivors.size(), " of the new group");
  auto child = c10::make_intrusive<DdpliteBackend>(childStore, newRank, static_cast<int>(survivors.size()), timeout,
                                                   std::move(trace));
  registerLive(child);
  if (cudaShrunk && child->cuda_) child->cuda_->adopt(std::move(cudaShrunk));
  return child;
}

namespace {

// "0,2," (CudaPath::shrinkReadiness) -> {0, 2}.
std::vector<int> ordinalsOf(const std::string& text) {
  std::vector<int> ordinals;
  size_t start = 0;
  for (size_t comma = text.find(','); comma != std::string::npos; comma = text.find(',', start)) {
    ordinals.push_back(std::stoi(text.substr(start, comma - start)));
    start = comma + 1;
  }
  return ordinals;
}

}  // namespace

ShrinkCoordination DdpliteBackend::shrinkCoordination(uint64_t epoch) {
  auto round = std::make_shared<StoreRendezvous>(rendezvous_.prefixed(strCat("shrink/", epoch, "/cuda-failed/")));
  auto lastChecked = std::make_shared<std::map<int, Clock::time_point>>();
  ShrinkCoordination coordination;
  // Called between NCCL's polls (every 100 us): the store is asked at most every 100 ms per device.
  coordination.othersGaveUp = [round, lastChecked](int ordinal) {
    auto& last = (*lastChecked)[ordinal];
    if (Clock::now() - last < std::chrono::milliseconds(100)) return false;
    last = Clock::now();
    return round->has(std::to_string(ordinal)).value_or(false);
  };
  coordination.giveUp = [round](int ordinal) {
    try {
      round->set(std::to_string(ordinal), "1");
    } catch (const std::exception&) {
      // The store is gone: the others' shrink ends at its deadline instead.
    }
  };
  return coordination;
}

void DdpliteBackend::keepDevicesEverySurvivorShrunk(const OpContext& ctx, uint64_t epoch,
                                                    const std::vector<int>& survivors,
                                                    std::unique_ptr<CudaSplit>& shrunk) {
  StoreRendezvous round = rendezvous_.prefixed(strCat("shrink/", epoch, "/cuda-made/"));
  std::vector<int> kept = shrunk ? shrunk->ordinals() : std::vector<int>{};
  std::string mine;
  for (int ordinal : kept) mine += strCat(ordinal, ",");
  const Deadline until = Clock::now() + std::chrono::milliseconds(timeoutMs_.load());
  try {
    round.set(std::to_string(rank_), mine);
    for (int r : survivors) {
      if (r == rank_) continue;
      while (!round.has(std::to_string(r)).value_or(false)) {
        if (peerProcessEnded(r) || Clock::now() >= until) {
          throwDistError(ctx, strCat("shrink #", epoch, ": rank ", r, " did not say which CUDA communicators it "
                                     "shrunk (", peerProcessEnded(r) ? "its process has ended" : "the group's timeout passed",
                                     ")"),
                         strCat("rank ", r, " may have failed during shrink_group: shrink again without it"));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      const std::vector<int> theirs =
          ordinalsOf(round.get(std::to_string(r), strCat("rank ", r, "'s shrunk CUDA devices in shrink #", epoch)));
      std::vector<int> both;
      for (int ordinal : kept) {
        if (std::find(theirs.begin(), theirs.end(), ordinal) != theirs.end()) both.push_back(ordinal);
      }
      kept = std::move(both);
    }
  } catch (const c10::DistBackendError&) {
    throw;
  } catch (const std::exception& error) {
    throwDistError(ctx, strCat("shrink #", epoch, ": the group's store could not be reached: ", error.what()),
                   "the store must outlive the failed ranks");
  }
  if (!shrunk) return;
  shrunk->keepOnly(kept);  // a device one survivor could not shrink gets a new communicator on every one
  if (kept.empty()) shrunk.reset();
}

std::vector<int> DdpliteBackend::agreeOnExclusion(const OpContext& ctx, uint64_t epoch,
                                                  const std::vector<int>& excluded, const std::string& cudaReady,
                                                  std::vector<int>* cudaAgreed) {
  StoreRendezvous round = rendezvous_.prefixed(strCat("shrink/", epoch, "/excluded/"));
  const std::string mine = listOf(excluded);
  const std::string hint = "the store must outlive the failed ranks: torchrun's agent hosts it; under env:// or "
                           "tcp:// rank 0's process does";
  const auto storeFailed = [&](const std::exception& error) {
    throwDistError(ctx, strCat("shrink #", epoch, ": the group's store could not be reached: ", error.what()), hint);
  };
  *cudaAgreed = ordinalsOf(cudaReady);
  try {
    // Before the list: a survivor that sees a peer's list finds its CUDA readiness too.
    round.set(strCat("cuda/", rank_), cudaReady);
    round.set(std::to_string(rank_), mine);
  } catch (const std::exception& error) {
    storeFailed(error);
  }
  // One decision per shrink and list of excluded ranks, the first one written (compareSet), which
  // every survivor with that list follows: "agreed <list>" once one has read every survivor's
  // list, equal to its own; "abandoned by rank r: <why>" once one gave up (a survivor missing at
  // the group's timeout or dead, another list). So those survivors either all build the new group
  // or all raise, and all count this shrink, so that their next try has the same number: one
  // arriving after the others gave up raises at once, naming their decision, instead of building
  // a group nobody else joins. Keyed by the list: a rank the survivors excluded (alive, late, with
  // a list of its own) decides nothing for them, and raises on the lists that differ.
  const std::string decisionKey = strCat("decision/", mine);
  const std::string agreed = strCat("agreed ", mine);
  const auto decide = [&](const std::string& proposal) {
    try {
      return round.compareSet(decisionKey, "", proposal);
    } catch (const std::exception& error) {
      storeFailed(error);
    }
    return std::string();
  };
  const auto throwAbandoned = [&](const std::string& decision) {
    throwDistError(ctx, strCat("shrink #", epoch, " without ", mine, " was ", decision),
                   "every survivor raised this: call shrink_group again on every survivor, excluding the ranks "
                   "named above too if they failed (torch_ddp_lite.failed_ranks() gives every survivor the same list)");
  };
  const auto abandon = [&](const std::string& why) {
    const std::string decided = decide(strCat("abandoned by rank ", rank_, ": ", why));
    if (decided != agreed) throwAbandoned(decided);
    // Another survivor with this list read every list and they agreed before this rank gave up:
    // follow it.
  };
  const auto decisionSoFar = [&]() -> std::optional<std::string> {
    if (!round.has(decisionKey).value_or(false)) return std::nullopt;
    try {
      return round.get(decisionKey, strCat("the decision of shrink #", epoch));
    } catch (const std::exception& error) {
      storeFailed(error);
    }
    return std::nullopt;
  };
  // Bounded by the group's timeout (not the store's, which may be the default group's 30 minutes).
  const Deadline until = Clock::now() + std::chrono::milliseconds(timeoutMs_.load());
  constexpr auto kDecisionLookEvery = std::chrono::milliseconds(100);
  std::vector<int> survivors;
  bool agreedElsewhere = false;
  for (int r = 0; r < size_; ++r) {
    if (std::binary_search(excluded.begin(), excluded.end(), r)) continue;
    survivors.push_back(r);
    if (r == rank_ || agreedElsewhere) continue;
    std::string theirs;
    Deadline nextDecisionLook = Clock::now();
    while (!round.has(std::to_string(r)).value_or(false)) {
      if (Clock::now() >= nextDecisionLook) {
        nextDecisionLook = Clock::now() + kDecisionLookEvery;
        if (auto decision = decisionSoFar(); decision && *decision != agreed) throwAbandoned(*decision);
      }
      const char* why = nullptr;
      if (peerProcessEnded(r)) why = "its process has ended";
      if (why == nullptr && Clock::now() >= until) why = "the group's timeout passed";
      if (why != nullptr) {
        abandon(strCat("rank ", r, " did not join it (", why, "); rank ", r,
                       " may have failed too, or does not call shrink_group: exclude it as well"));
        agreedElsewhere = true;  // every list was read elsewhere, r's included
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (agreedElsewhere) continue;
    try {
      theirs = round.get(std::to_string(r), strCat("rank ", r, "'s list of ranks to exclude in shrink #", epoch));
    } catch (const std::exception& error) {
      storeFailed(error);
    }
    if (theirs != mine && listNames(theirs, rank_)) {
      decide(strCat("abandoned by rank ", rank_, ": rank ", r, " excludes ", theirs, ", rank ", rank_,
                    " among them, while rank ", rank_, " excludes ", mine));
      throwDistError(ctx, strCat("shrink #", epoch, ": rank ", r, " excludes ", theirs, ", rank ", rank_,
                                 " among them, while rank ", rank_, " excludes ", mine, "; the survivors must agree, "
                                 "and a rank they declared failed (dead, stuck or too late) cannot join the group "
                                 "they shrink to"),
                     "this process is out of the job: end it, or rejoin through a launcher that admits new "
                     "ranks (torchft replica groups heal a restarted replica)");
    }
    if (theirs != mine) {
      decide(strCat("abandoned by rank ", rank_, ": rank ", rank_, " excludes ", mine, " but rank ", r, " excludes ",
                    theirs, "; the survivors must agree"));
      throwDistError(ctx, strCat("shrink #", epoch, ": rank ", rank_, " excludes ", mine, " but rank ", r,
                                 " excludes ", theirs, "; the survivors must agree"),
                     "pass the same ranks_to_exclude on every surviving rank (torch_ddp_lite's errors name the "
                     "failed ranks)");
    }
  }
  if (!agreedElsewhere) {
    const std::string decided = decide(agreed);
    if (decided != agreed) throwAbandoned(decided);
  }
  for (int r : survivors) {
    if (r == rank_) continue;
    try {  // the devices both this rank and rank r can shrink (r published them before its list)
      const std::vector<int> theirsReady =
          ordinalsOf(round.get(strCat("cuda/", r), strCat("rank ", r, "'s CUDA readiness in shrink #", epoch)));
      std::vector<int> both;
      for (int ordinal : *cudaAgreed) {
        if (std::find(theirsReady.begin(), theirsReady.end(), ordinal) != theirsReady.end()) both.push_back(ordinal);
      }
      *cudaAgreed = std::move(both);
    } catch (const std::exception& error) {
      storeFailed(error);
    }
  }
  return survivors;
}
#endif

}  // namespace ddplite
