// gfd_benchmark --layout paged: its flags, read in one place into PagedOptions, and its cases.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "paged_types.hpp"

namespace gfd::bench::paged {

// One case of the grid: `blocks` ids of `block_size` bytes per transfer; `under_load`: also
// measured beside the decode load (with --under-load).
struct Case {
  std::size_t block_size, blocks;
  bool under_load;
};

// The default grid: a block-size sweep at 64 blocks, then a block-count sweep at 4 KB. Beside
// the load it measures one mid-sized block and one long transfer; a grid given by flags is
// measured beside the load at every point.
inline constexpr Case kDefaultCases[] = {
    {2 << 10, 64, false}, {4 << 10, 64, false},  {8 << 10, 64, false},   {16 << 10, 64, false},
    {32 << 10, 64, true}, {64 << 10, 64, false}, {256 << 10, 64, false}, {2 << 20, 64, false},
    {4 << 10, 16, false}, {4 << 10, 256, false}, {4 << 10, 1024, true},  {4 << 10, 4096, false}};
// --quick: one case.
inline constexpr Case kQuickCase{4 << 10, 64, true};

struct PagedOptions {
  int layers = 32;
  std::size_t tensors = 64;     // 2 x layers: every layer's K and V
  std::vector<bool> to_host;    // the directions, in order: loads (false) before stores
  std::vector<Method> methods;  // besides the contiguous DMA
  std::vector<Case> cases;
  bool under_load = false, warm = false, trace = false;
  int iters = 20, warmup = 3, device = 0;
  // Unset: the defaults, which differ without a GPU (see the flags' help).
  std::optional<std::size_t> host_cache_bytes, device_cache_bytes, max_transfer;
  std::string csv;  // --csv's file, or empty
};

// Reads argv's flags. Returns nullopt after printing the usage for --help; throws
// std::invalid_argument naming the flag for a bad value.
std::optional<PagedOptions> parse_paged_flags(int argc, char** argv);

}  // namespace gfd::bench::paged
