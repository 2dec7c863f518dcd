#include "cpu/mpi_collectives.hpp"

#include "common/errors.hpp"

#ifdef DDPLITE_WITH_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <cstring>
#include <thread>

namespace ddplite::cpu {

#ifdef DDPLITE_WITH_MPI

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

// ---- dtypes and ops ------------------------------------------------------------------------

// Half, bfloat16 and bool have no MPI type: each gets a committed contiguous byte type of its
// own, so that a user-defined op can tell from the datatype which ddplite kernel to run.
struct CustomTypes {
  MPI_Datatype half;
  MPI_Datatype bfloat16;
  MPI_Datatype boolean;

  static MPI_Datatype bytes(int count) {
    MPI_Datatype type;
    MPI_Type_contiguous(count, MPI_BYTE, &type);
    MPI_Type_commit(&type);
    return type;
  }
  static const CustomTypes& get() {
    static const CustomTypes types{bytes(2), bytes(2), bytes(1)};  // created after MPI_Init
    return types;
  }
};

MPI_Datatype mpiType(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: return MPI_FLOAT;
    case c10::kDouble: return MPI_DOUBLE;
    case c10::kChar: return MPI_INT8_T;
    case c10::kByte: return MPI_UINT8_T;
    case c10::kShort: return MPI_INT16_T;
    case c10::kUInt16: return MPI_UINT16_T;
    case c10::kInt: return MPI_INT32_T;
    case c10::kUInt32: return MPI_UINT32_T;
    case c10::kLong: return MPI_INT64_T;
    case c10::kUInt64: return MPI_UINT64_T;
    case c10::kFloat8_e4m3fn:  // moved only: the reductions refuse float8 before anything is sent
    case c10::kFloat8_e5m2: return MPI_UINT8_T;
    case c10::kHalf: return CustomTypes::get().half;
    case c10::kBFloat16: return CustomTypes::get().bfloat16;
    case c10::kBool: return CustomTypes::get().boolean;
    default: DDPLITE_ENFORCE(false, "no MPI type for dtype ", c10::toString(dtype));
  }
  return MPI_DATATYPE_NULL;
}

c10::ScalarType customDtype(MPI_Datatype type) {
  const CustomTypes& types = CustomTypes::get();
  if (type == types.half) return c10::kHalf;
  if (type == types.bfloat16) return c10::kBFloat16;
  return c10::kBool;
}

// MPI_User_function for `Op` on the custom types: inout[i] = in[i] op inout[i] (all ops here
// are commutative), through the same kernel the TCP path uses.
template <RedOpType Op>
void customReduce(void* in, void* inout, int* count, MPI_Datatype* type) {
  ReduceFn reduce = selectReduceFn(customDtype(*type), Op);
  reduce(inout, in, static_cast<size_t>(*count));
}

struct CustomOps {
  MPI_Op sum, product, min, max, band, bor, bxor;

  template <RedOpType Op>
  static MPI_Op create() {
    MPI_Op op;
    MPI_Op_create(&customReduce<Op>, /*commute=*/1, &op);
    return op;
  }
  static const CustomOps& get() {
    static const CustomOps ops{create<RedOpType::SUM>(), create<RedOpType::PRODUCT>(), create<RedOpType::MIN>(),
                               create<RedOpType::MAX>(), create<RedOpType::BAND>(), create<RedOpType::BOR>(),
                               create<RedOpType::BXOR>()};
    return ops;
  }
};

bool hasBuiltinType(c10::ScalarType dtype) {
  return dtype != c10::kHalf && dtype != c10::kBFloat16 && dtype != c10::kBool;
}

MPI_Op mpiOp(c10::ScalarType dtype, RedOpType op) {
  const bool builtin = hasBuiltinType(dtype);
  const CustomOps* custom = builtin ? nullptr : &CustomOps::get();
  switch (op) {
    case RedOpType::SUM:
    case RedOpType::AVG:         // summed here, divided by the caller
    case RedOpType::PREMUL_SUM:  // premultiplied by the caller
      return builtin ? MPI_SUM : custom->sum;
    case RedOpType::PRODUCT: return builtin ? MPI_PROD : custom->product;
    case RedOpType::MIN: return builtin ? MPI_MIN : custom->min;
    case RedOpType::MAX: return builtin ? MPI_MAX : custom->max;
    case RedOpType::BAND: return builtin ? MPI_BAND : custom->band;
    case RedOpType::BOR: return builtin ? MPI_BOR : custom->bor;
    case RedOpType::BXOR: return builtin ? MPI_BXOR : custom->bxor;
    default: DDPLITE_ENFORCE(false, "no MPI op for ", reduceOpName(op));
  }
  return MPI_OP_NULL;
}

// ---- completion ----------------------------------------------------------------------------

void checkStarted(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw TransportError(TransportError::Kind::kIo, -1, strCat(call, " failed: ", std::string(text, length)));
}

// Drives `request` to completion, or throws kTimeout at `deadline`. MPI progresses inside
// MPI_Test, so the loop spins for the first ~50 us (small collectives finish there), then yields,
// then sleeps briefly to leave the core to the ranks it waits for.
void complete(MPI_Request& request, Deadline deadline, const char* call, const std::atomic<bool>& aborted) {
  const auto start = Clock::now();
  for (int flag = 0;;) {
    if (aborted) throw TransportError(TransportError::Kind::kAborted, -1, strCat(call, " abandoned: the group was aborted"));
    checkStarted(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), call);
    if (flag) return;
    const auto now = Clock::now();
    if (now >= deadline) {
      throw TransportError(TransportError::Kind::kTimeout, -1,
                           strCat("Timed out waiting for ", call, " to complete (MPI data path): at least one "
                                        "rank of the group has not joined it"));
    }
    const auto waited = now - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(5)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

MPI_Comm commOf(const mpi::GroupComm& comm) {
  return reinterpret_cast<MPI_Comm>(comm.handle());
}

// Only alltoall can get here with a value over INT_MAX (handles() keeps the others on TCP, but
// uneven splits differ per rank, and every rank must take the same path).
int asInt(size_t value) {
  if (value > static_cast<size_t>(INT_MAX)) {
    throw std::invalid_argument(strCat("a count or offset of ", value, " bytes exceeds MPI's 32-bit int; "
                                       "run exchanges over 2 GiB with DDPLITE_CPU_TRANSPORT=tcp"));
  }
  return static_cast<int>(value);
}

// Per-peer counts and displacements (bytes) of an exchange's spans, for the v-variants.
struct ByteLayout {
  std::vector<int> counts;
  std::vector<int> displacements;

  static ByteLayout of(const std::vector<Span>& spans, int size) {
    ByteLayout layout{std::vector<int>(size, 0), std::vector<int>(size, 0)};
    for (int i = 0; i < size && i < static_cast<int>(spans.size()); ++i) {
      layout.counts[i] = asInt(spans[i].bytes);
      layout.displacements[i] = asInt(spans[i].offset);
    }
    return layout;
  }
};

}  // namespace

bool MpiCollectives::handles(size_t bufferBytes) const {
  return bufferBytes <= static_cast<size_t>(INT_MAX);
}

void MpiCollectives::run(Collective collective, const AlgorithmArgs& args, c10::ScalarType dtype,
                         RedOpType op) const {
  MPI_Comm comm = commOf(comm_);
  MPI_Request request = MPI_REQUEST_NULL;
  const int count = asInt(args.count);
  switch (collective) {
    case Collective::kAllreduce:
      checkStarted(MPI_Iallreduce(MPI_IN_PLACE, args.data, count, mpiType(dtype), mpiOp(dtype, op), comm, &request),
                   "MPI_Iallreduce");
      complete(request, args.deadline, "MPI_Iallreduce", aborted_);
      return;
    case Collective::kBroadcast:
      checkStarted(MPI_Ibcast(args.data, asInt(args.count * args.elementSize), MPI_BYTE, args.root, comm, &request),
                   "MPI_Ibcast");
      complete(request, args.deadline, "MPI_Ibcast", aborted_);
      return;
    case Collective::kReduce: {
      const bool isRoot = comm_.rank() == args.root;
      checkStarted(MPI_Ireduce(isRoot ? MPI_IN_PLACE : args.data, isRoot ? args.data : nullptr, count, mpiType(dtype),
                               mpiOp(dtype, op), args.root, comm, &request),
                   "MPI_Ireduce");
      complete(request, args.deadline, "MPI_Ireduce", aborted_);
      return;
    }
    case Collective::kAllgather: {
      // Block `rank` is already in place (the algorithms' contract).
      checkStarted(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, args.data, asInt(args.count * args.elementSize),
                                  MPI_BYTE, comm, &request),
                   "MPI_Iallgather");
      complete(request, args.deadline, "MPI_Iallgather", aborted_);
      return;
    }
    case Collective::kReduceScatter: {
      checkStarted(MPI_Ireduce_scatter_block(MPI_IN_PLACE, args.data, count, mpiType(dtype), mpiOp(dtype, op), comm,
                                             &request),
                   "MPI_Ireduce_scatter_block");
      complete(request, args.deadline, "MPI_Ireduce_scatter_block", aborted_);
      // MPI leaves the result at the start of the buffer; the contract wants it in block `rank`.
      const size_t blockBytes = args.count * args.elementSize;
      if (comm_.rank() != 0 && blockBytes > 0) {
        std::memmove(args.data + comm_.rank() * blockBytes, args.data, blockBytes);
      }
      return;
    }
    case Collective::kBarrier:
      checkStarted(MPI_Ibarrier(comm, &request), "MPI_Ibarrier");
      complete(request, args.deadline, "MPI_Ibarrier", aborted_);
      return;
  }
}

void MpiCollectives::gather(const ExchangeArgs& args) const {
  MPI_Request request = MPI_REQUEST_NULL;
  const bool isRoot = comm_.rank() == args.root;
  const int bytes = asInt(args.sendSpans[args.root].bytes);
  checkStarted(MPI_Igather(args.sendData + args.sendSpans[args.root].offset, bytes, MPI_BYTE,
                           isRoot ? args.recvData : nullptr, bytes, MPI_BYTE, args.root, commOf(comm_), &request),
               "MPI_Igather");
  complete(request, args.deadline, "MPI_Igather", aborted_);
}

void MpiCollectives::scatter(const ExchangeArgs& args) const {
  MPI_Request request = MPI_REQUEST_NULL;
  const bool isRoot = comm_.rank() == args.root;
  const int bytes = asInt(args.recvSpans[args.root].bytes);
  checkStarted(MPI_Iscatter(isRoot ? args.sendData : nullptr, bytes, MPI_BYTE,
                            args.recvData + args.recvSpans[args.root].offset, bytes, MPI_BYTE, args.root,
                            commOf(comm_), &request),
               "MPI_Iscatter");
  complete(request, args.deadline, "MPI_Iscatter", aborted_);
}

void MpiCollectives::alltoall(const ExchangeArgs& args) const {
  const ByteLayout send = ByteLayout::of(args.sendSpans, comm_.size());
  const ByteLayout recv = ByteLayout::of(args.recvSpans, comm_.size());
  MPI_Request request = MPI_REQUEST_NULL;
  checkStarted(MPI_Ialltoallv(args.sendData, send.counts.data(), send.displacements.data(), MPI_BYTE, args.recvData,
                              recv.counts.data(), recv.displacements.data(), MPI_BYTE, commOf(comm_), &request),
               "MPI_Ialltoallv");
  complete(request, args.deadline, "MPI_Ialltoallv", aborted_);
}

namespace {

// The fields every rank must agree on, in a fixed order; opName travels in the gather only.
constexpr int kAgreedFields = 7;

std::vector<int64_t> fieldsOf(const Fingerprint& f) {
  return {static_cast<int64_t>(f.seq), static_cast<int64_t>(f.kind), f.algorithm, f.dtype, f.reduceOp, f.root,
          static_cast<int64_t>(f.bytes), f.opName};
}

Fingerprint fingerprintFrom(const int64_t* fields) {
  Fingerprint f;
  f.seq = static_cast<uint64_t>(fields[0]);
  f.kind = static_cast<WireKind>(fields[1]);
  f.algorithm = static_cast<uint8_t>(fields[2]);
  f.dtype = static_cast<int8_t>(fields[3]);
  f.reduceOp = static_cast<uint8_t>(fields[4]);
  f.root = static_cast<int32_t>(fields[5]);
  f.bytes = static_cast<uint64_t>(fields[6]);
  f.opName = static_cast<uint8_t>(fields[7]);
  return f;
}

// "ranks 0, 2 are in allreduce #3 (...); rank 1 is in gather #3 (...)", groups in first-rank order.
std::string describeSides(const std::vector<int64_t>& all, int size, int fieldsPerRank) {
  std::vector<std::pair<Fingerprint, std::vector<int>>> sides;
  for (int rank = 0; rank < size; ++rank) {
    const Fingerprint f = fingerprintFrom(all.data() + static_cast<size_t>(rank) * fieldsPerRank);
    auto side = std::find_if(sides.begin(), sides.end(), [&](const auto& s) { return s.first.sameCollective(f); });
    if (side == sides.end()) {
      sides.push_back({f, {rank}});
    } else {
      side->second.push_back(rank);
    }
  }
  std::string text;
  for (const auto& [f, ranks] : sides) {
    std::string who;
    for (int r : ranks) who += strCat(who.empty() ? "" : ", ", r);
    text += strCat(text.empty() ? "" : "; ", ranks.size() == 1 ? "rank " : "ranks ", who,
                   ranks.size() == 1 ? " is in " : " are in ", f.describe());
  }
  return text;
}

}  // namespace

void MpiCollectives::agree(const Fingerprint& fingerprint, Deadline deadline) const {
  const std::vector<int64_t> fields = fieldsOf(fingerprint);
  int64_t extremes[2 * kAgreedFields];
  for (int i = 0; i < kAgreedFields; ++i) {
    extremes[i] = fields[i];
    extremes[kAgreedFields + i] = -fields[i];
  }
  MPI_Request request = MPI_REQUEST_NULL;
  checkStarted(MPI_Iallreduce(MPI_IN_PLACE, extremes, 2 * kAgreedFields, MPI_INT64_T, MPI_MAX, commOf(comm_), &request),
               "MPI_Iallreduce (fingerprint)");
  complete(request, deadline, "MPI_Iallreduce (fingerprint)", aborted_);
  bool agreed = true;
  for (int i = 0; i < kAgreedFields; ++i) agreed = agreed && extremes[i] == -extremes[kAgreedFields + i];
  if (agreed) return;
  const int perRank = static_cast<int>(fields.size());
  std::vector<int64_t> all(static_cast<size_t>(perRank) * comm_.size());
  checkStarted(MPI_Iallgather(fields.data(), perRank, MPI_INT64_T, all.data(), perRank, MPI_INT64_T, commOf(comm_),
                              &request),
               "MPI_Iallgather (fingerprint)");
  complete(request, deadline, "MPI_Iallgather (fingerprint)", aborted_);
  throw TransportError(TransportError::Kind::kMismatch, -1,
                       strCat("collective mismatch (MPI data path): ", describeSides(all, comm_.size(), perRank),
                              "; this rank is in ", fingerprint.describe()));
}

#else  // !DDPLITE_WITH_MPI: the backend never constructs an MpiCollectives in such a build; should
       // one be used anyway, it says so instead of doing nothing.

namespace {
[[noreturn]] void unavailable() {
  throwRuntimeError("the MPI data path was used, but this ddplite was built without MPI", mpi::kRebuildHint);
}
}  // namespace

bool MpiCollectives::handles(size_t) const { unavailable(); }
void MpiCollectives::agree(const Fingerprint&, Deadline) const { unavailable(); }
void MpiCollectives::run(Collective, const AlgorithmArgs&, c10::ScalarType, c10d::ReduceOp::RedOpType) const {
  unavailable();
}
void MpiCollectives::gather(const ExchangeArgs&) const { unavailable(); }
void MpiCollectives::scatter(const ExchangeArgs&) const { unavailable(); }
void MpiCollectives::alltoall(const ExchangeArgs&) const { unavailable(); }

#endif

}  // namespace ddplite::cpu
