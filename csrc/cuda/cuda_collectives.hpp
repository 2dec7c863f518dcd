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
//
// Dtypes: data movement (broadcast, gathers, scatters, all-to-all, send/recv) carries any dtype,
// as bytes where NCCL has no type for it (float8, int16, uint16, complex); reductions need an NCCL
// type (complex SUM/AVG/PREMUL_SUM reduce their real view), and float8 reductions need every GPU
// of the group at compute capability 9.0 (rules::fp8ReductionRefusal).
//
// Groups: a function may open an NCCL group (grouped()), and NcclPath may have one open around
// it (a coalesced batch, issued at endCoalescing). Work that must follow the NCCL kernels on the
// stream (copies out of a flat buffer) goes into `launch.after`: the launcher runs it once the
// outermost group has ended, when the kernels are really enqueued.
#pragma once

#include "common/errors.hpp"
#include "cuda/nccl_compat.hpp"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <functional>
#include <vector>

namespace ddplite::nccl {

struct Launch {
  OpContext ctx;
  ncclComm_t comm;
  c10::cuda::CUDAStream stream;
  std::vector<at::Tensor>* scratch;  // owned by the Work; append buffers NCCL reads or writes
  std::chrono::steady_clock::time_point deadline;  // for calls a nonblocking communicator answers ncclInProgress
  std::vector<std::function<void()>>* after;       // stream work that must follow the NCCL kernels
  std::function<bool()> abortRequested;            // stops a wait on ncclInProgress (NcclComm::Lease)
};

// What NCCL moves for `tensor`: its elements in their own NCCL type, or its bytes as ncclUint8.
struct Payload {
  size_t count;
  ncclDataType_t type;
  size_t unitBytes;  // bytes per counted unit
};
Payload payloadOf(const at::Tensor& tensor);
// What NCCL reduces for `tensor` (complex: the real view's elements), for a dtype checkReduceOp
// accepted.
Payload reductionPayloadOf(const at::Tensor& tensor);
// Throws ValueError for ops NCCL lacks (bitwise), dtype/op pairs it refuses, and float8 on a group
// whose lowest compute capability (major * 10 + minor) is below 9.0.
void checkReduceOp(const OpContext& ctx, at::ScalarType dtype, const c10d::ReduceOp& op, int minCompCap);

// An NCCL group of this thread: start, and end (outermost end: waits out ncclInProgress on
// `comms` up to launch.deadline). Depth counted per thread, as NCCL does.
void groupStart(const Launch& launch);
void groupEnd(const Launch& launch, const std::vector<ncclComm_t>& comms);
// Closes this thread's group after an error of ours inside it: whatever NCCL has is launched
// (NCCL drops a group's tasks only for its own errors), nothing is waited for; the caller fails
// the process group, whose abort ends those kernels.
void groupAbandon();
bool insideGroup();
// An NCCL call's result: DistBackendError on failure; outside a group, ncclInProgress (a
// nonblocking communicator still connecting) is waited out up to launch.deadline.
void checkIssued(const Launch& launch, const char* call, ncclResult_t result);

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
  groupStart(launch);
  try {
    body();
  } catch (...) {
    groupAbandon();  // the first error is the one reported
    throw;
  }
  groupEnd(launch, {launch.comm});
}

// Calls an NCCL function of an op being issued (see checkIssued).
#define DDPLITE_NCCL_ISSUE(launch, call) ::ddplite::nccl::checkIssued((launch), #call, (call))
