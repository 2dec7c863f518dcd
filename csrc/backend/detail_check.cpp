#include "backend/detail_check.hpp"

#include <ATen/ops/empty.h>
#include <c10/util/StringUtil.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

namespace ddplite {

namespace {

constexpr const char* kCheckOpName = "argument check";  // the exchange's own name on the wire

std::string dtypeText(int32_t dtype) {
  return dtype < 0 ? "none" : c10::toString(static_cast<c10::ScalarType>(dtype));
}

std::string reduceOpText(int32_t op) {
  static const char* const kNames[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  if (op < 0) return "none";
  return op < static_cast<int32_t>(std::size(kNames)) ? kNames[op] : strCat("op ", op);
}

std::string shapeText(const ArgumentSignature& s) {
  if (s.tensorCount == 0) return "no tensors";
  std::vector<int64_t> dims(s.shape, s.shape + std::min(s.dims, ArgumentSignature::kMaxDims));
  std::string text = strCat("[", c10::Join(", ", dims), s.dims > ArgumentSignature::kMaxDims ? ", ..." : "", "]");
  if (s.tensorCount > 1) text += strCat(" (first of ", s.tensorCount, " tensors, ", s.totalNumel, " elements in all)");
  return text;
}

std::string ranksText(const std::vector<int>& ranks) {
  return strCat(ranks.size() == 1 ? "rank " : "ranks ", c10::Join(", ", ranks));
}

// "field: 'a' on ranks 0, 2; 'b' on rank 1" when the ranks disagree on `field`.
void addDifference(std::vector<std::string>& lines, const char* field, const std::vector<ArgumentSignature>& all,
                   const std::function<std::string(const ArgumentSignature&)>& text) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of first appearance
  for (size_t rank = 0; rank < all.size(); ++rank) {
    const std::string value = text(all[rank]);
    auto found = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == value; });
    if (found == groups.end()) {
      groups.push_back({value, {static_cast<int>(rank)}});
    } else {
      found->second.push_back(static_cast<int>(rank));
    }
  }
  if (groups.size() < 2) return;
  std::string line = strCat(field, ": ");
  for (size_t i = 0; i < groups.size(); ++i) {
    line += strCat(i == 0 ? "" : "; ", "'", groups[i].first, "' on ", ranksText(groups[i].second));
  }
  lines.push_back(std::move(line));
}

}  // namespace

ArgumentSignature signatureOf(const OpContext& ctx, c10::ArrayRef<at::Tensor> compared, int root, int reduceOp) {
  ArgumentSignature s;
  s.seq = ctx.seq;
  std::strncpy(s.op, ctx.op, sizeof(s.op) - 1);
  s.root = root;
  s.reduceOp = reduceOp;
  s.tensorCount = static_cast<int32_t>(compared.size());
  if (!compared.empty()) {
    const at::Tensor& first = compared.front();
    s.dtype = static_cast<int32_t>(first.scalar_type());
    s.dims = static_cast<int32_t>(first.dim());
    for (int64_t d = 0; d < std::min<int64_t>(first.dim(), ArgumentSignature::kMaxDims); ++d) s.shape[d] = first.size(d);
  }
  for (const auto& tensor : compared) {
    s.totalNumel += tensor.numel();
    if (static_cast<int32_t>(tensor.scalar_type()) != s.dtype) s.mixedDtypes = 1;
  }
  return s;
}

std::vector<std::string> signatureDifferences(const std::vector<ArgumentSignature>& all) {
  std::vector<std::string> lines;
  addDifference(lines, "sequence number", all, [](const auto& s) { return std::to_string(s.seq); });
  addDifference(lines, "op", all, [](const auto& s) { return std::string(s.op); });
  addDifference(lines, "dtype", all,
                [](const auto& s) { return dtypeText(s.dtype) + (s.mixedDtypes ? " (mixed)" : ""); });
  addDifference(lines, "shape", all, shapeText);
  addDifference(lines, "numel", all, [](const auto& s) { return std::to_string(s.totalNumel); });
  addDifference(lines, "root", all, [](const auto& s) { return s.root < 0 ? std::string("none") : std::to_string(s.root); });
  addDifference(lines, "reduce op", all, [](const auto& s) { return reduceOpText(s.reduceOp); });
  return lines;
}

void checkArgumentsAcrossRanks(const cpu::CpuContext& cpu, const ArgumentSignature& mine) {
  const int size = cpu.op.size;
  constexpr int64_t kBytes = sizeof(ArgumentSignature);
  at::Tensor input = at::empty({kBytes}, at::kByte);
  std::memcpy(input.data_ptr(), &mine, kBytes);
  at::Tensor output = at::empty({kBytes * size}, at::kByte);
  cpu::CpuContext exchange = cpu;
  exchange.op.op = kCheckOpName;
  exchange.algorithm = nullptr;
  cpu::allgatherInto(exchange, input, output);
  std::vector<ArgumentSignature> all(size);
  std::memcpy(all.data(), output.data_ptr(), kBytes * size);
  const std::vector<std::string> differences = signatureDifferences(all);
  if (differences.empty()) return;
  throwValueError(cpu.op,
                  strCat("the ranks called different collectives at #", mine.seq,
                         " (found by the DETAIL check before anything was sent; every rank raises this):\n  ",
                         c10::Join("\n  ", differences)),
                  "every rank must issue the same collectives in the same order, with the same dtypes, shapes, roots "
                  "and reduce ops; the group is still usable");
}

}  // namespace ddplite
