// Which algorithm runs each collective. Today each collective has one CPU algorithm; the
// size- and world-size-based choice (and DDPLITE_ALGO) plug in here without touching callers.
#pragma once

#include "cpu/algorithms/algorithm.hpp"

namespace ddplite::cpu {

enum class Collective { kAllreduce, kBroadcast, kReduce, kAllgather, kBarrier };

struct Selection {
  Algorithm run;
  const char* name;  // for logs and errors, e.g. "ring"
};

Selection selectAlgorithm(Collective collective, size_t bytes, int worldSize);

}  // namespace ddplite::cpu
