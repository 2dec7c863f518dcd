#include "backend/worker.hpp"

#include "common/errors.hpp"
#include "common/thread_name.hpp"

namespace ddplite {

Worker::Worker() : state_(std::make_shared<State>()), thread_([state = state_] { loop(*state); }) {
  nameThread(thread_, "ddplite-worker");
}

Worker::~Worker() {
  drainAndStop();
}

void Worker::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->stopping) {
      throwDistError("the process group was shut down; no collective can be issued on it",
                     "create a new process group after destroy_process_group()");
    }
    state_->queue.push_back(std::move(task));
  }
  state_->wake.notify_one();
}

bool Worker::tryClaimIdle() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->busy || state_->stopping || !state_->queue.empty()) return false;
  state_->busy = true;
  return true;
}

bool Worker::idle() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !state_->busy && state_->queue.empty();
}

void Worker::waitIdle(std::chrono::microseconds within) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  auto idleOrStopping = [this] { return state_->stopping || (!state_->busy && state_->queue.empty()); };
  if (idleOrStopping()) return;
  ++state_->idleWaiters;
  state_->becameIdle.wait_for(lock, within, idleOrStopping);
  --state_->idleWaiters;
}

void Worker::enqueueFirst(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->queue.push_front(std::move(task));  // the worker waits for releaseClaim(): busy is set
}

void Worker::releaseClaim() {
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->busy = false;
    queued = state_->stopping || !state_->queue.empty();
    if (!queued && state_->idleWaiters > 0) state_->becameIdle.notify_all();
  }
  // Wake the worker only when it has something to do: a needless wake-up costs a context switch
  // on a core the peers' ranks may need.
  if (queued) state_->wake.notify_one();
}

void Worker::drainAndStop() {
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    // Destroyed from one of its own tasks (a future callback dropped the group's last reference):
    // it cannot join itself, and the queued tasks belong to an owner that is going away. They are
    // dropped; the thread ends after the current task, touching only the shared state.
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stopping = true;
      state_->abandoned = true;
      dropped.swap(state_->queue);
    }
    thread_.detach();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopping = true;
    if (state_->idleWaiters > 0) state_->becameIdle.notify_all();
  }
  state_->wake.notify_one();
  thread_.join();
}

void Worker::loop(State& state) {
  while (true) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(state.mutex);
      state.wake.wait(lock, [&state] { return !state.busy && (state.stopping || !state.queue.empty()); });
      if (state.queue.empty()) return;  // stopping and drained
      task = std::move(state.queue.front());
      state.queue.pop_front();
      state.busy = true;
    }
    task();  // tasks catch their own exceptions (see DdpliteBackend::enqueue)
    task = nullptr;  // its captures (tensors, Works) go before the next wait, not at the next task
    std::lock_guard<std::mutex> lock(state.mutex);
    state.busy = false;
    if (state.queue.empty() && state.idleWaiters > 0) state.becameIdle.notify_all();
    if (state.abandoned) return;
  }
}

}  // namespace ddplite
