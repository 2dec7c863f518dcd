// CPU collectives on tensors: the bridge from at::Tensor to the byte-level algorithms.
//
// Contract: called on the backend's worker thread only, after validation (backend/validation)
// has accepted the arguments. Results land in the caller's tensors, contiguous or not; inputs
// that torch documents as unchanged (reduce on non-roots, reduce_scatter, gather, scatter,
// alltoall inputs) are left unchanged.
#pragma once

#include "common/errors.hpp"
#include "cpu/algorithms/algorithm.hpp"
#include "cpu/mpi_collectives.hpp"
#include "cpu/hierarchy/host_hierarchy.hpp"
#include "cpu/shm/shm_group.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace ddplite::cpu {

struct CpuContext {
  Transport& transport;
  Scratch& scratch;
  Deadline deadline;
  // The op being run: its sequence number and name go into the wire fingerprint of each
  // byte-level collective it runs (cpu/transport/fingerprint.hpp).
  OpContext op;
  // Set when the group runs with DDPLITE_CPU_TRANSPORT=mpi: collectives it handles go to MPI,
  // the rest (and p2p) through `transport`.
  const MpiCollectives* mpi = nullptr;
  // Set when the group runs on shared memory (cpu/shm/): every collective goes through it
  // unless its algorithm is pinned; point-to-point through `transport`.
  ShmGroup* shm = nullptr;
  // Set when this rank refused the op just before this one (its sequence number): peers that ran
  // it may be waiting for this rank, or have left bytes for it, on a path this op does not use.
  uint64_t refusedSeq = 0;
  // The group's reduction kernels (fixed when it was created: DDPLITE_CPU_KERNELS).
  const KernelSet* kernels = nullptr;
  // Set when the group spans hosts and some share one (cpu/hierarchy/host_hierarchy.hpp): every
  // collective but all_to_all runs hierarchically (all_to_all, and any collective with a pinned
  // algorithm, over `transport`, announced in the host's segment).
  HostHierarchy* hosts = nullptr;
  // Set by the backend when the flight recorder runs: receives the name of the algorithm (or
  // path: "shm", "mpi") of the op's last byte-level collective, a static string. Worker thread.
  const char** algorithm = nullptr;
};

void allreduce(const CpuContext& ctx, at::Tensor& tensor, const c10d::ReduceOp& op);
// One allreduce per dtype present, over the tensors of that dtype flattened together.
void allreduceCoalesced(const CpuContext& ctx, std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op);
void broadcast(const CpuContext& ctx, at::Tensor& tensor, int root);
void reduce(const CpuContext& ctx, at::Tensor& tensor, int root, const c10d::ReduceOp& op);
// output holds P * input.numel() elements, rank-major.
void allgatherInto(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output);
void allgatherList(const CpuContext& ctx, const at::Tensor& input, std::vector<at::Tensor>& outputs);
// outputLists[r][i] = rank r's inputs[i]: one all_gather of every rank's inputs laid end to end.
void allgatherCoalesced(const CpuContext& ctx, const std::vector<at::Tensor>& inputs,
                        std::vector<std::vector<at::Tensor>>& outputLists);
// input holds P * output.numel() elements, rank-major; block `rank` reduced lands in output.
void reduceScatterInto(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op);
void reduceScatterList(const CpuContext& ctx, const std::vector<at::Tensor>& inputs, at::Tensor& output,
                       const c10d::ReduceOp& op);
// outputs: P tensors on the root, empty elsewhere.
void gather(const CpuContext& ctx, const at::Tensor& input, std::vector<at::Tensor>& outputs, int root);
// inputs: P tensors on the root, empty elsewhere.
void scatter(const CpuContext& ctx, const std::vector<at::Tensor>& inputs, at::Tensor& output, int root);
// Splits count rows of dimension 0; empty splits mean P equal parts.
void alltoallBase(const CpuContext& ctx, const at::Tensor& input, at::Tensor& output,
                  const std::vector<int64_t>& inputSplits, const std::vector<int64_t>& outputSplits);
void alltoallList(const CpuContext& ctx, const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs);
void barrier(const CpuContext& ctx);

}  // namespace ddplite::cpu
