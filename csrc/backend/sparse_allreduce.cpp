#include "backend/sparse_allreduce.hpp"

#include "cpu/reduce/reduce_kernels.hpp"

#include <algorithm>

namespace ddplite {

namespace {

// nnz, sparse dims, dense dims, then the sizes (padded with -1).
constexpr int64_t kMetaLength = 3 + kSparseMaxDims;

at::Tensor metadataOf(const at::Tensor& sparse) {
  at::Tensor meta = at::full({kMetaLength}, -1, at::kLong);
  int64_t* row = meta.data_ptr<int64_t>();
  row[0] = sparse._nnz();
  row[1] = sparse.sparse_dim();
  row[2] = sparse.dense_dim();
  for (int64_t d = 0; d < sparse.dim(); ++d) row[3 + d] = sparse.size(d);
  return meta;
}

std::string describe(const int64_t* row) {
  std::string sizes;
  for (int64_t d = 0; d < row[1] + row[2]; ++d) sizes += strCat(d ? ", " : "", row[3 + d]);
  return strCat("[", sizes, "] with ", row[1], " sparse dims");
}

}  // namespace

void checkSparseAllreduce(const OpContext& ctx, const at::Tensor& tensor, const c10d::ReduceOp& op) {
  if (!tensor.device().is_cpu()) {
    throwValueError(ctx, strCat("sparse tensors are reduced on CPU only; this one is on ", tensor.device()),
                    "move it with tensor.cpu(), or reduce it densely");
  }
  if (op.op_ != c10d::ReduceOp::SUM) {
    throwValueError(ctx, "sparse tensors are reduced with ReduceOp.SUM only, as in gloo",
                    "use ReduceOp.SUM, or reduce the dense tensor");
  }
  if (tensor.dim() > kSparseMaxDims) {
    throwValueError(ctx, strCat("the sparse tensor has ", tensor.dim(), " dims; at most ", kSparseMaxDims),
                    "reshape it");
  }
  const std::string problem = cpu::reduceOpProblem(tensor.scalar_type(), op.op_);
  if (!cpu::isSupportedDtype(tensor.scalar_type()) || !problem.empty()) {
    throwValueError(ctx, strCat("sparse values of dtype ", tensor.scalar_type(), " cannot be summed on CPU",
                                problem.empty() ? "" : ": ", problem),
                    "convert the values to a dtype the CPU path sums (float32, float64, int64, ...)");
  }
}

at::Tensor sparseAllreduceSum(const OpContext& ctx, const at::Tensor& tensor, int size,
                              const std::function<at::Tensor(const at::Tensor&)>& allgather) {
  const at::Tensor input = tensor.coalesce();
  const at::Tensor rows = allgather(metadataOf(input)).view({size, kMetaLength});
  const int64_t* meta = rows.data_ptr<int64_t>();
  int64_t maxNnz = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t* row = meta + r * kMetaLength;
    if (!std::equal(row + 1, row + kMetaLength, meta + 1)) {
      throwValueError(ctx, strCat("rank ", r, "'s sparse tensor is ", describe(row), ", rank 0's is ",
                                  describe(meta)),
                      "every rank must all_reduce a sparse tensor of the same size and sparse dims");
    }
    maxNnz = std::max(maxNnz, row[0]);
  }
  const int64_t sparseDims = input.sparse_dim();
  const int64_t nnz = input._nnz();
  at::Tensor indices = at::zeros({sparseDims, maxNnz}, at::kLong);
  indices.narrow(1, 0, nnz).copy_(input._indices());
  std::vector<int64_t> valueShape = input._values().sizes().vec();
  valueShape[0] = maxNnz;
  at::Tensor values = at::zeros(valueShape, input._values().options());
  values.narrow(0, 0, nnz).copy_(input._values());
  valueShape.insert(valueShape.begin(), size);
  const at::Tensor allIndices = allgather(indices).view({size, sparseDims, maxNnz});
  const at::Tensor allValues = allgather(values).view(valueShape);
  std::vector<at::Tensor> indexParts, valueParts;
  for (int r = 0; r < size; ++r) {
    const int64_t count = meta[r * kMetaLength];
    indexParts.push_back(allIndices[r].narrow(1, 0, count));
    valueParts.push_back(allValues[r].narrow(0, 0, count));
  }
  return at::sparse_coo_tensor(at::cat(indexParts, 1), at::cat(valueParts, 0), input.sizes(), input.options())
      .coalesce();
}

}  // namespace ddplite
