// NCCL failures as DistBackendError, and the compiled/loaded version check.
//
// Every message names rank, op and sequence number (OpContext), the NCCL call, its result code,
// ncclGetErrorString, ncclGetLastError(comm) and both NCCL versions, and ends with a hint chosen
// by the error class (system error -> /dev/shm and interfaces, invalid usage -> two ranks on one
// GPU, remote error -> a peer failed, ...). Callable from any thread.
#pragma once

#include "common/errors.hpp"
#include "cuda/nccl_compat.hpp"

#include <chrono>
#include <functional>
#include <string>

namespace ddplite::nccl {

// ncclGetVersion() of the libnccl.so.2 this process loaded (torch's; see setup.py).
Version loadedVersion();
std::string versionText(const Version& version);

// Throws DistBackendError when the loaded NCCL cannot serve this build (other major version, or
// older than the header ddplite was compiled against). Called before the first communicator.
void checkLoadedVersion(const OpContext& ctx);

// What went wrong, for messages: "ncclAllReduce: unhandled system error (ncclSystemError, 2):
// <ncclGetLastError>; NCCL 2.28.9 compiled, 2.28.9 loaded". `comm` may be null.
std::string describeFailure(const char* call, ncclResult_t result, ncclComm_t comm);
const char* hintFor(ncclResult_t result);

// Throws DistBackendError for anything but ncclSuccess (and ncclInProgress).
void check(const OpContext& ctx, const char* call, ncclResult_t result, ncclComm_t comm);

// A nonblocking communicator's set-up or operation still running (`call` returned ncclInProgress):
// polls ncclCommGetAsyncError (rules::pollWhileInProgress) until it settles or `deadline`.
// DistBackendError when it fails, the deadline passes, or `cancelled()` says an abort was
// requested meanwhile; the caller then aborts the communicator. Any thread; the caller holds the
// communicator's Lease (or owns it during set-up).
void waitWhileInProgress(const OpContext& ctx, const char* call, ncclComm_t comm,
                         std::chrono::steady_clock::time_point deadline, const std::function<bool()>& cancelled = {});

}  // namespace ddplite::nccl

// Calls an NCCL function and raises a DistBackendError naming the call if it fails.
#define DDPLITE_NCCL_CHECK(ctx, comm, call) ::ddplite::nccl::check((ctx), #call, (call), (comm))
