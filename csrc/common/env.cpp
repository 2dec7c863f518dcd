#include "common/env.hpp"

#include "common/errors.hpp"

#include <strings.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace ddplite::env {

namespace {

constexpr const char* kSocketIfname = "DDPLITE_SOCKET_IFNAME";
constexpr const char* kDebug = "DDPLITE_DEBUG";
constexpr const char* kRingSegmentBytes = "DDPLITE_RING_SEGMENT_BYTES";
constexpr const char* kTreeChunkBytes = "DDPLITE_TREE_CHUNK_BYTES";
constexpr const char* kSocketBufferBytes = "DDPLITE_SOCKET_BUFFER_BYTES";
constexpr const char* kAlgo = "DDPLITE_ALGO";
constexpr const char* kCpuTransport = "DDPLITE_CPU_TRANSPORT";
constexpr const char* kCudaStaging = "DDPLITE_CUDA_STAGING";
constexpr const char* kFingerprint = "DDPLITE_FINGERPRINT";
constexpr const char* kShmChunkBytes = "DDPLITE_SHM_CHUNK_BYTES";
constexpr const char* kShmInlineBytes = "DDPLITE_SHM_INLINE_BYTES";
constexpr const char* kTcpSpinUs = "DDPLITE_TCP_SPIN_US";
constexpr const char* kShmSpinUs = "DDPLITE_SHM_SPIN_US";
constexpr const char* kCallerSpinUs = "DDPLITE_CALLER_SPIN_US";
constexpr const char* kCallerSpinTrial = "DDPLITE_CALLER_SPIN_TRIAL";
constexpr const char* kTcpSendChunkBytes = "DDPLITE_TCP_SEND_CHUNK_BYTES";
constexpr const char* kSyncOnCaller = "DDPLITE_SYNC_ON_CALLER";
constexpr const char* kRailsBytes = "DDPLITE_RAILS_BYTES";
constexpr const char* kCpuKernels = "DDPLITE_CPU_KERNELS";
constexpr const char* kConnect = "DDPLITE_CONNECT";
constexpr const char* kShmSync = "DDPLITE_SHM_SYNC";
constexpr const char* kShmTreeFanIn = "DDPLITE_SHM_TREE_FANIN";
constexpr const char* kAuth = "DDPLITE_AUTH";
constexpr const char* kAuthKeyFile = "DDPLITE_AUTH_KEY_FILE";
constexpr const char* kTraceBufferSize = "DDPLITE_TRACE_BUFFER_SIZE";
constexpr const char* kStragglerWindow = "DDPLITE_STRAGGLER_WINDOW";
constexpr const char* kStatus = "DDPLITE_STATUS";
constexpr const char* kStragglerReport = "DDPLITE_STRAGGLER_REPORT";
constexpr const char* kTorchTraceBufferSize = "TORCH_FR_BUFFER_SIZE";
constexpr const char* kTraceDir = "DDPLITE_TRACE_DIR";
constexpr const char* kTorchTraceFile = "TORCH_FR_DUMP_TEMP_FILE";
constexpr const char* kTraceStacks = "DDPLITE_TRACE_STACKS";
constexpr const char* kTraceSignal = "DDPLITE_TRACE_SIGNAL";
constexpr const char* kTestHooks = "DDPLITE_TEST_HOOKS";

// Defaults and allowed values, written once: the readers and the knob table both use these.
// For a choice knob the first entry is the default.
constexpr int64_t kDefaultChunkBytes = 256 << 10;
constexpr int64_t kMinimumChunkBytes = 64;
constexpr int64_t kDefaultSocketBufferBytes = 0;
constexpr int64_t kDefaultShmChunkBytes = 512 << 10;
constexpr int64_t kMinimumShmChunkBytes = 4096;
constexpr int64_t kMaximumShmChunkBytes = int64_t{1} << 30;
constexpr int64_t kDefaultShmInlineBytes = 256 << 10;
constexpr int64_t kDefaultTcpSpinUs = 50;
constexpr int64_t kMaximumTcpSpinUs = 100000;
constexpr int64_t kDefaultShmSpinUs = 50;
constexpr int64_t kMaximumShmSpinUs = 100000;
constexpr int64_t kDefaultCallerSpinUs = 0;
constexpr int64_t kMaximumCallerSpinUs = 100000;
constexpr int64_t kDefaultTcpSendChunkBytes = 32 << 10;
constexpr int64_t kMinimumTcpSendChunkBytes = 4096;
constexpr int64_t kMaximumTcpSendChunkBytes = int64_t{1} << 30;
constexpr int64_t kDefaultRailsBytes = 2 << 20;
constexpr int64_t kDefaultTraceBufferSize = 2000;
constexpr int64_t kMaximumTraceBufferSize = 1000000;
constexpr int64_t kDefaultStragglerWindow = 512;
constexpr int64_t kMaximumStragglerWindow = 65536;
constexpr int64_t kMaximumStragglerReportSeconds = 7 * 24 * 3600;
constexpr const char* kDefaultTracePrefix = "/tmp/ddplite_traces/ddplite_trace_rank_";
// DETAIL logs as INFO and turns on the cross-rank argument check (detailChecks()).
const std::initializer_list<const char*> kLogLevels = {"WARN", "INFO", "TRACE", "DETAIL"};
const std::initializer_list<const char*> kTransports = {"auto", "tcp", "mpi", "shm"};
const std::initializer_list<const char*> kStagings = {"auto", "always", "never"};
const std::initializer_list<const char*> kConnectModes = {"auto", "on_demand", "at_init"};
// DDPLITE_CONNECT=auto connects every pair at init up to this many ranks (a network problem shows in
// init_process_group), on demand above (set-up and descriptors that do not grow with the group).
constexpr int kConnectAtInitUpTo = 16;
const std::initializer_list<const char*> kShmSyncModes = {"auto", "flat", "tree"};
// DDPLITE_SHM_SYNC=auto: every rank reads every peer's flag up to this many ranks on a host, an
// arrival tree above (docs/scale.md, "Arrival trees in shared memory").
constexpr int kShmFlatSyncUpTo = 2;  // one peer: its flag is the one word to read
constexpr int64_t kDefaultShmTreeFanIn = 8;
constexpr int64_t kMaximumShmTreeFanIn = 64;
const std::initializer_list<const char*> kSwitch = {"1", "0"};
const std::initializer_list<const char*> kOffSwitch = {"0", "1"};

const char* rawValue(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

[[noreturn]] void invalid(const char* name, const char* value, const std::string& allowed) {
  throw std::invalid_argument(strCat(name, "='", value, "' is not a valid value; ", allowed));
}

std::string choicesText(std::initializer_list<const char*> choices) {
  std::string text = "use one of: ";
  for (const char* choice : choices) {
    text += choice;
    text += choice == *choices.begin() ? " (the default)" : "";
    text += choice == *(choices.end() - 1) ? "" : ", ";
  }
  return text;
}

// Index of the value in `choices` (case-insensitive), 0 (the default) when unset.
int readChoice(const char* name, std::initializer_list<const char*> choices) {
  const char* value = rawValue(name);
  if (value == nullptr) return 0;
  int index = 0;
  for (const char* choice : choices) {
    if (strcasecmp(value, choice) == 0) return index;
    ++index;
  }
  invalid(name, value, choicesText(choices));
}

// Whether all of `value` is one whole decimal number that fits a long long; stored in *parsed.
bool parseWhole(const char* value, long long* parsed) {
  char* end = nullptr;
  errno = 0;
  *parsed = std::strtoll(value, &end, 10);
  return end != value && *end == '\0' && errno != ERANGE;
}

// A whole decimal number of `unit` (bytes unless said) in [minimum, maximum]; `fallback` when unset.

int64_t readBytes(const char* name, int64_t fallback, int64_t minimum, int64_t maximum = INT64_MAX,
                  const char* unit = "bytes") {
  const char* value = rawValue(name);
  if (value == nullptr) return fallback;
  long long parsed = 0;
  if (!parseWhole(value, &parsed) || parsed < minimum || parsed > maximum) {
    invalid(name, value,
            strCat("use a whole number of ", unit, " >= ", minimum, maximum < INT64_MAX ? strCat(" and <= ", maximum) : "",
                   " (the default is ", fallback, ")"));
  }
  return parsed;
}

// DDPLITE_TCP_SEND_CHUNK_BYTES: 0 (no limit) or [kMinimumTcpSendChunkBytes, kMaximumTcpSendChunkBytes];
// a cap of a few bytes would turn a large transfer into a syscall per few bytes.
int64_t readTcpSendChunkBytes() {
  const char* value = rawValue(kTcpSendChunkBytes);
  if (value == nullptr) return kDefaultTcpSendChunkBytes;
  long long parsed = 0;
  if (!parseWhole(value, &parsed) || parsed < 0 || parsed > kMaximumTcpSendChunkBytes ||
      (parsed > 0 && parsed < kMinimumTcpSendChunkBytes)) {
    invalid(kTcpSendChunkBytes, value,
            strCat("use 0 (no limit) or a whole number of bytes >= ", kMinimumTcpSendChunkBytes, " and <= ",
                   kMaximumTcpSendChunkBytes, " (the default is ", kDefaultTcpSendChunkBytes, ")"));
  }
  return parsed;
}

}  // namespace

const std::vector<Knob>& allKnobs() {
  static const std::vector<Knob> knobs = {
      {kSocketIfname, "",
       "Interfaces for rank-to-rank sockets, NCCL syntax: 'eth' (prefix), '=eth0' (exact), "
       "'^docker,lo' (exclude). Falls back to NCCL_SOCKET_IFNAME, then GLOO_SOCKET_IFNAME; "
       "unset: the interface that reaches MASTER_ADDR"},
      {kDebug, *kLogLevels.begin(),
       "Log level on stderr: WARN, INFO or TRACE; DETAIL logs as INFO and checks every collective's arguments "
       "across ranks before it runs (as TORCH_DISTRIBUTED_DEBUG=DETAIL does): a mismatch raises on every rank"},
      {kRingSegmentBytes, std::to_string(kDefaultChunkBytes),
       strCat("Largest piece one ring step sends at once (bytes, >= ", kMinimumChunkBytes, ")")},
      {kTreeChunkBytes, std::to_string(kDefaultChunkBytes),
       strCat("Pipelining chunk of tree broadcast and reduce (bytes, >= ", kMinimumChunkBytes, ")")},
      {kSocketBufferBytes, std::to_string(kDefaultSocketBufferBytes),
       "SO_SNDBUF/SO_RCVBUF of data sockets; 0 keeps the kernel default"},
      {kAlgo, "",
       "Pin CPU algorithms, e.g. 'allreduce:ring,broadcast:tree' (collective:algorithm, comma-separated; "
       "'auto' for the size-based choice). Must be the same on every rank"},
      {kCpuTransport, *kTransports.begin(),
       "What carries CPU collectives: 'auto' (shared memory when all ranks of a group share a host, else "
       "ddplite's TCP transport; a segment that cannot be made falls back to TCP with a warning), 'tcp', "
       "'shm' (shared memory or an error) or 'mpi' (MPI's own collectives on the group's "
       "communicator; needs a build with MPI and a job launched by mpirun). Must be the same on every rank"},
      {kShmChunkBytes, std::to_string(kDefaultShmChunkBytes),
       strCat("Shared-memory path: bytes per rank and buffer moved per step (two buffers per rank; ",
              kMinimumShmChunkBytes, " to ", kMaximumShmChunkBytes, "). Must be the same on every rank")},
      {kShmInlineBytes, std::to_string(kDefaultShmInlineBytes),
       strCat("Shared-memory path: a collective of at most this many bytes runs on the calling thread "
              "when no other op is pending (no hand-off to the worker thread); 0 sends every op to the "
              "worker (0 to ", kMaximumShmChunkBytes, ")")},
      {kShmSpinUs, std::to_string(kDefaultShmSpinUs),
       strCat("Shared-memory path: how long (microseconds) a wait for the other ranks' flags spins, yielding the "
              "CPU every 64 pauses, before it sleeps on a futex; a group with more than two ranks per CPU sleeps "
              "after 64 pauses whatever this says. 0: sleep after 64 pauses (0 to ", kMaximumShmSpinUs,
              "). Read when a group is created")},
      {kCallerSpinUs, std::to_string(kDefaultCallerSpinUs),
       strCat("How long (microseconds) a wait spins where the op runs on the thread that called it and blocks "
              "on it (async_op=False, DDPLITE_SYNC_ON_CALLER), when longer than DDPLITE_SHM_SPIN_US or "
              "DDPLITE_TCP_SPIN_US. Only where those spin at all: TCP waits of at most ",
              kTcpSpinMaxBytes >> 10, " KiB of a group not on one host's segment, on a host with at most two of "
              "the group's ranks per CPU, and the segment of a host in a group across hosts; an async op's "
              "wait, on the worker thread, keeps the shorter spin. 1000 ran small all_reduces 1.6x faster at 4 "
              "namespace hosts x 2 ranks on 2 cores, and 3.1-5.5x slower under other load on those cores (4.1x "
              "beside one busy process); DDPLITE_CALLER_SPIN_TRIAL tries it against sleeping. 0: the same spin as async ops (0 to ", kMaximumCallerSpinUs,
              "). Read when a group is created")},
      {kCallerSpinTrial, *kSwitch.begin(),
       "Where DDPLITE_CALLER_SPIN_US is set: 1: a group's sync ops run on their caller try spinning and sleeping "
       "by turns, in blocks of 8 sequence numbers at the start of every 256, until each side has timed 8 ops, "
       "and the rest of those 256 spin only if the spin's median time was under 0.9x the sleep's "
       "(backend/caller_spin_trial.hpp; where sync ops are few among async ones, a trial may not fill and they "
       "take turns throughout); 0: they always spin. Read when a group is created"},
      {kSyncOnCaller, *kSwitch.begin(),
       "1: a CPU collective issued with async_op=False runs on the calling thread when nothing else of the "
       "group is queued or running (the caller blocks on it anyway; it saves two thread hand-offs). 0: it "
       "goes through the group's worker thread like an async op. Read when a group is created"},
      {kTcpSpinUs, std::to_string(kDefaultTcpSpinUs),
       strCat("TCP transport: how long (microseconds) a collective's wait for a peer's bytes retries the socket, "
              "yielding the CPU between tries, before it sleeps in poll(); only for transfers of at most ",
              kTcpSpinMaxBytes >> 10, " KiB. The wake-up it saves is most of a small message's time between "
              "hosts. 0: always sleep at once (0 to ", kMaximumTcpSpinUs, ")")},
      {kTcpSendChunkBytes, std::to_string(kDefaultTcpSendChunkBytes),
       strCat("TCP transport: the most bytes one send() hands the kernel. The kernel holds the socket's lock for "
              "a whole send(), so a large one stalls the bytes and acknowledgements coming the other way (a "
              "2-rank all_reduce sends both ways on one socket). 0: the whole remaining buffer per send() "
              "(0, or ", kMinimumTcpSendChunkBytes, " to ", kMaximumTcpSendChunkBytes, "). Read when a group is created")},
      {kRailsBytes, std::to_string(kDefaultRailsBytes),
       "Across hosts: an all_reduce of at least this many bytes runs on rails, every rank of a host carrying "
       "its share of the data between hosts (reduce-scatter in the host's segment, one all_reduce per rail "
       "over TCP, all-gather in the segment) instead of the hosts' leaders alone. 0: the leaders carry every "
       "all_reduce. Read when a group is created; must be the same on every rank"},
      {kCpuKernels, "auto",
       "Which compilation of the CPU reduction kernels runs: 'auto' (the widest this CPU runs), 'avx512', "
       "'avx2' or 'generic' (x86-64 baseline). Every set gives the same bits; pinning one is for measuring "
       "them. A set this CPU lacks fails init_process_group"},
      {kFingerprint, *kSwitch.begin(),
       "1: the first message of every CPU collective to each peer carries a 48-byte fingerprint (sequence "
       "number, op, sizes, dtype, reduce op, root, algorithm), so a rank in another collective is reported at "
       "once instead of its bytes being used. 0 turns the check off: only for measuring its cost, since "
       "mismatched collectives can then return wrong values. Read when a group is created"},
      {kConnect, *kConnectModes.begin(),
       strCat("When the TCP connections between ranks are made: 'on_demand' (a pair connects the first time one "
              "of them sends to or receives from the other: a rank holds only the connections its algorithms "
              "use, and set-up reads no peer's address), 'at_init' (every pair at init_process_group, so a "
              "network problem shows there) or 'auto' (at init up to ", kConnectAtInitUpTo,
              " ranks, on demand above). Same on every rank. Read when a group is created")},
      {kShmSync, *kShmSyncModes.begin(),
       strCat("How the ranks of a shared-memory group learn that all of them reached a step: 'flat' (each rank "
              "reads every peer's flag: P reads per rank and step), 'tree' (an arrival tree: each rank adds "
              "itself to one counter and reads one word; the last to arrive carries the count up and wakes "
              "everyone) or 'auto' (flat up to ", kShmFlatSyncUpTo,
              " ranks on a host, where there is one peer's flag to read, tree above). Same on every rank. Read "
              "when a group is created")},
      {kShmTreeFanIn, std::to_string(kDefaultShmTreeFanIn),
       strCat("Arrivals per counter of the shared-memory arrival tree (DDPLITE_SHM_SYNC; 2 to ",
              kMaximumShmTreeFanIn, "). Same on every rank")},
      {kAuth, *kSwitch.begin(),
       "1: every TCP connection between ranks (collectives' and send/recv meshes) is authenticated at set-up by "
       "an HMAC-SHA256 challenge-response keyed by a secret rank 0 shares through the store; a connection that "
       "fails it is dropped with a warning naming its address. 0 skips it (saves one round trip per "
       "connection at set-up; nothing after set-up), and then anyone who reaches a listener can take a rank's "
       "place: at set-up, or, when pairs connect on demand (DDPLITE_CONNECT), for a pair's whole life (a warning "
       "says so). Same on every rank. Read when a group is created"},
      {kAuthKeyFile, "",
       "A file holding the key (at least 16 bytes) that authenticates TCP connections, on every rank: the key "
       "never enters the store, so only its holders can join even when others can read the store (docs/"
       "security.md). Unset: rank 0 draws a secret and shares it through the store"},
      {kTraceBufferSize, std::to_string(kDefaultTraceBufferSize),
       "Flight recorder: ops remembered per process group (0 turns it off). Unset: TORCH_FR_BUFFER_SIZE, "
       "else the default"},
      {kStragglerWindow, std::to_string(kDefaultStragglerWindow),
       "Straggler scores (torch_ddp_lite.stragglers): the last collectives whose arrival and completion each "
       "rank remembers, per process group (0 turns it off: stragglers() then has nothing to score)"},
      {kStragglerReport, "0",
       "Seconds: global rank 0 logs the default group's straggler table (and ranks not answering) to stderr "
       "this often, asking every rank as `python -m torch_ddp_lite.status` does (one more Python thread, on rank "
       "0 only, whose work shares rank 0's GIL; needs DDPLITE_STATUS=1). 0: never"},
      {kStatus, *kSwitch.begin(),
       "1: each process answers `python -m torch_ddp_lite.status` on a port of its own (one listener and no "
       "extra thread beyond one per process; queries authenticated as the TCP connections are, read-only; "
       "docs/observability.md). 0: no listener, and status lists the process as not published. Same on every "
       "rank. Read when the process's first group is created"},
      {kTraceDir, "",
       "Flight recorder: directory of the dumps (file ddplite_trace_rank_<global rank>), written when an op "
       "fails, on torch_ddp_lite.dump_flight_recorder() and on SIGUSR1 (DDPLITE_TRACE_SIGNAL=1). Unset: the "
       "prefix in TORCH_FR_DUMP_TEMP_FILE, else /tmp/ddplite_traces/ddplite_trace_rank_"},
      {kTraceStacks, *kOffSwitch.begin(),
       "Flight recorder: 1 records the caller's Python stack with every op (costs microseconds per op)"},
      {kTraceSignal, *kOffSwitch.begin(),
       "Flight recorder: 1 dumps on SIGUSR1 (a handler that only wakes a thread of ddplite's; replaces any "
       "SIGUSR1 handler installed before the first group)"},
      {kCudaStaging, *kStagings.begin(),
       "CUDA tensors: 'auto' uses NCCL except on a GPU shared by two ranks (then host memory + CPU transport, "
       "with a warning); 'always' stages every CUDA op; 'never' raises instead of staging. Same on every rank"},
      {kTestHooks, "",
       "For ddplite's own tests, never for jobs: comma-separated 'shm_first_step=<n>' (the shared-memory "
       "steps start at n, to test their wrap at 2^32; same on every rank) and 'shm_fault=<rank>:<seq>' (that "
       "group rank throws std::bad_alloc right after it posts a step of collective #seq) and "
       "'shm_stall_attach=<rank>' (that group rank sleeps instead of attaching the segment) and "
       "'shm_attach_within=<s>' (rank 0 waits s seconds, not 30, for the others to attach it) and "
       "'shm_exit_unarrived=<rank>:<seq>' (that group rank kills itself between storing its posted flag and "
       "arriving at the shared-memory arrival tree, in collective #seq) and 'shm_delay_arrival=<rank>:<seq>:<ms>' "
       "(it sleeps there instead) and 'shm_combine_delay=<ms>' (the rank that combines a small all_reduce on "
       "arrival sleeps before it combines) and 'tcp_hello_delay=<ms>' (a rank connecting on demand sleeps between "
       "its connect and its hello, so that two ranks connecting to each other at once both have a connect under "
       "way when the other's hello arrives)"},
  };
  return knobs;
}

void validateAll() {
  readChoice(kDebug, kLogLevels);
  readBytes(kRingSegmentBytes, kDefaultChunkBytes, kMinimumChunkBytes);
  readBytes(kTreeChunkBytes, kDefaultChunkBytes, kMinimumChunkBytes);
  readBytes(kSocketBufferBytes, kDefaultSocketBufferBytes, 0);
  readChoice(kCpuTransport, kTransports);
  readBytes(kShmChunkBytes, kDefaultShmChunkBytes, kMinimumShmChunkBytes, kMaximumShmChunkBytes);
  readBytes(kShmInlineBytes, kDefaultShmInlineBytes, 0, kMaximumShmChunkBytes);
  readBytes(kTcpSpinUs, kDefaultTcpSpinUs, 0, kMaximumTcpSpinUs, "microseconds");
  readBytes(kShmSpinUs, kDefaultShmSpinUs, 0, kMaximumShmSpinUs, "microseconds");
  readBytes(kCallerSpinUs, kDefaultCallerSpinUs, 0, kMaximumCallerSpinUs, "microseconds");
  readTcpSendChunkBytes();
  readChoice(kFingerprint, kSwitch);
  readChoice(kSyncOnCaller, kSwitch);
  readChoice(kCallerSpinTrial, kSwitch);
  readBytes(kRailsBytes, kDefaultRailsBytes, 0);
  readChoice(kAuth, kSwitch);
  readChoice(kConnect, kConnectModes);
  readChoice(kShmSync, kShmSyncModes);
  readBytes(kShmTreeFanIn, kDefaultShmTreeFanIn, 2, kMaximumShmTreeFanIn, "arrivals");
  readChoice(kCudaStaging, kStagings);
  traceBufferSize();
  stragglerWindow();
  stragglerReportSeconds();
  readChoice(kStatus, kSwitch);
  readChoice(kTraceStacks, kOffSwitch);
  readChoice(kTraceSignal, kOffSwitch);
  testHooks();
}

std::string socketIfname(std::string* source) {
  for (const char* name : {kSocketIfname, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (const char* value = rawValue(name)) {
      if (source != nullptr) {
        *source = name;
      }
      return value;
    }
  }
  return "";
}

int logLevel() {
  static const int level = [] {
    try {
      const int index = readChoice(kDebug, kLogLevels);
      return index == 3 ? 1 : index;  // DETAIL logs as INFO
    } catch (const std::invalid_argument&) {
      return 0;
    }
  }();
  return level;
}

int64_t ringSegmentBytes() {
  static const int64_t bytes = readBytes(kRingSegmentBytes, kDefaultChunkBytes, kMinimumChunkBytes);
  return bytes;
}

int64_t treeChunkBytes() {
  static const int64_t bytes = readBytes(kTreeChunkBytes, kDefaultChunkBytes, kMinimumChunkBytes);
  return bytes;
}

int64_t socketBufferBytes() {
  static const int64_t bytes = readBytes(kSocketBufferBytes, kDefaultSocketBufferBytes, 0);
  return bytes;
}

int64_t shmChunkBytes() {
  static const int64_t bytes = readBytes(kShmChunkBytes, kDefaultShmChunkBytes, kMinimumShmChunkBytes, kMaximumShmChunkBytes);
  return bytes;
}

int64_t shmInlineBytes() {
  static const int64_t bytes = readBytes(kShmInlineBytes, kDefaultShmInlineBytes, 0, kMaximumShmChunkBytes);
  return bytes;
}

std::chrono::microseconds tcpSpin() {
  return std::chrono::microseconds(readBytes(kTcpSpinUs, kDefaultTcpSpinUs, 0, kMaximumTcpSpinUs, "microseconds"));
}

size_t tcpSendChunkBytes() {
  return static_cast<size_t>(readTcpSendChunkBytes());
}

std::chrono::microseconds shmSpin() {
  return std::chrono::microseconds(readBytes(kShmSpinUs, kDefaultShmSpinUs, 0, kMaximumShmSpinUs, "microseconds"));
}

std::chrono::microseconds callerSpin() {
  return std::chrono::microseconds(
      readBytes(kCallerSpinUs, kDefaultCallerSpinUs, 0, kMaximumCallerSpinUs, "microseconds"));
}

int64_t railsBytes() { return readBytes(kRailsBytes, kDefaultRailsBytes, 0); }

std::string algorithmSpec() {
  const char* value = rawValue(kAlgo);
  return value != nullptr ? value : "";
}

std::string cpuKernels() {
  const char* value = rawValue(kCpuKernels);
  if (value == nullptr) return "auto";
  std::string lowered(value);
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lowered;
}

std::string cpuTransport() {
  return *(kTransports.begin() + readChoice(kCpuTransport, kTransports));
}

std::vector<std::pair<std::string, std::string>> groupWideSettings() {
  const int syncMode = readChoice(kShmSync, kShmSyncModes);
  return {
      {kCpuTransport, cpuTransport()},
      {kShmChunkBytes, std::to_string(shmChunkBytes())},
      {kRingSegmentBytes, std::to_string(ringSegmentBytes())},
      {kTreeChunkBytes, std::to_string(treeChunkBytes())},
      {kFingerprint, fingerprintChecks() ? "1" : "0"},
      {kAuth, authenticateConnections() ? "1" : "0"},
      {kStatus, statusServer() ? "1" : "0"},
      {kConnect, *(kConnectModes.begin() + readChoice(kConnect, kConnectModes))},
      {kShmSync, *(kShmSyncModes.begin() + syncMode)},
      // the fan-in shapes nothing when every group waits flat: any value agrees then
      {kShmTreeFanIn, syncMode == 1 ? std::string("unused (flat)")
                                    : std::to_string(readBytes(kShmTreeFanIn, kDefaultShmTreeFanIn, 2,
                                                               kMaximumShmTreeFanIn, "arrivals"))},
      {kCudaStaging, *(kStagings.begin() + readChoice(kCudaStaging, kStagings))},
      {kRailsBytes, std::to_string(railsBytes())},
  };
}

bool detailChecks() {
  const char* torchLevel = rawValue("TORCH_DISTRIBUTED_DEBUG");
  if (torchLevel != nullptr && strcasecmp(torchLevel, "DETAIL") == 0) return true;
  try {
    return readChoice(kDebug, kLogLevels) == 3;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

int64_t traceBufferSize() {
  if (rawValue(kTraceBufferSize) != nullptr) {
    return readBytes(kTraceBufferSize, kDefaultTraceBufferSize, 0, kMaximumTraceBufferSize, "ops");
  }
  return readBytes(kTorchTraceBufferSize, kDefaultTraceBufferSize, 0, kMaximumTraceBufferSize, "ops");
}

int64_t stragglerWindow() {
  return readBytes(kStragglerWindow, kDefaultStragglerWindow, 0, kMaximumStragglerWindow, "ops");
}

std::string traceDumpPrefix() {
  if (const char* dir = rawValue(kTraceDir)) return strCat(dir, "/ddplite_trace_rank_");
  if (const char* prefix = rawValue(kTorchTraceFile)) return prefix;
  return kDefaultTracePrefix;
}

std::string authKeyFile() {
  const char* value = rawValue(kAuthKeyFile);
  return value != nullptr ? value : "";
}

bool traceStacks() {
  return readChoice(kTraceStacks, kOffSwitch) == 1;
}

bool traceSignal() {
  return readChoice(kTraceSignal, kOffSwitch) == 1;
}

bool fingerprintChecks() {
  return readChoice(kFingerprint, kSwitch) == 0;
}

bool syncOpsOnCaller() {
  return readChoice(kSyncOnCaller, kSwitch) == 0;
}

bool callerSpinTrial() {
  return readChoice(kCallerSpinTrial, kSwitch) == 0;
}

int64_t stragglerReportSeconds() {
  return readBytes(kStragglerReport, 0, 0, kMaximumStragglerReportSeconds, "seconds");
}

bool statusServer() {
  return readChoice(kStatus, kSwitch) == 0;
}

bool authenticateConnections() {
  return readChoice(kAuth, kSwitch) == 0;
}

bool connectOnDemand(int groupSize) {
  switch (readChoice(kConnect, kConnectModes)) {
    case 1: return true;
    case 2: return false;
    default: return groupSize > kConnectAtInitUpTo;
  }
}

int shmTreeFanIn(int hostRanks) {
  const int mode = readChoice(kShmSync, kShmSyncModes);
  if (mode == 1 || (mode == 0 && hostRanks <= kShmFlatSyncUpTo)) return 0;
  return static_cast<int>(readBytes(kShmTreeFanIn, kDefaultShmTreeFanIn, 2, kMaximumShmTreeFanIn, "arrivals"));
}

CudaStaging cudaStaging() {
  switch (readChoice(kCudaStaging, kStagings)) {
    case 1: return CudaStaging::kAlways;
    case 2: return CudaStaging::kNever;
    default: return CudaStaging::kAuto;
  }
}

TestHooks testHooks() {
  TestHooks hooks;
  const char* value = rawValue(kTestHooks);
  if (value == nullptr) return hooks;
  const std::string allowed =
      "use 'shm_first_step=<n>', 'shm_fault=<rank>:<seq>', 'shm_exit_unarrived=<rank>:<seq>', "
      "'shm_delay_arrival=<rank>:<seq>:<ms>', 'shm_combine_delay=<ms>', 'tcp_hello_delay=<ms>', "
      "'shm_numa_nodes=<m>', 'shm_attach_within=<s>' and/or 'shm_stall_attach=<rank>', comma-separated "
      "(unset: none)";
  std::string spec(value);
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t end = std::min(spec.find(',', begin), spec.size());
    const std::string item = spec.substr(begin, end - begin);
    unsigned long long a = 0, b = 0, c = 0;
    int used = 0;
    if (std::sscanf(item.c_str(), "shm_first_step=%llu%n", &a, &used) == 1 && used == static_cast<int>(item.size()) &&
        a <= UINT32_MAX) {
      hooks.shmFirstStep = static_cast<uint32_t>(a);
    } else if (std::sscanf(item.c_str(), "shm_numa_nodes=%llu%n", &a, &used) == 1 &&
               used == static_cast<int>(item.size()) && a > 0 && a <= 1024) {
      hooks.shmNumaNodes = static_cast<int>(a);
    } else if (std::sscanf(item.c_str(), "shm_stall_attach=%llu%n", &a, &used) == 1 &&
               used == static_cast<int>(item.size())) {
      hooks.shmStallAttach = static_cast<int>(a);
    } else if (std::sscanf(item.c_str(), "shm_attach_within=%llu%n", &a, &used) == 1 &&
               used == static_cast<int>(item.size()) && a > 0 && a <= 3600) {
      hooks.shmAttachWithinS = static_cast<uint32_t>(a);
    } else if (std::sscanf(item.c_str(), "shm_exit_unarrived=%llu:%llu%n", &a, &b, &used) == 2 &&
               used == static_cast<int>(item.size()) && b > 0) {
      hooks.shmExitUnarrivedRank = static_cast<int>(a);
      hooks.shmExitUnarrivedSeq = b;
    } else if (std::sscanf(item.c_str(), "shm_delay_arrival=%llu:%llu:%llu%n", &a, &b, &c, &used) == 3 &&
               used == static_cast<int>(item.size()) && b > 0 && c <= 600000) {
      hooks.shmDelayArrivalRank = static_cast<int>(a);
      hooks.shmDelayArrivalSeq = b;
      hooks.shmDelayArrivalMs = static_cast<uint32_t>(c);
    } else if (std::sscanf(item.c_str(), "tcp_hello_delay=%llu%n", &a, &used) == 1 &&
               used == static_cast<int>(item.size()) && a <= 600000) {
      hooks.tcpHelloDelayMs = static_cast<uint32_t>(a);
    } else if (std::sscanf(item.c_str(), "shm_combine_delay=%llu%n", &a, &used) == 1 &&
               used == static_cast<int>(item.size()) && a <= 600000) {
      hooks.shmCombineDelayMs = static_cast<uint32_t>(a);
    } else if (std::sscanf(item.c_str(), "shm_fault=%llu:%llu%n", &a, &b, &used) == 2 &&
               used == static_cast<int>(item.size()) && b > 0) {
      hooks.shmFaultRank = static_cast<int>(a);
      hooks.shmFaultSeq = b;
    } else {
      invalid(kTestHooks, value, allowed);
    }
    begin = end + 1;
  }
  return hooks;
}

}  // namespace ddplite::env
