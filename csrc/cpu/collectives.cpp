#include "cpu/collectives.hpp"

#include "cpu/algorithms/selector.hpp"

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

AlgorithmArgs argsFor(const CpuContext& ctx, at::Tensor& dense) {
  return AlgorithmArgs{ctx.transport, ctx.deadline, ctx.scratch, static_cast<char*>(dense.data_ptr()),
                       static_cast<size_t>(dense.numel()), static_cast<size_t>(dense.element_size())};
}

void divideForAverage(at::Tensor& tensor, int worldSize) {
  if (at::isFloatingType(tensor.scalar_type())) {
    tensor.div_(worldSize);
  } else {
    tensor.div_(worldSize, "trunc");  // integers: truncate towards zero, as NCCL does
  }
}

}  // namespace

void allreduce(const CpuContext& ctx, at::Tensor& tensor, RedOpType op) {
  if (tensor.numel() == 0) return;
  withContiguous(tensor, [&](at::Tensor& dense) {
    AlgorithmArgs args = argsFor(ctx, dense);
    args.reduce = selectReduceFn(dense.scalar_type(), op);
    selectAlgorithm(Collective::kAllreduce, dense.nbytes(), ctx.transport.size()).run(args);
  });
  if (op == RedOpType::AVG) {
    divideForAverage(tensor, ctx.transport.size());
  }
}

void broadcast(const CpuContext& ctx, at::Tensor& tensor, int root) {
  if (tensor.numel() == 0 || ctx.transport.size() == 1) return;
  withContiguous(tensor, [&](at::Tensor& dense) {
    AlgorithmArgs args = argsFor(ctx, dense);
    args.root = root;
    selectAlgorithm(Collective::kBroadcast, dense.nbytes(), ctx.transport.size()).run(args);
  });
}

void reduce(const CpuContext& ctx, at::Tensor& tensor, int root, RedOpType op) {
  if (tensor.numel() == 0 || ctx.transport.size() == 1) {
    return;  // AVG over one rank is the identity
  }
  const bool isRoot = ctx.transport.rank() == root;
  // Non-root ranks accumulate into a copy: their inputs stay as they were.
  at::Tensor accumulator = isRoot ? tensor.contiguous() : tensor.clone(at::MemoryFormat::Contiguous);
  AlgorithmArgs args = argsFor(ctx, accumulator);
  args.root = root;
  args.reduce = selectReduceFn(accumulator.scalar_type(), op);
  selectAlgorithm(Collective::kReduce, accumulator.nbytes(), ctx.transport.size()).run(args);
  if (isRoot) {
    if (op == RedOpType::AVG) divideForAverage(accumulator, ctx.transport.size());
    if (!accumulator.is_same(tensor)) tensor.copy_(accumulator);
  }
}

void allgatherInto(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output) {
  withContiguous(output, [&](at::Tensor& dense) {
    const int64_t blockElements = input.numel();
    dense.view(-1).narrow(0, ctx.transport.rank() * blockElements, blockElements).copy_(input.reshape(-1));
    AlgorithmArgs args = argsFor(ctx, dense);
    args.count = static_cast<size_t>(blockElements);
    selectAlgorithm(Collective::kAllgather, dense.nbytes(), ctx.transport.size()).run(args);
  });
}

void allgatherList(const CpuContext& ctx, const at::Tensor& input, std::vector<at::Tensor>& outputs) {
  at::Tensor gathered = at::empty({static_cast<int64_t>(outputs.size()) * input.numel()}, input.options());
  allgatherInto(ctx, input, gathered);
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].copy_(gathered.narrow(0, static_cast<int64_t>(i) * input.numel(), input.numel()).view_as(outputs[i]));
  }
}

void barrier(const CpuContext& ctx) {
  AlgorithmArgs args{ctx.transport, ctx.deadline, ctx.scratch, nullptr, 0, 1};
  selectAlgorithm(Collective::kBarrier, 0, ctx.transport.size()).run(args);
}

}  // namespace ddplite::cpu
