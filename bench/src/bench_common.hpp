// Shared pieces of gfd's benchmark programs: flags, the cold source pool, statistics, output.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gfd/types.hpp"

namespace gfd::bench {

// "--name=value" / "--name value" / "--flag" parsing with clear errors for unknown flags.
class Flags {
 public:
  Flags(int argc, char** argv, const std::map<std::string, std::string>& known);
  bool has(const std::string& name) const;
  std::string get(const std::string& name, const std::string& fallback = "") const;
  // The flag's value (or `fallback`) cut at every comma; empty parts are kept.
  std::vector<std::string> get_list(const std::string& name,
                                    const std::string& fallback = "") const;
  long long get_int(const std::string& name, long long fallback) const;
  std::vector<std::size_t> get_sizes(const std::string& name,
                                     const std::vector<std::size_t>& fallback) const;
  static std::string usage(const std::map<std::string, std::string>& known);

 private:
  std::map<std::string, std::string> values_;
};

std::size_t parse_size(const std::string& s);  // 4096, 4K, 2M, 1G
std::string format_size(std::size_t bytes);    // 4K, 2M, 512

struct Percentiles {
  double p50 = 0, p90 = 0, min = 0;
};
Percentiles percentiles(std::vector<double> v);

// Bytes of the last-level cache (sysfs), or 256 MiB when unknown.
std::size_t l3_bytes();

// Fills `bytes` at `data` with random, never-zero 64-bit words, on several threads (the first
// touch of fresh pages, where nothing touched them before).
void fill_random(std::byte* data, std::size_t bytes);

// A large host pool of random bytes (an anonymous mmap), filled by several threads.
struct Pool {
  std::byte* data = nullptr;
  std::size_t bytes = 0;
  explicit Pool(std::size_t bytes);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
};

// Picks n distinct source offsets at a 2x-block stride (no two picked blocks are adjacent)
// from the whole pool: fresh each call when `cold`, the same set each call when warm.
class SourcePicker {
 public:
  // Offsets of blocks at a pitch of `pitch` blocks: random distinct slots, or with `consecutive`
  // (--layout strided: constant-stride runs) n slots in a row from a random start.
  SourcePicker(std::size_t pool_bytes, std::size_t block, std::uint64_t seed, std::size_t pitch = 2,
               bool consecutive = false);
  std::vector<std::size_t> pick(std::size_t n);

 private:
  std::size_t slots_;
  std::size_t stride_;
  std::uint64_t state_;
  bool consecutive_;
};

double process_cpu_seconds();

// Microseconds from `t0` to now (steady clock).
double since_us(std::chrono::steady_clock::time_point t0);

// The backends named by --backends=a,b,... (every backend when the flag is absent); throws
// gfd::Error for an unknown name.
std::vector<gfd::Backend> backends_flag(const Flags& flags);

}  // namespace gfd::bench
