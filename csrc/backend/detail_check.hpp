// The DETAIL check (DDPLITE_DEBUG=DETAIL or TORCH_DISTRIBUTED_DEBUG=DETAIL): before a collective
// moves any data, its ranks all-gather a fixed-size signature of it (op, sequence number, dtype,
// tensor count, shapes, root, reduce op) over the group's own CPU path, and every rank compares
// all of them. A difference raises the same ValueError on every rank, with a field-by-field diff
// naming the ranks on each side. Nothing of the collective itself was sent, so the group stays
// usable: every rank consumed the same sequence number.
//
// torch 2.11 also wraps third-party backends in its ProcessGroupWrapper under
// TORCH_DISTRIBUTED_DEBUG=DETAIL (a gloo side group comparing op, shapes and dtypes; it raises a
// RuntimeError on the first difference); this check then runs behind it and adds roots, reduce
// ops and the ranks on each side.
//
// Cost: one extra all-gather of sizeof(ArgumentSignature) bytes per collective (only when on).
#pragma once

#include "common/errors.hpp"
#include "cpu/collectives.hpp"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ddplite {

// Plain bytes on the wire: the same layout on every rank of a job (one build).
struct ArgumentSignature {
  static constexpr int kMaxDims = 8;
  uint64_t seq = 0;
  char op[40] = {};             // ddplite's op name: "allreduce", "broadcast", ...
  int32_t dtype = -1;           // c10::ScalarType of the first compared tensor; -1: none
  int32_t mixedDtypes = 0;      // 1 when the compared tensors do not share one dtype
  int32_t root = -1;            // -1: not a rooted op
  int32_t reduceOp = -1;        // c10d::ReduceOp::RedOpType; -1: not a reduction
  int32_t tensorCount = 0;
  int32_t dims = 0;             // of the first compared tensor (shape[] holds up to kMaxDims)
  int64_t shape[kMaxDims] = {};
  int64_t totalNumel = 0;       // of all compared tensors
};
static_assert(sizeof(ArgumentSignature) == 144, "the DETAIL check's wire size (docs/reliability.md)");

// The signature of one op. `compared`: the tensors every rank passes alike (e.g. an all_gather's
// input, not a gather's root-only list; none for all_to_all_single, whose splits may differ).
ArgumentSignature signatureOf(const OpContext& ctx, c10::ArrayRef<at::Tensor> compared, int root, int reduceOp);

// The differences between the ranks' signatures (index = group rank), one line per field:
// "op: 'allreduce' on ranks 0, 2; 'broadcast' on rank 1". Empty when they agree.
std::vector<std::string> signatureDifferences(const std::vector<ArgumentSignature>& all);

// Exchanges `mine` with every rank over `cpu`'s path and raises (c10::ValueError, the same text
// on every rank) when the signatures differ. Worker thread, before the op's body.
void checkArgumentsAcrossRanks(const cpu::CpuContext& cpu, const ArgumentSignature& mine);

}  // namespace ddplite
