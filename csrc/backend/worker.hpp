// One background thread per backend that runs collectives in the order they were issued.
//
// enqueue() may be called from any thread (the main thread and the autograd thread issue
// collectives concurrently under DDP); the FIFO order of enqueue() calls is the execution order,
// so callers serialise "assign sequence number + enqueue" under their own lock.
//
// A caller may instead run a task itself, on its own thread (small shared-memory collectives:
// two thread hand-offs would cost more than the op): tryClaimIdle() succeeds only when nothing
// is queued or running, and until releaseClaim() the worker starts nothing, so tasks still run
// one at a time and in issue order. The worker's mutex orders the caller's task before and after
// the worker's: whatever one task wrote, the next one sees.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace ddplite {

class Worker {
 public:
  Worker();
  ~Worker();  // runs what is queued, then joins

  void enqueue(std::function<void()> task);
  // True when the worker was idle (empty queue, no task running, not stopping): the caller now
  // owns the execution slot and must call releaseClaim() when its task is done.
  bool tryClaimIdle();
  void releaseClaim();
  // While claimed: hands the caller's task to the worker after all, ahead of anything queued
  // since the claim (those were issued after it); it starts at releaseClaim().
  void enqueueFirst(std::function<void()> task);
  // Whether nothing is queued or running (a snapshot).
  bool idle();
  // Blocks until nothing is queued or running (or the worker stops), at most `within`. For a
  // caller about to issue an op it will block on anyway: whatever the worker holds was issued
  // before it and must finish first, so waiting here costs that caller nothing, and its op can
  // then run on its own thread (tryClaimIdle) instead of after a hand-off.
  void waitIdle(std::chrono::microseconds within);
  // Runs every queued task, then stops the thread. Idempotent; enqueue() after it throws. On the
  // worker thread itself (its owner destroyed by a task's future callback) it drops the queued
  // tasks instead and lets the thread end after the current one (detached).
  void drainAndStop();

 private:
  // Shared with the thread, so that a worker destroyed by one of its own tasks (drainAndStop on
  // the worker thread) can let the thread finish that task and leave without touching `this`.
  struct State {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::function<void()>> queue;
    std::condition_variable becameIdle;  // waitIdle's; notified when busy clears with nothing queued
    int idleWaiters = 0;                  // threads in waitIdle; guarded by mutex
    bool busy = false;  // a task runs, on the worker or on a claiming caller; guarded by mutex
    bool stopping = false;
    bool abandoned = false;  // destroyed from its own thread: end after the current task
  };
  static void loop(State& state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace ddplite
