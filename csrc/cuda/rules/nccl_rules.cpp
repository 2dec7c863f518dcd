#include "cuda/rules/nccl_rules.hpp"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace ddplite::nccl::rules {

namespace {

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

int parseInt(const std::string& text, const std::string& whole) {
  size_t used = 0;
  int value = 0;
  try {
    value = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw std::invalid_argument("bad GPU identity '" + whole + "'");
  return value;
}

bool sameGpu(const GpuIdentity& a, const GpuIdentity& b) {
  return a.uuid == b.uuid || (a.host == b.host && a.busId == b.busId);
}

}  // namespace

std::string encodeIdentity(const GpuIdentity& identity) {
  std::ostringstream out;
  out << identity.host << '|' << identity.busId << '|' << identity.uuid << '|' << identity.ccMajor << '.'
      << identity.ccMinor << '|' << (identity.multiRankGpu ? 1 : 0);
  return out.str();
}

GpuIdentity decodeIdentity(const std::string& text) {
  // The host comes first and may itself hold '|' (NCCL_HOSTID is free text): split from the right.
  std::vector<std::string> parts = split(text, '|');
  if (parts.size() < 5) throw std::invalid_argument("bad GPU identity '" + text + "'");
  const size_t n = parts.size();
  GpuIdentity identity;
  for (size_t i = 0; i + 4 < n; ++i) identity.host += (i ? "|" : "") + parts[i];
  identity.busId = parts[n - 4];
  identity.uuid = parts[n - 3];
  const std::vector<std::string> cc = split(parts[n - 2], '.');
  if (cc.size() != 2) throw std::invalid_argument("bad GPU identity '" + text + "'");
  identity.ccMajor = parseInt(cc[0], text);
  identity.ccMinor = parseInt(cc[1], text);
  if (parts[n - 1] != "0" && parts[n - 1] != "1") throw std::invalid_argument("bad GPU identity '" + text + "'");
  identity.multiRankGpu = parts[n - 1] == "1";
  return identity;
}

SharedGpuDecision sharedGpu(const std::vector<GpuIdentity>& identities) {
  SharedGpuDecision decision;
  bool everyRankMultiRank = true;
  for (const auto& identity : identities) everyRankMultiRank = everyRankMultiRank && identity.multiRankGpu;
  for (size_t a = 0; a < identities.size() && decision.sharedGpu.empty(); ++a) {
    for (size_t b = a + 1; b < identities.size(); ++b) {
      if (!sameGpu(identities[a], identities[b])) continue;
      std::ostringstream out;
      out << "ranks " << a << " and " << b << " are both on GPU " << identities[a].uuid;
      if (identities[a].uuid != identities[b].uuid) out << " and " << identities[b].uuid << " (MIG slices of one GPU)";
      out << " (PCI bus " << identities[a].busId << ", host " << identities[a].host << ")";
      decision.sharedGpu = out.str();
      break;
    }
  }
  decision.ncclServes = decision.sharedGpu.empty() || everyRankMultiRank;
  return decision;
}

int minComputeCapability(const std::vector<GpuIdentity>& identities) {
  int lowest = 0;
  for (size_t i = 0; i < identities.size(); ++i) {
    const int cc = identities[i].ccMajor * 10 + identities[i].ccMinor;
    lowest = i == 0 ? cc : std::min(lowest, cc);
  }
  return lowest;
}

std::string fp8ReductionRefusal(bool ncclHasFp8, int minCompCap) {
  if (!ncclHasFp8) return "float8 reductions need NCCL >= 2.24, and ddplite was built against an older one";
  if (minCompCap < 90) {
    std::ostringstream out;
    out << "NCCL reduces float8 only on GPUs of compute capability 9.0 or newer, and the lowest in this group is "
        << minCompCap / 10 << "." << minCompCap % 10;
    return out.str();
  }
  return "";
}

std::string identityKey(int ordinal, int rank) {
  return "nccl/device" + std::to_string(ordinal) + "/identity/rank" + std::to_string(rank);
}

std::string uniqueIdKey(int ordinal) {
  return "nccl/device" + std::to_string(ordinal) + "/uid";
}

PollResult pollWhileInProgress(const std::function<int()>& query, int inProgress, int success,
                               const std::function<std::chrono::steady_clock::time_point()>& now,
                               std::chrono::steady_clock::time_point deadline, const std::function<void()>& pause,
                               const std::function<bool()>& cancelled) {
  PollResult result{PollOutcome::kDone, success, 0};
  while (true) {
    result.lastCode = query();
    ++result.polls;
    if (result.lastCode == success) return result;
    if (result.lastCode != inProgress) {
      result.outcome = PollOutcome::kFailed;
      return result;
    }
    if (now() >= deadline) {
      result.outcome = PollOutcome::kTimedOut;
      return result;
    }
    if (cancelled && cancelled()) {
      result.outcome = PollOutcome::kCancelled;
      return result;
    }
    pause();
  }
}

SplitArgs splitArgs(const std::vector<int>& members, int parentRank, int noColor) {
  const auto me = std::find(members.begin(), members.end(), parentRank);
  if (me == members.end()) return SplitArgs{noColor, 0};
  return SplitArgs{*std::min_element(members.begin(), members.end()), static_cast<int>(me - members.begin())};
}

ShrinkPlan shrinkPlan(bool builtWithShrink, Version loaded, bool parentUsable, bool abortPending) {
  if (!builtWithShrink) {
    return {ShrinkComm::kNewCommunicator, kNcclShrinkDefault,
            "ddplite was built against an NCCL without ncclCommShrink (before 2.27)"};
  }
  if (loaded.major < 2 || (loaded.major == 2 && loaded.minor < 27)) {
    return {ShrinkComm::kNewCommunicator, kNcclShrinkDefault,
            "the NCCL this process loaded is older than 2.27 (no ncclCommShrink)"};
  }
  if (!parentUsable) {
    return {ShrinkComm::kNewCommunicator, kNcclShrinkDefault,
            "the parent group's communicator was aborted, failed, or has work outstanding without SHRINK_ABORT"};
  }
  return {ShrinkComm::kShrinkParent, abortPending ? kNcclShrinkAbort : kNcclShrinkDefault,
          abortPending ? "ncclCommShrink with NCCL_SHRINK_ABORT" : "ncclCommShrink"};
}

std::vector<size_t> unpairedSelfOps(const std::vector<SelfOp>& ops) {
  std::map<int, std::pair<std::vector<size_t>, std::vector<size_t>>> byDevice;  // sends, receives
  for (size_t i = 0; i < ops.size(); ++i) {
    auto& [sends, receives] = byDevice[ops[i].device];
    (ops[i].send ? sends : receives).push_back(i);
  }
  std::vector<size_t> unpaired;
  for (const auto& [device, lists] : byDevice) {
    const auto& [sends, receives] = lists;
    for (size_t k = 0; k < std::max(sends.size(), receives.size()); ++k) {
      const bool paired = k < sends.size() && k < receives.size() && ops[sends[k]].bytes == ops[receives[k]].bytes;
      if (paired) continue;
      if (k < sends.size()) unpaired.push_back(sends[k]);
      if (k < receives.size()) unpaired.push_back(receives[k]);
    }
  }
  std::sort(unpaired.begin(), unpaired.end());
  return unpaired;
}

Teardown teardownFor(TeardownCause cause, bool groupBroken) {
  if (groupBroken) return Teardown::kAbort;  // nothing queued will finish: NCCL may never return
  return cause == TeardownCause::kShutdown ? Teardown::kDrainThenDestroy : Teardown::kAbort;
}

}  // namespace ddplite::nccl::rules
