#include "cpu/collectives.hpp"

#include "cpu/hierarchy/hierarchical_algorithms.hpp"
#include "cpu/shm/shm_algorithms.hpp"

#include "common/errors.hpp"
#include "cpu/algorithms/selector.hpp"

#include <algorithm>

namespace ddplite::cpu {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

// Runs `body` on a contiguous view of `tensor` and copies back if a copy had to be made.
template <typename Body>
void withContiguous(at::Tensor& tensor, Body body) {
  if (tensor.is_contiguous()) {
    body(tensor);
    return;
  }
  at::Tensor dense = tensor.contiguous();
  body(dense);
  tensor.copy_(dense);
}

char* bytesOf(const at::Tensor& dense) {
  return static_cast<char*>(dense.data_ptr());
}

AlgorithmArgs argsFor(const CpuContext& ctx, const at::Tensor& dense) {
  return AlgorithmArgs{ctx.transport, ctx.deadline, ctx.scratch, bytesOf(dense), static_cast<size_t>(dense.numel()),
                       static_cast<size_t>(dense.element_size())};
}

// torch has no division for uint16/32/64 (div_trunc_cpu is not implemented for them).
template <typename T>
void divideUnsigned(at::Tensor& tensor, int worldSize) {
  at::Tensor dense = tensor.contiguous();
  T* values = dense.data_ptr<T>();
  const T divisor = static_cast<T>(worldSize);
  for (int64_t i = 0, n = dense.numel(); i < n; ++i) values[i] /= divisor;
  if (!dense.is_same(tensor)) tensor.copy_(dense);
}

void divideForAverage(at::Tensor& tensor, int worldSize) {
  switch (tensor.scalar_type()) {
    case c10::kUInt16: return divideUnsigned<uint16_t>(tensor, worldSize);
    case c10::kUInt32: return divideUnsigned<uint32_t>(tensor, worldSize);
    case c10::kUInt64: return divideUnsigned<uint64_t>(tensor, worldSize);
    default: break;
  }
  if (at::isFloatingType(tensor.scalar_type())) {
    tensor.div_(worldSize);
  } else {
    tensor.div_(worldSize, "trunc");  // integers: truncate towards zero, as NCCL does
  }
}

// PREMUL_SUM multiplies every rank's input by the factor (a double or a one-element tensor kept
// in the op's supplement) before summing. `tensor` must be a buffer the collective may change.
void premultiply(at::Tensor& tensor, const c10d::ReduceOp& op) {
  if (op.op_ != RedOpType::PREMUL_SUM) return;
  auto* factor = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  DDPLITE_ENFORCE(factor != nullptr, "PREMUL_SUM without its factor");
  if (factor->tensor_factor.defined()) {
    tensor.mul_(factor->tensor_factor.to(tensor.device(), tensor.scalar_type()));
  } else {
    tensor.mul_(factor->double_factor);
  }
}

void finishReduction(at::Tensor& result, const c10d::ReduceOp& op, int worldSize) {
  if (op.op_ == RedOpType::AVG) divideForAverage(result, worldSize);
}

// A fresh contiguous buffer holding `tensors` one after another, flattened.
at::Tensor concatenated(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  flat.reserve(tensors.size());
  for (const auto& tensor : tensors) flat.push_back(tensor.reshape(-1));
  return at::cat(flat);
}

// Copies consecutive pieces of `flat` back into `tensors` (their shapes decide the pieces).
void splitInto(const at::Tensor& flat, std::vector<at::Tensor>& tensors) {
  int64_t offset = 0;
  for (auto& tensor : tensors) {
    tensor.copy_(flat.narrow(0, offset, tensor.numel()).view(tensor.sizes()));
    offset += tensor.numel();
  }
}

std::vector<Span> equalSpans(int parts, size_t bytesEach) {
  std::vector<Span> spans(parts);
  for (int i = 0; i < parts; ++i) spans[i] = {i * bytesEach, bytesEach};
  return spans;
}

// Spans of consecutive rows of dimension 0; empty splits mean `parts` equal parts.
std::vector<Span> rowSpans(const at::Tensor& tensor, const std::vector<int64_t>& splits, int parts) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  const size_t rowBytes = rows == 0 ? 0 : tensor.nbytes() / static_cast<size_t>(rows);
  std::vector<Span> spans(parts);
  size_t offset = 0;
  for (int i = 0; i < parts; ++i) {
    const size_t bytes = (splits.empty() ? static_cast<size_t>(rows / parts) : static_cast<size_t>(splits[i])) * rowBytes;
    spans[i] = {offset, bytes};
    offset += bytes;
  }
  return spans;
}

std::vector<Span> tensorSpans(const std::vector<at::Tensor>& tensors) {
  std::vector<Span> spans(tensors.size());
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    spans[i] = {offset, tensors[i].nbytes()};
    offset += tensors[i].nbytes();
  }
  return spans;
}

ExchangeArgs exchangeArgs(const CpuContext& ctx, const char* sendData, std::vector<Span> sendSpans, char* recvData,
                          std::vector<Span> recvSpans, int root = 0) {
  return ExchangeArgs{ctx.transport, ctx.deadline, sendData, std::move(sendSpans), recvData, std::move(recvSpans), root};
}

// The fingerprint of one byte-level collective of this op (cpu/transport/fingerprint.hpp).
// `bytes` must be a size every rank agrees on; `reduceOp` < 0 for data movement, `root` < 0 for
// unrooted collectives.
Fingerprint fingerprintOf(const CpuContext& ctx, WireKind kind, uint8_t algorithm, const char* algorithmName,
                          c10::ScalarType dtype, int reduceOp, int root, size_t bytes) {
  if (ctx.algorithm != nullptr) *ctx.algorithm = algorithmName;
  Fingerprint fingerprint;
  fingerprint.seq = ctx.op.seq;
  fingerprint.kind = kind;
  fingerprint.opName = userOpCode(ctx.op.op);
  fingerprint.algorithm = algorithm;
  fingerprint.algorithmName = algorithmName;
  fingerprint.dtype = static_cast<int8_t>(dtype);
  fingerprint.reduceOp = reduceOp < 0 ? 0xff : static_cast<uint8_t>(reduceOp);
  fingerprint.root = root;
  fingerprint.bytes = bytes;
  return fingerprint;
}

WireKind wireKindOf(Collective collective) {
  // WireKind kAllreduce .. kBarrier follow Collective's order.
  return static_cast<WireKind>(static_cast<uint8_t>(collective) + 1);
}

bool isReduction(Collective collective) {
  return collective == Collective::kAllreduce || collective == Collective::kReduce ||
         collective == Collective::kReduceScatter;
}

bool isRooted(Collective collective) {
  return collective == Collective::kBroadcast || collective == Collective::kReduce;
}

// The shared-memory algorithm of `collective` (every byte-level collective has one; gather,
// scatter and all_to_all go through exchangeVia, to shm::exchange).
void (*shmAlgorithmFor(Collective collective))(ShmGroup&, const AlgorithmArgs&) {
  switch (collective) {
    case Collective::kAllreduce: return &shm::allreduce;
    case Collective::kBroadcast: return &shm::broadcast;
    case Collective::kReduce: return &shm::reduce;
    case Collective::kAllgather: return &shm::allgather;
    case Collective::kReduceScatter: return &shm::reduceScatter;
    case Collective::kBarrier: return &shm::barrier;
  }
  return nullptr;
}

// Whether the segment's chunk holds `collective`'s smallest step: reduce_scatter puts one piece
// per rank into a chunk (shm::reduceScatterPieceCount); the others need one element per chunk.
// The same answer on every rank (chunk, size and dtype agree).
bool fitsSharedMemory(const ShmGroup& group, Collective collective, size_t elementSize) {
  if (collective != Collective::kReduceScatter) return true;
  return shm::reduceScatterPieceCount(group.chunkBytes(), group.size(), elementSize) > 0;
}

// Before a collective through shared memory right after this rank refused op `refusedSeq`: its
// peers that ran the refused op over TCP sent this rank bytes for it, which wait on its sockets
// and which shared memory would never read (the TCP path meets them at once). So look: a header
// of the refused op is kMismatch, named as the TCP path would name it. Only that op's: other
// bytes may wait there legitimately (a leader's or an all_to_all proxy's first message of this
// collective across hosts;
// a peer already in a later op over TCP, after it left a reduce through shared memory early).
void throwIfPeersSentOverTcp(const CpuContext& ctx, const Fingerprint& fingerprint) {
  for (int peer = 0; ctx.refusedSeq != 0 && peer < ctx.transport.size(); ++peer) {
    WireHeader header;
    if (peer == ctx.transport.rank() || !ctx.transport.peekWaitingHeader(peer, &header)) continue;
    if (header.seq != ctx.refusedSeq) continue;
    std::string what = headerMismatch(header, fingerprint, header.messageBytes, ctx.transport.describePeer(peer));
    if (what.empty()) what = strCat(ctx.transport.describePeer(peer), " sent bytes for ", fingerprint.describe(), " over TCP");
    throw TransportError(TransportError::Kind::kMismatch, peer, what);
  }
}

void beginOnSharedMemory(const CpuContext& ctx, const Fingerprint& fingerprint) {
  const Fingerprint onSegment = shm::segmentPartOf(fingerprint);
  throwIfPeersSentOverTcp(ctx, onSegment);
  ctx.shm->beginCollective(onSegment, ctx.refusedSeq);
}

// Says in the segment(s) this rank shares that it runs `fingerprint` over TCP (ShmGroup).
void announceTcpCollective(const CpuContext& ctx, const Fingerprint& fingerprint) {
  if (ctx.shm != nullptr) ctx.shm->announceTcpCollective(fingerprint, ctx.deadline);
  if (ctx.hosts != nullptr && ctx.hosts->local() != nullptr) {
    ctx.hosts->local()->announceTcpCollective(fingerprint, ctx.deadline);
  }
}

// Arms the group's TCP mesh for a collective among all its ranks over TCP (announced in the
// segment(s) first). In a group across hosts the hierarchy numbers the op's wire parts
// (HostHierarchy::claimParts): a leader has armed the mesh for the op's earlier collectives across
// hosts (the DETAIL argument check's, for one), which the other ranks ran in their segments only,
// so the transport's own numbering would differ between them.
void beginOnTcp(const CpuContext& ctx, Fingerprint fingerprint) {
  announceTcpCollective(ctx, fingerprint);
  if (ctx.hosts != nullptr) {
    ctx.hosts->claimParts(fingerprint.seq, /*railsWanted=*/false);
    fingerprint.part = ctx.hosts->claimedPart();
    fingerprint.partGiven = true;
  }
  ctx.transport.beginCollective(fingerprint);
}

// A byte-level collective of a group across hosts (cpu/shm/*_hierarchical.cpp).
void runAcrossHosts(const CpuContext& ctx, Collective collective, const AlgorithmArgs& args,
                    const Fingerprint& fingerprint, size_t bufferBytes) {
  HostHierarchy& hosts = *ctx.hosts;
  const bool railsWanted = collective == Collective::kAllreduce && hosts.allreduceOnRails(args.count, bufferBytes);
  if (hosts.claimParts(fingerprint.seq, railsWanted) && ctx.algorithm != nullptr) *ctx.algorithm = "hierarchical-rails";
  switch (collective) {
    case Collective::kAllreduce: return hierarchy::allreduceAcrossHosts(hosts, args, fingerprint, bufferBytes, ctx.refusedSeq);
    case Collective::kBroadcast: return hierarchy::broadcastAcrossHosts(hosts, args, fingerprint, bufferBytes, ctx.refusedSeq);
    case Collective::kReduce: return hierarchy::reduceAcrossHosts(hosts, args, fingerprint, bufferBytes, ctx.refusedSeq);
    case Collective::kAllgather: return hierarchy::allgatherAcrossHosts(hosts, args, fingerprint, ctx.refusedSeq);
    case Collective::kReduceScatter: return hierarchy::reduceScatterAcrossHosts(hosts, args, fingerprint, ctx.refusedSeq);
    case Collective::kBarrier: return hierarchy::barrierAcrossHosts(hosts, args, fingerprint, ctx.refusedSeq);
  }
}

// The data path of one byte-level collective: MPI's when the group uses it; the hierarchical one
// when the group spans hosts with a segment in each (and no pin); shared memory's when
// the group has a segment and no algorithm is pinned for the collective, else the selected
// algorithm with the transport armed with the collective's fingerprint (announced in the segment,
// if any). `bufferBytes` as in selectAlgorithm (the same on every rank).
void runCollective(const CpuContext& ctx, Collective collective, const AlgorithmArgs& args, size_t bufferBytes,
                   c10::ScalarType dtype, RedOpType op = RedOpType::SUM) {
  const int reduceOp = isReduction(collective) ? static_cast<int>(op) : -1;
  const int root = isRooted(collective) ? args.root : -1;
  if (ctx.mpi != nullptr && ctx.mpi->handles(bufferBytes)) {
    ctx.mpi->agree(fingerprintOf(ctx, wireKindOf(collective), 0, "mpi", dtype, reduceOp, root, bufferBytes),
                   ctx.deadline);
    ctx.mpi->run(collective, args, dtype, op);
    return;
  }
  if (ctx.hosts != nullptr && !isPinned(collective)) {
    const Fingerprint fingerprint =
        fingerprintOf(ctx, wireKindOf(collective), kShmAlgorithmIndex, "shm", dtype, reduceOp, root, bufferBytes);
    throwIfPeersSentOverTcp(ctx, fingerprint);
    if (ctx.algorithm != nullptr) *ctx.algorithm = "hierarchical";  // the flight recorder's name for it
    runAcrossHosts(ctx, collective, args, fingerprint, bufferBytes);
    return;
  }
  if (ctx.shm != nullptr && shmAlgorithmFor(collective) != nullptr && !isPinned(collective) &&
      fitsSharedMemory(*ctx.shm, collective, args.elementSize)) {
    beginOnSharedMemory(ctx, fingerprintOf(ctx, wireKindOf(collective), kShmAlgorithmIndex, "shm", dtype, reduceOp,
                                           root, bufferBytes));
    shmAlgorithmFor(collective)(*ctx.shm, args);
    ctx.shm->endCollective();
    return;
  }
  const Selection selection = selectAlgorithm(collective, bufferBytes, ctx.transport.size());
  const Fingerprint fingerprint =
      fingerprintOf(ctx, wireKindOf(collective), selection.index, selection.name, dtype, reduceOp, root, bufferBytes);
  beginOnTcp(ctx, fingerprint);
  selection.run(args);
}

size_t totalBytes(const std::vector<Span>& spans) {
  size_t total = 0;
  for (const Span& span : spans) total += span.bytes;
  return total;
}

// Exchanges: MPI's gather/scatter/alltoallv when the group uses MPI, else the direct algorithms.
// Every rank must take the same path, so the size test uses what all ranks know: the send spans
// for gather (equal on every rank), the receive spans for scatter. alltoall's totals differ per
// rank, so under MPI it always goes to MPI (which refuses counts over 2 GiB with a clear error);
// its fingerprint carries no size, and each first message's length checks the splits instead.
using MpiExchange = void (MpiCollectives::*)(const ExchangeArgs&) const;

// One exchange: through MPI when the group uses it and `mpiTakesIt`, else `direct` on the transport;
// fingerprinted either way. `agreed` is the size every rank agrees on (0 for all_to_all).
void exchangeVia(const CpuContext& ctx, const ExchangeArgs& args, WireKind kind, const char* algorithm,
                 size_t agreed, bool mpiTakesIt, c10::ScalarType dtype, MpiExchange viaMpi,
                 void (*direct)(const ExchangeArgs&)) {
  const int root = kind == WireKind::kAlltoall ? -1 : args.root;
  const Fingerprint fingerprint = fingerprintOf(ctx, kind, 0, algorithm, dtype, -1, root, agreed);
  if (ctx.mpi != nullptr && mpiTakesIt) {
    ctx.mpi->agree(fingerprint, ctx.deadline);
    (ctx.mpi->*viaMpi)(args);
    return;
  }
  if (ctx.hosts != nullptr && ctx.hosts->exchangesThroughLeaders() &&
      (kind != WireKind::kAlltoall || ctx.hosts->alltoallThroughProxies())) {
    const Fingerprint hierarchical = fingerprintOf(ctx, kind, kShmAlgorithmIndex, "shm", dtype, -1, root, agreed);
    throwIfPeersSentOverTcp(ctx, hierarchical);
    if (ctx.algorithm != nullptr) *ctx.algorithm = "hierarchical";  // the flight recorder's name for it
    ctx.hosts->claimParts(hierarchical.seq, /*railsWanted=*/false);  // the leaders' part (beginAmongLeaders)
    if (kind == WireKind::kGather) {
      hierarchy::gatherAcrossHosts(*ctx.hosts, args, ctx.scratch, hierarchical, ctx.refusedSeq);
    } else if (kind == WireKind::kScatter) {
      hierarchy::scatterAcrossHosts(*ctx.hosts, args, ctx.scratch, hierarchical, ctx.refusedSeq);
    } else {
      hierarchy::alltoallAcrossHosts(*ctx.hosts, args, hierarchical, ctx.refusedSeq);
    }
    return;
  }
  if (ctx.shm != nullptr && shm::exchangeFits(*ctx.shm)) {
    beginOnSharedMemory(ctx, fingerprint);
    shm::exchange(*ctx.shm, args, kind);
    ctx.shm->endCollective();
    return;
  }
  beginOnTcp(ctx, fingerprint);
  direct(args);
}

void gatherVia(const CpuContext& ctx, const ExchangeArgs& args, c10::ScalarType dtype) {
  const size_t agreed = totalBytes(args.sendSpans);
  exchangeVia(ctx, args, WireKind::kGather, "direct", agreed, ctx.mpi != nullptr && ctx.mpi->handles(agreed), dtype,
              &MpiCollectives::gather, &gatherDirect);
}

void scatterVia(const CpuContext& ctx, const ExchangeArgs& args, c10::ScalarType dtype) {
  const size_t agreed = totalBytes(args.recvSpans);
  exchangeVia(ctx, args, WireKind::kScatter, "direct", agreed, ctx.mpi != nullptr && ctx.mpi->handles(agreed), dtype,
              &MpiCollectives::scatter, &scatterDirect);
}

void alltoallVia(const CpuContext& ctx, const ExchangeArgs& args, c10::ScalarType dtype) {
  exchangeVia(ctx, args, WireKind::kAlltoall, "pairwise", 0, /*mpiTakesIt=*/true, dtype, &MpiCollectives::alltoall,
              &alltoallPairwise);
}

// Reduce-scatter on a working buffer of P equal blocks that the algorithm may overwrite.
void reduceScatterWorking(const CpuContext& ctx, at::Tensor& working, at::Tensor& output, const c10d::ReduceOp& op) {
  const int size = ctx.transport.size();
  premultiply(working, op);
  AlgorithmArgs args = argsFor(ctx, working);
  args.count = static_cast<size_t>(output.numel());
  args.reduce = selectReduceFn(working.scalar_type(), op.op_, *ctx.kernels);
  args.reduceMany = selectReduceManyFn(working.scalar_type(), op.op_, *ctx.kernels);
  runCollective(ctx, Collective::kReduceScatter, args, working.nbytes(), working.scalar_type(), op.op_);
  at::Tensor mine = working.narrow(0, ctx.transport.rank() * output.numel(), output.numel());
  finishReduction(mine, op, size);
  output.copy_(mine.view(output.sizes()));
}

}  // namespace

void allreduce(const CpuContext& ctx, at::Tensor& tensor, const c10d::ReduceOp& op) {
  if (tensor.numel() == 0) return;
  withContiguous(tensor, [&](at::Tensor& dense) {
    premultiply(dense, op);
    AlgorithmArgs args = argsFor(ctx, dense);
    args.reduce = selectReduceFn(dense.scalar_type(), op.op_, *ctx.kernels);
    args.reduceMany = selectReduceManyFn(dense.scalar_type(), op.op_, *ctx.kernels);
    runCollective(ctx, Collective::kAllreduce, args, dense.nbytes(), dense.scalar_type(), op.op_);
  });
  finishReduction(tensor, op, ctx.transport.size());
}

void allreduceCoalesced(const CpuContext& ctx, std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op) {
  std::vector<c10::ScalarType> dtypes;
  for (const auto& tensor : tensors) {
    if (std::find(dtypes.begin(), dtypes.end(), tensor.scalar_type()) == dtypes.end()) {
      dtypes.push_back(tensor.scalar_type());
    }
  }
  for (c10::ScalarType dtype : dtypes) {
    std::vector<at::Tensor> group;
    for (const auto& tensor : tensors) {
      if (tensor.scalar_type() == dtype) group.push_back(tensor);
    }
    at::Tensor flat = concatenated(group);
    allreduce(ctx, flat, op);
    splitInto(flat, group);
  }
}

void broadcast(const CpuContext& ctx, at::Tensor& tensor, int root) {
  if (tensor.numel() == 0 || ctx.transport.size() == 1) return;
  withContiguous(tensor, [&](at::Tensor& dense) {
    AlgorithmArgs args = argsFor(ctx, dense);
    args.root = root;
    runCollective(ctx, Collective::kBroadcast, args, dense.nbytes(), dense.scalar_type());
  });
}

void reduce(const CpuContext& ctx, at::Tensor& tensor, int root, const c10d::ReduceOp& op) {
  if (tensor.numel() == 0) return;
  if (ctx.transport.size() == 1) {
    premultiply(tensor, op);  // AVG over one rank is the identity; PREMUL_SUM still scales
    return;
  }
  const bool isRoot = ctx.transport.rank() == root;
  // Non-root ranks accumulate into a copy: their inputs stay as they were.
  at::Tensor accumulator = isRoot ? tensor.contiguous() : tensor.clone(at::MemoryFormat::Contiguous);
  premultiply(accumulator, op);
  AlgorithmArgs args = argsFor(ctx, accumulator);
  args.root = root;
  args.reduce = selectReduceFn(accumulator.scalar_type(), op.op_, *ctx.kernels);
  args.reduceMany = selectReduceManyFn(accumulator.scalar_type(), op.op_, *ctx.kernels);
  runCollective(ctx, Collective::kReduce, args, accumulator.nbytes(), accumulator.scalar_type(), op.op_);
  if (isRoot) {
    finishReduction(accumulator, op, ctx.transport.size());
    if (!accumulator.is_same(tensor)) tensor.copy_(accumulator);
  }
}

void allgatherInto(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output) {
  withContiguous(output, [&](at::Tensor& dense) {
    const int64_t blockElements = input.numel();
    dense.view(-1).narrow(0, ctx.transport.rank() * blockElements, blockElements).copy_(input.reshape(-1));
    AlgorithmArgs args = argsFor(ctx, dense);
    args.count = static_cast<size_t>(blockElements);
    runCollective(ctx, Collective::kAllgather, args, dense.nbytes(), dense.scalar_type());
  });
}

void allgatherList(const CpuContext& ctx, const at::Tensor& input, std::vector<at::Tensor>& outputs) {
  at::Tensor gathered = at::empty({static_cast<int64_t>(outputs.size()) * input.numel()}, input.options());
  allgatherInto(ctx, input, gathered);
  splitInto(gathered, outputs);
}

void allgatherCoalesced(const CpuContext& ctx, const std::vector<at::Tensor>& inputs,
                        std::vector<std::vector<at::Tensor>>& outputLists) {
  const at::Tensor mine = concatenated(inputs);
  const int64_t each = mine.numel();
  at::Tensor gathered = at::empty({static_cast<int64_t>(outputLists.size()) * each}, mine.options());
  allgatherInto(ctx, mine, gathered);
  for (size_t r = 0; r < outputLists.size(); ++r) splitInto(gathered.narrow(0, r * each, each), outputLists[r]);
}

void reduceScatterInto(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op) {
  at::Tensor working = input.reshape(-1).clone(at::MemoryFormat::Contiguous);
  reduceScatterWorking(ctx, working, output, op);
}

void reduceScatterList(const CpuContext& ctx, const std::vector<at::Tensor>& inputs, at::Tensor& output,
                       const c10d::ReduceOp& op) {
  at::Tensor working = concatenated(inputs);
  reduceScatterWorking(ctx, working, output, op);
}

void gather(const CpuContext& ctx, const at::Tensor& input, std::vector<at::Tensor>& outputs, int root) {
  const int size = ctx.transport.size();
  const at::Tensor source = input.contiguous();
  const std::vector<Span> sendSpans(size, Span{0, source.nbytes()});
  if (ctx.transport.rank() != root) {
    gatherVia(ctx, exchangeArgs(ctx, bytesOf(source), sendSpans, nullptr, {}, root), input.scalar_type());
    return;
  }
  at::Tensor gathered = at::empty({size * input.numel()}, input.options());
  gatherVia(ctx, exchangeArgs(ctx, bytesOf(source), sendSpans, bytesOf(gathered), equalSpans(size, source.nbytes()), root),
            input.scalar_type());
  splitInto(gathered, outputs);
}

void scatter(const CpuContext& ctx, const std::vector<at::Tensor>& inputs, at::Tensor& output, int root) {
  const int size = ctx.transport.size();
  withContiguous(output, [&](at::Tensor& dense) {
    const std::vector<Span> recvSpans(size, Span{0, dense.nbytes()});
    if (ctx.transport.rank() != root) {
      scatterVia(ctx, exchangeArgs(ctx, nullptr, {}, bytesOf(dense), recvSpans, root), dense.scalar_type());
      return;
    }
    const at::Tensor source = concatenated(inputs);
    scatterVia(ctx, exchangeArgs(ctx, bytesOf(source), equalSpans(size, dense.nbytes()), bytesOf(dense), recvSpans, root),
               dense.scalar_type());
  });
}

void alltoallBase(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output,
                  const std::vector<int64_t>& inputSplits, const std::vector<int64_t>& outputSplits) {
  const int size = ctx.transport.size();
  const at::Tensor source = input.contiguous();
  withContiguous(output, [&](at::Tensor& dense) {
    alltoallVia(ctx,
                exchangeArgs(ctx, bytesOf(source), rowSpans(source, inputSplits, size), bytesOf(dense),
                             rowSpans(dense, outputSplits, size)),
                dense.scalar_type());
  });
}

void alltoallList(const CpuContext& ctx, const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) {
  const at::Tensor source = concatenated(inputs);
  int64_t received = 0;
  for (const auto& output : outputs) received += output.numel();
  at::Tensor landing = at::empty({received}, source.options());
  alltoallVia(ctx, exchangeArgs(ctx, bytesOf(source), tensorSpans(inputs), bytesOf(landing), tensorSpans(outputs)),
              source.scalar_type());
  splitInto(landing, outputs);
}

void barrier(const CpuContext& ctx) {
  AlgorithmArgs args{ctx.transport, ctx.deadline, ctx.scratch, nullptr, 0, 1};
  runCollective(ctx, Collective::kBarrier, args, 0, c10::kByte);
}

}  // namespace ddplite::cpu
