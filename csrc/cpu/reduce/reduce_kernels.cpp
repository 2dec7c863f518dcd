#include "cpu/reduce/reduce_kernels.hpp"

#include "common/env.hpp"
#include "common/errors.hpp"
#include "cpu/reduce/kernel_sets.hpp"

#include <cstring>
#include <stdexcept>

namespace ddplite::cpu {

struct KernelSet {
  const char* name;
  kernels::KernelPair (*select)(c10::ScalarType, c10d::ReduceOp::RedOpType);
};

namespace {

using RedOpType = c10d::ReduceOp::RedOpType;

// Narrowest first.
const KernelSet kSets[] = {
    {"generic", &kernels::genericKernels},
    {"avx2", &kernels::avx2Kernels},
    {"avx512", &kernels::avx512Kernels},
};

bool cpuRuns(const KernelSet& set) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (std::strcmp(set.name, "avx2") == 0) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  }
  if (std::strcmp(set.name, "avx512") == 0) {
    // libgcc also checks that the OS saves the AVX-512 registers (XCR0).
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("f16c");
  }
#endif
  return std::strcmp(set.name, "generic") == 0;
}

const KernelSet* findSet(const std::string& name) {
  for (const KernelSet& set : kSets) {
    if (name == set.name) return &set;
  }
  return nullptr;
}

std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

}  // namespace

const std::vector<std::string>& kernelSetNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const KernelSet& set : kSets) all.emplace_back(set.name);
    return all;
  }();
  return names;
}

std::vector<std::string> runnableSetNames() {
  std::vector<std::string> names;
  for (const KernelSet& set : kSets) {
    if (cpuRuns(set)) names.emplace_back(set.name);
  }
  return names;
}

const std::string& kernelSetName(const KernelSet& set) {
  static const std::vector<std::string>& names = kernelSetNames();
  return names[&set - kSets];
}

const KernelSet& kernelSetFromEnv() {
  const std::string choice = env::cpuKernels();
  if (choice == "auto") {
    const KernelSet* widest = &kSets[0];
    for (const KernelSet& set : kSets) {
      if (cpuRuns(set)) widest = &set;
    }
    return *widest;
  }
  const KernelSet* pinned = findSet(choice);
  if (pinned == nullptr || !cpuRuns(*pinned)) {
    throw std::invalid_argument(strCat("DDPLITE_CPU_KERNELS='", choice, "' is not a valid value",
                                       pinned == nullptr ? "" : " on this CPU (it lacks the instructions)",
                                       "; use one of: auto (the default), ", joined(runnableSetNames())));
  }
  return *pinned;
}

const KernelSet& kernelSetNamed(const std::string& name) {
  const KernelSet* set = findSet(name);
  if (set == nullptr || !cpuRuns(*set)) {
    throw std::invalid_argument(strCat("no kernel set '", name, "' this CPU runs; it runs: ", joined(runnableSetNames())));
  }
  return *set;
}

ReduceFn selectReduceFn(c10::ScalarType dtype, RedOpType op, const KernelSet& set) {
  return set.select(dtype, op).pairwise;
}

ReduceManyFn selectReduceManyFn(c10::ScalarType dtype, RedOpType op, const KernelSet& set) {
  return set.select(dtype, op).many;
}

ReduceFn selectReduceFn(c10::ScalarType dtype, RedOpType op) {
  static const KernelSet& first = kernelSetFromEnv();
  return selectReduceFn(dtype, op, first);
}

bool isSupportedDtype(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat: case c10::kDouble: case c10::kHalf: case c10::kBFloat16:
    case c10::kChar: case c10::kByte: case c10::kShort: case c10::kUInt16: case c10::kInt: case c10::kUInt32:
    case c10::kLong: case c10::kUInt64: case c10::kBool:
    case c10::kFloat8_e4m3fn: case c10::kFloat8_e5m2:  // data movement only (reduceOpProblem)
      return true;
    default:
      return false;
  }
}

bool isFloat8(c10::ScalarType dtype) {
  return dtype == c10::kFloat8_e4m3fn || dtype == c10::kFloat8_e5m2;
}

const char* reduceOpName(RedOpType op) {
  switch (op) {
    case RedOpType::SUM: return "SUM";
    case RedOpType::AVG: return "AVG";
    case RedOpType::PRODUCT: return "PRODUCT";
    case RedOpType::MIN: return "MIN";
    case RedOpType::MAX: return "MAX";
    case RedOpType::BAND: return "BAND";
    case RedOpType::BOR: return "BOR";
    case RedOpType::BXOR: return "BXOR";
    case RedOpType::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

std::string reduceOpProblem(c10::ScalarType dtype, RedOpType op) {
  if (kernels::genericKernels(dtype, op).pairwise != nullptr) {  // every set supports the same pairs
    return "";
  }
  std::string name = reduceOpName(op);
  std::string type = c10::toString(dtype);
  if (isFloat8(dtype)) {
    return type + " tensors can be moved (broadcast, gathers, scatter, all-to-all, send/recv) but not reduced "
           "on CPU (ReduceOp." + name + "); neither can gloo";
  }
  if (op == RedOpType::PREMUL_SUM) {
    return "ReduceOp.PREMUL_SUM is defined for floating-point tensors only, not " + type;
  }
  if (dtype == c10::kBool) {
    return "ReduceOp." + name + " is not defined for bool tensors (use SUM/MAX for 'any', PRODUCT/MIN for 'all')";
  }
  return "ReduceOp." + name + " is not defined for " + type + " tensors (bitwise ops need an integer or bool dtype)";
}

}  // namespace ddplite::cpu
