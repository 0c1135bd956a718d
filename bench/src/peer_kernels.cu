#include "peer_kernels.cuh"

namespace gfd::bench {
namespace {

// 16-byte loads a lane keeps in flight: a warp moves 4 KB per round, so that one warp has a
// whole 4 KB block in flight over the link (a host read costs ~1 us of latency).
constexpr int kUnroll = 8;
constexpr int kWarpsPerCta = kUvaThreads / 32;

__global__ void __launch_bounds__(kUvaThreads)
    uva_copy(const PeerCopy* __restrict__ copies, std::uint32_t count) {
  const unsigned lane = threadIdx.x & 31u;
  const std::uint32_t warps = gridDim.x * kWarpsPerCta;
  for (std::uint32_t c = blockIdx.x * kWarpsPerCta + threadIdx.x / 32u; c < count; c += warps) {
    const PeerCopy pc = copies[c];
    const auto* src = static_cast<const unsigned char*>(pc.src);
    auto* dst = static_cast<unsigned char*>(pc.dst);
    const std::uint64_t n = pc.bytes;
    std::uint64_t done = 0;
    if (((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15u) ==
        0) {
      const std::uint64_t n16 = n / 16;
      const auto* s4 = reinterpret_cast<const uint4*>(src);
      auto* d4 = reinterpret_cast<uint4*>(dst);
      for (std::uint64_t base = lane; base < n16; base += kUnroll * 32) {
        uint4 v[kUnroll];
        // Every load issued before the first store: kUnroll requests per lane in flight.
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const std::uint64_t i = base + k * 32;
          if (i < n16) v[k] = __ldcs(s4 + i);  // streamed: read once, keep L2 for the model
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const std::uint64_t i = base + k * 32;
          if (i < n16) __stcs(d4 + i, v[k]);
        }
      }
      done = n16 * 16;
    }
    for (std::uint64_t i = done + lane; i < n; i += 32) dst[i] = src[i];
  }
}

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

cudaError_t launch_uva_copy(const PeerCopy* copies, std::uint32_t count, int ctas,
                            cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  uva_copy<<<ctas, kUvaThreads, 0, stream>>>(copies, count);
  return cudaGetLastError();
}

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
  cudaError_t e = cudaFuncGetAttributes(&a, uva_copy);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, fill_pattern);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, check_pattern);
  return e;
}

}  // namespace gfd::bench
