#include "backend/flight_recorder.hpp"

#include "common/env.hpp"
#include "common/logging.hpp"
#include "common/thread_name.hpp"

#include <Python.h>

#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace ddplite {

namespace {

using c10d::OpType;

// The version of torch's dump format we write; the analyzer checks that every rank has the same
// one and picks its coalescing rules by it ("2.10": torch 2.7 and later).
constexpr const char* kFormatVersion = "2.10";
constexpr size_t kMaxFrames = 64;

enum class State : uint8_t { kScheduled, kStarted, kCompleted };

const char* stateName(State state) {
  switch (state) {
    case State::kScheduled: return "scheduled";
    case State::kStarted: return "started";
    case State::kCompleted: return "completed";
  }
  return "scheduled";
}

int64_t wallClockNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Record ids are per process, from 0, across every group (the analyzer orders by them).
std::atomic<uint64_t> nextRecordId{0};

struct Frame {
  std::string name;
  std::string filename;
  int line = 0;
};

// The calling thread's Python stack, innermost first (as torch's recorder lists it). Takes the
// GIL: the c10d bindings release it before calling the backend, and the thread's frames stay on
// its thread state meanwhile.
void capturePythonStack(std::vector<Frame>& frames) {
  frames.clear();
  if (!Py_IsInitialized()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr && frames.size() < kMaxFrames) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    Frame entry;
    entry.line = PyFrame_GetLineNumber(frame);
    for (auto [attribute, field] : {std::pair{"co_name", &entry.name}, std::pair{"co_filename", &entry.filename}}) {
      PyObject* text = PyObject_GetAttrString(reinterpret_cast<PyObject*>(code), attribute);
      if (text != nullptr && PyUnicode_Check(text)) *field = PyUnicode_AsUTF8(text);
      Py_XDECREF(text);
    }
    PyErr_Clear();
    Py_DECREF(code);
    frames.push_back(std::move(entry));
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyGILState_Release(gil);
}

const char* dtypeName(c10::ScalarType type) {
  return c10::toString(type);  // "Float", "Double", "Long", "BFloat16", ... as torch records them
}

// The registry of live recorders, for the process-wide dump. Weak: a destroyed group's entries
// go with it (200 new_group/destroy rounds must not grow anything).
std::mutex registryMutex;
std::vector<std::weak_ptr<FlightRecorder>>& registry() {
  static auto* recorders = new std::vector<std::weak_ptr<FlightRecorder>>();  // never destroyed: used at exit
  return *recorders;
}

void registerRecorder(const std::shared_ptr<FlightRecorder>& recorder) {
  std::lock_guard<std::mutex> lock(registryMutex);
  auto& recorders = registry();
  recorders.erase(std::remove_if(recorders.begin(), recorders.end(), [](const auto& weak) { return weak.expired(); }),
                  recorders.end());
  recorders.push_back(recorder);
}

std::vector<std::shared_ptr<FlightRecorder>> liveRecorders() {
  std::lock_guard<std::mutex> lock(registryMutex);
  std::vector<std::shared_ptr<FlightRecorder>> live;
  for (const auto& weak : registry()) {
    if (auto recorder = weak.lock()) live.push_back(std::move(recorder));
  }
  return live;
}

c10::impl::GenericDict newDict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

c10::impl::GenericList newList() {
  return c10::impl::GenericList(c10::AnyType::get());
}

bool writeFileAtomically(const std::string& path, const std::vector<char>& bytes, std::string& why) {
  const std::string temporary = strCat(path, ".tmp", getpid());
  const int fd = ::open(temporary.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = strCat("cannot create ", temporary, ": ", std::strerror(errno));
    return false;
  }
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      why = strCat("cannot write ", temporary, ": ", std::strerror(errno));
      ::close(fd);
      ::unlink(temporary.c_str());
      return false;
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    why = strCat("cannot rename ", temporary, " to ", path, ": ", std::strerror(errno));
    ::unlink(temporary.c_str());
    return false;
  }
  return true;
}

// mkdir -p of the directory part of `path`.
void makeParentDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
    ::mkdir(path.substr(0, slash).c_str(), 0755);  // EEXIST and the like: the open reports what matters
  }
}

}  // namespace

const char* frOpName(OpType type, const char* op) {
  switch (type) {
    case OpType::BROADCAST: return "broadcast";
    case OpType::ALLREDUCE: return "all_reduce";
    case OpType::REDUCE: return "reduce";
    case OpType::ALLGATHER: return "all_gather";
    case OpType::_ALLGATHER_BASE: return "_all_gather_base";
    case OpType::GATHER: return "gather";
    case OpType::SCATTER: return "scatter";
    case OpType::REDUCE_SCATTER: return "reduce_scatter";
    case OpType::_REDUCE_SCATTER_BASE: return "_reduce_scatter_base";
    case OpType::ALLTOALL_BASE:
    case OpType::ALLTOALL: return "all_to_all";
    case OpType::BARRIER: return "all_reduce_barrier";
    case OpType::SEND: return "send";
    case OpType::RECV:
    case OpType::RECVANYSOURCE: return "recv";
    case OpType::ALLREDUCE_COALESCED: return "allreduce_coalesced";
    case OpType::ALLGATHER_COALESCED: return "ALLGATHER_coalesced";  // the analyzer's name for it
    case OpType::COALESCED:
      if (std::strcmp(op, "allgather_into_tensor_coalesced") == 0) return "all_gather_into_tensor_coalesced";
      if (std::strcmp(op, "reduce_scatter_tensor_coalesced") == 0) return "reduce_scatter_tensor_coalesced";
      if (std::strcmp(op, "allreduce_coalesced") == 0) return "allreduce_coalesced";
      return "coalesced";
    default: return "coalesced";
  }
}

// One ring slot, compact and contiguous: the shapes of the usual op (a few tensors of a few dims)
// live inside it, so recording writes about four adjacent cache lines and allocates nothing.
// The inputs' shapes come first in `dims`/`sizes`/`types`, then the outputs'.
//
// Ordering: record() fills a slot under the recorder's mutex and publishes it by storing
// `recordId` last (release). started()/completed() run without the mutex, on the thread that
// runs or finishes the op: they check `recordId` (acquire) and store the progress fields
// (relaxed, then `state` with release); the dump reads them under the mutex (acquire on
// `state`). A slot the ring reuses while its old op is still queued (more than the ring's
// capacity in flight) can show the new op with the old op's progress: a wrong state in a dump,
// never a crash.
struct FlightRecorder::Slot {
  std::atomic<uint64_t> recordId{UINT64_MAX};  // UINT64_MAX: never used
  uint64_t collectiveSeq = 0;
  uint64_t p2pSeq = 0;
  int64_t createdNs = 0;
  std::atomic<int64_t> startedNs{0};
  std::atomic<int64_t> completedNs{0};
  bool timed = false;  // duration_ms = completed - started, in the dump
  int64_t timeoutMs = 0;
  const char* profilingOp = "";
  const char* dataPath = "";
  std::atomic<const char*> algorithm{nullptr};
  std::atomic<State> state{State::kScheduled};
  bool isP2p = false;
  uint16_t inputCount = 0;                    // tensors of the inputs in dims/types
  c10::SmallVector<uint8_t, 8> dims;          // each tensor's number of dims
  c10::SmallVector<c10::ScalarType, 8> types; // each tensor's dtype
  c10::SmallVector<int64_t, 6> sizes;         // every tensor's sizes, concatenated
  std::vector<Frame> frames;
};


namespace {

void appendShapesImpl(c10::ArrayRef<at::Tensor> tensors, bool flat, c10::SmallVector<uint8_t, 8>& dims,
                      c10::SmallVector<c10::ScalarType, 8>& types, c10::SmallVector<int64_t, 6>& sizes) {
  if (tensors.empty()) return;
  if (flat) {
    int64_t numel = 0;
    for (const auto& tensor : tensors) numel += tensor.numel();
    dims.push_back(1);
    sizes.push_back(numel);
    types.push_back(tensors.front().scalar_type());
    return;
  }
  for (const auto& tensor : tensors) {
    dims.push_back(static_cast<uint8_t>(tensor.dim()));
    for (int64_t size : tensor.sizes()) sizes.push_back(size);
    types.push_back(tensor.scalar_type());
  }
}

// [[sizes of tensor first, first + count)] as the analyzer reads them.
c10::IValue sizesValue(const FlightRecorder::Slot& slot, size_t first, size_t count) {
  size_t at = 0;
  for (size_t t = 0; t < first; ++t) at += slot.dims[t];
  auto list = newList();
  for (size_t t = first; t < first + count; ++t) {
    auto shape = newList();
    for (uint8_t d = 0; d < slot.dims[t]; ++d) shape.push_back(slot.sizes[at++]);
    list.push_back(std::move(shape));
  }
  return list;
}

c10::IValue dtypesValue(const FlightRecorder::Slot& slot, size_t first, size_t count) {
  auto list = newList();
  for (size_t t = first; t < first + count; ++t) list.push_back(std::string(dtypeName(slot.types[t])));
  return list;
}

c10::IValue optionalNs(int64_t ns) {
  return ns == 0 ? c10::IValue() : c10::IValue(ns);
}

}  // namespace

struct FlightRecorder::DumpBuilder {
  std::vector<std::pair<uint64_t, c10::IValue>> entries;
  c10::impl::GenericDict pgConfig = newDict();
  c10::impl::GenericDict pgStatus = newDict();
  int globalRank = -1;
};

FlightRecorder::FlightRecorder(TraceGroupIdentity identity, int globalRank, size_t capacity)
    : globalRank_(globalRank), capacity_(capacity), stacks_(env::traceStacks()), identity_(std::move(identity)),
      slots_(std::make_unique<Slot[]>(capacity)) {}

FlightRecorder::~FlightRecorder() = default;

std::shared_ptr<FlightRecorder> FlightRecorder::create(TraceGroupIdentity identity, int globalRank) {
  const int64_t capacity = env::traceBufferSize();
  if (capacity <= 0) return nullptr;
  auto recorder = std::make_shared<FlightRecorder>(std::move(identity), globalRank, static_cast<size_t>(capacity));
  registerRecorder(recorder);
  return recorder;
}

void FlightRecorder::nameGroup(const std::string& name, const std::string& desc) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!name.empty()) identity_.name = name;
  if (!desc.empty()) identity_.desc = desc;
}

namespace {
// The caller's stack for its next record(), and whether it was taken: this thread only.
thread_local std::vector<Frame> callerFrames;
thread_local bool callerFramesTaken = false;
}  // namespace

void FlightRecorder::captureCallerStack() const {
  if (!stacks_) return;
  capturePythonStack(callerFrames);
  callerFramesTaken = true;
}

FlightRecorder::Handle FlightRecorder::record(const TraceOp& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = nextRecordId.fetch_add(1, std::memory_order_relaxed);
  Slot& slot = slots_[id % capacity_];
  slot.recordId.store(UINT64_MAX, std::memory_order_relaxed);  // unpublished while it is rewritten
  slot.profilingOp = op.profilingOp;
  slot.isP2p = op.isP2p;
  slot.collectiveSeq = op.collectiveSeq;
  slot.p2pSeq = op.p2pSeq;
  slot.dims.clear();
  slot.types.clear();
  slot.sizes.clear();
  appendShapesImpl(op.inputs, op.flatInputs, slot.dims, slot.types, slot.sizes);
  slot.inputCount = static_cast<uint16_t>(slot.dims.size());
  appendShapesImpl(op.outputs, op.flatOutputs, slot.dims, slot.types, slot.sizes);
  slot.dataPath = op.dataPath;
  slot.algorithm.store(nullptr, std::memory_order_relaxed);
  slot.state.store(State::kScheduled, std::memory_order_relaxed);
  slot.createdNs = wallClockNs();
  slot.startedNs.store(0, std::memory_order_relaxed);
  slot.completedNs.store(0, std::memory_order_relaxed);
  slot.timed = op.timed;
  slot.timeoutMs = op.timeout.count();
  if (callerFramesTaken) {
    slot.frames.swap(callerFrames);
    callerFramesTaken = false;
  } else {
    slot.frames.clear();
  }
  slot.recordId.store(id, std::memory_order_release);  // published: started()/completed() may update it
  // The next op's slot is cold once the ring is larger than the cache: fetch it now, while this
  // op runs, instead of missing on it in the next record().
  const char* next = reinterpret_cast<const char*>(&slots_[(id + 1) % capacity_]);
  for (size_t line = 0; line < sizeof(Slot); line += 64) __builtin_prefetch(next + line, 1);
  return id + 1;
}

FlightRecorder::Slot* FlightRecorder::slotOf(Handle handle) {
  if (handle == 0) return nullptr;
  Slot& slot = slots_[(handle - 1) % capacity_];
  return slot.recordId.load(std::memory_order_acquire) == handle - 1 ? &slot : nullptr;
}

void FlightRecorder::started(Handle handle) {
  // The clock read is about 20 ns (vDSO): a third of the recorder's own cost on an 8-byte
  // all_reduce, but what makes start times and durations readable in a dump.
  if (Slot* slot = slotOf(handle)) {
    slot->startedNs.store(wallClockNs(), std::memory_order_relaxed);
    slot->state.store(State::kStarted, std::memory_order_release);
  }
}

void FlightRecorder::completed(Handle handle, const char* algorithm) {
  if (Slot* slot = slotOf(handle)) {
    slot->completedNs.store(wallClockNs(), std::memory_order_relaxed);
    if (algorithm != nullptr) slot->algorithm.store(algorithm, std::memory_order_relaxed);
    slot->state.store(State::kCompleted, std::memory_order_release);
  }
}

void FlightRecorder::appendTo(DumpBuilder& dump) const {
  std::lock_guard<std::mutex> lock(mutex_);
  dump.globalRank = globalRank_;
  auto config = newDict();
  config.insert("name", identity_.name);
  config.insert("desc", identity_.desc);
  config.insert("ranks", strCat("[", c10::Join(", ", identity_.globalRanks), "]"));  // a str, as torch writes it
  dump.pgConfig.insert_or_assign(identity_.name, config);
  uint64_t lastCompleted = 0;
  uint64_t lastStarted = 0;
  uint64_t lastEnqueued = 0;
  for (size_t i = 0; i < capacity_; ++i) {
    const Slot& slot = slots_[i];
    const uint64_t recordId = slot.recordId.load(std::memory_order_acquire);
    if (recordId == UINT64_MAX) continue;
    const State state = slot.state.load(std::memory_order_acquire);
    const int64_t startedNs = slot.startedNs.load(std::memory_order_relaxed);
    const int64_t completedNs = slot.completedNs.load(std::memory_order_relaxed);
    const char* algorithm = slot.algorithm.load(std::memory_order_relaxed);
    if (!slot.isP2p) {
      lastEnqueued = std::max(lastEnqueued, slot.collectiveSeq);
      if (state != State::kScheduled) lastStarted = std::max(lastStarted, slot.collectiveSeq);
      if (state == State::kCompleted) lastCompleted = std::max(lastCompleted, slot.collectiveSeq);
    }
    auto entry = newDict();
    entry.insert("record_id", static_cast<int64_t>(recordId));
    entry.insert("pg_id", static_cast<int64_t>(0));
    entry.insert("process_group", c10::ivalue::Tuple::create(identity_.name, identity_.desc));
    entry.insert("collective_seq_id", static_cast<int64_t>(slot.collectiveSeq));
    entry.insert("p2p_seq_id", static_cast<int64_t>(slot.p2pSeq));
    entry.insert("op_id", static_cast<int64_t>(slot.isP2p ? slot.p2pSeq : slot.collectiveSeq));
    entry.insert("profiling_name", strCat("nccl:", slot.profilingOp));
    entry.insert("time_created_ns", slot.createdNs);
    const size_t outputs = slot.dims.size() - slot.inputCount;
    entry.insert("input_sizes", sizesValue(slot, 0, slot.inputCount));
    entry.insert("input_dtypes", dtypesValue(slot, 0, slot.inputCount));
    entry.insert("output_sizes", sizesValue(slot, slot.inputCount, outputs));
    entry.insert("output_dtypes", dtypesValue(slot, slot.inputCount, outputs));
    entry.insert("state", std::string(stateName(state)));
    entry.insert("time_discovered_started_ns", optionalNs(startedNs));
    entry.insert("time_discovered_completed_ns", optionalNs(completedNs));
    // torch's recorder writes duration_ms only when timing is on (and it could compute it).
    if (slot.timed && startedNs != 0 && completedNs != 0 && state == State::kCompleted) {
      entry.insert("duration_ms", static_cast<double>(completedNs - startedNs) / 1e6);
    }
    entry.insert("retired", state == State::kCompleted);
    entry.insert("timeout_ms", slot.timeoutMs);
    entry.insert("is_p2p", slot.isP2p);
    auto frames = newList();
    for (const Frame& frame : slot.frames) {
      auto line = newDict();
      line.insert("name", frame.name);
      line.insert("filename", frame.filename);
      line.insert("line", static_cast<int64_t>(frame.line));
      frames.push_back(std::move(line));
    }
    entry.insert("frames", frames);
    entry.insert("ddplite_path", std::string(slot.dataPath));
    entry.insert("ddplite_algorithm", algorithm != nullptr ? c10::IValue(std::string(algorithm)) : c10::IValue());
    dump.entries.emplace_back(recordId, std::move(entry));
  }
  auto status = newDict();
  status.insert("last_enqueued_collective", static_cast<int64_t>(lastEnqueued));
  status.insert("last_started_collective", static_cast<int64_t>(lastStarted));
  status.insert("last_completed_collective", static_cast<int64_t>(lastCompleted));
  dump.pgStatus.insert_or_assign(identity_.name, status);
}

namespace {

// The dump and the global rank of this process (-1 when no group records).
std::pair<std::vector<char>, int> buildDump() {
  FlightRecorder::DumpBuilder dump;
  for (const auto& recorder : liveRecorders()) recorder->appendTo(dump);
  std::sort(dump.entries.begin(), dump.entries.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  auto entries = newList();
  for (auto& [id, entry] : dump.entries) entries.push_back(std::move(entry));
  auto top = newDict();
  top.insert("version", std::string(kFormatVersion));
  top.insert("comm_lib_version", std::string("ddplite"));
  top.insert("pg_config", dump.pgConfig);
  top.insert("pg_status", dump.pgStatus);
  top.insert("entries", entries);
  std::vector<at::Tensor> noTensors;  // the dump holds none; a table keeps the pickle plain
  return {torch::jit::pickle(top, &noTensors), dump.globalRank};
}

}  // namespace

std::vector<char> flightRecorderPickle() {
  return buildDump().first;
}

std::optional<std::string> dumpFlightRecorder(const std::string& path) {
  auto [bytes, globalRank] = buildDump();
  if (globalRank < 0) {
    DDPLITE_LOG(kWarn, "flight recorder: nothing to dump (no ddplite process group records; "
                       "DDPLITE_TRACE_BUFFER_SIZE=0?)");
    return std::nullopt;
  }
  const std::string target = path.empty() ? strCat(env::traceDumpPrefix(), globalRank) : path;
  makeParentDirectories(target);
  std::string why;
  if (!writeFileAtomically(target, bytes, why)) {
    DDPLITE_LOG(kWarn, "flight recorder: could not write the dump: ", why);
    return std::nullopt;
  }
  DDPLITE_LOG(kInfo, "flight recorder: dumped to ", target);
  return target;
}

std::string dumpFlightRecorderOnFailure(std::atomic<bool>& dumpedAlready) {
  if (dumpedAlready.exchange(true)) return "";
  const std::optional<std::string> path = dumpFlightRecorder();
  if (!path) return "";
  const size_t slash = path->rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path->substr(0, slash);
  return strCat(". Flight recorder dump: ", *path, " (every rank writes one; read them with: python -m "
                "torch.distributed.flight_recorder.fr_trace ", dir, ")");
}

namespace {

int signalPipe[2] = {-1, -1};

void onTraceSignal(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] ssize_t ignored = ::write(signalPipe[1], &byte, 1);  // async-signal-safe; full pipe: one is enough
  errno = saved;
}

}  // namespace

void installTraceSignalHandler() {
  static std::once_flag once;
  if (!env::traceSignal()) return;
  std::call_once(once, [] {
    if (::pipe2(signalPipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      DDPLITE_LOG(kWarn, "flight recorder: DDPLITE_TRACE_SIGNAL=1 ignored: pipe: ", std::strerror(errno));
      return;
    }
    // The reading end blocks: the thread sleeps in read() until a signal's byte arrives.
    ::fcntl(signalPipe[0], F_SETFL, 0);
    std::thread dumper([] {
      char byte = 0;
      for (;;) {
        const ssize_t n = ::read(signalPipe[0], &byte, 1);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        dumpFlightRecorder();
      }
    });
    nameThread(dumper, "ddplite-frdump");
    dumper.detach();  // lives as long as the process; holds nothing but the pipe
    struct sigaction action {};
    action.sa_handler = onTraceSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &action, nullptr);
    DDPLITE_LOG(kInfo, "flight recorder: SIGUSR1 dumps (DDPLITE_TRACE_SIGNAL=1)");
  });
}

}  // namespace ddplite
