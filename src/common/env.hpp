// GFD_* environment variables that are not engine options: the parsing of a boolean shared by
// all of them, and the one line the library writes on its own (GFD_QUIET silences it).
#pragma once

#include <string>

namespace gfd::detail {

// The boolean environment variable `name`: `fallback` when it is not set; true for "1", "true"
// or "on", false for "0", "false" or "off" (exactly what every GFD_* boolean accepts); anything
// else, the empty string included, throws gfd::Error(kInvalidArgument) naming the variable and
// its value.
bool env_flag(const char* name, bool fallback);

// Writes "gfd: <msg>" as one line on stderr, unless GFD_QUIET is true (as env_flag reads it).
// Never throws: a malformed GFD_QUIET does not silence the line, which then says so.
void log_info(const std::string& msg) noexcept;

}  // namespace gfd::detail
