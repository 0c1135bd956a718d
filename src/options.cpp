#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "gfd/error.hpp"
#include "gfd/options.hpp"

namespace gfd {
namespace {

[[noreturn]] void bad_env(const char* name, const char* value, const char* want) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string("environment variable ") + name + "='" + value + "': expected " + want);
}

long long parse_int(const char* name, const char* v) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0') bad_env(name, v, "an integer");
  return x;
}

std::size_t parse_size(const char* name, const char* v) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || std::string(v).find('-') != std::string::npos) bad_env(name, v, "a size such as 65536, 64K, 2M or 1G");
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10;
  else if (*end == 'M' || *end == 'm') shift = 20;
  else if (*end == 'G' || *end == 'g') shift = 30;
  if (shift != 0) ++end;
  if (*end != '\0' || (shift != 0 && x > (~0ull >> shift)))
    bad_env(name, v, "a size such as 65536, 64K, 2M or 1G");
  return static_cast<std::size_t>(x << shift);
}

void env_int(const char* name, int& field) {
  if (const char* v = std::getenv(name)) {
    const long long x = parse_int(name, v);
    if (x < INT_MIN || x > INT_MAX) bad_env(name, v, "an integer that fits in an int");
    field = static_cast<int>(x);
  }
}
void env_bool(const char* name, bool& field) {
  if (const char* v = std::getenv(name)) {
    const std::string s = v;
    if (s == "1" || s == "true" || s == "on") field = true;
    else if (s == "0" || s == "false" || s == "off") field = false;
    else bad_env(name, v, "0 or 1");
  }
}

void env_size(const char* name, std::size_t& field) {
  if (const char* v = std::getenv(name)) field = parse_size(name, v);
}

}  // namespace

EngineOptions EngineOptions::from_env(EngineOptions o) {
  env_int("GFD_DEVICE", o.device);
  env_size("GFD_STAGING_BYTES", o.staging_bytes);
  env_size("GFD_SLOT_BYTES", o.slot_bytes);
  env_size("GFD_FIRST_CHUNK_BYTES", o.first_chunk_bytes);
  env_size("GFD_PIECE_BYTES", o.piece_bytes);
  env_size("GFD_DIRECT_MIN_BYTES", o.direct_min_bytes);
  env_size("GFD_INLINE_GATHER_BYTES", o.inline_gather_bytes);
  env_int("GFD_GATHER_THREADS", o.gather_threads);
  env_int("GFD_COPY_STREAMS", o.copy_streams);
  env_int("GFD_NUMA_NODE", o.numa_node);
  env_int("GFD_SPIN_US", o.spin_us);
  env_bool("GFD_CHECK_OVERLAPS", o.check_overlaps);
  env_bool("GFD_SUBMITTER_GATHERS", o.submitter_gathers);
  env_bool("GFD_USE_ALL_LOCAL_CPUS", o.use_all_local_cpus);
  env_bool("GFD_NONTEMPORAL_STORES", o.nontemporal_stores);
  env_bool("GFD_PREISSUE", o.preissue);
  env_size("GFD_KERNEL_MAX_BYTES", o.kernel_max_bytes);
  env_int("GFD_PAGEABLE_CACHE_MS", o.pageable_cache_ms);
  if (const char* v = std::getenv("GFD_BACKEND")) {
    try {
      o.backend = backend_from_string(v);
    } catch (const Error&) {
      bad_env("GFD_BACKEND", v, "gather, batch_async, per_block or zero_copy_kernel");
    }
  }
  return o;
}

}  // namespace gfd
