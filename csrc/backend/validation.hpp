// Argument checks, run on the caller's thread before anything is queued, so bad input raises a
// ValueError at the call site and never reaches (or desynchronises) the wire.
#pragma once

#include "common/errors.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace ddplite::validation {

// Exactly one tensor per call (one tensor per process, as torch.distributed passes).
const at::Tensor& singleTensor(const OpContext& ctx, const std::vector<at::Tensor>& tensors, const char* what);

// Dense, of a supported dtype, on CPU or CUDA.
void checkTensor(const OpContext& ctx, const at::Tensor& tensor, const char* what);

// A tensor the collective writes: its elements must not share memory (an expanded view such as
// torch.ones(1).expand(n) would have every rank's result land on one element).
void checkWritable(const OpContext& ctx, const at::Tensor& tensor, const char* what);
void checkWritable(const OpContext& ctx, const std::vector<at::Tensor>& tensors, const char* what);

void checkRoot(const OpContext& ctx, int64_t root);

void checkReduceOp(const OpContext& ctx, const at::Tensor& tensor, const c10d::ReduceOp& op);

// Same dtype and number of elements as `reference`.
void checkMatches(const OpContext& ctx, const at::Tensor& reference, const at::Tensor& other, const char* what);

// Same device type for every tensor in the call.
void checkSameDevice(const OpContext& ctx, const std::vector<at::Tensor>& tensors);

// `tensors` holds exactly `count` tensors, each matching `reference` (dtype and size).
void checkList(const OpContext& ctx, const std::vector<at::Tensor>& tensors, size_t count, const at::Tensor& reference,
               const char* what, const char* hint);

// gather_list / scatter_list: on the root exactly one list of P tensors like `reference`
// (returned); elsewhere none (an empty list is returned).
std::vector<at::Tensor> rootOnlyList(const OpContext& ctx, const std::vector<std::vector<at::Tensor>>& lists,
                                     bool isRoot, const at::Tensor& reference, const char* name, const char* role);

// Coalesced allgather / reduce-scatter: non-empty, equally long lists where input i and output i
// share a dtype and inputScale * inputs[i].numel() == outputScale * outputs[i].numel().
void checkCoalescedPairs(const OpContext& ctx, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs, int64_t inputScale, int64_t outputScale);

// A non-empty list of valid tensors (coalesced collectives).
void checkNonEmptyList(const OpContext& ctx, const std::vector<at::Tensor>& tensors, const char* what);

// all_to_all_single: splits of dimension 0 (empty = equal parts) that add up to the tensor.
void checkSplits(const OpContext& ctx, const at::Tensor& tensor, const std::vector<int64_t>& splits, const char* what);

// all_to_all: what this rank sends itself (its input block) fits the output block it lands in.
void checkOwnBlock(const OpContext& ctx, size_t sentBytes, size_t landingBytes);
// The bytes of this rank's own block of an all_to_all_single tensor split by `splits` (empty:
// equal parts); the tensor passed checkSplits.
size_t ownSplitBytes(const OpContext& ctx, const at::Tensor& tensor, const std::vector<int64_t>& splits);

// send/recv peer: a rank of this group, other than this one unless `selfServed` (CUDA tensors in
// an open coalescing group: NCCL pairs a rank's send to itself with its receive in one NCCL group,
// as torch's NCCL backend serves batch_isend_irecv at world size 1).
void checkPeer(const OpContext& ctx, int peer, const char* direction, bool selfServed = false);
// Tags below `firstUserTag` are the backend's own (monitored_barrier.hpp).
void checkTag(const OpContext& ctx, int tag, int firstUserTag);

}  // namespace ddplite::validation
