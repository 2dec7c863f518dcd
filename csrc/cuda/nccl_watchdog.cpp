#include "cuda/nccl_watchdog.hpp"

#include "common/logging.hpp"
#include "common/thread_name.hpp"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>

namespace ddplite::nccl {

namespace {
constexpr auto kPollInterval = std::chrono::milliseconds(10);
}

NcclWatchdog::NcclWatchdog(at::Device device, std::function<WatchdogFailure()> checkComms,
                           std::function<void(const WatchdogFailure&)> onFailure)
    : device_(device), checkComms_(std::move(checkComms)), onFailure_(std::move(onFailure)), thread_([this] { loop(); }) {
  nameThread(thread_, "ddplite-nccl-wd");
}

NcclWatchdog::~NcclWatchdog() {
  stop();
}

namespace {
void fail(NcclWork& work, const WatchdogFailure& failure) {
  try {
    throwDistError(work.context(), failure.what, failure.hint);
  } catch (...) {
    work.markFailed(std::current_exception(), failure.result);
  }
}
}  // namespace

void NcclWatchdog::watch(c10::intrusive_ptr<NcclWork> work) {
  std::optional<WatchdogFailure> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_) {
      pending_.push_back(std::move(work));
      return;
    }
    failed = failure_;
    retiring_.push_back(work);
  }
  fail(*work, *failed);
}

void NcclWatchdog::failAll(const WatchdogFailure& failure) {
  std::deque<c10::intrusive_ptr<NcclWork>> failing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_) failure_ = failure;
    failing.swap(pending_);
    retiring_.insert(retiring_.end(), failing.begin(), failing.end());
  }
  for (auto& work : failing) fail(*work, failure);
  wake_.notify_all();
}

bool NcclWatchdog::drain(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  return wake_.wait_until(lock, deadline, [this] { return pending_.empty(); });
}

void NcclWatchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  // Only under joinMutex_ is thread_ read or joined; a second caller finds it joined.
  std::lock_guard<std::mutex> join(joinMutex_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  if (thread_.joinable()) return;  // the watchdog's own thread: the owner's stop() retires

  const auto deadline = std::chrono::steady_clock::now() + kRetireWait;
  std::deque<c10::intrusive_ptr<NcclWork>> retiring;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    retiring.swap(retiring_);
  }
  size_t leaked = 0;
  for (auto& work : retiring) {
    bool done = false;
    try {
      while (!(done = work->endEventDone()) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    } catch (const std::exception&) {
      done = false;  // CUDA is failing: treat the kernel as still running
    }
    if (done) {
      work->releaseStash();
    } else {
      ++leaked;
      // Deliberately leaked: a kernel of an aborted communicator may still write this memory.
      new c10::intrusive_ptr<NcclWork>(work);
    }
  }
  if (leaked > 0) {
    DDPLITE_LOG(kWarn, "ddplite NCCL watchdog: ", leaked, " failed collective(s) still had kernels running ",
                kRetireWait.count(), " ms after the abort; their buffers are kept (leaked) rather than freed under them");
  }
}

WatchdogFailure NcclWatchdog::poll() {
  WatchdogFailure failure = checkComms_();
  if (!failure.what.empty()) return failure;

  std::vector<c10::intrusive_ptr<NcclWork>> done;
  const auto now = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if ((*it)->endEventDone()) {
        done.push_back(std::move(*it));
        it = pending_.erase(it);
      } else if ((*it)->timedOut(now)) {
        const NcclWork& late = **it;
        failure.what = strCat("Timed out waiting for ", late.context().op, " #", late.context().seq, " to complete on ",
                              late.device(), " within its timeout of ", late.timeout().count(),
                              " ms; the watchdog aborted the NCCL communicator");
        failure.hint = "a rank did not reach this collective in time: it may be slower, stuck, or have issued a "
                       "different collective (compare the '#seq' in each rank's error). Raise the limit with "
                       "init_process_group(timeout=...) if the work is just slow";
        failure.result = c10d::WorkResult::TIMEOUT;
        break;
      } else {
        ++it;
      }
    }
  }
  std::vector<c10::intrusive_ptr<NcclWork>> retired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = retiring_.begin(); it != retiring_.end();) {
      if ((*it)->endEventDone()) {
        retired.push_back(std::move(*it));
        it = retiring_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& work : done) work->markDone();  // outside the lock: frees tensors
  for (auto& work : retired) work->releaseStash();
  if (!done.empty()) wake_.notify_all();
  return failure;
}

void NcclWatchdog::loop() {
  // Relaxed: this thread's event queries are not "unsafe calls" that a global-mode graph capture
  // on another thread (torch.cuda.graph's default) would refuse, which would end that capture.
  // The events it queries are never part of a capture (NcclPath::track). Set after the device,
  // so that no context is made on GPU 0.
  std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed;
  try {
    c10::cuda::set_device(device_.index());
    relaxed.emplace(cudaStreamCaptureModeRelaxed);
  } catch (const std::exception&) {
    // the first poll reports the CUDA failure
  }
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    WatchdogFailure failure;
    try {
      c10::cuda::set_device(device_.index());  // cheap when already current
      failure = poll();
    } catch (const std::exception& error) {
      failure = WatchdogFailure{strCat("the watchdog could not query CUDA: ", error.what()),
                                "the GPU or driver failed; check nvidia-smi and dmesg"};
    }
    if (!failure.what.empty() && !reported_) {
      reported_ = true;
      DDPLITE_LOG(kWarn, "ddplite NCCL watchdog: ", failure.what);
      onFailure_(failure);
    }
    lock.lock();
    wake_.wait_for(lock, kPollInterval, [this] { return stopping_; });
  }
}

}  // namespace ddplite::nccl
