#include "backend/monitored_barrier.hpp"

#include <ATen/ATen.h>

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>

namespace ddplite {

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::seconds kCompletionSlack{5};  // the engine's timer fails a message at its deadline

int arrivalTag(uint64_t call) { return kFirstUserTag - 1 - static_cast<int>(2 * (call % (1u << 28))); }
int verdictTag(uint64_t call) { return arrivalTag(call) - 1; }

// Completions of the messages of one call. Shared with the engine's callbacks, which may run
// after the call has returned or thrown (a recv rank 0 stopped waiting for).
class Completions {
 public:
  explicit Completions(int count) : done_(count) {}

  cpu::P2pEngine::Completion slot(int index) {
    return [self = shared(), index](std::exception_ptr error, int) {
      std::lock_guard<std::mutex> lock(self->mutex_);
      self->done_[index] = error;
      self->wake_.notify_all();
    };
  }
  // The outcome of message `index` (null: it completed), or a timeout error when the engine did
  // not complete it by `deadline` + slack (its own timer normally has by then).
  std::exception_ptr wait(int index, Clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!wake_.wait_until(lock, deadline + kCompletionSlack, [&] { return done_[index].has_value(); })) {
      return std::make_exception_ptr(std::runtime_error("the message did not complete"));
    }
    return *done_[index];
  }
  void own(std::shared_ptr<Completions> self) { self_ = self; }

 private:
  std::shared_ptr<Completions> shared() { return self_.lock(); }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::optional<std::exception_ptr>> done_;  // guarded by mutex_
  std::weak_ptr<Completions> self_;
};

std::shared_ptr<Completions> makeCompletions(int count) {
  auto completions = std::make_shared<Completions>(count);
  completions->own(completions);
  return completions;
}

std::string whatOf(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

at::Tensor int64s(int64_t count) { return at::zeros({count}, at::kLong); }

std::string joined(const std::vector<int>& ranks) {
  std::string text;
  for (int r : ranks) text += strCat(text.empty() ? "" : ", ", r);
  return text;
}

// Rank 0's verdict, one int64 per rank: kPassed, kFailed, or kUnchecked (not waited for after an
// earlier rank failed or rank 0's time ran out), then one for the barrier as a whole.
enum Verdict : int64_t { kUnchecked = 0, kPassed = 1, kFailed = -1 };

// "1, 3": the ranks whose verdict is kFailed.
std::string failedRanks(const int64_t* verdict, int size) {
  std::vector<int> failed;
  for (int r = 0; r < size; ++r) {
    if (verdict[r] == kFailed) failed.push_back(r);
  }
  return joined(failed);
}

constexpr const char* kHint =
    "the rank(s) named did not call monitored_barrier in time: they may be stuck in an earlier "
    "collective, slower, or gone; their own errors and flight-recorder dumps say which";

// Rank 0's side. `verdict` is filled as ranks are checked, then sent to every rank.
void collectArrivals(cpu::P2pEngine& p2p, const MonitoredBarrierCall& call) {
  const int size = call.ctx.size;
  const auto start = Clock::now();
  const auto deadline = start + call.timeout;  // for every arrival: they are awaited together
  auto arrivals = makeCompletions(size);
  std::vector<at::Tensor> landing(size);
  for (int r = 1; r < size; ++r) {
    landing[r] = int64s(1);
    p2p.recv(r, arrivalTag(call.ctx.seq), landing[r], deadline, arrivals->slot(r));
  }
  std::vector<int64_t> verdict(size + 1, kUnchecked);  // [size]: the barrier as a whole
  verdict[0] = kPassed;
  std::vector<int> processed, failed;
  std::string firstCause;
  for (int r = 1; r < size; ++r) {
    // gloo's rule: out of time once the whole milliseconds elapsed reach the timeout (so always,
    // with a timeout of 0); then rank r fails with "Rank 0 timed out ..." as its cause, as in gloo,
    // whose out-of-time check throws inside rank r's wait. With waitAllRanks every rank is awaited.
    const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    if (!call.waitAllRanks && elapsed >= call.timeout) {
      verdict[r] = kFailed;
      failed.push_back(r);
      firstCause = strCat("Rank 0 timed out in monitoredBarrier after ", call.timeout.count(), " ms.\n",
                          processed.empty() ? std::string("No ranks successfully processed in monitoredBarrier.")
                                            : strCat("Successfully processed ranks: ", joined(processed)));
      break;
    }
    std::exception_ptr error = arrivals->wait(r, deadline);
    if (!error) {
      verdict[r] = kPassed;
      processed.push_back(r);
      continue;
    }
    verdict[r] = kFailed;
    failed.push_back(r);
    if (firstCause.empty()) firstCause = whatOf(error);
    if (!call.waitAllRanks) break;
  }
  std::string failure;  // the error to raise once the verdict is out
  if (!failed.empty()) {
    failure = strCat("[Rank 0]: ", failed.size() == 1 ? "Rank " : "Ranks ", joined(failed),
                     " failed to pass monitoredBarrier in ", call.timeout.count(), " ms\n Original exception: \n",
                     firstCause);
  }
  verdict[size] = failure.empty() ? kPassed : kFailed;
  // The verdict goes to every rank, those that have not arrived included (it waits for them as an
  // unexpected message), so that no rank waits for a reply that never comes.
  at::Tensor verdictTensor = int64s(size + 1);
  std::copy(verdict.begin(), verdict.end(), verdictTensor.data_ptr<int64_t>());
  auto sends = makeCompletions(size);
  const auto sendBy = Clock::now() + call.replyTimeout;
  for (int r = 1; r < size; ++r) p2p.send(r, verdictTag(call.ctx.seq), verdictTensor, sendBy, sends->slot(r));
  if (!failure.empty()) throwDistError(call.ctx, failure, kHint);
  for (int r = 1; r < size; ++r) {
    if (std::exception_ptr error = sends->wait(r, sendBy)) {
      throwDistError(call.ctx, strCat("every rank passed monitoredBarrier, but sending the verdict to rank ", r,
                                      " failed: ", whatOf(error)),
                     "that rank's connection broke after it arrived; check its log");
    }
  }
}

// A rank > 0: arrive, then wait for the verdict.
void arriveAndWait(cpu::P2pEngine& p2p, const MonitoredBarrierCall& call) {
  const int rank = call.ctx.rank;
  const auto deadline = Clock::now() + call.replyTimeout;
  auto messages = makeCompletions(2);
  at::Tensor arrival = int64s(1);
  arrival.fill_(rank);
  at::Tensor verdict = int64s(call.ctx.size + 1);
  p2p.send(0, arrivalTag(call.ctx.seq), arrival, deadline, messages->slot(0));
  p2p.recv(0, verdictTag(call.ctx.seq), verdict, deadline, messages->slot(1));
  std::string cause;
  for (int index : {0, 1}) {
    if (std::exception_ptr error = messages->wait(index, deadline)) {
      cause = whatOf(error);
      break;
    }
  }
  if (cause.empty()) {
    const int64_t* flags = verdict.data_ptr<int64_t>();
    if (flags[call.ctx.size] == kPassed) return;
    cause = strCat("rank 0 reports that rank(s) ", failedRanks(flags, call.ctx.size),
                   " failed to pass monitoredBarrier in ", call.timeout.count(), " ms");
  }
  throwDistError(call.ctx,
                 strCat("Rank ", rank, " successfully reached monitoredBarrier, but received errors while waiting "
                        "for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original exception: \n",
                        cause),
                 "rank 0's error names the rank(s) that did not arrive");
}

}  // namespace

void monitoredBarrier(cpu::P2pEngine& p2p, const MonitoredBarrierCall& call) {
  if (call.ctx.size == 1) return;
  if (call.ctx.rank == 0) {
    collectArrivals(p2p, call);
  } else {
    arriveAndWait(p2p, call);
  }
}

}  // namespace ddplite
