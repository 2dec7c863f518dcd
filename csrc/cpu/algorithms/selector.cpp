#include "cpu/algorithms/selector.hpp"

namespace ddplite::cpu {

Selection selectAlgorithm(Collective collective, size_t /*bytes*/, int /*worldSize*/) {
  switch (collective) {
    case Collective::kAllreduce: return {&allreduceRing, "ring"};
    case Collective::kBroadcast: return {&broadcastBinaryTree, "tree"};
    case Collective::kReduce: return {&reduceBinaryTree, "tree"};
    case Collective::kAllgather: return {&allgatherRing, "ring"};
    case Collective::kBarrier: return {&barrierDissemination, "dissemination"};
  }
  return {nullptr, "none"};
}

}  // namespace ddplite::cpu
