// The watchdog: one thread per group (started with the group's first communicator) that
// watches every NCCL Work until its end event completes.
//
// Every 10 ms it (1) asks each communicator for an asynchronous error (ncclCommGetAsyncError),
// (2) retires works whose end event has completed (releasing their stashed tensors), and (3)
// checks each remaining work against its timeout. On an async error or a timeout it calls
// `onFailure` once, on the watchdog thread; the owner (NcclPath) then aborts its communicators
// and fails every pending work through failAll().
//
// After failAll() the failure sticks: a work handed to watch() later (a launch that raced with
// the failure) fails at once instead of waiting for an end event no one checks. Failed works
// move to a retiring list and keep their tensors until their end event completes (the aborted
// kernels have exited); stop() waits for them at most kRetireWait and then leaks what is left,
// with a warning, rather than free memory a kernel may still write.
#pragma once

#include "cuda/nccl_work.hpp"

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ddplite::nccl {

struct WatchdogFailure {
  std::string what;  // for the error message of each pending work
  std::string hint;
  c10d::WorkResult result = c10d::WorkResult::COMM_ERROR;  // what each work's getFutureResult() says
};

class NcclWatchdog {
 public:
  // `checkComms`: "" when healthy, else a description of the communicator error (watchdog thread).
  // `onFailure`: called once, on the watchdog thread, with what went wrong.
  // `device`: made current on the watchdog thread before its first CUDA call, so event queries
  // and the frees of retired works do not create a context on GPU 0.
  NcclWatchdog(at::Device device, std::function<WatchdogFailure()> checkComms,
               std::function<void(const WatchdogFailure&)> onFailure);
  ~NcclWatchdog();  // stop()

  void watch(c10::intrusive_ptr<NcclWork> work);
  // Fails every pending work with `failure`, and every work watched later (any thread).
  void failAll(const WatchdogFailure& failure);
  // Blocks until no work is pending or `deadline`; true if drained.
  bool drain(std::chrono::steady_clock::time_point deadline);
  // Joins the thread (idempotent; any thread but the watchdog's own, several at once), then
  // retires failed works as above. Pending works stay pending.
  void stop();
  static constexpr std::chrono::milliseconds kRetireWait{5000};

 private:
  void loop();
  // One pass; returns a failure to report, or an empty `what`.
  WatchdogFailure poll();

  at::Device device_;
  std::function<WatchdogFailure()> checkComms_;
  std::function<void(const WatchdogFailure&)> onFailure_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<c10::intrusive_ptr<NcclWork>> pending_;
  std::deque<c10::intrusive_ptr<NcclWork>> retiring_;  // failed, tensors kept until the end event
  std::optional<WatchdogFailure> failure_;             // set by failAll: later works fail at once
  bool stopping_ = false;
  bool reported_ = false;
  std::mutex joinMutex_;  // serializes stop()'s join: abort() and shutdown() may race
  std::thread thread_;   // last: uses everything above
};

}  // namespace ddplite::nccl
