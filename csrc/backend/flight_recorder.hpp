// The flight recorder: per process group, a bounded ring of the last N ops this rank issued
// (collectives and send/recv), dumped on every rank when an op fails, on request from Python
// (torch_ddp_lite.dump_flight_recorder) and on SIGUSR1 when DDPLITE_TRACE_SIGNAL=1, in the format
// torch's own analyzer reads:
//
//   python -m torch.distributed.flight_recorder.fr_trace DIR
//
// Format (torch 2.11's analyzer, torch/distributed/flight_recorder/components/): one file per
// rank, named <prefix><global rank> with no extension, holding a pickle of
//   {"version": "2.10", "pg_config": {name: {"name", "desc", "ranks": "[0, 1]"}},
//    "pg_status": {...}, "comm_lib_version": "ddplite ...", "entries": [entry, ...]}
// where each entry has record_id (per process, from 0, ascending), process_group (name, desc),
// collective_seq_id, p2p_seq_id, is_p2p, profiling_name ("nccl:all_reduce": the analyzer accepts
// only the nccl:/xccl: prefixes and torch's op names), input/output sizes and dtypes, state
// ("scheduled", "started", "completed"), timestamps, timeout_ms, frames (the Python stack when
// DDPLITE_TRACE_STACKS=1) and two keys of ours the analyzer ignores: ddplite_path (the group's
// CPU path) and ddplite_algorithm (the algorithm that ran).
//
// Why not torch's own c10d::FlightRecorder: its instance lives in libtorch_cuda/libtorch_cpu
// without exported symbols for third-party entries, and FlightRecorderDetail.hpp needs
// nlohmann/json, which the wheel does not ship. The dump format is what we share with torch.
//
// Only CPU ops are recorded: CUDA ops go to the NCCL path, whose completion is known only to the
// watchdog (docs/gpu.md).
//
// Cost: record() takes one uncontended mutex and copies sizes into a compact slot (no allocation
// for ops of up to a few tensors) and prefetches the next slot; started()/completed() take no
// lock (a few atomic stores, ordering in flight_recorder.cpp). Measured in docs/reliability.md.
//
// Threading: record() on the caller's thread (under the group's enqueue mutex for collectives),
// started()/completed() on whichever thread runs or finishes the op; dump from any thread.
#pragma once

#include "common/errors.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ddplite {

// Who a group is, as torch's analyzer needs it: pg_config's name, desc and global ranks.
struct TraceGroupIdentity {
  std::string name;              // torch's group name ("0", "1", ...): Backend::getGroupUid()
  std::string desc;              // "default_pg", "undefined", or new_group(group_desc=...)
  std::vector<int> globalRanks;  // global rank of each group rank
};

// One op as the caller issues it.
struct TraceOp {
  const char* profilingOp;  // torch's name: "all_reduce", "broadcast", "send", ... (frOpName)
  bool isP2p = false;
  uint64_t collectiveSeq = 0;
  uint64_t p2pSeq = 0;
  c10::ArrayRef<at::Tensor> inputs;
  c10::ArrayRef<at::Tensor> outputs;
  // Record the list as one flat tensor of the summed size (all_gather's outputs, reduce_scatter's
  // inputs: the analyzer compares numel across the group that way).
  bool flatInputs = false;
  bool flatOutputs = false;
  const char* dataPath = "";  // "shm", "tcp", "mpi", "hierarchical", "p2p"
  std::chrono::milliseconds timeout{0};
  bool timed = false;  // collectives timing on (enableCollectivesTiming): the entry gets duration_ms
};

// torch's flight-recorder name for an op of c10d type `type` called `op` by ddplite
// ("all_reduce" for allreduce; "all_reduce_barrier" for barrier; the coalesced variants by name).
const char* frOpName(c10d::OpType type, const char* op);

class FlightRecorder {
 public:
  // An entry's handle: its record id + 1; 0 when nothing was recorded.
  using Handle = uint64_t;

  // The recorder of one group, registered for the process-wide dump; null when the buffer size
  // is 0 (DDPLITE_TRACE_BUFFER_SIZE, else TORCH_FR_BUFFER_SIZE, default 2000).
  static std::shared_ptr<FlightRecorder> create(TraceGroupIdentity identity, int globalRank);

  FlightRecorder(TraceGroupIdentity identity, int globalRank, size_t capacity);
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Torch names and describes the group after the backend exists (ProcessGroup::setGroupName):
  // the backend passes them on at its first op.
  void nameGroup(const std::string& name, const std::string& desc);

  // With DDPLITE_TRACE_STACKS=1 (read when the group was created): takes the calling thread's
  // Python stack (needs the GIL) for its next record(); call it before taking any lock that a
  // thread holding the GIL may wait for.
  void captureCallerStack() const;
  Handle record(const TraceOp& op);
  // Stamps time_discovered_started_ns (wall clock) on the thread that begins running the op.
  void started(Handle handle);
  // `algorithm`: what ran (static string) or nullptr.
  void completed(Handle handle, const char* algorithm);

  int globalRank() const { return globalRank_; }
  size_t capacity() const { return capacity_; }

  // For the dump (flight_recorder.cpp): adds this group's entries and pg_config line.
  struct DumpBuilder;
  void appendTo(DumpBuilder& dump) const;
  struct Slot;  // one ring entry (flight_recorder.cpp)

  ~FlightRecorder();

 private:
  Slot* slotOf(Handle handle);  // null when the ring has reused its slot

  const int globalRank_;
  const size_t capacity_;
  const bool stacks_;  // DDPLITE_TRACE_STACKS
  mutable std::mutex mutex_;
  TraceGroupIdentity identity_;  // guarded by mutex_
  std::unique_ptr<Slot[]> slots_;  // ring of capacity_; written under mutex_ but for progress (see Slot)
};

// The process's dump (every live group's entries, ascending record id) as pickle bytes.
std::vector<char> flightRecorderPickle();

// Writes the dump to <prefix><global rank> and returns the path: prefix from DDPLITE_TRACE_DIR
// ("<dir>/ddplite_trace_rank_"), else TORCH_FR_DUMP_TEMP_FILE, else "/tmp/ddplite_traces/ddplite_trace_rank_";
// `path` overrides. nullopt (with a warning) when no group records or the file cannot be written.
std::optional<std::string> dumpFlightRecorder(const std::string& path = "");

// The automatic dump on a failure, once per `dumpedAlready` flag (a group's first failure dumps;
// its cascade does not). Returns ". Flight recorder dump: <path> (...)" for the error, or "".
std::string dumpFlightRecorderOnFailure(std::atomic<bool>& dumpedAlready);

// DDPLITE_TRACE_SIGNAL=1: installs a SIGUSR1 handler that dumps from a thread of its own (the
// handler only writes a byte to a pipe). Idempotent; called when a group is created.
void installTraceSignalHandler();

}  // namespace ddplite
