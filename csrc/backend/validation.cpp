#include "backend/validation.hpp"

#include "cpu/reduce/reduce_kernels.hpp"

#include <ATen/MemoryOverlap.h>

#include <algorithm>

namespace ddplite::validation {

namespace {
// float8 reductions on CUDA tensors are the CUDA path's to judge (NCCL >= 2.24 reduces them;
// cuda/cuda_collectives.cpp checks the build); the CPU collectives only move float8.
bool cudaJudgesReduction(const at::Tensor& tensor) {
  return tensor.device().is_cuda() && cpu::isFloat8(tensor.scalar_type());
}
}  // namespace

const at::Tensor& singleTensor(const OpContext& ctx, const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    throwValueError(ctx, strCat("expected exactly one ", what, " tensor per process, got ", tensors.size()),
                    "ddplite runs one tensor per process per collective; pass a single tensor");
  }
  checkTensor(ctx, tensors[0], what);
  return tensors[0];
}

void checkTensor(const OpContext& ctx, const at::Tensor& tensor, const char* what) {
  if (!tensor.defined()) {
    throwValueError(ctx, strCat("the ", what, " tensor is undefined"), "pass a real tensor");
  }
  if (tensor.layout() != c10::kStrided) {
    throwValueError(ctx, strCat("the ", what, " tensor is ", tensor.layout(), "; ddplite supports dense tensors only"),
                    "convert it with tensor.to_dense(); of sparse tensors ddplite serves all_reduce(SUM) of COO on CPU only");
  }
  if (!cpu::isSupportedDtype(tensor.scalar_type())) {
    throwValueError(ctx, strCat("dtype ", tensor.scalar_type(), " of the ", what, " tensor is not supported"),
                    "supported dtypes: float32, float64, float16, bfloat16, int8, int16, int32, int64, uint8, "
                    "uint16, uint32, uint64, bool, and float8 e4m3fn/e5m2 (moved on CPU; reduced on CUDA)");
  }
  if (!tensor.device().is_cpu() && !tensor.device().is_cuda()) {
    throwValueError(ctx, strCat("the ", what, " tensor is on ", tensor.device(), "; ddplite serves cpu and cuda"),
                    "move the tensor to the CPU");
  }
}

void checkWritable(const OpContext& ctx, const at::Tensor& tensor, const char* what) {
  if (tensor.defined() && at::has_internal_overlap(tensor) == at::MemOverlap::Yes) {
    throwValueError(ctx,
                    strCat("the ", what, " tensor (shape ", tensor.sizes(), ", strides ", tensor.strides(),
                           ") has elements that share memory, so it cannot hold a result"),
                    "pass a tensor with storage of its own, e.g. tensor.clone() or torch.empty(shape) "
                    "instead of an expand()ed view");
  }
}

void checkWritable(const OpContext& ctx, const std::vector<at::Tensor>& tensors, const char* what) {
  for (const auto& tensor : tensors) checkWritable(ctx, tensor, what);
}

void checkRoot(const OpContext& ctx, int64_t root) {
  if (root < 0 || root >= ctx.size) {
    throwValueError(ctx, strCat("root rank ", root, " is out of range [0, ", ctx.size, ")"),
                    "src/dst must be a rank of this group (for a subgroup, pass the global rank to "
                    "torch.distributed, which translates it)");
  }
}

void checkReduceOp(const OpContext& ctx, const at::Tensor& tensor, const c10d::ReduceOp& op) {
  if (cudaJudgesReduction(tensor)) return;
  std::string problem = cpu::reduceOpProblem(tensor.scalar_type(), op.op_);
  if (!problem.empty()) {
    throwValueError(ctx, problem, "choose a ReduceOp defined for this dtype, or convert the tensor");
  }
}

void checkMatches(const OpContext& ctx, const at::Tensor& reference, const at::Tensor& other, const char* what) {
  checkTensor(ctx, other, what);
  if (other.scalar_type() != reference.scalar_type() || other.numel() != reference.numel()) {
    throwValueError(ctx,
                    strCat("the ", what, " tensor (", other.scalar_type(), ", ", other.numel(),
                           " elements) does not match the input (", reference.scalar_type(), ", ",
                           reference.numel(), " elements)"),
                    "every tensor of one collective must have the input's dtype and size");
  }
}

void checkSameDevice(const OpContext& ctx, const std::vector<at::Tensor>& tensors) {
  for (const auto& tensor : tensors) {
    if (tensor.device().type() != tensors.front().device().type()) {
      throwValueError(ctx, strCat("tensors on ", tensors.front().device(), " and ", tensor.device(), " in one call"),
                      "put every tensor of one collective on the same device");
    }
  }
}

void checkList(const OpContext& ctx, const std::vector<at::Tensor>& tensors, size_t count, const at::Tensor& reference,
               const char* what, const char* hint) {
  if (tensors.size() != count) {
    throwValueError(ctx, strCat("expected ", count, " ", what, " tensors, got ", tensors.size()), hint);
  }
  for (const auto& tensor : tensors) checkMatches(ctx, reference, tensor, what);
}

void checkNonEmptyList(const OpContext& ctx, const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.empty()) {
    throwValueError(ctx, strCat("the list of ", what, " tensors is empty"), "pass at least one tensor");
  }
  for (const auto& tensor : tensors) checkTensor(ctx, tensor, what);
  checkSameDevice(ctx, tensors);
}

void checkSplits(const OpContext& ctx, const at::Tensor& tensor, const std::vector<int64_t>& splits, const char* what) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  if (splits.empty()) {
    if (rows % ctx.size != 0) {
      throwValueError(ctx,
                      strCat("the ", what, " tensor's first dimension (", rows, ") does not divide by the world size ",
                             ctx.size),
                      "pass explicit split sizes, or make dimension 0 a multiple of the world size");
    }
    return;
  }
  int64_t total = 0;
  bool negative = false;
  for (int64_t split : splits) {
    total += split;
    negative = negative || split < 0;
  }
  if (static_cast<int>(splits.size()) != ctx.size || negative || total != rows) {
    throwValueError(ctx,
                    strCat("the ", what, " split sizes (", splits.size(), " entries summing to ", total,
                           ") must be ", ctx.size, " non-negative entries summing to dimension 0 of the tensor (",
                           rows, ")"),
                    "split sizes count rows of dimension 0, one entry per rank");
  }
}

size_t ownSplitBytes(const OpContext& ctx, const at::Tensor& tensor, const std::vector<int64_t>& splits) {
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  if (rows == 0) return 0;
  const int64_t ownRows = splits.empty() ? rows / ctx.size : splits[ctx.rank];
  return static_cast<size_t>(ownRows) * (tensor.nbytes() / static_cast<size_t>(rows));
}

void checkOwnBlock(const OpContext& ctx, size_t sentBytes, size_t landingBytes) {
  if (sentBytes != landingBytes) {
    throwValueError(ctx,
                    strCat("this rank sends itself ", sentBytes, " bytes but its output has room for ", landingBytes,
                           " bytes from itself"),
                    "input split i must have the size of output split i on rank i: make this rank's own "
                    "input and output splits equal");
  }
}

void checkPeer(const OpContext& ctx, int peer, const char* direction, bool selfServed) {
  if (peer == ctx.rank && peer >= 0 && peer < ctx.size && !selfServed) {
    throwValueError(ctx, strCat("cannot ", direction, " rank ", peer, ": that is this rank"),
                    "a rank exchanges with itself only with CUDA tensors inside batch_isend_irecv (one NCCL group, "
                    "as with nccl); on the CPU copy the tensor instead (gloo refuses this too)");
  }
  if (peer < 0 || peer >= ctx.size) {
    throwValueError(ctx, strCat("cannot ", direction, " rank ", peer, ": it must be another rank of this group [0, ",
                                ctx.size, ")"),
                    "pass the peer's rank (torch.distributed translates global ranks for subgroups)");
  }
}

void checkTag(const OpContext& ctx, int tag, int firstUserTag) {
  if (tag < firstUserTag) {
    throwValueError(ctx, strCat("tag ", tag, " is reserved (tags below ", firstUserTag, " are ddplite's own)"),
                    "use a tag >= 0, as torch.distributed's own calls do");
  }
}

std::vector<at::Tensor> rootOnlyList(const OpContext& ctx, const std::vector<std::vector<at::Tensor>>& lists,
                                     bool isRoot, const at::Tensor& reference, const char* name, const char* role) {
  if (!isRoot) {
    if (!lists.empty() && !lists[0].empty()) {
      throwValueError(ctx, strCat("a non-", role, " rank passed a ", name),
                      strCat("pass ", name, " only on the ", role, " rank (None elsewhere)"));
    }
    return {};
  }
  if (lists.size() != 1) {
    throwValueError(ctx, strCat("the ", role, " expects one ", name, ", got ", lists.size()),
                    strCat("pass ", name, " with one tensor per rank on the ", role, " rank"));
  }
  checkList(ctx, lists[0], ctx.size, reference, name,
            strCat(name, " on the ", role, " needs one tensor per rank, each like the rank's own tensor").c_str());
  return lists[0];
}

void checkCoalescedPairs(const OpContext& ctx, const std::vector<at::Tensor>& inputs,
                         const std::vector<at::Tensor>& outputs, int64_t inputScale, int64_t outputScale) {
  checkNonEmptyList(ctx, inputs, "input");
  checkNonEmptyList(ctx, outputs, "output");
  if (outputs.size() != inputs.size()) {
    throwValueError(ctx, strCat(outputs.size(), " outputs for ", inputs.size(), " inputs"), "pass one output per input");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (outputs[i].scalar_type() != inputs[i].scalar_type() ||
        inputs[i].numel() * inputScale != outputs[i].numel() * outputScale) {
      throwValueError(ctx,
                      strCat("pair ", i, ": input (", inputs[i].scalar_type(), ", ", inputs[i].numel(),
                             " elements) and output (", outputs[i].scalar_type(), ", ", outputs[i].numel(),
                             " elements) need one dtype and a ", std::max(inputScale, outputScale),
                             "x size ratio (the world size)"),
                      "allocate each output with the input's dtype and the collective's size (see "
                      "all_gather_into_tensor / reduce_scatter_tensor)");
    }
  }
}

}  // namespace ddplite::validation
