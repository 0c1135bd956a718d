#include "gfd/options.hpp"

#include <numa.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/tuning.hpp"
#include "engine/option_table.hpp"
#include "gfd/error.hpp"
#include "host/topology.hpp"

namespace gfd {
namespace {

// A value that does not parse: what was expected, for the caller to put in its message.
struct BadValue {
  const char* expected;
};

// One parser and one formatter per kind of value (the kinds of option_table.hpp).
namespace option_kinds {
struct Int {
  static constexpr const char* kValues = "integer";
  static void parse(const std::string& v, int& field) {
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (errno != 0 || end == v.c_str() || *end != '\0') throw BadValue{"an integer"};
    if (x < INT_MIN || x > INT_MAX) throw BadValue{"an integer that fits in an int"};
    field = static_cast<int>(x);
  }
  static std::string format(int v) { return std::to_string(v); }
};

struct Size {
  static constexpr const char* kValues = "size (K, M, G suffixes)";
  static void parse(const std::string& v, std::size_t& field) {
    constexpr const char* kWant = "a size such as 65536, 64K, 2M or 1G";
    char* end = nullptr;
    errno = 0;
    // strtoull skips blanks and takes a minus sign: a size has neither.
    const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (errno != 0 || end == v.c_str() || v.find('-') != std::string::npos) throw BadValue{kWant};
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
      shift = 10;
    else if (*end == 'M' || *end == 'm')
      shift = 20;
    else if (*end == 'G' || *end == 'g')
      shift = 30;
    if (shift != 0) ++end;
    if (*end != '\0' || (shift != 0 && x > (~0ull >> shift))) throw BadValue{kWant};
    field = static_cast<std::size_t>(x << shift);
  }
  static std::string format(std::size_t v) {
    for (const auto& [shift, suffix] : {std::pair{30, "G"}, std::pair{20, "M"}, std::pair{10, "K"}})
      if (v != 0 && v % (std::size_t{1} << shift) == 0) return std::to_string(v >> shift) + suffix;
    return std::to_string(v);
  }
};

struct Count {
  static constexpr const char* kValues = "integer >= 0";
  static void parse(const std::string& v, std::size_t& field) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
    if (errno != 0 || end == v.c_str() || *end != '\0' || v.find('-') != std::string::npos)
      throw BadValue{"an integer >= 0"};
    field = static_cast<std::size_t>(x);
  }
  static std::string format(std::size_t v) { return std::to_string(v); }
};

struct Flag {
  static constexpr const char* kValues = "boolean";
  static void parse(const std::string& v, bool& field) {
    if (v == "1" || v == "true" || v == "on")
      field = true;
    else if (v == "0" || v == "false" || v == "off")
      field = false;
    else
      throw BadValue{"1, true or on, or 0, false or off"};
  }
  static std::string format(bool v) { return v ? "true" : "false"; }
};

struct Cpus {
  static constexpr const char* kValues = "CPU list";
  static void parse(const std::string& v, std::string& field) {
    try {
      (void)detail::parse_cpulist(v);
    } catch (const Error&) {
      throw BadValue{"a CPU list such as 0-7,16"};
    }
    field = v;
  }
  static std::string format(const std::string& v) { return v; }
};

struct Writes {
  static constexpr const char* kValues = "auto, cldemote, streaming, plain";
  static void parse(const std::string& v, StagingWrites& field) {
    try {
      field = staging_writes_from_string(v);
    } catch (const Error&) {
      throw BadValue{"auto, cldemote, streaming or plain"};
    }
  }
  static std::string format(StagingWrites v) { return to_string(v); }
};

struct BackendName {
  static constexpr const char* kValues = "gather, batch_async, per_block, zero_copy_kernel";
  static void parse(const std::string& v, Backend& field) {
    try {
      field = backend_from_string(v);
    } catch (const Error&) {
      throw BadValue{"gather, batch_async, per_block or zero_copy_kernel"};
    }
  }
  static std::string format(Backend v) { return to_string(v); }
};
}  // namespace option_kinds

// Parses `value` into option `name` of `o`; false when there is no such option. Throws BadValue.
bool parse_option(EngineOptions& o, std::string_view name, const std::string& value) {
#define GFD_PARSE(field, kind, variable, doc)  \
  if (name == #field) {                        \
    option_kinds::kind::parse(value, o.field); \
    return true;                               \
  }
  GFD_ENGINE_OPTIONS(GFD_PARSE)
#undef GFD_PARSE
  return false;
}

}  // namespace

std::span<const detail::OptionInfo> detail::option_table() {
#define GFD_INFO(field, kind, variable, doc) {#field, variable, option_kinds::kind::kValues, doc},
  static constexpr OptionInfo kTable[] = {GFD_ENGINE_OPTIONS(GFD_INFO)};
#undef GFD_INFO
  return kTable;
}

EngineOptions EngineOptions::from_env(EngineOptions o) {
  for (const detail::OptionInfo& opt : detail::option_table()) {
    const char* v = std::getenv(opt.variable);
    if (v == nullptr) continue;
    try {
      (void)parse_option(o, opt.name, v);
    } catch (const BadValue& bad) {
      throw Error(ErrorCode::kInvalidArgument, std::string("environment variable ") + opt.variable +
                                                   "='" + v + "': expected " + bad.expected);
    }
  }
  return o;
}

bool EngineOptions::set(std::string_view name, std::string_view value) {
  try {
    return parse_option(*this, name, std::string(value));
  } catch (const BadValue& bad) {
    throw Error(ErrorCode::kInvalidArgument, "EngineOptions::" + std::string(name) + ": '" +
                                                 std::string(value) + "': expected " +
                                                 bad.expected);
  }
}

std::string EngineOptions::get(std::string_view name) const {
#define GFD_FORMAT(field, kind, variable, doc) \
  if (name == #field) return option_kinds::kind::format(field);
  GFD_ENGINE_OPTIONS(GFD_FORMAT)
#undef GFD_FORMAT
  throw Error(ErrorCode::kInvalidArgument,
              "EngineOptions: no option named '" + std::string(name) + "'");
}

std::vector<std::string> EngineOptions::names() {
  std::vector<std::string> out;
  for (const detail::OptionInfo& opt : detail::option_table()) out.emplace_back(opt.name);
  return out;
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
  if (slot_bytes % 16 != 0)
    bad_option("slot_bytes: " + str(slot_bytes) + " is not a multiple of 16");
  if (staging_bytes / slot_bytes < 2)
    bad_option("staging_bytes: " + str(staging_bytes) +
               " must hold at least two slots of slot_bytes " + str(slot_bytes) +
               " so that gathering and DMA overlap");
  if (staging_bytes / slot_bytes > 65536)
    bad_option("staging_bytes: " + str(staging_bytes / slot_bytes) +
               " slots is more than 65536; use larger slots");
  if (piece_bytes < 256) bad_option("piece_bytes: " + str(piece_bytes) + " is below 256");
  if (slot_bytes / piece_bytes > 32768)
    bad_option("piece_bytes: " + str(piece_bytes) + " cuts a slot of " + str(slot_bytes) +
               " bytes into more than 32768 pieces");
  if (chunk_bytes_to_host != 0 && (chunk_bytes_to_host < 4096 || chunk_bytes_to_host > slot_bytes ||
                                   chunk_bytes_to_host % 16 != 0))
    bad_option("chunk_bytes_to_host: " + str(chunk_bytes_to_host) +
               " must be 0 or a multiple of 16 from 4096 to " + "slot_bytes " + str(slot_bytes));
  if (first_chunk_bytes < 4096)
    bad_option("first_chunk_bytes: " + str(first_chunk_bytes) + " is below 4096");
  if (spin_us < 0) bad_option("spin_us: " + str(spin_us) + " is negative");
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
        bad_option("cpus: CPU " + str(c) + " is not one this process may run on (" +
                   detail::format_cpulist(allowed) + ")");
  }
  const auto ncpu = static_cast<long long>(allowed.size());
  if (gather_threads > ncpu)
    bad_option("gather_threads: " + str(gather_threads) + " is more than the " + str(ncpu) +
               " CPUs this process may use");
}

void detail::Tuning::validate() const {
  const auto bad = [](const std::string& msg) {
    throw Error(ErrorCode::kInvalidArgument, "Tuning::" + msg);
  };
  if (placement_chunks < 1 || placement_chunks > 32)
    bad("placement_chunks: " + str(placement_chunks) + " is outside 1..32");
  if (placement_blocks < 1 || placement_blocks > 32)
    bad("placement_blocks: " + str(placement_blocks) + " is outside 1..32");
}

}  // namespace gfd
