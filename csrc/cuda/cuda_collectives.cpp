#include "cuda/cuda_collectives.hpp"

#include "cuda/nccl_errors.hpp"

namespace ddplite::nccl {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

// An ncclRedOp_t for one NCCL call: a built-in op, or a PREMUL_SUM op created on the
// communicator and destroyed when this goes out of scope (NCCL allows destroying it as soon as
// the call that uses it has returned).
class RedOp {
 public:
  RedOp(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op);
  ~RedOp() {
    if (custom_) ncclRedOpDestroy(op_, comm_);
  }
  RedOp(const RedOp&) = delete;
  RedOp& operator=(const RedOp&) = delete;
  ncclRedOp_t get() const { return op_; }

 private:
  void createPreMulSum(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op);

  ncclRedOp_t op_ = ncclSum;
  ncclComm_t comm_;
  bool custom_ = false;
};

ncclRedOp_t builtinOp(const OpContext& ctx, at::ScalarType dtype, RedOpType op) {
  if (dtype == at::kBool) {
    // NCCL has no bool: it travels as uint8, where "any" is MAX and "all" is MIN (as in torch).
    if (op == RedOpType::SUM || op == RedOpType::MAX) return ncclMax;
    if (op == RedOpType::PRODUCT || op == RedOpType::MIN) return ncclMin;
  }
  switch (op) {
    case RedOpType::SUM: return ncclSum;
    case RedOpType::AVG: return ncclAvg;
    case RedOpType::PRODUCT: return ncclProd;
    case RedOpType::MIN: return ncclMin;
    case RedOpType::MAX: return ncclMax;
    default:
      throwValueError(ctx, "this reduce op is not available on CUDA tensors (NCCL has no bitwise reductions)",
                      "use SUM, AVG, PRODUCT, MIN, MAX or PREMUL_SUM, or run the op on CPU tensors");
  }
}

template <typename Scalar>
ncclResult_t preMulSumHost(ncclRedOp_t* op, Scalar factor, ncclDataType_t type, ncclComm_t comm) {
  return ncclRedOpCreatePreMulSum(op, &factor, type, ncclScalarHostImmediate, comm);
}

RedOp::RedOp(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op) : comm_(launch.comm) {
  if (op.op_ == RedOpType::PREMUL_SUM) {
    createPreMulSum(launch, tensor, op);
  } else {
    op_ = builtinOp(launch.ctx, tensor.scalar_type(), op.op_);
  }
}

void RedOp::createPreMulSum(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op) {
  const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (supplement == nullptr) {
    throwValueError(launch.ctx, "ReduceOp.PREMUL_SUM without a factor",
                    "build it with torch.distributed._make_nccl_premul_sum(factor)");
  }
  const ncclDataType_t type = toNcclType(launch.ctx, tensor.scalar_type());
  ncclResult_t result = ncclSuccess;
  if (supplement->tensor_factor.defined()) {
    // The factor stays on the device; the copy runs on the NCCL stream and is kept alive by the Work.
    at::Tensor factor = supplement->tensor_factor.to(tensor.device(), tensor.scalar_type()).reshape({1});
    launch.scratch->push_back(factor);
    result = ncclRedOpCreatePreMulSum(&op_, factor.data_ptr(), type, ncclScalarDevice, launch.comm);
  } else {
    const double factor = supplement->double_factor;
    switch (tensor.scalar_type()) {
      case at::kHalf: result = preMulSumHost(&op_, at::Half(static_cast<float>(factor)), type, launch.comm); break;
      case at::kBFloat16: result = preMulSumHost(&op_, at::BFloat16(static_cast<float>(factor)), type, launch.comm); break;
      case at::kFloat: result = preMulSumHost(&op_, static_cast<float>(factor), type, launch.comm); break;
      case at::kDouble: result = preMulSumHost(&op_, factor, type, launch.comm); break;
      default:
        throwValueError(launch.ctx, strCat("ReduceOp.PREMUL_SUM on CUDA supports float16, bfloat16, float32 and "
                                           "float64, not ", tensor.scalar_type()),
                        "convert the tensor to a floating dtype");
    }
  }
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm, result);
  custom_ = true;
}

char* bytesOf(const at::Tensor& tensor) {
  return static_cast<char*>(tensor.data_ptr());
}

// Element offsets and counts of each rank's part of dimension 0 (all_to_all_single).
struct Parts {
  std::vector<size_t> offsets;
  std::vector<size_t> counts;
};

Parts partsOf(const at::Tensor& tensor, const std::vector<int64_t>& splits, int size) {
  Parts parts;
  const int64_t rows = tensor.dim() == 0 ? 1 : tensor.size(0);
  const size_t rowElements = rows == 0 ? 0 : static_cast<size_t>(tensor.numel() / rows);
  size_t offset = 0;
  for (int r = 0; r < size; ++r) {
    const size_t count = splits.empty() ? static_cast<size_t>(tensor.numel() / size) : splits[r] * rowElements;
    parts.offsets.push_back(offset);
    parts.counts.push_back(count);
    offset += count;
  }
  return parts;
}

}  // namespace

ncclDataType_t toNcclType(const OpContext& ctx, at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kChar: return ncclInt8;
    case at::kByte: return ncclUint8;
    case at::kBool: return ncclUint8;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kUInt32: return ncclUint32;
    case at::kUInt64: return ncclUint64;
#if DDPLITE_NCCL_HAS_FP8
    case at::kFloat8_e4m3fn: return ncclFloat8e4m3;
    case at::kFloat8_e5m2: return ncclFloat8e5m2;
#endif
    default:
      throwValueError(ctx, strCat("dtype ", dtype, " is not supported on CUDA by this build (NCCL ",
                                  versionText(compiledVersion()), ")"),
                      "supported: float32, float64, float16, bfloat16, int8, uint8, int32, uint32, int64, uint64, "
                      "bool, and float8 (e4m3fn, e5m2) with NCCL >= 2.24");
  }
}

void checkReduceOp(const OpContext& ctx, at::ScalarType dtype, const c10d::ReduceOp& op) {
  toNcclType(ctx, dtype);
  if (op.op_ == RedOpType::PREMUL_SUM) {
    if (dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kFloat && dtype != at::kDouble) {
      throwValueError(ctx, strCat("ReduceOp.PREMUL_SUM on CUDA supports floating dtypes, not ", dtype),
                      "convert the tensor to float16, bfloat16, float32 or float64");
    }
    return;
  }
  if (dtype == at::kBool && op.op_ == RedOpType::AVG) {
    throwValueError(ctx, "ReduceOp.AVG is not defined for bool tensors", "use SUM/MAX for 'any', MIN/PRODUCT for 'all'");
  }
  builtinOp(ctx, dtype, op.op_);
}

void broadcast(const Launch& launch, at::Tensor& tensor, int root) {
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                   toNcclType(launch.ctx, tensor.scalar_type()), root, launch.comm, launch.stream));
}

void allreduce(const Launch& launch, at::Tensor& tensor, const c10d::ReduceOp& op) {
  RedOp redOp(launch, tensor, op);
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                   toNcclType(launch.ctx, tensor.scalar_type()), redOp.get(), launch.comm,
                                   launch.stream));
}

void reduce(const Launch& launch, at::Tensor& tensor, const c10d::ReduceOp& op, int root) {
  RedOp redOp(launch, tensor, op);
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                                toNcclType(launch.ctx, tensor.scalar_type()), redOp.get(), root, launch.comm,
                                launch.stream));
}

void allgatherInto(const Launch& launch, const at::Tensor& input, at::Tensor& output) {
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                                   toNcclType(launch.ctx, input.scalar_type()), launch.comm, launch.stream));
}

void allgatherList(const Launch& launch, const at::Tensor& input, std::vector<at::Tensor>& outputs, int size) {
  const int64_t count = input.numel();
  at::Tensor flat = at::empty({count * size}, input.options());
  launch.scratch->push_back(flat);
  allgatherInto(launch, input, flat);
  for (int r = 0; r < size; ++r) {
    outputs[r].copy_(flat.narrow(0, r * count, count).view(outputs[r].sizes()));
  }
}

void reduceScatterInto(const Launch& launch, const at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op) {
  RedOp redOp(launch, output, op);
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                       toNcclType(launch.ctx, output.scalar_type()), redOp.get(), launch.comm,
                                       launch.stream));
}

void reduceScatterList(const Launch& launch, const std::vector<at::Tensor>& inputs, at::Tensor& output,
                       const c10d::ReduceOp& op) {
  const int64_t count = output.numel();
  at::Tensor flat = at::empty({count * static_cast<int64_t>(inputs.size())}, output.options());
  launch.scratch->push_back(flat);
  for (size_t r = 0; r < inputs.size(); ++r) {
    flat.narrow(0, static_cast<int64_t>(r) * count, count).copy_(inputs[r].reshape({-1}));
  }
  reduceScatterInto(launch, flat, output, op);
}

void alltoallBase(const Launch& launch, const at::Tensor& input, at::Tensor& output,
                  const std::vector<int64_t>& outputSplits, const std::vector<int64_t>& inputSplits, int size) {
  const Parts sends = partsOf(input, inputSplits, size);
  const Parts recvs = partsOf(output, outputSplits, size);
  const ncclDataType_t type = toNcclType(launch.ctx, input.scalar_type());
  const size_t element = input.element_size();
  grouped(launch, [&] {
    for (int r = 0; r < size; ++r) {
      DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                         ncclSend(bytesOf(input) + sends.offsets[r] * element, sends.counts[r], type, r, launch.comm,
                                  launch.stream));
      DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                         ncclRecv(bytesOf(output) + recvs.offsets[r] * element, recvs.counts[r], type, r, launch.comm,
                                  launch.stream));
    }
  });
}

void alltoallList(const Launch& launch, const std::vector<at::Tensor>& inputs, std::vector<at::Tensor>& outputs) {
  grouped(launch, [&] {
    for (size_t r = 0; r < inputs.size(); ++r) {
      const int peer = static_cast<int>(r);
      send(launch, inputs[r], peer);
      recv(launch, outputs[r], peer);
    }
  });
}

void gather(const Launch& launch, const at::Tensor& input, std::vector<at::Tensor>& outputs, int root) {
  if (launch.ctx.rank != root) {
    send(launch, input, root);
    return;
  }
  grouped(launch, [&] {
    for (size_t r = 0; r < outputs.size(); ++r) {
      if (static_cast<int>(r) != root) recv(launch, outputs[r], static_cast<int>(r));
    }
  });
  outputs[root].copy_(input);
}

void scatter(const Launch& launch, const std::vector<at::Tensor>& inputs, at::Tensor& output, int root) {
  if (launch.ctx.rank != root) {
    recv(launch, output, root);
    return;
  }
  grouped(launch, [&] {
    for (size_t r = 0; r < inputs.size(); ++r) {
      if (static_cast<int>(r) != root) send(launch, inputs[r], static_cast<int>(r));
    }
  });
  output.copy_(inputs[root]);
}

void send(const Launch& launch, const at::Tensor& tensor, int peer) {
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclSend(tensor.data_ptr(), tensor.numel(), toNcclType(launch.ctx, tensor.scalar_type()), peer,
                              launch.comm, launch.stream));
}

void recv(const Launch& launch, at::Tensor& tensor, int peer) {
  DDPLITE_NCCL_CHECK(launch.ctx, launch.comm,
                     ncclRecv(tensor.data_ptr(), tensor.numel(), toNcclType(launch.ctx, tensor.scalar_type()), peer,
                              launch.comm, launch.stream));
}

}  // namespace ddplite::nccl
