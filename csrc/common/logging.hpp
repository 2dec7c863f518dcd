// Levelled logging on stderr, controlled by DDPLITE_DEBUG (WARN by default, INFO, TRACE).
// Each line starts with "[ddplite <pid>]" so interleaved rank logs stay readable.
#pragma once

#include "common/env.hpp"
#include "common/errors.hpp"

#include <string>

namespace ddplite::log {

enum Level { kWarn = 0, kInfo = 1, kTrace = 2 };

void write(Level level, const std::string& message);

inline bool enabled(Level level) {
  return env::logLevel() >= level;
}

}  // namespace ddplite::log

#define DDPLITE_LOG(level, ...)                                                 \
  do {                                                                          \
    if (::ddplite::log::enabled(::ddplite::log::level)) {                       \
      ::ddplite::log::write(::ddplite::log::level, ::ddplite::strCat(__VA_ARGS__)); \
    }                                                                           \
  } while (0)
