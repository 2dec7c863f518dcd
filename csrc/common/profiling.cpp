#include "common/profiling.hpp"

#include <ATen/record_function.h>

#include <cstring>

namespace ddplite {

using c10d::OpType;

const char* profilingTitle(OpType type, const char* op) {
  switch (type) {
    case OpType::BROADCAST: return "ddplite:broadcast";
    case OpType::ALLREDUCE: return "ddplite:all_reduce";
    case OpType::ALLREDUCE_COALESCED: return "ddplite:all_reduce_coalesced";
    case OpType::REDUCE: return "ddplite:reduce";
    case OpType::ALLGATHER: return "ddplite:all_gather";
    case OpType::_ALLGATHER_BASE: return "ddplite:all_gather_into_tensor";
    case OpType::ALLGATHER_COALESCED: return "ddplite:all_gather_coalesced";
    case OpType::GATHER: return "ddplite:gather";
    case OpType::SCATTER: return "ddplite:scatter";
    case OpType::REDUCE_SCATTER: return "ddplite:reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE: return "ddplite:reduce_scatter_tensor";
    case OpType::ALLTOALL_BASE: return "ddplite:all_to_all_single";
    case OpType::ALLTOALL: return "ddplite:all_to_all";
    case OpType::SEND: return "ddplite:send";
    case OpType::RECV: return "ddplite:recv";
    case OpType::RECVANYSOURCE: return "ddplite:recv_anysource";
    case OpType::BARRIER: return "ddplite:barrier";
    case OpType::COALESCED:
      if (op != nullptr && std::strcmp(op, "allgather_into_tensor_coalesced") == 0) {
        return "ddplite:all_gather_into_tensor_coalesced";
      }
      if (op != nullptr && std::strcmp(op, "reduce_scatter_tensor_coalesced") == 0) {
        return "ddplite:reduce_scatter_tensor_coalesced";
      }
      if (op != nullptr && std::strcmp(op, "allreduce_coalesced") == 0) return "ddplite:all_reduce_coalesced";
      return "ddplite:coalesced";
    default: return "ddplite:op";
  }
}

bool profilerListening() {
  return at::hasCallbacks();
}

ProfilingArgs profilingArgs(OpType type, const char* op, c10::ArrayRef<at::Tensor> inputs) {
  ProfilingArgs args;
  if (!profilerListening()) return args;
  args.title = profilingTitle(type, op);
  args.inputs = inputs.vec();
  return args;
}

int64_t OpClock::nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<float> OpClock::durationMs() const {
  const int64_t start = startNs_.load(std::memory_order_relaxed);
  const int64_t end = endNs_.load(std::memory_order_relaxed);
  if (start == 0 || end == 0) return std::nullopt;
  return static_cast<float>(static_cast<double>(end - start) / 1e6);
}

}  // namespace ddplite
