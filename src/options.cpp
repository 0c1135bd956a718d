#include <cerrno>
#include <climits>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <numa.h>

#include "env.hpp"
#include "gfd/error.hpp"
#include "gfd/options.hpp"
#include "host/topology.hpp"

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
// The one boolean parser of every GFD_* variable (env.hpp).
void env_bool(const char* name, bool& field) { field = detail::env_flag(name, field); }

void env_size(const char* name, std::size_t& field) {
  if (const char* v = std::getenv(name)) field = parse_size(name, v);
}

void env_cpus(const char* name, std::string& field) {
  if (const char* v = std::getenv(name)) {
    try {
      (void)detail::parse_cpulist(v);
    } catch (const Error&) {
      bad_env(name, v, "a CPU list such as 0-7,16");
    }
    field = v;
  }
}

}  // namespace

EngineOptions EngineOptions::from_env(EngineOptions o) {
  env_int("GFD_DEVICE", o.device);
  env_size("GFD_STAGING_BYTES", o.staging_bytes);
  env_size("GFD_SLOT_BYTES", o.slot_bytes);
  env_size("GFD_CHUNK_BYTES_TO_HOST", o.chunk_bytes_to_host);
  env_size("GFD_FIRST_CHUNK_BYTES", o.first_chunk_bytes);
  env_size("GFD_PIECE_BYTES", o.piece_bytes);
  env_size("GFD_DIRECT_MIN_BYTES", o.direct_min_bytes);
  env_size("GFD_DIRECT_MIN_BYTES_TO_HOST", o.direct_min_bytes_to_host);
  env_size("GFD_DIRECT_SPLIT_MIN_BYTES", o.direct_split_min_bytes);
  env_int("GFD_DIRECT_SPLIT_PERCENT", o.direct_split_percent);
  env_size("GFD_STRIDED_MIN_ROWS", o.strided_min_rows);
  env_size("GFD_STRIDED_MIN_BYTES", o.strided_min_bytes);
  env_bool("GFD_HOST_DIRECT", o.host_direct);
  env_bool("GFD_PLAN_FROM_IDS", o.plan_from_ids);
  env_cpus("GFD_CPUS", o.cpus);
  env_size("GFD_INLINE_GATHER_BYTES", o.inline_gather_bytes);
  env_int("GFD_GATHER_THREADS", o.gather_threads);
  env_int("GFD_COPY_STREAMS", o.copy_streams);
  env_int("GFD_NUMA_NODE", o.numa_node);
  env_int("GFD_SPIN_US", o.spin_us);
  env_bool("GFD_CHECK_OVERLAPS", o.check_overlaps);
  env_bool("GFD_SUBMITTER_GATHERS", o.submitter_gathers);
  env_bool("GFD_USE_ALL_LOCAL_CPUS", o.use_all_local_cpus);
  if (const char* v = std::getenv("GFD_STAGING_WRITES")) {
    try {
      o.staging_writes = staging_writes_from_string(v);
    } catch (const Error&) {
      bad_env("GFD_STAGING_WRITES", v, "auto, cldemote, streaming or plain");
    }
  }
  env_bool("GFD_PREISSUE", o.preissue);
  env_bool("GFD_BATCH_PLACEMENT", o.batch_placement);
  env_bool("GFD_DEFER_SLOT_WAITS", o.defer_slot_waits);
  env_bool("GFD_BATCH_PACKING", o.batch_packing);
  env_int("GFD_PLACEMENT_CHUNKS", o.placement_chunks);
  env_int("GFD_PLACEMENT_BLOCKS", o.placement_blocks);
  env_bool("GFD_TIME_DMAS", o.time_dmas);
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

namespace {
[[noreturn]] void bad_option(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "EngineOptions::" + msg);
}
template <class T>
std::string str(T v) {
  return std::to_string(v);
}
constexpr int kMaxCopyStreams = 16;
}  // namespace

void EngineOptions::validate() const {
  if (device < 0) bad_option("device: " + str(device) + " is negative");
  if (copy_streams < 1 || copy_streams > kMaxCopyStreams)
    bad_option("copy_streams: " + str(copy_streams) + " is outside 1.." + str(kMaxCopyStreams));
  if (slot_bytes < 4096) bad_option("slot_bytes: " + str(slot_bytes) + " is below 4096");
  if (slot_bytes % 16 != 0) bad_option("slot_bytes: " + str(slot_bytes) + " is not a multiple of 16");
  if (staging_bytes / slot_bytes < 2)
    bad_option("staging_bytes: " + str(staging_bytes) + " must hold at least two slots of slot_bytes " +
               str(slot_bytes) + " so that gathering and DMA overlap");
  if (staging_bytes / slot_bytes > 65536)
    bad_option("staging_bytes: " + str(staging_bytes / slot_bytes) + " slots is more than 65536; use larger slots");
  if (piece_bytes < 256) bad_option("piece_bytes: " + str(piece_bytes) + " is below 256");
  if (slot_bytes / piece_bytes > 32768)
    bad_option("piece_bytes: " + str(piece_bytes) + " cuts a slot of " + str(slot_bytes) +
               " bytes into more than 32768 pieces");
  if (chunk_bytes_to_host != 0 && (chunk_bytes_to_host < 4096 || chunk_bytes_to_host > slot_bytes ||
                                   chunk_bytes_to_host % 16 != 0))
    bad_option("chunk_bytes_to_host: " + str(chunk_bytes_to_host) + " must be 0 or a multiple of 16 from 4096 to " +
               "slot_bytes " + str(slot_bytes));
  if (placement_chunks < 1 || placement_chunks > 32)
    bad_option("placement_chunks: " + str(placement_chunks) + " is outside 1..32");
  if (placement_blocks < 1 || placement_blocks > 32)
    bad_option("placement_blocks: " + str(placement_blocks) + " is outside 1..32");
  if (first_chunk_bytes < 4096) bad_option("first_chunk_bytes: " + str(first_chunk_bytes) + " is below 4096");
  if (spin_us < 0) bad_option("spin_us: " + str(spin_us) + " is negative");
  if (direct_split_percent < 0 || direct_split_percent > 100)
    bad_option("direct_split_percent: " + str(direct_split_percent) + " is outside 0..100");
  if (pageable_cache_ms < 0 || pageable_cache_ms > 3600000)
    bad_option("pageable_cache_ms: " + str(pageable_cache_ms) + " is outside 0..3600000 (an hour)");
  if (numa_node < -2) bad_option("numa_node: " + str(numa_node) + " is below -2");
  if (numa_node >= 0 && (numa_available() < 0 || numa_node > numa_max_node()))
    bad_option("numa_node: " + str(numa_node) + " does not exist on this machine");
  if (gather_threads < 0) bad_option("gather_threads: " + str(gather_threads) + " is negative");
  const std::vector<int> allowed = detail::allowed_cpus();
  if (!cpus.empty()) {
    std::vector<int> list;
    try {
      list = detail::parse_cpulist(cpus);
    } catch (const Error& e) {
      bad_option("cpus: '" + cpus + "' is not a CPU list such as 0-7,16 (" + e.what() + ")");
    }
    if (list.empty()) bad_option("cpus: '" + cpus + "' names no CPU");
    for (int c : list)
      if (!std::binary_search(allowed.begin(), allowed.end(), c))
        bad_option("cpus: CPU " + str(c) + " is not one this process may run on (" + detail::format_cpulist(allowed) +
                   ")");
  }
  const auto ncpu = static_cast<long long>(allowed.size());
  if (gather_threads > ncpu)
    bad_option("gather_threads: " + str(gather_threads) + " is more than the " + str(ncpu) +
               " CPUs this process may use");
}

}  // namespace gfd
