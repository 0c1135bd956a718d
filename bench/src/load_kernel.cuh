// A compute load for gfd_benchmark --under-load: thread blocks of pure FMA work that fill every
// SM, either as one long kernel of many short waves (other kernels get SMs only as its blocks
// retire) or as a series of short kernels back to back, like a model's layers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace gfd::bench {

// Floats the kernels' `sink` must hold (any grid size: block b would write sink[b % kSinkFloats],
// and only if its FMAs gave an impossible value, so nothing is written in practice).
constexpr std::uint32_t kSinkFloats = 4096;

// SMs of `device`.
int sm_count(int device);
// Launches `waves` x (8 blocks of 256 threads per SM), each thread doing `iters` rounds of FMAs.
cudaError_t launch_fma_load(float* sink, std::uint32_t iters, std::uint32_t waves, int sms,
                            cudaStream_t stream);

// `kernels` launches of launch_fma_load(sink, iters, waves, sms) back to back, captured into a
// CUDA graph (so that thousands of short kernels cost one launch and the host thread stays free
// for the transfers measured beside them). Graph kernels run at the priority of the stream the
// graph is launched into. Release with cudaGraphExecDestroy.
cudaError_t make_fma_series(float* sink, std::uint32_t iters, std::uint32_t waves, int sms,
                            std::uint32_t kernels, cudaStream_t capture_stream,
                            cudaGraphExec_t* out);

}  // namespace gfd::bench
