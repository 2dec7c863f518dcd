#include "cuda/staged_path.hpp"

#include "backend/work.hpp"
#include "common/logging.hpp"

#include <c10/cuda/CUDAGuard.h>

#include <mutex>

namespace ddplite {

namespace {

using c10d::OpType;

bool isFloat8(const at::Tensor& tensor) {
  return tensor.scalar_type() == at::kFloat8_e4m3fn || tensor.scalar_type() == at::kFloat8_e5m2;
}

// How a tensor is staged. The CPU collectives move float8 but do not reduce it, so:
// kBytes (data movement: broadcast, gathers, scatter, all-to-all, send/recv) stages its raw
// bytes (view as uint8: exact); kReduce (reductions) stages it widened to float32, and the copy
// back rounds the result to float8 once. Every other dtype is staged as it is.
enum class Staging { kBytes, kReduce };

// Blocking device-to-host copies on the caller's current stream: they wait for every kernel
// already queued there, which is the stream order the collective must honour.
at::Tensor toHost(const at::Tensor& tensor, Staging staging = Staging::kBytes) {
  if (!isFloat8(tensor)) return tensor.to(at::kCPU);
  return staging == Staging::kBytes ? tensor.view(at::kByte).to(at::kCPU) : tensor.to(at::kCPU, at::kFloat);
}

std::vector<at::Tensor> toHost(const std::vector<at::Tensor>& tensors, Staging staging = Staging::kBytes) {
  std::vector<at::Tensor> host;
  host.reserve(tensors.size());
  for (const auto& tensor : tensors) host.push_back(toHost(tensor, staging));
  return host;
}

std::vector<std::vector<at::Tensor>> toHost(const std::vector<std::vector<at::Tensor>>& lists,
                                            Staging staging = Staging::kBytes) {
  std::vector<std::vector<at::Tensor>> host;
  for (const auto& list : lists) host.push_back(toHost(list, staging));
  return host;
}

// PREMUL_SUM with a tensor factor on the GPU: the CPU collective premultiplies host tensors, so
// it gets the factor as a host tensor (copied here, on the caller's stream, like the data).
c10d::ReduceOp onHost(const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return op;
  const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (supplement == nullptr || !supplement->tensor_factor.defined() || supplement->tensor_factor.is_cpu()) return op;
  return c10d::ReduceOp(c10d::ReduceOp::PREMUL_SUM,
                        c10::make_intrusive<c10d::NCCLPreMulSumSupplement>(supplement->tensor_factor.to(at::kCPU)));
}

template <typename Options>
Options onHost(const Options& opts) {
  Options host = opts;
  host.reduceOp = onHost(opts.reduceOp);
  return host;
}

std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> flat;
  for (const auto& list : lists) flat.insert(flat.end(), list.begin(), list.end());
  return flat;
}

// Host-to-device copies of the results, on whichever thread completed the CPU collective. The
// copy is a blocking one on that thread's current stream, so the data is on the device before
// the Work completes.
void copyToDevice(const std::vector<at::Tensor>& host, std::vector<at::Tensor>& device) {
  for (size_t i = 0; i < host.size(); ++i) {
    c10::cuda::CUDAGuard guard(device[i].device());
    // float8 staged as bytes goes back as bytes; staged as float32, copy_ rounds it to float8.
    if (isFloat8(device[i]) && host[i].scalar_type() == at::kByte) {
      device[i].view(at::kByte).copy_(host[i]);
    } else {
      device[i].copy_(host[i]);
    }
  }
}

}  // namespace

void StagedPath::warnOnce() const {
  static std::once_flag warned;
  std::call_once(warned, [this] {
    const std::string message =
        strCat("ddplite: CUDA tensors of this group go through host memory and the CPU transport (", reason_,
               "); this is correct but much slower than NCCL. See docs/gpu.md, 'Two ranks on one GPU'.");
    DDPLITE_LOG(kWarn, message);
    TORCH_WARN_ONCE(message);
  });
}

c10::intrusive_ptr<c10d::Work> StagedPath::copyBackWhenDone(const c10::intrusive_ptr<c10d::Work>& inner, const char* op,
                                                            OpType type, std::vector<at::Tensor> host,
                                                            std::vector<at::Tensor> device) {
  const OpContext ctx{deps_.rank, deps_.size, op, inner->getSequencenumber()};
  // No profiler span of its own: the CPU op it wraps has one. Timed from here (the host copy made).
  auto outer = c10::make_intrusive<DdpliteWork>(ctx, type, device, ProfilingArgs{},
                                                deps_.timing.load(std::memory_order_relaxed));
  outer->markStarted();
  inner->getFuture()->addCallback([outer, inner, host = std::move(host), device](c10::ivalue::Future& done) mutable {
    outer->setSourceRank(inner->sourceRank());  // recv from any source
    if (done.hasError()) {
      outer->markFinished(done.exception_ptr());
      return;
    }
    try {
      copyToDevice(host, device);
    } catch (...) {
      outer->markFinished(std::current_exception());
      return;
    }
    outer->markFinished(nullptr);
  });
  return outer;
}

c10::intrusive_ptr<c10d::Work> StagedPath::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  warnOnce();
  auto host = toHost(tensors);
  return copyBackWhenDone(deps_.cpuBackend.broadcast(host, opts), "broadcast", OpType::BROADCAST, host, tensors);
}

c10::intrusive_ptr<c10d::Work> StagedPath::allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  warnOnce();
  auto host = toHost(tensors, Staging::kReduce);
  return copyBackWhenDone(deps_.cpuBackend.allreduce(host, onHost(opts)), "allreduce", OpType::ALLREDUCE, host, tensors);
}

c10::intrusive_ptr<c10d::Work> StagedPath::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  warnOnce();
  auto host = toHost(tensors, Staging::kReduce);
  return copyBackWhenDone(deps_.cpuBackend.allreduce_coalesced(host, onHost(opts)), "allreduce_coalesced", OpType::COALESCED,
                          host, tensors);
}

c10::intrusive_ptr<c10d::Work> StagedPath::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  warnOnce();
  auto host = toHost(tensors, Staging::kReduce);
  return copyBackWhenDone(deps_.cpuBackend.reduce(host, onHost(opts)), "reduce", OpType::REDUCE, host, tensors);
}

c10::intrusive_ptr<c10d::Work> StagedPath::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs);
  auto hostOutputs = toHost(outputs);
  auto inner = deps_.cpuBackend.allgather(hostOutputs, hostInputs, opts);
  return copyBackWhenDone(inner, "allgather", OpType::ALLGATHER, flatten(hostOutputs), flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> StagedPath::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions& opts) {
  warnOnce();
  at::Tensor hostInput = toHost(input);
  at::Tensor hostOutput = toHost(output);
  auto inner = deps_.cpuBackend._allgather_base(hostOutput, hostInput, opts);
  return copyBackWhenDone(inner, "allgather_into_tensor", OpType::_ALLGATHER_BASE, {hostOutput}, {output});
}

c10::intrusive_ptr<c10d::Work> StagedPath::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs);
  auto hostOutputs = toHost(outputs);
  auto inner = deps_.cpuBackend.allgather_into_tensor_coalesced(hostOutputs, hostInputs, opts);
  return copyBackWhenDone(inner, "allgather_into_tensor_coalesced", OpType::COALESCED, hostOutputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StagedPath::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs, Staging::kReduce);
  auto hostOutputs = toHost(outputs, Staging::kReduce);
  auto inner = deps_.cpuBackend.reduce_scatter(hostOutputs, hostInputs, onHost(opts));
  return copyBackWhenDone(inner, "reduce_scatter", OpType::REDUCE_SCATTER, hostOutputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StagedPath::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  warnOnce();
  at::Tensor hostInput = toHost(input, Staging::kReduce);
  at::Tensor hostOutput = toHost(output, Staging::kReduce);
  auto inner = deps_.cpuBackend._reduce_scatter_base(hostOutput, hostInput, onHost(opts));
  return copyBackWhenDone(inner, "reduce_scatter_tensor", OpType::_REDUCE_SCATTER_BASE, {hostOutput}, {output});
}

c10::intrusive_ptr<c10d::Work> StagedPath::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs, Staging::kReduce);
  auto hostOutputs = toHost(outputs, Staging::kReduce);
  auto inner = deps_.cpuBackend.reduce_scatter_tensor_coalesced(hostOutputs, hostInputs, onHost(opts));
  return copyBackWhenDone(inner, "reduce_scatter_tensor_coalesced", OpType::COALESCED, hostOutputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StagedPath::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs);
  auto hostOutputs = toHost(outputs);
  auto inner = deps_.cpuBackend.gather(hostOutputs, hostInputs, opts);
  return copyBackWhenDone(inner, "gather", OpType::GATHER, flatten(hostOutputs), flatten(outputs));
}

c10::intrusive_ptr<c10d::Work> StagedPath::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs);
  auto hostOutputs = toHost(outputs);
  auto inner = deps_.cpuBackend.scatter(hostOutputs, hostInputs, opts);
  return copyBackWhenDone(inner, "scatter", OpType::SCATTER, hostOutputs, outputs);
}

c10::intrusive_ptr<c10d::Work> StagedPath::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& outputSplitSizes,
                                                         std::vector<int64_t>& inputSplitSizes,
                                                         const c10d::AllToAllOptions& opts) {
  warnOnce();
  at::Tensor hostInput = toHost(input);
  at::Tensor hostOutput = toHost(output);
  auto inner = deps_.cpuBackend.alltoall_base(hostOutput, hostInput, outputSplitSizes, inputSplitSizes, opts);
  return copyBackWhenDone(inner, "all_to_all_single", OpType::ALLTOALL_BASE, {hostOutput}, {output});
}

c10::intrusive_ptr<c10d::Work> StagedPath::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions& opts) {
  warnOnce();
  auto hostInputs = toHost(inputs);
  auto hostOutputs = toHost(outputs);
  auto inner = deps_.cpuBackend.alltoall(hostOutputs, hostInputs, opts);
  return copyBackWhenDone(inner, "all_to_all", OpType::ALLTOALL, hostOutputs, outputs);
}

// The CPU backend numbers the staged send/recv again in its own p2p sequence (one more number
// per op on every rank alike); `ctx` is not needed here.
c10::intrusive_ptr<c10d::Work> StagedPath::send(std::vector<at::Tensor>& tensors, int dstRank, int tag,
                                                const OpContext& /*ctx*/) {
  warnOnce();
  auto host = toHost(tensors);
  return copyBackWhenDone(deps_.cpuBackend.send(host, dstRank, tag), "send", OpType::SEND, {}, {});
}

c10::intrusive_ptr<c10d::Work> StagedPath::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                                const OpContext& /*ctx*/) {
  warnOnce();
  auto host = toHost(tensors);
  auto inner = srcRank < 0 ? deps_.cpuBackend.recvAnysource(host, tag) : deps_.cpuBackend.recv(host, srcRank, tag);
  return copyBackWhenDone(inner, "recv", OpType::RECV, host, tensors);
}

c10::intrusive_ptr<c10d::Work> StagedPath::barrier(at::Device device, const c10d::BarrierOptions& opts) {
  c10d::BarrierOptions cpuOptions = opts;
  cpuOptions.device = std::nullopt;
  cpuOptions.device_ids.clear();
  return deps_.cpuBackend.barrier(cpuOptions);
}

}  // namespace ddplite
