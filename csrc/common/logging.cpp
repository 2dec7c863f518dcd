#include "common/logging.hpp"

#include <unistd.h>

#include <cstdio>

namespace ddplite::log {

void write(Level level, const std::string& message) {
  static const char* names[] = {"WARN", "INFO", "TRACE"};
  // One fprintf per line keeps lines from different threads whole.
  std::fprintf(stderr, "[ddplite %d] %s %s\n", static_cast<int>(getpid()), names[level], message.c_str());
}

}  // namespace ddplite::log
