#include "common/env.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "gfd/error.hpp"

namespace gfd::detail {

bool env_flag(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  const std::string_view s = v;
  if (s == "1" || s == "true" || s == "on") return true;
  if (s == "0" || s == "false" || s == "off") return false;
  throw Error(ErrorCode::kInvalidArgument, std::string("environment variable ") + name + "='" +
                                               std::string(s) +
                                               "': expected 1, true or on, or 0, false or off");
}

void log_info(const std::string& msg) noexcept {
  // One fprintf per line: lines of engines created on several threads do not interleave.
  try {
    if (env_flag("GFD_QUIET", false)) return;
    std::fprintf(stderr, "gfd: %s\n", msg.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "gfd: %s (not silenced: %s)\n", msg.c_str(), e.what());
  } catch (...) {
    // Out of memory for the message: nothing to say it with.
  }
}

}  // namespace gfd::detail
