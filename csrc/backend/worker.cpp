#include "backend/worker.hpp"

#include "common/errors.hpp"

namespace ddplite {

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  drainAndStop();
}

void Worker::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      throwDistError("the process group was shut down; no collective can be issued on it",
                     "create a new process group after destroy_process_group()");
    }
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
}

bool Worker::tryClaimIdle() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (busy_ || stopping_ || !queue_.empty()) return false;
  busy_ = true;
  return true;
}

void Worker::enqueueFirst(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_front(std::move(task));  // the worker waits for releaseClaim(): busy_ is set
}

void Worker::releaseClaim() {
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    queued = stopping_ || !queue_.empty();
  }
  // Wake the worker only when it has something to do: a needless wake-up costs a context switch
  // on a core the peers' ranks may need.
  if (queued) wake_.notify_one();
}

void Worker::drainAndStop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) {
    thread_.join();
  }
}

void Worker::loop() {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return !busy_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    task();  // tasks catch their own exceptions (see DdpliteBackend::enqueue)
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
  }
}

}  // namespace ddplite
