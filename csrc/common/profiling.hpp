// What torch.profiler and Work.getDuration see of a ddplite op.
//
// Profiler spans: torch's c10d::Work opens an asynchronous RecordFunction when given a title
// (its constructor) and closes it in finish(), on whichever thread completes the op, as gloo's
// works do. ddplite's Works pass profilingTitle() and their inputs only while some RecordFunction
// callback is installed (a profiler is on): otherwise the Work would allocate a RecordFunction
// per op for nothing.
//
// Durations: OpClock marks when the op starts running and when it ends (steady clock).
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

namespace ddplite {

// "ddplite:all_reduce", "ddplite:send", ...: static storage (RecordFunction keeps the pointer).
// `op` is the backend's own name of the call; it tells the coalesced kinds apart.
const char* profilingTitle(c10d::OpType type, const char* op);

// Whether a Work made now should open a profiler span (some RecordFunction callback is installed).
bool profilerListening();

// The title and inputs to give c10d::Work's constructor: null and none unless profilerListening().
struct ProfilingArgs {
  const char* title = nullptr;
  std::optional<std::vector<at::Tensor>> inputs;
};
ProfilingArgs profilingArgs(c10d::OpType type, const char* op, c10::ArrayRef<at::Tensor> inputs);

// Start and end of one op, for Work.getDuration. start() on the thread that begins running it,
// end() on the thread that completes it, before the Work is marked completed (Work::finish's
// mutex then orders both stores before any reader that saw the Work completed); relaxed atomics
// because a reader may also look before completion (durationMs then says so).
class OpClock {
 public:
  void start() { startNs_.store(nowNs(), std::memory_order_relaxed); }
  void end() { endNs_.store(nowNs(), std::memory_order_relaxed); }
  // Milliseconds from start() to end(); nullopt until both have happened.
  std::optional<float> durationMs() const;

 private:
  static int64_t nowNs();
  std::atomic<int64_t> startNs_{0};
  std::atomic<int64_t> endNs_{0};
};

}  // namespace ddplite
