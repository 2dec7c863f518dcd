// The Work ddplite returns for a collective that runs on NCCL.
//
// Streams and events (the ProcessGroupNCCL contract):
//   * start event: recorded on the caller's current stream at launch; the group's NCCL stream
//     waits on it, so NCCL reads inputs only after every kernel queued before the call.
//   * end event: recorded on the NCCL stream right after the NCCL call(s).
//   * wait() / synchronize(): the caller's current stream waits on the end event; the host does
//     not block (except for barrier, and when wait() is given a timeout).
//   * getFuture(): a CUDA-aware ivalue::Future over the device, completed at launch with the
//     outputs while the NCCL stream is current, so whoever waits on it (DDP comm hooks,
//     then()) waits on the NCCL stream on the GPU, not on the host.
//
// Ownership: inputs, outputs and scratch buffers are stashed here at launch and released by the
// watchdog thread once the end event has completed, so the caching allocator cannot hand their
// memory to someone else while NCCL still uses it (even if the caller drops every reference
// right after the call). A failed Work keeps them too, until its end event completes (the
// kernels of an aborted communicator exit, but only then); see NcclWatchdog.
//
// Deferred launch: an op issued inside a coalesced group (NcclPath::startCoalescing) is created
// at once and launched when the group ends. Until then it is not completed, wait() orders
// nothing (as ProcessGroupNCCL's works inside a group) and wait(timeout) raises.
// Graph capture: a Work launched while the caller's stream is capturing is never queried by the
// watchdog (an event query would invalidate the capture); it keeps its tensors while it lives.
//
// Threads: created and launched on the caller's thread; completed or failed by the watchdog.
#pragma once

#include "common/compat_cuda.hpp"
#include "common/errors.hpp"
#include "common/profiling.hpp"

#include <ATen/core/ivalue.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

namespace ddplite::nccl {

class NcclWork final : public c10d::Work {
 public:
  // `profiling`: the profiler span (closed when the watchdog sees the end event, or on failure).
  // `timed`: getDuration serves the GPU time between a start event recorded on the NCCL stream
  // once it has waited for the caller, and the end event (both timing events then).
  NcclWork(const OpContext& context, c10d::OpType type, at::Device device, std::vector<at::Tensor> outputs,
           std::chrono::milliseconds timeout, bool isBarrier, ProfilingArgs profiling = {}, bool timed = false);

  // Launching thread, in this order around the NCCL call(s).
  void stash(std::vector<at::Tensor> tensors);
  void waitForCaller(const c10::cuda::CUDAStream& current, const c10::cuda::CUDAStream& ncclStream);
  void markLaunched(const c10::cuda::CUDAStream& ncclStream);  // recordEnd, then completeFuture
  // The future completes with the outputs, `ncclStream` current: its waiters wait on that stream.
  void completeFuture(const c10::cuda::CUDAStream& ncclStream);
  // The end event goes on the NCCL stream after whatever NCCL has of the op (all of it, or part
  // of it when issuing failed: the failed Work then keeps its tensors until that has run).
  void recordEnd(const c10::cuda::CUDAStream& ncclStream);
  bool launched() const { return launched_.load(std::memory_order_acquire); }

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout) override;
  // Work::blockCurrentStream (torch 2.9+; async ops waited on from another stream).
  void blockCurrentStream() DDPLITE_OVERRIDE_SINCE_2_9 { synchronize(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // The op's c10d::WorkResult as an int, set by the watchdog: SUCCESS once the end event has
  // completed, TIMEOUT or COMM_ERROR when it failed the op (never, for an op captured in a graph).
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override { return resultFuture_; }
  uint64_t getSequencenumber() const override { return context_.seq; }
  // Milliseconds of GPU time (see the constructor); RuntimeError unless timed and completed.
  float getDuration() const override;

  const OpContext& context() const { return context_; }
  at::Device device() const { return device_; }

  // Watchdog thread.
  bool endEventDone() const;
  bool timedOut(std::chrono::steady_clock::time_point now) const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  void markDone();                        // end event completed: release the stash
  // Communicator aborted: wait() raises `error`, getFutureResult() says `result`; stash kept.
  void markFailed(std::exception_ptr error, c10d::WorkResult result = c10d::WorkResult::COMM_ERROR);
  void releaseStash();                    // a failed Work's end event completed (or it never launched)

 private:
  void throwIfFailed() const;
  void setResult(c10d::WorkResult result);
  void waitOnHost(std::chrono::steady_clock::time_point deadline, bool bounded);

  const OpContext context_;
  const at::Device device_;
  const std::vector<at::Tensor> outputs_;
  const std::chrono::milliseconds timeout_;
  const bool isBarrier_;
  std::chrono::steady_clock::time_point launchedAt_;  // set by recordEnd, before the watchdog sees the Work
  std::vector<at::Tensor> stash_;  // guarded by mutex_
  compat::CudaEvent startEvent_{cudaEventDisableTiming};
  // Timed Works: a timing start event on the NCCL stream, and an end event that times too.
  std::unique_ptr<compat::CudaEvent> timingStart_;
  compat::CudaEvent endEvent_;
  std::atomic<bool> failed_{false};
  // Set (release) by markLaunched on the launching thread after the end event is recorded; read
  // (acquire) by isCompleted/wait on any thread, so a reader that sees it sees the event.
  std::atomic<bool> launched_{false};
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  c10::intrusive_ptr<c10::ivalue::Future> resultFuture_;
  std::atomic<bool> resultSet_{false};
};

}  // namespace ddplite::nccl
