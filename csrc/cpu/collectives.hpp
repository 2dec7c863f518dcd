// CPU collectives on tensors: the bridge from at::Tensor to the byte-level algorithms.
//
// Contract: called on the backend's worker thread only, after validation (backend/validation)
// has accepted the arguments. Results land in the caller's tensors, contiguous or not.
#pragma once

#include "cpu/algorithms/algorithm.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace ddplite::cpu {

struct CpuContext {
  Transport& transport;
  Scratch& scratch;
  Deadline deadline;
};

void allreduce(const CpuContext& ctx, at::Tensor& tensor, c10d::ReduceOp::RedOpType op);
void broadcast(const CpuContext& ctx, at::Tensor& tensor, int root);
void reduce(const CpuContext& ctx, at::Tensor& tensor, int root, c10d::ReduceOp::RedOpType op);
// output holds P * input.numel() elements, rank-major.
void allgatherInto(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output);
void allgatherList(const CpuContext& ctx, const at::Tensor& input, std::vector<at::Tensor>& outputs);
void barrier(const CpuContext& ctx);

}  // namespace ddplite::cpu
