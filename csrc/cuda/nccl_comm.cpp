#include "cuda/nccl_comm.hpp"

#include "common/logging.hpp"
#include "cuda/nccl_errors.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

namespace ddplite::nccl {

namespace {

std::string hex(const void* data, size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string text;
  const auto* raw = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    text += digits[raw[i] >> 4];
    text += digits[raw[i] & 15];
  }
  return text;
}

void checkCuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throwDistError(strCat(call, " failed: ", cudaGetErrorString(status)),
                   "check that the GPU is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)");
  }
}

bool multiRankGpuEnabled() {
#if DDPLITE_NCCL_HAS_MULTI_RANK_GPU
  const char* value = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return value != nullptr && std::strcmp(value, "1") == 0;
#else
  return false;
#endif
}

// "uuid|busId|0 or 1": what one rank publishes about its GPU.
std::string encode(const DeviceIdentity& identity) {
  return strCat(identity.uuid, "|", identity.busId, "|", identity.multiRankGpu ? 1 : 0);
}

DeviceIdentity decode(const std::string& text) {
  const size_t first = text.find('|');
  const size_t second = text.find('|', first + 1);
  DDPLITE_ENFORCE(first != std::string::npos && second != std::string::npos, "bad device identity '", text, "'");
  return DeviceIdentity{text.substr(0, first), text.substr(first + 1, second - first - 1), text.substr(second + 1) == "1"};
}

}  // namespace

DeviceIdentity identify(at::Device device) {
  cudaDeviceProp properties{};
  checkCuda(cudaGetDeviceProperties(&properties, device.index()), "cudaGetDeviceProperties");
  char busId[64] = {0};
  checkCuda(cudaDeviceGetPCIBusId(busId, sizeof(busId), device.index()), "cudaDeviceGetPCIBusId");
  return DeviceIdentity{hex(&properties.uuid, sizeof(properties.uuid)), busId, multiRankGpuEnabled()};
}

std::vector<DeviceIdentity> exchangeIdentities(Bootstrap& bootstrap, const std::string& key, int rank, int size,
                                               const DeviceIdentity& mine) {
  std::vector<DeviceIdentity> all;
  all.reserve(size);
  for (int root = 0; root < size; ++root) {
    all.push_back(decode(bootstrap.broadcast(strCat(key, "/rank", root), encode(mine), root)));
  }
  return all;
}

std::string describeSharedGpu(const std::vector<DeviceIdentity>& identities) {
  for (size_t a = 0; a < identities.size(); ++a) {
    for (size_t b = a + 1; b < identities.size(); ++b) {
      if (identities[a].uuid == identities[b].uuid) {
        return strCat("ranks ", a, " and ", b, " are both on GPU ", identities[a].uuid, " (PCI bus ",
                      identities[a].busId, ")");
      }
    }
  }
  return "";
}

std::unique_ptr<NcclComm> NcclComm::create(Bootstrap& bootstrap, const std::string& key, const OpContext& ctx,
                                           at::Device device) {
  checkLoadedVersion(ctx);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (ctx.rank == 0) DDPLITE_NCCL_CHECK(ctx, nullptr, ncclGetUniqueId(&id));
  const std::string blob = bootstrap.broadcast(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)), 0);
  DDPLITE_ENFORCE(blob.size() == sizeof(id), "NCCL unique id of ", blob.size(), " bytes, expected ", sizeof(id));
  std::memcpy(&id, blob.data(), sizeof(id));

  c10::cuda::CUDAGuard guard(device);
  ncclComm_t comm = nullptr;
  DDPLITE_NCCL_CHECK(ctx, nullptr, ncclCommInitRank(&comm, ctx.size, id, ctx.rank));
  DDPLITE_LOG(kInfo, ctx.describe(), ": NCCL communicator ready on ", device, " (", bootstrap.name(), " bootstrap, NCCL ",
              versionText(loadedVersion()), ")");
  return std::unique_ptr<NcclComm>(new NcclComm(comm, device));
}

NcclComm::~NcclComm() {
  std::lock_guard<std::timed_mutex> lock(mutex_);  // no Lease outlives the owner; wait out a late abort()
  if (!aborted_.load() && comm_ != nullptr) {
    ncclCommDestroy(comm_);  // errors at teardown have no one left to report to
  }
}

ncclResult_t NcclComm::asyncError(std::string& detail) {
  std::unique_lock<std::timed_mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || aborted_.load()) return ncclSuccess;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  const ncclResult_t error = result != ncclSuccess ? result : state;
  if (error != ncclSuccess && error != ncclInProgress) detail = describeFailure("ncclCommGetAsyncError", error, comm_);
  return error;
}

NcclComm::Lease::Lease(NcclComm& owner) : owner_(owner), lock_(owner.mutex_) {}

NcclComm::Lease::~Lease() {
  if (owner_.abortRequested_.load()) owner_.abortLocked();
}

void NcclComm::abort() {
  std::unique_lock<std::timed_mutex> lock(mutex_, std::defer_lock);
  if (!lock.try_lock_for(kAbortWait)) {
    // A launch holds the handle (blocked inside NCCL); its Lease aborts on release.
    abortRequested_.store(true);
    if (!lock.try_lock()) return;  // else the holder released it just now: abort here
  }
  abortLocked();
}

void NcclComm::abortLocked() {
  if (aborted_.exchange(true)) return;
  ncclCommAbort(comm_);
}

}  // namespace ddplite::nccl
