// What the GPU yardsticks in bench/micro (ref_pipeline, uva_kernel) share: the CUDA error check,
// the contiguous DMA they are measured against, and main's error report.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace gfd::micro {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// GB/s of one pinned cudaMemcpyAsync of `bytes` from `src` to `dst` on `stream`, timed from the
// call to the stream's synchronisation: P50 of `iters` copies after 5 warm-up ones.
inline double contiguous_dma_gbps(void* dst, const void* src, std::size_t bytes,
                                  cudaStream_t stream, int iters) {
  std::vector<double> us;
  for (int i = 0; i < 5 + iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    if (i >= 5) us.push_back(gfd::bench::since_us(t0));
  }
  return static_cast<double>(bytes) / (gfd::bench::percentiles(us).p50 * 1e3);
}

// The start of a yardstick's main: prints the usage for --help, or says that there is no CUDA
// device. True when that was all there was to do (the program then exits 0).
inline bool usage_or_no_device(const char* name, const gfd::bench::Flags& flags,
                               const std::map<std::string, std::string>& known) {
  if (flags.has("help")) {
    std::printf("usage: %s [flags]\n%s", name, gfd::bench::Flags::usage(known).c_str());
    return true;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device; nothing to measure.\n", name);
    return true;
  }
  return false;
}

// main's body: runs `run`, and reports an exception as "<name>: <what>" with exit code 2.
template <class Run>
int guarded_main(const char* name, Run&& run) {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
}

}  // namespace gfd::micro
