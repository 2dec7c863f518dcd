// One function per collective: the NCCL calls for tensors already on the NCCL stream.
//
// Contract for every function: called by NcclPath::launch on the launching thread, with the
// group's order mutex held, the tensors' device current and `launch.stream` (the group's NCCL
// stream for that device) as the current stream, after that stream was made to wait for the
// caller's stream. Scratch tensors they allocate are allocated on the NCCL stream and are
// returned through `launch.scratch` so the Work keeps them alive until the GPU is done.
// Tensors handed to NCCL directly must be contiguous (NcclPath checks); list forms copy through
// a flat buffer on the NCCL stream. NCCL failures raise DistBackendError (nccl_errors.hpp);
// unsupported dtypes or ops raise ValueError before anything is issued.
#pragma once

#include "common/errors.hpp"
#include "cuda/nccl_compat.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace ddplite::nccl {

struct Launch {
  OpContext ctx;
  ncclComm_t comm;
  c10::cuda::CUDAStream stream;
  std::vector<at::Tensor>* scratch;  // owned by the Work; append buffers NCCL reads or writes
};

ncclDataType_t toNcclType(const OpContext& ctx, at::ScalarType dtype);
// Throws ValueError for ops NCCL lacks (bitwise) or dtype/op pairs it refuses.
void checkReduceOp(const OpContext& ctx, at::ScalarType dtype, const c10d::ReduceOp& op);

void broadcast(const Launch& launch, at::Tensor& tensor, int root);
void allreduce(const Launch& launch, at::Tensor& tensor, const c10d::ReduceOp& op);
void reduce(const Launch& launch, at::Tensor& tensor, const c10d::ReduceOp& op, int root);
void allgatherInto(const Launch& launch, const at::Tensor& input, at::Tensor& output);
void allgatherList(const Launch& launch, const at::Tensor& input, std::vector<at::Tensor>& outputs, int size);
void reduceScatterInto(const Launch& launch, const at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op);
void reduceScatterList(const Launch& launch, const std::vector<at::Tensor>& inputs, at::Tensor& output,
                       const c10d::ReduceOp& op);
// Empty splits mean equal parts of dimension 0.
void alltoallBase(const Launch& launch, const at::Tensor& input, at::Tensor& output,
                  const std::vector<int64_t>& outputSplits, const std::vector<int64_t>& inputSplits, int size);
void alltoallList(const Launch& launch, const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs);
// `outputs`: on the root one tensor per rank, elsewhere empty.
void gather(const Launch& launch, const at::Tensor& input, std::vector<at::Tensor>& outputs, int root);
// `inputs`: on the root one tensor per rank, elsewhere empty.
void scatter(const Launch& launch, const std::vector<at::Tensor>& inputs, at::Tensor& output, int root);
void send(const Launch& launch, const at::Tensor& tensor, int peer);
void recv(const Launch& launch, at::Tensor& tensor, int peer);

// Runs `body` between ncclGroupStart and ncclGroupEnd (coalesced collectives, all-to-all).
template <typename Body>
void grouped(const Launch& launch, Body&& body);

}  // namespace ddplite::nccl

#include "cuda/nccl_errors.hpp"

template <typename Body>
void ddplite::nccl::grouped(const Launch& launch, Body&& body) {
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm, ncclGroupStart());
  try {
    body();
  } catch (...) {
    ncclGroupEnd();  // close the group; the first error is the one reported
    throw;
  }
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm, ncclGroupEnd());
}
