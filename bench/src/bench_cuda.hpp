// CUDA runtime calls of the benchmarks, checked: a failed call throws std::runtime_error naming
// the call and where it was made (the benchmarks report it and go on with the next method).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace gfd::bench {

inline void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(e) + " (" + file + ":" +
                             std::to_string(line) + ")");
}

}  // namespace gfd::bench

#define GFD_BENCH_CUDA(call) ::gfd::bench::cuda_check((call), #call, __FILE__, __LINE__)
