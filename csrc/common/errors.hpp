// Errors raised by ddplite, in two tiers (as in gloo's docs/errors.md):
//   * DDPLITE_ENFORCE: an internal invariant broke. It is a bug in ddplite; the message names
//     the file and line.
//   * throwValueError / throwDistError: the user's input is wrong (ValueError) or the job failed
//     at run time (torch.distributed.DistBackendError). Every message starts with the op context
//     ("ddplite rank 1/4, allreduce #12") and ends with a hint, so a log line alone says who
//     failed, in which collective, and what to try.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <sstream>
#include <string>

namespace ddplite {

// Who is running which collective: the prefix of every user-facing message.
struct OpContext {
  int rank = -1;
  int size = -1;
  const char* op = "";
  uint64_t seq = 0;

  std::string describe() const;
};

template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

// Raised on the caller's thread for bad arguments; Python sees ValueError.
[[noreturn]] void throwValueError(const OpContext& ctx, const std::string& what, const std::string& hint);

// Raised for run-time failures (peer gone, timeout, aborted group); Python sees
// torch.distributed.DistBackendError.
[[noreturn]] void throwDistError(const OpContext& ctx, const std::string& what, const std::string& hint);

// A run-time failure without op context (set-up, rendezvous).
[[noreturn]] void throwDistError(const std::string& what, const std::string& hint);

// A feature missing from this build (MPI, NCCL): Python sees RuntimeError.
[[noreturn]] void throwRuntimeError(const std::string& what, const std::string& hint);
// A call this op does not serve in its present state (RuntimeError), with the op's context.
[[noreturn]] void throwRuntimeError(const OpContext& ctx, const std::string& what, const std::string& hint);

}  // namespace ddplite

#define DDPLITE_ENFORCE(cond, ...)                                                              \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      TORCH_INTERNAL_ASSERT(false, "ddplite internal error: ", #cond, " failed: ",              \
                            ::ddplite::strCat(__VA_ARGS__),                                     \
                            " (please report this at the torch-ddp-lite issue tracker)");       \
    }                                                                                           \
  } while (0)
