// Which algorithm runs each collective: a pin (DDPLITE_ALGO, or torch_ddp_lite.set_algorithm)
// when there is one, otherwise the automatic rule by message size and world size.
//
// Every rank of a group must make the same choice for the same op, so the rule depends only on
// what all ranks agree on (collective, bytes, world size) and pins must be set identically on
// every rank. Pins are process-wide (they apply to every group) and may change between ops.
#pragma once

#include "cpu/algorithms/algorithm.hpp"

#include <string>
#include <utility>
#include <vector>

namespace ddplite::cpu {

enum class Collective { kAllreduce, kBroadcast, kReduce, kAllgather, kReduceScatter, kBarrier };

struct Selection {
  Algorithm run;
  const char* name;  // for logs and errors, e.g. "ring"
  uint8_t index;     // position in availableAlgorithms() for the collective (on the wire: fingerprint.hpp)
};

// `bytes`: the buffer of allreduce/broadcast/reduce, the gathered (allgather) or the input
// (reduce_scatter) size.
Selection selectAlgorithm(Collective collective, size_t bytes, int worldSize);

// Whether `collective` has a pin now. A pinned collective runs its pinned algorithm over TCP
// even in a group with shared memory (the pin is what the user asked to run).
bool isPinned(Collective collective);

// The automatic rule alone (no pins): the algorithm name for `collective` at `bytes` and
// `worldSize`. The rule and its reasons are in docs/algorithms.md ("The automatic rule").
const char* automaticChoice(Collective collective, size_t bytes, int worldSize);

// The same by collective name ("allreduce", ...), for Python and tests; throws
// std::invalid_argument for an unknown name.
std::string automaticChoiceByName(const std::string& collective, size_t bytes, int worldSize);

// Pins from a spec "collective:algorithm[,collective:algorithm...]"; "collective:auto" removes
// that pin, and "" or "auto" removes them all. Throws std::invalid_argument naming the bad token
// and the valid choices; on error nothing changes.
void setAlgorithmPins(const std::string& spec);

// (collective, pinned algorithm or "auto") for every collective, in a fixed order.
std::vector<std::pair<std::string, std::string>> algorithmPins();

// (collective, algorithm names) for every collective.
std::vector<std::pair<std::string, std::vector<std::string>>> availableAlgorithms();

// Applies DDPLITE_ALGO, when set, once per process (later calls do nothing, so pins set from
// Python afterwards stick); throws std::invalid_argument like setAlgorithmPins. Called when a
// group is created and before the Python API reads or changes pins.
void applyAlgorithmPinsFromEnv();

}  // namespace ddplite::cpu
