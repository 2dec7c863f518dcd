// The decisions of the NCCL path, as plain functions with no CUDA or NCCL types, so that every
// build (the CPU-only one too) compiles them and tests/test_cuda_rules.py checks them without a
// GPU. nccl_path.cpp and nccl_comm.cpp call these and do nothing but carry out their answers.
//
// What each rule mirrors (NCCL 2.28/2.30 and torch 2.11's ProcessGroupNCCL, read, not run):
//   * sharedGpu: NCCL's init refuses two ranks whose host hash and PCI bus id are equal
//     ("Duplicate GPU detected") unless it is >= 2.30 and every rank enabled multi-rank GPUs.
//     MIG slices of one GPU have different UUIDs but one bus id, so both are compared.
//   * fp8ReductionRefusal: NCCL's enqueue refuses a float8 reduction with ncclInvalidArgument when
//     the communicator's lowest compute capability is below 9.0 ("FP8 reduction support begins
//     with sm90 capable devices"); data movement is sent as bytes and needs nothing.
//   * pollWhileInProgress: a nonblocking communicator answers ncclInProgress until its set-up or
//     operation is done; the caller polls its async error against the op's deadline.
//   * teardown: ProcessGroupNCCL's destructor aborts when the group was never shut down; only
//     destroy_process_group (shutdown) waits for queued work.
// Threads: every function is pure, or uses only what it is given.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddplite::nccl::rules {

struct Version {
  int major = 0;
  int minor = 0;
  int patch = 0;
};

// One rank's GPU, as the ranks exchange it before NCCL init.
struct GpuIdentity {
  std::string host;      // NCCL_HOSTID if set, else hostname + boot id (what NCCL's host hash covers)
  std::string busId;     // PCI bus id, lower case ("0000:3b:00.0")
  std::string uuid;      // the device's UUID in hex (a MIG slice has its own)
  int ccMajor = 0;       // compute capability
  int ccMinor = 0;
  bool multiRankGpu = false;  // this rank's NCCL is >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1
};

// "host|busId|uuid|major.minor|0 or 1" and back; decode throws std::invalid_argument on garbage.
std::string encodeIdentity(const GpuIdentity& identity);
GpuIdentity decodeIdentity(const std::string& text);

struct SharedGpuDecision {
  std::string sharedGpu;  // "ranks 0 and 1 are both on GPU <uuid> (PCI bus <id>, host <h>)"; "" if none
  bool ncclServes = true; // false: stage through host memory (or refuse, DDPLITE_CUDA_STAGING=never)
};
SharedGpuDecision sharedGpu(const std::vector<GpuIdentity>& identities);

// The lowest compute capability over every rank, as major * 10 + minor (NCCL's minCompCap).
int minComputeCapability(const std::vector<GpuIdentity>& identities);

// "" when NCCL can reduce float8 on this communicator; otherwise why not (for a ValueError).
// `ncclHasFp8`: the NCCL ddplite was compiled against has the float8 types (>= 2.24).
std::string fp8ReductionRefusal(bool ncclHasFp8, int minCompCap);

// Bootstrap keys of one NCCL path: `ordinal` is the device's order of first use in the group
// (the same on every rank). They are unique per run because the backend's whole store view is
// (DdpliteBackend: "ddplite/run<k>/"), and the bootstrap deletes them once every rank read them.
std::string identityKey(int ordinal, int rank);
std::string uniqueIdKey(int ordinal);

// Polls `query` (which returns NCCL result codes) until it stops answering `inProgress`, `now()`
// passes `deadline`, or `cancelled()` (an abort was requested meanwhile; may be empty), calling
// `pause()` between polls. The clock is a parameter so that tests can drive it. kTimedOut and
// kCancelled: the caller aborts the communicator and raises, within the op's timeout.
enum class PollOutcome { kDone, kFailed, kTimedOut, kCancelled };
struct PollResult {
  PollOutcome outcome;
  int lastCode;  // the last code `query` returned
  int polls;     // how many times it was called
};
PollResult pollWhileInProgress(const std::function<int()>& query, int inProgress, int success,
                               const std::function<std::chrono::steady_clock::time_point()>& now,
                               std::chrono::steady_clock::time_point deadline, const std::function<void()>& pause,
                               const std::function<bool()>& cancelled = {});

// ncclCommSplit's arguments for one rank of the parent in a split_group: the members of one new
// group share a color (their lowest parent rank: the new groups are disjoint) and are ordered by
// their position in `members` (key), the caller's order: torch 2.14+ numbers a split's ranks by
// their position in the list it was given (up to 2.13 it sorts the list first); a rank in no new
// group, or one that refused the split, passes `noColor` (NCCL_SPLIT_NOCOLOR), since every rank
// of the parent must take part.
struct SplitArgs {
  int color;
  int key;
};
SplitArgs splitArgs(const std::vector<int>& members, int parentRank, int noColor);

// How a shrunk group (torch's shrink_group) gets its communicator on one device where the parent
// group has one. ncclCommShrink (NCCL 2.27) makes it from the parent's among the survivors only, the
// excluded ranks taking no part; NCCL_SHRINK_ABORT first ends the parent's pending operations
// (shrink_group's SHRINK_ABORT: a peer hangs). Without it, or when the parent's communicator was
// aborted or failed (it cannot be shrunk then), the new group makes its own on its first CUDA op.
enum class ShrinkComm { kShrinkParent, kNewCommunicator };
struct ShrinkPlan {
  ShrinkComm how;
  int ncclFlags;    // for ncclCommShrink: NCCL_SHRINK_DEFAULT (0) or NCCL_SHRINK_ABORT (1)
  std::string why;  // for the log: why this way
};
// `builtWithShrink`: the nccl.h ddplite compiled against has ncclCommShrink; `loaded`: the
// libnccl this process runs; `parentUsable`: the parent's communicator was neither aborted nor
// failed (NCCL refuses to shrink a communicator holding an async error), and, without
// `abortPending`, has no outstanding work (NCCL_SHRINK_DEFAULT may deadlock on it). Every survivor
// must take the same way for a device: the backend uses ncclCommShrink only where all could.
constexpr int kNcclShrinkDefault = 0;  // NCCL_SHRINK_DEFAULT (nccl.h)
constexpr int kNcclShrinkAbort = 1;    // NCCL_SHRINK_ABORT
ShrinkPlan shrinkPlan(bool builtWithShrink, Version loaded, bool parentUsable, bool abortPending);

// A rank's sends to itself and receives from itself in one NCCL group. NCCL pairs them inside
// the group, per communicator (here: per device), the k-th send with the k-th receive; one left
// over fails the group's end (ncclInvalidUsage, "send to self without a matching recv"), which
// would abort every communicator of the group. The path fails such ops alone, never issued. A
// pair of different sizes is refused too (NCCL matches by order only).
struct SelfOp {
  bool send;     // else a receive
  int device;    // CUDA device index
  size_t bytes;
};
// Indices into `ops` (issue order) of the ops left unpaired, ascending.
std::vector<size_t> unpairedSelfOps(const std::vector<SelfOp>& ops);

// What happens to a group's communicators when the group goes away.
enum class Teardown {
  kDrainThenDestroy,  // destroy_process_group: let queued work finish (up to the timeout), ncclCommDestroy
  kAbort,             // abort(), a broken group, or destruction without shutdown: ncclCommAbort now
};
enum class TeardownCause { kShutdown, kAbort, kDestructor };
Teardown teardownFor(TeardownCause cause, bool groupBroken);

}  // namespace ddplite::nccl::rules
