// StagedPath: CUDA collectives run through host memory and the backend's CPU collectives.
//
// Used for a device that two ranks of the group share (NCCL refuses "Duplicate GPU" before
// NCCL 2.30's multi-rank mode), or for every device with DDPLITE_CUDA_STAGING=always. Slow but
// correct, so multi-rank CUDA jobs also run on a one-GPU machine.
//
// Stream order: on the caller's thread each CUDA tensor is copied to host memory with a
// blocking copy on the caller's current stream (so it sees every kernel queued before the
// call); the CPU collective then runs on the backend's worker thread; when it completes, the
// results are copied back to the CUDA tensors on that thread, and only then does the Work (and
// its future) complete. wait() therefore blocks the host, and work queued on the current stream
// after wait() sees the results. The host copies are owned by the completion callback.
#pragma once

#include "cuda/cuda_path.hpp"

#include <string>

namespace ddplite {

class StagedPath final : public CudaPath {
 public:
  explicit StagedPath(const CudaPathDeps& deps) : deps_(deps) {}

  // Logs once per process why CUDA tensors are staged (the first time a staged op runs).
  void setReason(std::string reason) { reason_ = std::move(reason); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag,
                                      const OpContext& ctx) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                      const OpContext& ctx) override;
  c10::intrusive_ptr<c10d::Work> barrier(at::Device device, const c10d::BarrierOptions& opts) override;
  // The CPU collectives belong to the backend, which aborts and shuts them down itself.
  void abort() override {}
  void shutdown() override {}
  void abandon() override {}
  void connect(at::Device) override {}
  std::unique_ptr<CudaSplit> split(const std::vector<int>&) override { return nullptr; }
  std::string shrinkReadiness(bool) override { return {}; }
  std::unique_ptr<CudaSplit> shrink(const std::vector<int>&, bool, const std::vector<int>&,
                                    const ShrinkCoordination&) override {
    return nullptr;
  }
  void adopt(std::unique_ptr<CudaSplit>) override {}
  // Staged ops are CPU collectives the backend's own collector gathers.
  void startCoalescing() override {}
  void endCoalescing() override {}

 private:
  void warnOnce() const;
  // Completes a Work on `device` tensors once `inner` (the CPU collective on `host` copies) is
  // done, after copying host[i] into device[i].
  c10::intrusive_ptr<c10d::Work> copyBackWhenDone(const c10::intrusive_ptr<c10d::Work>& inner, const char* op,
                                                  c10d::OpType type, std::vector<at::Tensor> host,
                                                  std::vector<at::Tensor> device);

  CudaPathDeps deps_;
  std::string reason_ = "DDPLITE_CUDA_STAGING=always";
};

}  // namespace ddplite
