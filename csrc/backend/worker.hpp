// One background thread per backend that runs collectives in the order they were issued.
//
// enqueue() may be called from any thread (the main thread and the autograd thread issue
// collectives concurrently under DDP); the FIFO order of enqueue() calls is the execution order,
// so callers serialise "assign sequence number + enqueue" under their own lock.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace ddplite {

class Worker {
 public:
  Worker();
  ~Worker();  // runs what is queued, then joins

  void enqueue(std::function<void()> task);
  // Runs every queued task, then stops the thread. Idempotent; enqueue() after it throws.
  void drainAndStop();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddplite
