#include "cuda/nccl_watchdog.hpp"

#include "common/logging.hpp"

#include <c10/cuda/CUDAFunctions.h>

namespace ddplite::nccl {

namespace {
constexpr auto kPollInterval = std::chrono::milliseconds(10);
}

NcclWatchdog::NcclWatchdog(at::Device device, std::function<WatchdogFailure()> checkComms,
                           std::function<void(const WatchdogFailure&)> onFailure)
    : device_(device), checkComms_(std::move(checkComms)), onFailure_(std::move(onFailure)), thread_([this] { loop(); }) {}

NcclWatchdog::~NcclWatchdog() {
  stop();
}

void NcclWatchdog::watch(c10::intrusive_ptr<NcclWork> work) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(std::move(work));
}

void NcclWatchdog::failAll(const WatchdogFailure& failure) {
  std::deque<c10::intrusive_ptr<NcclWork>> failing;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failing.swap(pending_);
  }
  for (auto& work : failing) {
    try {
      throwDistError(work->context(), failure.what, failure.hint);
    } catch (...) {
      work->markFailed(std::current_exception());
    }
  }
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
        break;
      } else {
        ++it;
      }
    }
  }
  for (auto& work : done) work->markDone();  // outside the lock: frees tensors
  if (!done.empty()) wake_.notify_all();
  return failure;
}

void NcclWatchdog::loop() {
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
