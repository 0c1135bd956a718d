#include "peer_kernels.cuh"

namespace gfd::bench {
namespace {

__global__ void fill_pattern(std::uint64_t* data, std::uint64_t words, std::uint64_t first_word,
                             std::uint64_t tag) {
  const std::uint64_t step = std::uint64_t{gridDim.x} * blockDim.x;
  for (std::uint64_t i = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words; i += step)
    data[i] = pattern_word(tag, first_word + i);
}

__global__ void check_pattern(const PatternCheck* __restrict__ checks, std::uint32_t count,
                              unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (std::uint32_t c = blockIdx.x; c < count; c += gridDim.x) {
    const PatternCheck pc = checks[c];
    for (std::uint64_t i = threadIdx.x; i < pc.words; i += blockDim.x)
      bad += pc.data[i] != pattern_word(pc.tag, pc.first_word + i);
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

}  // namespace

cudaError_t launch_fill_pattern(std::uint64_t* data, std::uint64_t words, std::uint64_t first_word,
                                std::uint64_t tag, cudaStream_t stream) {
  if (words == 0) return cudaSuccess;
  const std::uint64_t blocks = (words + 255) / 256;
  fill_pattern<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
      data, words, first_word, tag);
  return cudaGetLastError();
}

cudaError_t launch_check_pattern(const PatternCheck* checks, std::uint32_t count,
                                 unsigned long long* mismatches, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const unsigned grid = count < 65535u ? count : 65535u;
  check_pattern<<<grid, 256, 0, stream>>>(checks, count, mismatches);
  return cudaGetLastError();
}

cudaError_t preload_peer_kernels() {
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, fill_pattern);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, check_pattern);
  return e;
}

}  // namespace gfd::bench
