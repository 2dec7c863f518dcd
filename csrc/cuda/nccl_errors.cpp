#include "cuda/nccl_errors.hpp"

#include <thread>

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

void waitWhileInProgress(const OpContext& ctx, const char* call, ncclComm_t comm,
                         std::chrono::steady_clock::time_point deadline, const std::function<bool()>& cancelled) {
  const auto started = std::chrono::steady_clock::now();
  const rules::PollResult result = rules::pollWhileInProgress(
      [comm] {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t asked = ncclCommGetAsyncError(comm, &state);
        return static_cast<int>(asked != ncclSuccess ? asked : state);
      },
      ncclInProgress, ncclSuccess, [] { return std::chrono::steady_clock::now(); }, deadline,
      [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); }, cancelled);
  if (result.outcome == rules::PollOutcome::kDone) return;
  if (result.outcome == rules::PollOutcome::kCancelled) {
    throwDistError(ctx, strCat("the communicator was aborted while ", call, " was still in progress"),
                   "the group failed or abort() was called; the first error names the cause");
  }
  if (result.outcome == rules::PollOutcome::kFailed) {
    const auto code = static_cast<ncclResult_t>(result.lastCode);
    throwDistError(ctx, describeFailure(call, code, comm), hintFor(code));
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  throwDistError(ctx,
                 strCat("Timed out after ", waited.count(), " ms waiting for ", call,
                        " to finish: NCCL was still setting up or connecting (ncclInProgress) when the op's timeout "
                        "ran out"),
                 "a rank did not reach this set-up or collective: check that every rank is alive and issued the same "
                 "ops, and that the GPUs can reach each other (NCCL_DEBUG=INFO); raise "
                 "init_process_group(timeout=...) if set-up is just slow");
}

void check(const OpContext& ctx, const char* call, ncclResult_t result, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  throwDistError(ctx, describeFailure(call, result, comm), hintFor(result));
}

}  // namespace ddplite::nccl
