#include "common/env.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ddplite::env {

namespace {

constexpr const char* kSocketIfname = "DDPLITE_SOCKET_IFNAME";
constexpr const char* kDebug = "DDPLITE_DEBUG";
constexpr const char* kRingSegmentBytes = "DDPLITE_RING_SEGMENT_BYTES";
constexpr const char* kTreeChunkBytes = "DDPLITE_TREE_CHUNK_BYTES";
constexpr const char* kSocketBufferBytes = "DDPLITE_SOCKET_BUFFER_BYTES";
constexpr const char* kAlgo = "DDPLITE_ALGO";
constexpr const char* kCpuTransport = "DDPLITE_CPU_TRANSPORT";
constexpr const char* kCudaStaging = "DDPLITE_CUDA_STAGING";
constexpr const char* kFingerprint = "DDPLITE_FINGERPRINT";

const char* rawValue(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && value[0] != '\0') ? value : nullptr;
}

int64_t readBytes(const char* name, int64_t fallback, int64_t minimum) {
  const char* value = rawValue(name);
  if (value == nullptr) {
    return fallback;
  }
  char* end = nullptr;
  long long parsed = std::strtoll(value, &end, 10);
  if (end == value || parsed < minimum) {
    return fallback;
  }
  return parsed;
}

}  // namespace

const std::vector<Knob>& allKnobs() {
  static const std::vector<Knob> knobs = {
      {kSocketIfname, "",
       "Interfaces for rank-to-rank sockets, NCCL syntax: 'eth' (prefix), '=eth0' (exact), "
       "'^docker,lo' (exclude). Falls back to NCCL_SOCKET_IFNAME, then GLOO_SOCKET_IFNAME; "
       "unset: the interface that reaches MASTER_ADDR"},
      {kDebug, "WARN", "Log level on stderr: WARN, INFO or TRACE"},
      {kRingSegmentBytes, "262144", "Largest piece one ring step sends at once (bytes)"},
      {kTreeChunkBytes, "262144", "Pipelining chunk of tree broadcast and reduce (bytes)"},
      {kSocketBufferBytes, "0", "SO_SNDBUF/SO_RCVBUF of data sockets; 0 keeps the kernel default"},
      {kAlgo, "",
       "Pin CPU algorithms, e.g. 'allreduce:ring,broadcast:tree' (collective:algorithm, comma-separated; "
       "'auto' for the size-based choice). Must be the same on every rank"},
      {kCpuTransport, "tcp",
       "What carries CPU collectives: 'tcp' (ddplite's own transport and algorithms) or 'mpi' (MPI's own "
       "collectives on the group's communicator; needs a build with MPI and a job launched by mpirun). "
       "Must be the same on every rank"},
      {kFingerprint, "1",
       "1: the first message of every CPU collective to each peer carries a 48-byte fingerprint (sequence "
       "number, op, sizes, dtype, reduce op, root, algorithm), so a rank in another collective is reported at "
       "once instead of its bytes being used. 0 turns the check off: only for measuring its cost, since "
       "mismatched collectives can then return wrong values. Read when a group is created"},
      {kCudaStaging, "auto",
       "CUDA tensors: 'auto' uses NCCL except on a GPU shared by two ranks (then host memory + CPU transport, "
       "with a warning); 'always' stages every CUDA op; 'never' raises instead of staging. Same on every rank"},
  };
  return knobs;
}

std::string socketIfname(std::string* source) {
  for (const char* name : {kSocketIfname, "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (const char* value = rawValue(name)) {
      if (source != nullptr) {
        *source = name;
      }
      return value;
    }
  }
  return "";
}

int logLevel() {
  static const int level = [] {
    const char* value = rawValue(kDebug);
    if (value == nullptr) return 0;
    if (strcasecmp(value, "INFO") == 0) return 1;
    if (strcasecmp(value, "TRACE") == 0) return 2;
    return 0;
  }();
  return level;
}

int64_t ringSegmentBytes() {
  static const int64_t bytes = readBytes(kRingSegmentBytes, 256 << 10, 64);
  return bytes;
}

int64_t treeChunkBytes() {
  static const int64_t bytes = readBytes(kTreeChunkBytes, 256 << 10, 64);
  return bytes;
}

int64_t socketBufferBytes() {
  static const int64_t bytes = readBytes(kSocketBufferBytes, 0, 0);
  return bytes;
}

std::string algorithmSpec() {
  const char* value = rawValue(kAlgo);
  return value != nullptr ? value : "";
}

std::string cpuTransport() {
  const char* value = rawValue(kCpuTransport);
  return value == nullptr ? "tcp" : value;
}

bool fingerprintChecks() {
  const char* value = rawValue(kFingerprint);
  if (value == nullptr || std::strcmp(value, "1") == 0) return true;
  if (std::strcmp(value, "0") == 0) return false;
  throw std::invalid_argument(std::string(kFingerprint) + "='" + value + "' is not a valid value; use 1 (the default) or 0");
}

CudaStaging cudaStaging() {
  const char* value = rawValue(kCudaStaging);
  if (value == nullptr) return CudaStaging::kAuto;
  if (strcasecmp(value, "always") == 0) return CudaStaging::kAlways;
  if (strcasecmp(value, "never") == 0) return CudaStaging::kNever;
  return CudaStaging::kAuto;
}

}  // namespace ddplite::env
