#include "common/errors.hpp"

namespace ddplite {

std::string OpContext::describe() const {
  return strCat("ddplite rank ", rank, "/", size, ", ", op, " #", seq);
}

namespace {
std::string compose(const std::string& prefix, const std::string& what, const std::string& hint) {
  std::string msg = prefix.empty() ? what : prefix + ": " + what;
  if (!hint.empty()) {
    msg += "\nHint: " + hint;
  }
  return msg;
}
}  // namespace

void throwValueError(const OpContext& ctx, const std::string& what, const std::string& hint) {
  C10_THROW_ERROR(ValueError, compose(ctx.describe(), what, hint));
}

void throwDistError(const OpContext& ctx, const std::string& what, const std::string& hint) {
  C10_THROW_ERROR(DistBackendError, compose(ctx.describe(), what, hint));
}

void throwDistError(const std::string& what, const std::string& hint) {
  C10_THROW_ERROR(DistBackendError, compose("ddplite", what, hint));
}

void throwRuntimeError(const std::string& what, const std::string& hint) {
  C10_THROW_ERROR(Error, compose("ddplite", what, hint));
}

void throwRuntimeError(const OpContext& ctx, const std::string& what, const std::string& hint) {
  C10_THROW_ERROR(Error, compose(ctx.describe(), what, hint));
}

}  // namespace ddplite
