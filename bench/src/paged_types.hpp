// The vocabulary of gfd_benchmark --layout paged: the methods it compares, one grid point, one
// result row and the block ids of one repetition.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace gfd::bench::paged {

enum class Method {
  kDma,
  kGfd,
  kGfdZeroCopy,
  kBatch,
  kPerBlock,
  kUva2,
  kUva12,
  kGatherOnly,  // a stage of gfd alone: its gather threads' copies (no GPU work)
  kPlaceOnly,   // a stage of gfd alone: its placing (packing) kernel (no host side, no DMA)
};

// Each method's name in --methods and in the rows; kMethods[0], the contiguous DMA, is always
// measured (the reference), the others as --methods says (gfd's stages only when named).
struct MethodName {
  Method method;
  const char* name;
};
inline constexpr MethodName kMethods[] = {{Method::kDma, "dma_contiguous"},
                                          {Method::kGfd, "gfd"},
                                          {Method::kGfdZeroCopy, "gfd_zero_copy"},
                                          {Method::kBatch, "batch"},
                                          {Method::kPerBlock, "per_block"},
                                          {Method::kUva2, "uva2"},
                                          {Method::kUva12, "uva12"},
                                          {Method::kGatherOnly, "gather_only"},
                                          {Method::kPlaceOnly, "place_only"}};

inline bool is_stage(Method m) { return m == Method::kGatherOnly || m == Method::kPlaceOnly; }

inline const char* method_name(Method m) {
  for (const MethodName& n : kMethods)
    if (n.method == m) return n.name;
  return "?";
}

// One grid point: blocks of `size` bytes, `n` per transfer (after the caps; `requested` before),
// how many blocks each host and each device cache holds at that size, and whether the point is
// also measured beside the decode load.
struct Config {
  std::size_t size = 0, n = 0, requested = 0, host_blocks = 0, gpu_blocks = 0;
  bool under_load = false;
};

struct Row {
  std::string direction, method, load = "none";
  std::size_t size = 0, n = 0, bytes = 0, host_blocks = 0, gpu_blocks = 0, reps = 0;
  Percentiles us;
  double submit_us = 0, ref_gbps = 0;
  double kept = -1;      // under load: P50 GB/s / the same method's idle P50; -1: none
  double slowdown = -1;  // under load: mean matmul time during the transfers / alone - 1
  int verified = -1;     // 1 yes, 0 failed, -1 not checked (the contiguous DMA)
  double p50_gbps() const { return us.p50 > 0 ? bytes / (us.p50 * 1e3) : 0; }
  double p90_gbps() const { return us.p90 > 0 ? bytes / (us.p90 * 1e3) : 0; }  // the slow tail
};

// Block ids of one repetition: a swap-in moves host block host[i] to device block device[i] of
// every pair, a swap-out device block device[i] to host block host[i].
struct Ids {
  std::vector<std::int64_t> host, device;
};

}  // namespace gfd::bench::paged
