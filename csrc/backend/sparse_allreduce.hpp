// all_reduce(SUM) of a sparse COO tensor on CPU, as gloo serves it: every rank's indices and
// values are gathered and the sum is built locally.
//
// Steps (P ranks, each with nnz_r non-zeros after coalescing):
//   1. all_gather of a fixed-size metadata row: nnz, sparse dims, dense dims, the sizes.
//      Every rank checks that all rows agree on the dims and sizes (ValueError otherwise, on
//      every rank alike, since every rank sees the same rows).
//   2. all_gather of the indices, padded to max(nnz_r) columns.
//   3. all_gather of the values, padded to max(nnz_r) rows.
//   4. The sum: one COO tensor of all ranks' entries, coalesced (duplicates summed).
// Cost: three all_gathers, α·3·log P + β·(P-1)·max(nnz)·(8·sparse dims + value bytes); memory
// P·max(nnz) entries. The result is coalesced and replaces the caller's tensor's contents.
#pragma once

#include "common/errors.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>

namespace ddplite {

// All dims of a sparse tensor ddplite accepts (sparse + dense).
constexpr int kSparseMaxDims = 16;

// ValueError unless the sparse COO `tensor` can be reduced here: on CPU, SUM, at most
// kSparseMaxDims dims, values of a dtype the CPU path reduces.
void checkSparseAllreduce(const OpContext& ctx, const at::Tensor& tensor, const c10d::ReduceOp& op);

// `allgather(input)`: the group's all_gather of a dense CPU tensor, returning P·input.numel()
// elements, rank-major (blocking; the caller's thread). Returns the coalesced sum.
at::Tensor sparseAllreduceSum(const OpContext& ctx, const at::Tensor& tensor, int size,
                              const std::function<at::Tensor(const at::Tensor&)>& allgather);

}  // namespace ddplite
