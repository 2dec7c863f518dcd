// torch's monitored_barrier with gloo's semantics, over the group's point-to-point engine (so it
// never queues behind collectives and needs no sequence number):
//
//   rank r > 0: sends its arrival to rank 0, then waits for rank 0's verdict;
//   rank 0:     waits for each rank's arrival in rank order, all within `timeout` of its own
//               arrival, then sends every rank the verdict (which ranks passed, which failed).
//
// Rank 0 raises naming the first rank, in rank order, that did not arrive in time ("[Rank 0]:
// Rank 1 failed to pass monitoredBarrier in 2000 ms"), or every such rank with waitAllRanks
// ("Ranks 1, 3 failed to pass ..."), or "Rank 0 timed out in monitoredBarrier" when its time ran
// out before it could wait for the next rank. The other ranks raise ("Rank 2 successfully reached
// monitoredBarrier, but received errors while waiting for send/recv from rank 0 ...") as soon as
// the verdict says the barrier failed (gloo's ranks wait for their own timeout instead), or when
// no verdict comes within `replyTimeout`. The phrases are gloo's: torch's tests match them.
// Errors are DistBackendError (a RuntimeError, which is what gloo raises).
//
// Tags: each call uses two tags below kFirstUserTag, from a per-group call counter that every
// rank advances alike, so a rank that arrives after rank 0 gave up never matches a later call.
// Threads: the caller's; the engine's threads complete the messages.
#pragma once

#include "common/errors.hpp"
#include "cpu/p2p/p2p_engine.hpp"

#include <chrono>
#include <climits>
#include <cstdint>
#include <string>
#include <vector>

namespace ddplite {

// Tags below this one are the backend's own (user tags are torch's ints; negative ones this low
// are refused by send/recv).
constexpr int kFirstUserTag = INT_MIN / 2;

struct MonitoredBarrierCall {
  OpContext ctx;                          // op "monitored_barrier", seq = the call counter
  std::chrono::milliseconds timeout;      // rank 0's budget for all arrivals (0: none at all)
  bool waitAllRanks = false;
  std::chrono::milliseconds replyTimeout; // how long a rank > 0 waits for the verdict
};

// Returns when every rank arrived; throws DistBackendError otherwise (see above).
void monitoredBarrier(cpu::P2pEngine& p2p, const MonitoredBarrierCall& call);

}  // namespace ddplite
