#include "cuda/cuda_collectives.hpp"

#include "cuda/nccl_errors.hpp"

#include <optional>

namespace ddplite::nccl {

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

// The scalar type NCCL reduces: a complex tensor reduces its real view (and torch's PREMUL_SUM
// factor is real).
at::ScalarType reducedScalarType(at::ScalarType dtype) {
  return at::isComplexType(dtype) ? c10::toRealValueType(dtype) : dtype;
}

// An ncclRedOp_t for one NCCL call: a built-in op, or a PREMUL_SUM op created on the
// communicator and destroyed when this goes out of scope (NCCL allows destroying it as soon as
// the call that uses it has returned).
class RedOp {
 public:
  RedOp(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op, ncclDataType_t type);
  ~RedOp() {
    if (custom_) ncclRedOpDestroy(op_, comm_);
  }
  RedOp(const RedOp&) = delete;
  RedOp& operator=(const RedOp&) = delete;
  ncclRedOp_t get() const { return op_; }

 private:
  void createPreMulSum(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op, ncclDataType_t type);

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

RedOp::RedOp(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op, ncclDataType_t type)
    : comm_(launch.comm) {
  if (op.op_ == RedOpType::PREMUL_SUM) {
    createPreMulSum(launch, tensor, op, type);
  } else {
    op_ = builtinOp(launch.ctx, tensor.scalar_type(), op.op_);
  }
}

void RedOp::createPreMulSum(const Launch& launch, const at::Tensor& tensor, const c10d::ReduceOp& op,
                            ncclDataType_t type) {
  const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  DDPLITE_ENFORCE(supplement != nullptr, "PREMUL_SUM without a factor reached the launch (checkReduceOp refuses it)");
  const at::ScalarType scalarType = reducedScalarType(tensor.scalar_type());
  ncclResult_t result = ncclSuccess;
  const at::Tensor& tensorFactor = supplement->tensor_factor;
  if (tensorFactor.defined() && tensorFactor.device().is_cuda()) {
    // The factor stays on the GPU (no host sync): NCCL reads it when the kernel runs, so the
    // converted copy (made on the NCCL stream, after the caller's work) is kept by the Work.
    at::Tensor factor = tensorFactor.to(tensor.device(), scalarType).reshape({1});
    launch.scratch->push_back(factor);
    result = ncclRedOpCreatePreMulSum(&op_, factor.data_ptr(), type, ncclScalarDevice, launch.comm);
  } else {
    // A CPU tensor factor is read here on the host: copying it to the GPU would be a synchronous
    // copy from pageable memory on the NCCL stream (blocking this thread behind queued work).
    const double factor = tensorFactor.defined() ? tensorFactor.item<double>() : supplement->double_factor;
    switch (scalarType) {
      case at::kHalf: result = preMulSumHost(&op_, at::Half(static_cast<float>(factor)), type, launch.comm); break;
      case at::kBFloat16: result = preMulSumHost(&op_, at::BFloat16(static_cast<float>(factor)), type, launch.comm); break;
      case at::kFloat: result = preMulSumHost(&op_, static_cast<float>(factor), type, launch.comm); break;
      case at::kDouble: result = preMulSumHost(&op_, factor, type, launch.comm); break;
      default:
        DDPLITE_ENFORCE(false, "PREMUL_SUM of ", tensor.scalar_type(), " reached the launch (checkReduceOp refuses it)");
    }
  }
  checkIssued(launch, "ncclRedOpCreatePreMulSum", result);
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

namespace {

thread_local int ncclGroupDepth = 0;  // this thread's open NCCL groups (NCCL's own count is per thread too)

// NCCL's own type for `dtype`, if it has one (bool travels as uint8).
std::optional<ncclDataType_t> nativeType(at::ScalarType dtype) {
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
    default: return std::nullopt;
  }
}

bool isFloat8(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2;
}

}  // namespace

Payload payloadOf(const at::Tensor& tensor) {
  const at::ScalarType dtype = tensor.scalar_type();
  // float8 moves as bytes: NCCL < 2.24 lacks the types, and some versions refuse float8 below sm90
  // even where nothing is reduced.
  if (auto type = nativeType(dtype); type && !isFloat8(dtype)) {
    return Payload{static_cast<size_t>(tensor.numel()), *type, static_cast<size_t>(tensor.element_size())};
  }
  return Payload{static_cast<size_t>(tensor.nbytes()), ncclUint8, 1};
}

Payload reductionPayloadOf(const at::Tensor& tensor) {
  const at::ScalarType reduced = reducedScalarType(tensor.scalar_type());
  const auto type = nativeType(reduced);
  DDPLITE_ENFORCE(type.has_value(), "reduction of ", tensor.scalar_type(), " reached the launch (checkReduceOp refuses it)");
  const size_t values = static_cast<size_t>(tensor.numel()) * (reduced == tensor.scalar_type() ? 1 : 2);
  return Payload{values, *type, c10::elementSize(reduced)};
}

void checkReduceOp(const OpContext& ctx, at::ScalarType dtype, const c10d::ReduceOp& op, int minCompCap) {
  if (isFloat8(dtype)) {
    const std::string refusal = rules::fp8ReductionRefusal(DDPLITE_NCCL_HAS_FP8, minCompCap);
    if (!refusal.empty()) {
      throwValueError(ctx, refusal,
                      "reduce in bfloat16 or float16 (tensor.to(torch.bfloat16)) and cast back; broadcast, gathers "
                      "and all-to-all of float8 work on every GPU");
    }
  } else if (!at::isComplexType(dtype) && !nativeType(dtype)) {
    throwValueError(ctx, strCat("NCCL cannot reduce ", dtype, " tensors"),
                    "reduce in a dtype NCCL has (float32, float64, float16, bfloat16, int8, uint8, int32, uint32, "
                    "int64, uint64, bool, complex), or run the op on CPU tensors");
  }
  if (op.op_ == RedOpType::PREMUL_SUM) {
    // Checked here, before launch: inside the launch a refusal would fail the whole group.
    const auto* supplement = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
    if (supplement == nullptr) {
      throwValueError(ctx, "ReduceOp.PREMUL_SUM without a factor",
                      "build it with torch.distributed._make_nccl_premul_sum(factor)");
    }
    if (supplement->tensor_factor.defined() && supplement->tensor_factor.numel() != 1) {
      throwValueError(ctx, strCat("the PREMUL_SUM factor tensor has ", supplement->tensor_factor.numel(),
                                  " elements; it must have exactly one"),
                      "pass a one-element tensor or a Python number to _make_nccl_premul_sum");
    }
    const at::ScalarType real = reducedScalarType(dtype);
    if (real != at::kHalf && real != at::kBFloat16 && real != at::kFloat && real != at::kDouble) {
      throwValueError(ctx, strCat("ReduceOp.PREMUL_SUM on CUDA supports floating dtypes, not ", dtype),
                      "convert the tensor to float16, bfloat16, float32 or float64");
    }
    return;
  }
  if (at::isComplexType(dtype) && op.op_ != RedOpType::SUM && op.op_ != RedOpType::AVG) {
    throwValueError(ctx, "ReduceOp.PRODUCT, MIN and MAX are not defined for complex tensors",
                    "use SUM, AVG or PREMUL_SUM for complex tensors (NCCL reduces their real view)");
  }
  if (dtype == at::kBool && op.op_ == RedOpType::AVG) {
    throwValueError(ctx, "ReduceOp.AVG is not defined for bool tensors", "use SUM/MAX for 'any', MIN/PRODUCT for 'all'");
  }
  builtinOp(ctx, dtype, op.op_);
}

void groupStart(const Launch& launch) {
  check(launch.ctx, "ncclGroupStart", ncclGroupStart(), launch.comm);
  ++ncclGroupDepth;
}

void groupEnd(const Launch& launch, const std::vector<ncclComm_t>& comms) {
  --ncclGroupDepth;
  const ncclResult_t result = ncclGroupEnd();
  check(launch.ctx, "ncclGroupEnd", result, launch.comm);
  if (result == ncclInProgress && ncclGroupDepth == 0) {
    for (ncclComm_t comm : comms) {
      waitWhileInProgress(launch.ctx, "ncclGroupEnd", comm, launch.deadline, launch.abortRequested);
    }
  }
}

void groupAbandon() {
  --ncclGroupDepth;
  ncclGroupEnd();  // its result adds nothing to the error being raised
}

bool insideGroup() {
  return ncclGroupDepth > 0;
}

void checkIssued(const Launch& launch, const char* call, ncclResult_t result) {
  check(launch.ctx, call, result, launch.comm);
  if (result == ncclInProgress && !insideGroup()) {
    waitWhileInProgress(launch.ctx, call, launch.comm, launch.deadline, launch.abortRequested);
  }
}

void broadcast(const Launch& launch, at::Tensor& tensor, int root) {
  const Payload payload = payloadOf(tensor);
  DDPLITE_NCCL_ISSUE(launch, ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), payload.count, payload.type, root,
                                           launch.comm, launch.stream));
}

void allreduce(const Launch& launch, at::Tensor& tensor, const c10d::ReduceOp& op) {
  const Payload payload = reductionPayloadOf(tensor);
  RedOp redOp(launch, tensor, op, payload.type);
  DDPLITE_NCCL_ISSUE(launch, ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), payload.count, payload.type,
                                           redOp.get(), launch.comm, launch.stream));
}

void reduce(const Launch& launch, at::Tensor& tensor, const c10d::ReduceOp& op, int root) {
  const Payload payload = reductionPayloadOf(tensor);
  RedOp redOp(launch, tensor, op, payload.type);
  DDPLITE_NCCL_ISSUE(launch, ncclReduce(tensor.data_ptr(), tensor.data_ptr(), payload.count, payload.type, redOp.get(),
                                        root, launch.comm, launch.stream));
}

void allgatherInto(const Launch& launch, const at::Tensor& input, at::Tensor& output) {
  const Payload payload = payloadOf(input);
  DDPLITE_NCCL_ISSUE(launch, ncclAllGather(input.data_ptr(), output.data_ptr(), payload.count, payload.type,
                                           launch.comm, launch.stream));
}

void allgatherList(const Launch& launch, const at::Tensor& input, std::vector<at::Tensor>& outputs, int size) {
  const int64_t count = input.numel();
  at::Tensor flat = at::empty({count * size}, input.options());
  launch.scratch->push_back(flat);
  allgatherInto(launch, input, flat);
  // The copies read what the kernel wrote: they are queued once the kernel is (launch.after).
  std::vector<at::Tensor> targets = outputs;
  launch.after->push_back([flat, targets, count, size]() mutable {
    for (int r = 0; r < size; ++r) {
      targets[r].copy_(flat.narrow(0, r * count, count).view(targets[r].sizes()));
    }
  });
}

void reduceScatterInto(const Launch& launch, const at::Tensor& input, at::Tensor& output, const c10d::ReduceOp& op) {
  const Payload payload = reductionPayloadOf(output);
  RedOp redOp(launch, output, op, payload.type);
  DDPLITE_NCCL_ISSUE(launch, ncclReduceScatter(input.data_ptr(), output.data_ptr(), payload.count, payload.type,
                                               redOp.get(), launch.comm, launch.stream));
}

void reduceScatterList(const Launch& launch, const std::vector<at::Tensor>& inputs, at::Tensor& output,
                       const c10d::ReduceOp& op) {
  const int64_t count = output.numel();
  at::Tensor flat = at::empty({count * static_cast<int64_t>(inputs.size())}, output.options());
  launch.scratch->push_back(flat);
  for (size_t r = 0; r < inputs.size(); ++r) {  // before the kernel on the stream, wherever it is enqueued
    flat.narrow(0, static_cast<int64_t>(r) * count, count).copy_(inputs[r].reshape({-1}));
  }
  reduceScatterInto(launch, flat, output, op);
}

void alltoallBase(const Launch& launch, const at::Tensor& input, at::Tensor& output,
                  const std::vector<int64_t>& outputSplits, const std::vector<int64_t>& inputSplits, int size) {
  const Parts sends = partsOf(input, inputSplits, size);
  const Parts recvs = partsOf(output, outputSplits, size);
  const Payload payload = payloadOf(input);
  const size_t element = input.element_size();
  const size_t unitsPerElement = element / payload.unitBytes;  // 1, or the element's bytes when sent as bytes
  grouped(launch, [&] {
    for (int r = 0; r < size; ++r) {
      DDPLITE_NCCL_ISSUE(launch, ncclSend(bytesOf(input) + sends.offsets[r] * element, sends.counts[r] * unitsPerElement,
                                          payload.type, r, launch.comm, launch.stream));
      DDPLITE_NCCL_ISSUE(launch, ncclRecv(bytesOf(output) + recvs.offsets[r] * element, recvs.counts[r] * unitsPerElement,
                                          payload.type, r, launch.comm, launch.stream));
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
  outputs[root].copy_(input);  // reads the input only: may precede the kernels on the stream
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
  output.copy_(inputs[root]);  // as in gather
}

void send(const Launch& launch, const at::Tensor& tensor, int peer) {
  const Payload payload = payloadOf(tensor);
  DDPLITE_NCCL_ISSUE(launch, ncclSend(tensor.data_ptr(), payload.count, payload.type, peer, launch.comm, launch.stream));
}

void recv(const Launch& launch, at::Tensor& tensor, int peer) {
  const Payload payload = payloadOf(tensor);
  DDPLITE_NCCL_ISSUE(launch, ncclRecv(tensor.data_ptr(), payload.count, payload.type, peer, launch.comm, launch.stream));
}

}  // namespace ddplite::nccl
