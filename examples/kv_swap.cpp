// kv_swap: swap part of a paged KV cache out to host memory, overwrite those blocks on the GPU,
// swap them back in and check every byte, with gfd's public API only.
//   build/examples/kv_swap [device]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <gfd/gfd.hpp>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kv_swap: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  if (gfd::visible_devices().empty()) {
    std::printf("kv_swap: no CUDA GPU is visible here; the example needs one.\n");
    return 0;
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  // A paged cache: 8 layers x (K, V) x 512 blocks of 16 KB, in one device allocation.
  constexpr std::size_t kLayers = 8, kBlocks = 512, kBlockBytes = 16 << 10, kSlots = 256;
  const std::size_t cache_bytes = 2 * kLayers * kBlocks * kBlockBytes;
  void* raw = nullptr;
  check(cudaMalloc(&raw, cache_bytes), "cudaMalloc");
  auto* mem = static_cast<std::byte*>(raw);
  std::vector<std::byte> original(cache_bytes);
  std::mt19937_64 rng(1);
  for (auto& b : original) b = static_cast<std::byte>(rng());
  check(cudaMemcpy(mem, original.data(), cache_bytes, cudaMemcpyHostToDevice), "upload");

  gfd::PagedKvCache cache;
  cache.block_bytes = kBlockBytes;
  cache.blocks = kBlocks;
  for (std::size_t l = 0; l < kLayers; ++l) {
    cache.k.push_back(mem + (2 * l) * kBlocks * kBlockBytes);
    cache.v.push_back(mem + (2 * l + 1) * kBlocks * kBlockBytes);
  }
  // Offloaded blocks live in ordinary (pageable) host memory: gfd stages them.
  std::vector<std::byte> host(kSlots * 2 * kLayers * kBlockBytes);
  const gfd::HostKvPool pool{host.data(), kSlots};

  // Evict 200 random blocks to 200 random slots.
  std::vector<std::uint32_t> ids(kBlocks), slots(kSlots);
  std::iota(ids.begin(), ids.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::shuffle(slots.begin(), slots.end(), rng);
  ids.resize(200);
  slots.resize(200);

  gfd::Engine engine(device);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto out = gfd::kv_copy_list(cache, pool, ids, slots, gfd::KvDirection::kSwapOut);
  engine.copy_to_host(out, stream).wait();  // every byte is in host memory now
  for (std::uint32_t id : ids)              // the runtime reuses those device blocks
    for (std::size_t l = 0; l < kLayers; ++l) {
      check(cudaMemsetAsync(cache.k[l] + id * kBlockBytes, 0, kBlockBytes, stream), "memset K");
      check(cudaMemsetAsync(cache.v[l] + id * kBlockBytes, 0, kBlockBytes, stream), "memset V");
    }
  const auto in = gfd::kv_copy_list(cache, pool, ids, slots, gfd::KvDirection::kSwapIn);
  // Ordered after the memsets; work queued on the stream next (here the download) sees the data.
  const gfd::Transfer swap_in = engine.copy_to_device(in, stream);
  std::vector<std::byte> back(cache_bytes);
  check(cudaMemcpyAsync(back.data(), mem, cache_bytes, cudaMemcpyDeviceToHost, stream), "download");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  swap_in.wait();  // throws the transfer's gfd::Error if it failed

  const bool ok = back == original;
  std::printf("kv_swap: swapped %zu blocks x %zu layers x K,V (%zu copies, %.1f MB) out and back in: %s\n",
              ids.size(), kLayers, out.size(), out.size() * kBlockBytes / 1e6,
              ok ? "every byte matches" : "MISMATCH");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  check(cudaFree(mem), "cudaFree");
  return ok ? 0 : 2;
} catch (const gfd::Error& e) {
  std::fprintf(stderr, "kv_swap: %s\n", e.what());
  return 1;
}
