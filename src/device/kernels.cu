#include <algorithm>

#include "device/kernels.cuh"

namespace gfd::detail {
namespace {

// Placing a staged chunk (scatter) and packing device blocks into staging (gather) run on the
// copy lanes beside the model's kernels, so they take as few SMs as keep up with the link: two
// thread blocks of 1024 threads per chunk, a warp per entry (KV blocks are 1-64 KB), each lane
// keeping kMoveUnroll 16-byte loads in flight. (Host to device, chunks are usually placed several
// at a time by place_kernel below; move_kernel places one chunk where that is off.) One thread
// block per chunk held 4 KB transfers back, four gained nothing over two, and a thread block per
// entry spreads over every SM (docs/performance.md, "Design decisions").
// kToStaging = false: staging -> device addresses (scatter); true: device addresses -> staging.
constexpr int kMoveThreads = 1024;
constexpr int kMoveBlocks = 2;
constexpr int kMoveUnroll = 4;

// One entry's bytes, copied by the 32 lanes of a warp.
__device__ __forceinline__ void move_entry(const unsigned char* __restrict__ src,
                                           unsigned char* __restrict__ dst, std::uint64_t n,
                                           std::uint32_t lane) {
  std::uint64_t done = 0;
  if (((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15) == 0) {
    const std::uint64_t n16 = n / 16;
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    for (std::uint64_t base = lane; base < n16; base += 32 * kMoveUnroll) {
      uint4 v[kMoveUnroll];
#pragma unroll
      for (int k = 0; k < kMoveUnroll; ++k) {
        const std::uint64_t i = base + k * 32;
        if (i < n16) v[k] = s4[i];
      }
#pragma unroll
      for (int k = 0; k < kMoveUnroll; ++k) {
        const std::uint64_t i = base + k * 32;
        if (i < n16) d4[i] = v[k];
      }
    }
    done = n16 * 16;
  }
  for (std::uint64_t i = done + lane; i < n; i += 32) dst[i] = src[i];
}

template <bool kToStaging>
__global__ void __launch_bounds__(kMoveThreads)
    move_kernel(const ScatterEntry* __restrict__ entries, std::uint32_t count,
                unsigned char* __restrict__ staging) {
  const std::uint32_t lane = threadIdx.x & 31;
  const std::uint32_t warps = gridDim.x * (blockDim.x / 32);
  for (std::uint32_t e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; e < count; e += warps) {
    const ScatterEntry en = entries[e];
    unsigned char* device = reinterpret_cast<unsigned char*>(en.dst);
    if (kToStaging)
      move_entry(device, staging + en.src_offset, en.bytes, lane);
    else
      move_entry(staging + en.src_offset, device, en.bytes, lane);
  }
}

// Placing several staged chunks of one copy lane in one launch (Tuning::batch_placement):
// the chunks travel as the kernel's parameter, a warp per entry over all of them. Once every
// thread block is done (the last one to count itself out on `counter` knows), each chunk's
// flag in pinned host memory says that its slot may take the next chunk: the host learns it
// from memory, with no event recorded or queried per chunk. The grid is sized by the bytes
// (kPlaceBytesPerBlock each), at most the engine's placement_blocks (kPlaceMaxBlocks).
constexpr std::uint64_t kPlaceBytesPerBlock = 256 << 10;
constexpr std::uint32_t kPlaceMaxBlocks = 32;

struct PlaceParams {
  std::uint32_t chunks;
  std::uint32_t total;  // entries of every chunk
  std::uint32_t* counter;
  PlaceChunk c[kMaxPlaceChunks];
};

// Every entry of a launch's chunks (`p.c[0..p.chunks)`, `p.total` entries together), a warp per
// entry: `move(chunk, entry, lane)` moves one entry's bytes (the placing and packing launches).
template <class Params, class Move>
__device__ __forceinline__ void move_chunks(const Params& p, Move move) {
  const std::uint32_t lane = threadIdx.x & 31;
  const std::uint32_t warps = gridDim.x * (blockDim.x / 32);
  std::uint32_t k = 0;  // the chunk of entry e (e only grows)
  for (std::uint32_t e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; e < p.total;
       e += warps) {
    while (k + 1 < p.chunks && e >= p.c[k + 1].first) ++k;
    const ScatterEntry en = p.c[k].entries[e - p.c[k].first];  // read once (it may be host memory)
    move(p.c[k], en, lane);
  }
}

__global__ void __launch_bounds__(kMoveThreads)
    place_kernel(const __grid_constant__ PlaceParams p) {
  move_chunks(p, [](const PlaceChunk& c, const ScatterEntry& en, std::uint32_t lane) {
    move_entry(static_cast<const unsigned char*>(c.staging) + en.src_offset,
               reinterpret_cast<unsigned char*>(en.dst), en.bytes, lane);
  });
  // Every thread of the block has read its staged bytes (they are stored) before thread 0
  // counts the block out; the last block out has seen every other block's count, so every
  // staged byte of the launch has been read when it writes the flags.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(p.counter, 1u) == gridDim.x - 1) {
      *p.counter = 0;  // the next launch on this lane runs after this one (stream order)
      __threadfence_system();
      for (std::uint32_t i = 0; i < p.chunks; ++i)
        *reinterpret_cast<volatile std::uint64_t*>(p.c[i].flag) = p.c[i].value;
    }
  }
}

// Packing several device-to-host chunks of the pack lane in one launch: the chunks travel as the
// kernel's parameter, a warp per entry over all of them, so that beside a model's kernels the lane
// waits for SMs once per launch instead of once per chunk. The device-to-host lane waits for the
// whole launch (an event) before its DMAs.
struct PackParams {
  std::uint32_t chunks;
  std::uint32_t total;  // entries of every chunk
  PackChunk c[kMaxPlaceChunks];
};

__global__ void __launch_bounds__(kMoveThreads) pack_kernel(const __grid_constant__ PackParams p) {
  move_chunks(p, [](const PackChunk& c, const ScatterEntry& en, std::uint32_t lane) {
    move_entry(reinterpret_cast<const unsigned char*>(en.dst),
               static_cast<unsigned char*>(c.staging) + en.src_offset, en.bytes, lane);
  });
}

// Zero-copy gather, as serving runtimes do it today: the SMs read pinned host memory over PCIe
// through unified addressing. One thread block per entry, as many blocks as entries (the
// hardware starts each as another retires), and every thread reads its entry itself, so no
// block waits at a barrier for one thread's read of the list (both alternatives, the entry in
// shared memory behind a barrier or a grid of 8 blocks per SM striding the list, were slower:
// bench/micro/uva_kernel). Each thread keeps kUnroll independent 16-byte loads in flight for
// larger blocks: a PCIe read takes a microsecond or more and only many outstanding loads fill
// the link.
constexpr int kZeroCopyThreads = 256;
constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kZeroCopyThreads)
    zero_copy_kernel(const ZeroCopyEntry* __restrict__ entries, std::uint32_t count) {
  for (std::uint32_t e = blockIdx.x; e < count; e += gridDim.x) {
    const ZeroCopyEntry en = entries[e];
    const auto* src = reinterpret_cast<const unsigned char*>(en.src);
    auto* dst = reinterpret_cast<unsigned char*>(en.dst);
    const std::uint64_t n = en.bytes;
    std::uint64_t done = 0;
    if (((en.src | en.dst) & 15) == 0) {
      const std::uint64_t n16 = n / 16;
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
      uint4* d4 = reinterpret_cast<uint4*>(dst);
      for (std::uint64_t base = threadIdx.x; base < n16; base += kUnroll * kZeroCopyThreads) {
        uint4 v[kUnroll];
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const std::uint64_t i = base + k * kZeroCopyThreads;
          if (i < n16) v[k] = s4[i];
        }
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) {
          const std::uint64_t i = base + k * kZeroCopyThreads;
          if (i < n16) d4[i] = v[k];
        }
      }
      done = n16 * 16;
    }
    for (std::uint64_t i = done + threadIdx.x; i < n; i += kZeroCopyThreads) dst[i] = src[i];
  }
}

__global__ void delay_kernel(std::uint64_t nanoseconds) {
  std::uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  for (;;) {
    std::uint64_t now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (now - start >= nanoseconds) break;
    __nanosleep(1000);
  }
}

}  // namespace

cudaError_t launch_scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
                           cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  move_kernel<false><<<kMoveBlocks, kMoveThreads, 0, stream>>>(
      entries, count, const_cast<unsigned char*>(static_cast<const unsigned char*>(staging)));
  return cudaGetLastError();
}

cudaError_t launch_place(PlaceChunk* chunks, std::uint32_t n, std::uint64_t bytes,
                         std::uint32_t max_blocks, std::uint32_t* counter, cudaStream_t stream) {
  if (n == 0 || n > kMaxPlaceChunks || max_blocks == 0) return cudaErrorInvalidValue;
  PlaceParams p;
  p.chunks = n;
  p.counter = counter;
  std::uint32_t total = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    chunks[i].first = total;
    total += chunks[i].count;
    p.c[i] = chunks[i];
  }
  p.total = total;
  const std::uint64_t want = (bytes + kPlaceBytesPerBlock - 1) / kPlaceBytesPerBlock;
  const std::uint64_t most = std::min<std::uint64_t>(max_blocks, kPlaceMaxBlocks);
  const auto grid = static_cast<std::uint32_t>(
      std::clamp<std::uint64_t>(want, std::min<std::uint64_t>(kMoveBlocks, most), most));
  place_kernel<<<grid, kMoveThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  move_kernel<true><<<kMoveBlocks, kMoveThreads, 0, stream>>>(entries, count,
                                                              static_cast<unsigned char*>(staging));
  return cudaGetLastError();
}

cudaError_t launch_pack(PackChunk* chunks, std::uint32_t n, std::uint64_t bytes,
                        std::uint32_t max_blocks, cudaStream_t stream) {
  if (n == 0 || n > kMaxPlaceChunks || max_blocks == 0) return cudaErrorInvalidValue;
  PackParams p;
  p.chunks = n;
  p.total = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    chunks[i].first = p.total;
    p.total += chunks[i].count;
    p.c[i] = chunks[i];
  }
  if (p.total == 0) return cudaSuccess;
  // Sized as the placing launch: a thread block per kPlaceBytesPerBlock, two at least.
  const std::uint64_t most = std::min<std::uint64_t>(max_blocks, kPlaceMaxBlocks);
  const std::uint64_t want = (bytes + kPlaceBytesPerBlock - 1) / kPlaceBytesPerBlock;
  const auto grid = static_cast<std::uint32_t>(
      std::clamp<std::uint64_t>(want, std::min<std::uint64_t>(kMoveBlocks, most), most));
  pack_kernel<<<grid, kMoveThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_zero_copy(const ZeroCopyEntry* entries, std::uint32_t count,
                             cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  // One block per entry; the grid's limit (2^31 - 1) is above any transfer's count.
  const std::uint32_t grid = count < 0x7fffffffu ? count : 0x7fffffffu;
  zero_copy_kernel<<<grid, kZeroCopyThreads, 0, stream>>>(entries, count);
  return cudaGetLastError();
}

cudaError_t preload_kernels() {
  // Load the module now: with lazy loading (CUDA's default) the first launch would load it and
  // that synchronises the context, which deadlocks while a caller's stream waits for a transfer
  // whose kernel is being launched.
  cudaFuncAttributes a{};
  cudaError_t e = cudaFuncGetAttributes(&a, move_kernel<false>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, move_kernel<true>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, place_kernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, pack_kernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, delay_kernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, zero_copy_kernel);
  return e;
}

cudaError_t launch_delay(std::uint32_t microseconds, cudaStream_t stream) {
  delay_kernel<<<1, 1, 0, stream>>>(std::uint64_t{microseconds} * 1000);
  return cudaGetLastError();
}

}  // namespace gfd::detail
