// The Work object ddplite returns for every collective.
//
// Life cycle: created on the caller's thread, completed exactly once on the worker thread
// (collectives) or on a P2P engine thread (send/recv) by markFinished. The future (getFuture) completes with the list of output tensors, which is
// what DDP's comm hooks and finalize_backward read; on failure it carries the same
// DistBackendError that wait() raises.
#pragma once

#include "common/errors.hpp"
#include "common/profiling.hpp"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <vector>

namespace ddplite {

class DdpliteWork final : public c10d::Work {
 public:
  // `profiling`: the profiler span to open (common/profiling.hpp; none by default). `timed`:
  // the group has collectives timing on (enableCollectivesTiming), so getDuration serves it.
  DdpliteWork(const OpContext& context, c10d::OpType type, std::vector<at::Tensor> outputs,
              ProfilingArgs profiling = {}, bool timed = false);

  // wait(): blocks until done (an infinite wait is still bounded by the op's own timeout,
  // which the worker enforces). wait(t) with t > 0 raises DistBackendError after t.
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // A future of the op's c10d::WorkResult (as an int): SUCCESS, TIMEOUT (the op's timeout
  // passed), or COMM_ERROR (any other failure); it completes when the op does, never with an
  // error. Made on first call.
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override;
  uint64_t getSequencenumber() const override;
  // The rank a recv's message came from (recv from any source); -1 before it completes.
  int sourceRank() const override { return sourceRank_.load(); }
  void setSourceRank(int rank) { sourceRank_ = rank; }

  const OpContext& context() const { return context_; }

  // Running thread, when the op begins to run (a queued op's wait in the queue is not counted;
  // a send/recv starts when it is posted). A no-op unless timed.
  void markStarted() {
    if (timed_) clock_.start();
  }
  // Where an op's time went (torch_ddp_lite.bench --breakdown): steady_clock nanoseconds (the
  // clock of Python's time.perf_counter_ns on Linux) at which the backend took the call (the
  // constructor), a thread began running it (markRunning), its collective returned (markRan) and
  // the Work completed (markFinished); 0 for a stage not reached. Each is written once by the
  // thread at that stage, before markFinished completes the Work; read them after wait() (the
  // Work's mutex orders the writes before completed_ is seen).
  struct Stages {
    int64_t issued = 0, running = 0, ran = 0, finished = 0;
  };
  void markRunning() { stages_.running = nowNs(); }
  void markRan() { stages_.ran = nowNs(); }
  const Stages& stages() const { return stages_; }
  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // Milliseconds from markStarted to completion, as torch's Work._get_duration() reports them.
  // RuntimeError when the group's timing was off when the op was issued, or before completion.
  float getDuration() const override;

  // Completing thread only. Completes the futures, then the Work, outside every lock of ours
  // (future callbacks run inline and may take the GIL). `outcome` classifies a failure for
  // getFutureResult (COMM_ERROR unless said otherwise); ignored on success.
  void markFinished(std::exception_ptr error, c10d::WorkResult outcome = c10d::WorkResult::COMM_ERROR);

 private:
  const OpContext context_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<int> sourceRank_{-1};
  const bool timed_;
  OpClock clock_;
  Stages stages_;
  std::mutex resultMutex_;  // guards the two below
  c10::intrusive_ptr<c10::ivalue::Future> resultFuture_;  // getFutureResult's, once asked for
  std::optional<c10d::WorkResult> result_;                 // set by markFinished
};

}  // namespace ddplite
