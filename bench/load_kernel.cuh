// A compute load for gfd_benchmark --under-load: thread blocks of pure FMA work that fill every
// SM, in many short waves (like a model's kernels), so that other kernels get SMs only as these
// blocks retire.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gfd::bench {

// SMs of `device`.
int sm_count(int device);
// Launches `waves` x (8 blocks of 256 threads per SM), each thread doing `iters` rounds of FMAs.
cudaError_t launch_fma_load(float* sink, std::uint32_t iters, std::uint32_t waves, int sms,
                            cudaStream_t stream);

}  // namespace gfd::bench
