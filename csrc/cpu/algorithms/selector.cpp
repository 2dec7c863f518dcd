#include "cpu/algorithms/selector.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace ddplite::cpu {

namespace {

struct Entry {
  const char* name;
  Algorithm run;
};

// The single source of truth: each collective with its name, its algorithms (the index of one
// is what a pin stores and what the wire fingerprint carries) and its pin. Nothing else lists
// the collectives, so adding one means adding an enum value and a row here.
struct CollectiveTable {
  Collective collective;
  const char* name;
  std::vector<Entry> algorithms;
  // Pinned algorithm index; -1 = automatic. Read on every collective without a lock (relaxed:
  // a pin is a whole value, and pins only change between ops by contract); pinsMutex only
  // serialises writers, so one setAlgorithmPins call is applied as a whole.
  std::atomic<int> pinned{-1};
};

CollectiveTable collectiveTables[] = {
    {Collective::kAllreduce,
     "allreduce",
     {{"naive", &allreduceNaive},
      {"ring", &allreduceRing},
      {"butterfly", &allreduceButterfly},
      {"halving_doubling", &allreduceHalvingDoubling}}},
    {Collective::kBroadcast,
     "broadcast",
     {{"naive", &broadcastNaive}, {"tree", &broadcastBinaryTree}, {"ring", &broadcastRing}}},
    {Collective::kReduce, "reduce", {{"naive", &reduceNaive}, {"tree", &reduceBinaryTree}}},
    {Collective::kAllgather, "allgather", {{"ring", &allgatherRing}, {"doubling", &allgatherDoubling}}},
    {Collective::kReduceScatter,
     "reduce_scatter",
     {{"ring", &reduceScatterRing}, {"halving", &reduceScatterHalving}}},
    {Collective::kBarrier, "barrier", {{"dissemination", &barrierDissemination}}},
};

std::mutex pinsMutex;

CollectiveTable& tableOf(Collective collective) {
  for (CollectiveTable& table : collectiveTables) {
    if (table.collective == collective) return table;
  }
  DDPLITE_ENFORCE(false, "collective ", static_cast<int>(collective), " has no row in selector.cpp");
}

const Entry& byName(const CollectiveTable& table, const char* name) {
  for (const Entry& entry : table.algorithms) {
    if (std::string(entry.name) == name) return entry;
  }
  DDPLITE_ENFORCE(false, "no algorithm ", name, " for ", table.name);
}

}  // namespace

// The automatic rule. Thresholds come from the sweeps in docs/algorithms.md (2-core machine,
// 2-3 ranks over loopback TCP): latency-bound sizes take the algorithms with the fewest message
// rounds, bandwidth-bound sizes the ones that move the fewest bytes per rank. The world size
// moves the allreduce crossover: at 2 ranks butterfly is one exchange of S bytes against the
// ring's two of S/2 and wins up to 128 KiB; from 3 ranks the fold adds two rounds and it loses
// to the ring above 16 KiB. From 8 ranks the ring's 2(P-1) steps cost more than butterfly's
// log2(P) exchanges of S up to about 8 KiB x P (scripts/allreduce_crossover.py: 64 KiB at 8
// ranks, 128-256 KiB at 16, 256 KiB-1 MiB at 32), as the α-β costs above predict: the crossover
// grows as α 2(P-1) / (β log2 P). Among many hosts' leaders that keeps the ring from taking 2(H-1)
// network latencies for a message of a few hundred KiB. Capped at 512 KiB (64 ranks): in a flat
// group across hosts every butterfly step sends each local rank's whole buffer through the host's
// one NIC, where the ring sends one segment (docs/algorithms.md: at 8,192 ranks and 16 MB, 4.5 s
// of NIC time against the ring's 0.29 s).
size_t butterflyUpTo(int worldSize) {
  if (worldSize <= 2) return 128 * 1024;
  if (worldSize < 8) return 16 * 1024;
  return std::min<size_t>(8 * 1024 * static_cast<size_t>(worldSize), 512 * 1024);
}

const char* automaticChoice(Collective collective, size_t bytes, int worldSize) {
  constexpr size_t kSmall = 64 * 1024;
  switch (collective) {
    case Collective::kAllreduce:
      return bytes <= butterflyUpTo(worldSize) ? "butterfly" : "ring";
    case Collective::kBroadcast:
      return bytes <= 256 * 1024 ? "tree" : "ring";
    case Collective::kReduce:
      return "tree";
    case Collective::kAllgather:
      return bytes <= kSmall ? "doubling" : "ring";
    case Collective::kReduceScatter:
      return bytes <= kSmall ? "halving" : "ring";
    case Collective::kBarrier:
      return "dissemination";
  }
  return "";
}

namespace {

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string choicesText() {
  std::ostringstream out;
  for (const auto& table : collectiveTables) {
    out << (&table == &collectiveTables[0] ? "" : "; ") << table.name << ":";
    for (const Entry& entry : table.algorithms) out << (&entry == &table.algorithms.front() ? "" : "|") << entry.name;
  }
  return out.str();
}

[[noreturn]] void badSpec(const std::string& spec, const std::string& token, const std::string& why) {
  throw std::invalid_argument(strCat("bad algorithm pin '", token, "' in '", spec, "': ", why,
                                     ". Write collective:algorithm pairs separated by commas, e.g. "
                                     "'allreduce:ring,broadcast:tree'; valid choices (or 'auto'): ",
                                     choicesText()));
}

}  // namespace

Selection selectAlgorithm(Collective collective, size_t bytes, int worldSize) {
  const CollectiveTable& table = tableOf(collective);
  const int pinned = table.pinned.load(std::memory_order_relaxed);
  const Entry& entry = pinned >= 0 ? table.algorithms[pinned] : byName(table, automaticChoice(collective, bytes, worldSize));
  return {entry.run, entry.name, static_cast<uint8_t>(&entry - table.algorithms.data())};
}

bool isPinned(Collective collective) {
  return tableOf(collective).pinned.load(std::memory_order_relaxed) >= 0;
}

std::string automaticChoiceByName(const std::string& collective, size_t bytes, int worldSize) {
  for (const auto& table : collectiveTables) {
    if (collective == table.name) return automaticChoice(table.collective, bytes, worldSize);
  }
  throw std::invalid_argument(strCat("unknown collective '", collective, "'; valid: ", choicesText()));
}

void setAlgorithmPins(const std::string& spec) {
  std::lock_guard<std::mutex> lock(pinsMutex);
  std::vector<int> updated;
  for (const auto& table : collectiveTables) updated.push_back(table.pinned.load());
  if (trim(spec).empty() || trim(spec) == "auto") {
    std::fill(updated.begin(), updated.end(), -1);
  }
  std::stringstream tokens(trim(spec) == "auto" ? "" : spec);
  std::string token;
  while (std::getline(tokens, token, ',')) {
    token = trim(token);
    if (token.empty()) continue;
    const size_t colon = token.find(':');
    if (colon == std::string::npos) badSpec(spec, token, "missing ':'");
    const std::string collective = trim(token.substr(0, colon));
    const std::string algorithm = trim(token.substr(colon + 1));
    const CollectiveTable* table = nullptr;
    for (const auto& candidate : collectiveTables) {
      if (collective == candidate.name) table = &candidate;
    }
    if (table == nullptr) badSpec(spec, token, strCat("unknown collective '", collective, "'"));
    int index = -1;
    for (size_t i = 0; i < table->algorithms.size(); ++i) {
      if (algorithm == table->algorithms[i].name) index = static_cast<int>(i);
    }
    if (index < 0 && algorithm != "auto") {
      badSpec(spec, token, strCat("'", algorithm, "' is not an algorithm of ", collective));
    }
    updated[table - collectiveTables] = index;
  }
  for (size_t i = 0; i < updated.size(); ++i) collectiveTables[i].pinned = updated[i];
}

std::vector<std::pair<std::string, std::string>> algorithmPins() {
  std::lock_guard<std::mutex> lock(pinsMutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& table : collectiveTables) {
    const int pinned = table.pinned;
    out.emplace_back(table.name, pinned >= 0 ? table.algorithms[pinned].name : "auto");
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<std::string>>> availableAlgorithms() {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  for (const auto& table : collectiveTables) {
    std::vector<std::string> names;
    for (const Entry& entry : table.algorithms) names.emplace_back(entry.name);
    out.emplace_back(table.name, names);
  }
  return out;
}

void applyAlgorithmPinsFromEnv() {
  static std::once_flag applied;
  std::call_once(applied, [] {
    const std::string spec = env::algorithmSpec();
    if (!spec.empty()) setAlgorithmPins(spec);
  });
}

namespace {

// The transport's names for algorithm indices on the wire (fingerprint.hpp): WireKind kAllreduce ..
// kBarrier follow Collective's order.
std::string algorithmNameOnWire(WireKind kind, uint8_t algorithm) {
  const auto index = static_cast<size_t>(kind);
  if (index < 1 || index > std::size(collectiveTables)) return "";
  const auto& algorithms = collectiveTables[index - 1].algorithms;
  return algorithm < algorithms.size() ? std::string(algorithms[algorithm].name) : std::string();
}

[[maybe_unused]] const bool algorithmNamerRegistered = (registerAlgorithmNamer(&algorithmNameOnWire), true);

}  // namespace

}  // namespace ddplite::cpu
