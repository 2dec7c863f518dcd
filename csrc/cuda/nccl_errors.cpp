#include "cuda/nccl_errors.hpp"

namespace ddplite::nccl {

namespace {

const char* resultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "unknown ncclResult_t";
  }
}

}  // namespace

Version loadedVersion() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return Version{};
  return decodeVersion(code);
}

std::string versionText(const Version& version) {
  return strCat(version.major, ".", version.minor, ".", version.patch);
}

void checkLoadedVersion(const OpContext& ctx) {
  const Version loaded = loadedVersion();
  const Version compiled = compiledVersion();
  if (!loadedCanServeCompiled(loaded, compiled)) {
    throwDistError(ctx,
                   strCat("ddplite was compiled against NCCL ", versionText(compiled), " but this process loaded NCCL ",
                          versionText(loaded), ", which cannot serve it (", loaded.major != compiled.major
                              ? "different major version" : "older than the header", ")"),
                   "rebuild ddplite against the NCCL torch loads (pip install --no-build-isolation --no-deps -e ., "
                   "or set DDPLITE_NCCL_HOME), and make sure only one nvidia-nccl wheel is installed "
                   "(python -m torch_ddp_lite.collect_env shows both versions)");
  }
}

const char* hintFor(ncclResult_t result) {
  switch (result) {
    case ncclUnhandledCudaError:
      return "a CUDA call inside NCCL failed: look for an earlier CUDA error (out of memory, a faulting kernel) and "
             "rerun with NCCL_DEBUG=INFO";
    case ncclSystemError:
      return "a system call failed: in containers give /dev/shm enough room (docker --ipc=host or --shm-size), "
             "check the network interface (NCCL_SOCKET_IFNAME) and rerun with NCCL_DEBUG=INFO";
    case ncclInternalError:
      return "NCCL hit an internal error, often a network problem in disguise: rerun with NCCL_DEBUG=INFO";
    case ncclInvalidArgument:
      return "NCCL rejected an argument (dtype, count or pointer): this is probably a ddplite bug, please report it "
             "with NCCL_DEBUG=INFO output";
    case ncclInvalidUsage:
      return "usually two ranks on one GPU or a mismatched collective: call torch.cuda.set_device(local_rank) in "
             "every rank and check CUDA_VISIBLE_DEVICES";
    case ncclRemoteError:
      return "a peer rank failed or exited: its own log shows the first error";
    default:
      return "rerun with NCCL_DEBUG=INFO for NCCL's own explanation";
  }
}

std::string describeFailure(const char* call, ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return strCat(call, ": ", ncclGetErrorString(result), " (", resultName(result), ", ", static_cast<int>(result), ")",
                (last != nullptr && last[0] != '\0') ? strCat("; NCCL says: ", last) : std::string(),
                "; NCCL ", versionText(compiledVersion()), " compiled, ", versionText(loadedVersion()), " loaded");
}

void check(const OpContext& ctx, const char* call, ncclResult_t result, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  throwDistError(ctx, describeFailure(call, result, comm), hintFor(result));
}

}  // namespace ddplite::nccl
