// The SM-side pieces of gfd_benchmark --layout paged that only it needs: the pattern fill and
// check kernels that verify the device caches without copying them back. (The UVA copy kernel it
// measures as a peer is the test-device facade's, testkit::uva_copy, which gfd.testing shares.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

// pattern_word is shared by host code (g++) and the kernels (nvcc).
#if defined(__CUDACC__)
#define GFD_BENCH_HD __host__ __device__
#else
#define GFD_BENCH_HD
#endif

namespace gfd::bench {

// 64-bit word `word` of a cache tagged `tag` (splitmix64 of both): indexed by the word's place
// in the whole cache, so that one fill serves every block size. Never zero, the poison.
GFD_BENCH_HD inline std::uint64_t pattern_word(std::uint64_t tag, std::uint64_t word) {
  std::uint64_t x = (tag << 40) ^ word ^ 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return x | 1;
}

// Writes pattern_word(tag, first_word + i) to word i of the `words` words at `data` (device).
cudaError_t launch_fill_pattern(std::uint64_t* data, std::uint64_t words, std::uint64_t first_word,
                                std::uint64_t tag, cudaStream_t stream);

// One block to check: its `words` words at `data` must be pattern_word(tag, first_word + i).
struct PatternCheck {
  const std::uint64_t* data = nullptr;
  std::uint64_t words = 0;
  std::uint64_t first_word = 0;
  std::uint64_t tag = 0;
};

// Adds to `*mismatches` (device memory) the words of each of `count` checks (device memory)
// that differ from the pattern.
cudaError_t launch_check_pattern(const PatternCheck* checks, std::uint32_t count,
                                 unsigned long long* mismatches, cudaStream_t stream);

// Loads this file's kernels now: a lazy module load at first launch synchronises the context,
// which would deadlock while an engine's stream waits on a host flag (testkit::preload_uva_copy
// does the same for the UVA kernel).
cudaError_t preload_peer_kernels();

}  // namespace gfd::bench
