// The SM copy kernel the benchmarks measure as a peer of gfd's copy engines: SMs reading or
// writing pinned host memory directly over the link through unified addressing, the kind of
// kernel SGLang's HiCache, LMCache and vLLM's small-page loads ship. One copy of it serves
// gfd_benchmark (C++) and gfd.testing (Python), so that both measure the same kernel.
#include <cuda_runtime_api.h>

#include <string>

#include "device/cuda_check.hpp"
#include "device/device.hpp"
#include "gfd/error.hpp"
#include "testkit/testkit.hpp"

namespace gfd::testkit {
namespace {

// 16-byte loads a lane keeps in flight: a warp moves 4 KB per round, so that one warp has a
// whole 4 KB block in flight over the link (a host read costs ~1 us of latency).
constexpr int kUnroll = 8;
constexpr int kWarpsPerCta = kUvaThreads / 32;

__global__ void __launch_bounds__(kUvaThreads)
    uva_copy_kernel(void* const* __restrict__ dsts, const void* const* __restrict__ srcs,
                    const std::uint64_t* __restrict__ sizes, std::uint64_t count) {
  const unsigned lane = threadIdx.x & 31u;
  const std::uint64_t warps = std::uint64_t{gridDim.x} * kWarpsPerCta;
  for (std::uint64_t c = std::uint64_t{blockIdx.x} * kWarpsPerCta + threadIdx.x / 32u; c < count;
       c += warps) {
    const auto* src = static_cast<const unsigned char*>(srcs[c]);
    auto* dst = static_cast<unsigned char*>(dsts[c]);
    const std::uint64_t n = sizes[c];
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

// The emulated device has no SMs: the kernel is a GPU's alone.
void require_gpu(const Device& device, const char* call) {
  if (device.emulated())
    throw Error(ErrorCode::kInvalidArgument,
                std::string(call) +
                    ": an SM copy kernel needs a CUDA GPU, and this device is the "
                    "emulated one");
}

}  // namespace

void uva_copy(const Device& device, void* const* dsts, const void* const* srcs,
              const std::uint64_t* sizes, std::size_t count, int ctas, cudaStream_t stream) {
  require_gpu(device, "uva_copy");
  if (ctas < 1 || ctas > kMaxUvaCtas)
    throw Error(ErrorCode::kInvalidArgument, "uva_copy: ctas: " + std::to_string(ctas) +
                                                 " is not in [1, " + std::to_string(kMaxUvaCtas) +
                                                 "]");
  if (count == 0) return;
  for (const auto& [p, name] : {std::pair<const void*, const char*>{dsts, "dsts"},
                                std::pair<const void*, const char*>{srcs, "srcs"},
                                std::pair<const void*, const char*>{sizes, "sizes"}})
    if (p == nullptr)
      throw Error(ErrorCode::kInvalidArgument, std::string("uva_copy: ") + name + ": null, with " +
                                                   std::to_string(count) + " copies");
  device.internal().make_current();
  uva_copy_kernel<<<static_cast<unsigned>(ctas), kUvaThreads, 0, stream>>>(dsts, srcs, sizes,
                                                                           count);
  GFD_CUDA_CHECK(cudaGetLastError());
}

void preload_uva_copy(const Device& device) {
  require_gpu(device, "preload_uva_copy");
  device.internal().make_current();
  cudaFuncAttributes a{};
  GFD_CUDA_CHECK(cudaFuncGetAttributes(&a, uva_copy_kernel));
}

}  // namespace gfd::testkit
