// gfd_benchmark --layout pool and --layout strided: their flags, read in one place into
// PoolOptions, and their cases.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gfd/gfd.hpp"
#include "source_pool.hpp"

namespace gfd::bench::pool {

// One case of the grid: `blocks` blocks of `block_size` bytes per transfer.
struct Case {
  std::size_t blocks, block_size;
};

// The default grid: a block-count sweep at 4 KB, then a block-size sweep at 2048 blocks (fewer
// for the largest sizes: at most 256 MB a transfer).
inline constexpr Case kDefaultCases[] = {{16, 4 << 10},    {64, 4 << 10},    {256, 4 << 10},
                                         {1024, 4 << 10},  {2048, 4 << 10},  {4096, 4 << 10},
                                         {16384, 4 << 10}, {2048, 512},      {2048, 1 << 10},
                                         {2048, 16 << 10}, {2048, 64 << 10}, {1024, 256 << 10}};
// --quick: one case.
inline constexpr Case kQuickCase{2048, 4 << 10};
// --under-load measures one case: this one, or the first of a grid given by flags.
inline constexpr Case kLoadCase{2048, 4 << 10};

// The --under-load modes, in the order they run, and each one's `load` label in the rows ("sm"
// is the high-priority mode; bench/plot_results.py and bench/summarize.py read these labels).
struct LoadMode {
  const char* name;
  const char* label;
};
inline constexpr LoadMode kLoadModes[] = {
    {"high", "sm"}, {"equal", "sm-equal"}, {"short", "sm-short"}};

struct PoolOptions {
  bool strided = false;  // --layout strided: each transfer's blocks in a row at --pitch
  std::size_t pitch = 2, batch = 1;
  int iters = 30, warmup = 5, device = 0;
  bool warm = false, trace = false, to_host = false, pageable = false, host_load_probe = false;
  std::string dst = "contiguous";  // contiguous, scattered or both
  std::vector<Backend> backends;
  std::vector<PoolKind> pools;
  std::vector<LoadMode> load_modes;  // empty: no --under-load
  bool under_load = false;
  std::vector<Case> cases;
  bool cases_from_flags = false;  // --blocks or --block-sizes
  std::optional<std::size_t> pool_bytes;
  std::string csv, json;
};

// Reads argv's flags for `layout` (pool or strided). Returns nullopt after printing the usage
// for --help; throws std::invalid_argument naming the flag for a bad value.
std::optional<PoolOptions> parse_pool_flags(int argc, char** argv, const std::string& layout);

}  // namespace gfd::bench::pool
