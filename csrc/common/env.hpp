// Every environment knob ddplite reads is declared once, in env.cpp, with the DDPLITE_ prefix
// (NCCL's habit), its default written once next to it. Every knob validates the same way: a value
// outside the allowed set throws std::invalid_argument naming the knob, the value and the allowed
// values (validateAll() at group creation turns that into a ValueError from init_process_group).
// Values are read on first use and cached for the life of the process, except where noted.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddplite::env {

struct Knob {
  const char* name;         // full variable name, e.g. "DDPLITE_SOCKET_IFNAME"
  std::string defaultValue; // as text; "" means unset
  std::string help;         // one line, shown by torch_ddp_lite.env_knobs()
};

// The table of every knob, for docs and collect_env.
const std::vector<Knob>& allKnobs();

// Reads every knob that has a fixed set of values (all but SOCKET_IFNAME, checked against the
// machine's interfaces when sockets open, ALGO, parsed by the selector, and CPU_KERNELS, checked
// against the CPU by cpu/reduce/reduce_kernels.cpp) and throws
// std::invalid_argument for the first bad one. Called when a group is created, so a typo fails
// init_process_group on every rank instead of being ignored.
void validateAll();

// The knobs every rank of a group must set alike (they shape what goes on the wire or which
// path a collective takes), as (name, value in effect). Compared across ranks when a group is
// created. Call after validateAll().
std::vector<std::pair<std::string, std::string>> groupWideSettings();

// DDPLITE_SOCKET_IFNAME (NCCL syntax), falling back to NCCL_SOCKET_IFNAME then GLOO_SOCKET_IFNAME.
// Returns "" when none is set. `source` receives the variable that was used.
std::string socketIfname(std::string* source = nullptr);

// DDPLITE_DEBUG: WARN (default, 0), INFO (1) or TRACE (2), any case; DETAIL logs as INFO (1). Never throws (logging calls
// it from anywhere): a bad value logs at WARN until validateAll() reports it.
int logLevel();

// DDPLITE_RING_SEGMENT_BYTES: largest piece a ring step moves at once.
int64_t ringSegmentBytes();

// DDPLITE_TREE_CHUNK_BYTES: chunk size that pipelines tree broadcast and reduce.
int64_t treeChunkBytes();

// DDPLITE_SOCKET_BUFFER_BYTES: SO_SNDBUF / SO_RCVBUF for data sockets (0 = kernel default).
int64_t socketBufferBytes();

// DDPLITE_ALGO: algorithm pins, "collective:algorithm,..." ("" when unset). Parsed and checked by
// cpu/algorithms/selector.cpp.
std::string algorithmSpec();

// DDPLITE_SHM_CHUNK_BYTES: bytes per rank and buffer of the shared-memory path (cpu/shm/).
int64_t shmChunkBytes();

// DDPLITE_SHM_INLINE_BYTES: shared-memory collectives up to this size run on the calling thread
// when nothing else is pending (0: never).
int64_t shmInlineBytes();

// DDPLITE_SYNC_ON_CALLER: whether a CPU collective issued with async_op=False runs on the calling
// thread when the group's worker is idle (backend.cpp, enqueue). Read each time (a group reads it
// when it is created); throws std::invalid_argument naming the knob for a value other than 0 or 1.
bool syncOpsOnCaller();

// DDPLITE_TCP_SPIN_US: how long a TCP transfer of at most kTcpSpinMaxBytes retries its sockets
// (sched_yield between tries) before it sleeps in poll() (0: never). Read each time (a transport
// reads it when it is created); throws std::invalid_argument naming the knob for a bad value.
inline constexpr size_t kTcpSpinMaxBytes = 256 << 10;
std::chrono::microseconds tcpSpin();

// DDPLITE_TCP_SEND_CHUNK_BYTES: the most bytes one send() of the TCP transport hands the kernel
// (0: the whole remainder). Read each time (a transport reads it when it is created); throws
// std::invalid_argument naming the knob for a bad value.
size_t tcpSendChunkBytes();

// DDPLITE_SHM_SPIN_US: how long a shared-memory wait spins (yielding every 64 pauses) before it
// sleeps on a futex, in a group of at most two ranks per CPU (0, and beyond: after 64 pauses). Read each time (a group reads it when
// it is created); throws std::invalid_argument naming the knob for a bad value.
std::chrono::microseconds shmSpin();

// DDPLITE_CALLER_SPIN_US (0: off): how long a wait spins on a thread that runs an op it blocks on
// (cpu/transport/wait_policy.hpp), where the shared-memory or TCP wait spins at all and its own spin is
// shorter. Read each time (a group reads it when it is created); throws std::invalid_argument
// naming the knob for a bad value.
std::chrono::microseconds callerSpin();

// DDPLITE_CALLER_SPIN_TRIAL (1): whether a group measures spinning against sleeping for the ops
// its callers block on and keeps the faster (backend/caller_spin_trial.hpp), or always spins. Read
// each time (a group reads it when it is created); throws std::invalid_argument naming the knob for a
// bad value.
bool callerSpinTrial();

// DDPLITE_RAILS_BYTES: an all_reduce across hosts of at least this many bytes runs on rails, every
// rank of a host carrying its share between hosts (cpu/hierarchy/allreduce_hierarchical.cpp); 0:
// never. Read each time (a group reads it when it is created); throws std::invalid_argument naming
// the knob for a bad value.
int64_t railsBytes();

// DDPLITE_CPU_KERNELS: "auto" (default) or the name of a reduction kernel set, lower-cased. The
// name is checked by cpu/reduce/reduce_kernels.cpp (it knows the sets and what this CPU runs).
std::string cpuKernels();

// DDPLITE_CPU_TRANSPORT: "auto" (default), "tcp", "mpi" or "shm", lower-cased.
std::string cpuTransport();

// DDPLITE_FINGERPRINT: whether collectives carry and check the wire fingerprint
// (cpu/transport/fingerprint.hpp). Read each time (a group reads it when it is created); throws
// std::invalid_argument naming the knob for a value other than 0 or 1.
bool fingerprintChecks();

// DDPLITE_AUTH: whether the TCP meshes authenticate every connection at set-up
// (cpu/transport/auth.hpp). Read each time (a group reads it when it is created).
bool authenticateConnections();

// DDPLITE_CONNECT: whether a group of `groupSize` ranks connects its TCP pairs on demand (true)
// or every pair at set-up (false). Read each time (a group reads it when it is created).
bool connectOnDemand(int groupSize);

// DDPLITE_SHM_SYNC and DDPLITE_SHM_TREE_FANIN: the fan-in of the arrival tree a shared-memory
// group of `hostRanks` ranks synchronises through (cpu/shm/arrival_tree.hpp), 0 for flat (every
// rank reads every flag). Read each time (a group reads it when it is created); throws
// std::invalid_argument naming the knob for a bad value.
int shmTreeFanIn(int hostRanks);

// DDPLITE_AUTH_KEY_FILE: the path of the connection key (cpu/transport/auth.hpp); "" when unset.
std::string authKeyFile();

// Whether collectives check their arguments across ranks before running (backend/detail_check.hpp):
// DDPLITE_DEBUG=DETAIL or TORCH_DISTRIBUTED_DEBUG=DETAIL. Read each time (a group reads it when
// it is created). Never throws.
bool detailChecks();

// Flight recorder (backend/flight_recorder.hpp), each read each time:
// DDPLITE_TRACE_BUFFER_SIZE, else TORCH_FR_BUFFER_SIZE, else 2000: ops remembered per group (0: off).
int64_t traceBufferSize();
// DDPLITE_STRAGGLER_WINDOW: collectives a group remembers for straggler scores
// (backend/wait_ledger.hpp), 0 for none. Read each time (a group reads it when it is created).
int64_t stragglerWindow();
// DDPLITE_STRAGGLER_REPORT: how often (seconds; 0: never) global rank 0 logs the straggler
// table (torch_ddp_lite/stragglers.py runs the report). Read each time; throws
// std::invalid_argument naming the knob for a bad value.
int64_t stragglerReportSeconds();
// DDPLITE_STATUS: whether this process answers the live status query (health/status_server.hpp).
// Read each time; throws std::invalid_argument naming the knob for a bad value.
bool statusServer();
// Where dumps go: "<DDPLITE_TRACE_DIR>/ddplite_trace_rank_", else TORCH_FR_DUMP_TEMP_FILE, else
// "/tmp/ddplite_traces/ddplite_trace_rank_"; the global rank is appended.
std::string traceDumpPrefix();
// DDPLITE_TRACE_STACKS=1: record the caller's Python stack with each op.
bool traceStacks();
// DDPLITE_TRACE_SIGNAL=1: dump on SIGUSR1.
bool traceSignal();

// DDPLITE_CUDA_STAGING: how CUDA tensors travel when NCCL cannot serve the group.
//   kAuto: NCCL, except on a GPU two ranks share (then through host memory, with a warning);
//   kAlways: always through host memory and the CPU transport; kNever: NCCL or an error.
enum class CudaStaging { kAuto, kAlways, kNever };
CudaStaging cudaStaging();

// DDPLITE_TEST_HOOKS: fault injection and starting states for ddplite's own tests (env.cpp's help
// text). Read each time; throws std::invalid_argument naming the knob for a malformed value.
struct TestHooks {
  uint32_t shmFirstStep = 0;  // the shared-memory steps start after this one (cpu/shm/shm_group.cpp)
  int shmFaultRank = -1;      // this group rank throws std::bad_alloc after posting a step of ...
  uint64_t shmFaultSeq = 0;   // ... collective #shmFaultSeq (0: never)
  int shmStallAttach = -1;    // this group rank never attaches the segment (it sleeps; tests kill it)
  uint32_t shmAttachWithinS = 0;  // > 0: rank 0 waits this many seconds for the others to attach (else 30)
  int shmExitUnarrivedRank = -1;    // this group rank kills itself (SIGKILL) between its posted flag ...
  uint64_t shmExitUnarrivedSeq = 0;  // ... and its arrival at the arrival tree, in collective #seq (0: never)
  int shmNumaNodes = 0;  // m > 0: rank r of a shared-memory group says it runs on NUMA node r % m (synthetic topology)
  int shmDelayArrivalRank = -1;     // this group rank sleeps between its posted flag and its arrival ...
  uint64_t shmDelayArrivalSeq = 0;  // ... in collective #seq (0: never) ...
  uint32_t shmDelayArrivalMs = 0;   // ... this many milliseconds
  uint32_t shmCombineDelayMs = 0;   // the rank that combines a step on arrival sleeps this long before it combines
  uint32_t tcpHelloDelayMs = 0;     // an on-demand connector sleeps this long between its connect and its Hello
};
TestHooks testHooks();

}  // namespace ddplite::env
