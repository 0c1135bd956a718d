// registered_caches: describe a paged KV cache to an engine once (Engine::register_caches), then
// move blocks by id both ways (Engine::copy_blocks) and check every byte.
//   build/examples/registered_caches [device]
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gfd/gfd.hpp>
#include <random>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "registered_caches: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  if (gfd::visible_devices().empty()) {
    std::printf("registered_caches: needs an NVIDIA GPU; none is visible here, nothing to do.\n");
    return 0;
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  // 8 layers x (K, V): 16 arrays of 512 device blocks of 16 KB, each mirrored by a host array of
  // 256 blocks in one pinned pool.
  constexpr std::size_t kArrays = 16, kDeviceBlocks = 512, kHostBlocks = 256,
                        kBlockBytes = 16 << 10;
  const std::size_t device_bytes = kArrays * kDeviceBlocks * kBlockBytes;
  void* raw = nullptr;
  check(cudaMalloc(&raw, device_bytes), "cudaMalloc");
  auto* dev = static_cast<std::byte*>(raw);
  std::vector<std::byte> original(device_bytes);
  std::mt19937_64 rng(1);
  for (auto& b : original) b = static_cast<std::byte>(rng());
  check(cudaMemcpy(dev, original.data(), device_bytes, cudaMemcpyHostToDevice), "upload");

  gfd::Engine engine(device);
  gfd::HostPool pool(kArrays * kHostBlocks * kBlockBytes, device);
  std::vector<gfd::CachePair> pairs(kArrays);
  for (std::size_t a = 0; a < kArrays; ++a) {
    pairs[a].host = {pool.data() + a * kHostBlocks * kBlockBytes, kHostBlocks, kBlockBytes, 0};
    pairs[a].device = {dev + a * kDeviceBlocks * kBlockBytes, kDeviceBlocks, kBlockBytes, 0};
  }
  const gfd::CacheSet caches = engine.register_caches(pairs);  // checked once, here

  // Evict device blocks 10..209 to host blocks 0..199, in every array.
  std::vector<std::int64_t> device_ids, host_ids;
  for (std::int64_t i = 0; i < 200; ++i) {
    device_ids.push_back(10 + i);
    host_ids.push_back(i);
  }
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  engine.copy_blocks(caches, gfd::Direction::kToHost, device_ids, host_ids, stream).wait();
  // The runtime reuses those device blocks...
  for (std::size_t a = 0; a < kArrays; ++a)
    check(
        cudaMemsetAsync(dev + (a * kDeviceBlocks + 10) * kBlockBytes, 0, 200 * kBlockBytes, stream),
        "cudaMemsetAsync");
  // ...and brings them back. Ordered after the memsets; work queued on the stream next (here the
  // download) sees the data.
  const gfd::Transfer in =
      engine.copy_blocks(caches, gfd::Direction::kToDevice, host_ids, device_ids, stream);
  std::vector<std::byte> back(device_bytes);
  check(cudaMemcpyAsync(back.data(), dev, device_bytes, cudaMemcpyDeviceToHost, stream),
        "download");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  in.wait();  // throws the transfer's gfd::Error if it failed

  const bool ok = back == original;
  std::printf("registered_caches: %zu ids x %zu arrays (%.1f MB) to host and back: %s\n",
              device_ids.size(), kArrays, static_cast<double>(in.bytes()) / 1e6,
              ok ? "every byte matches" : "MISMATCH");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  check(cudaFree(dev), "cudaFree");
  return ok ? 0 : 2;
} catch (const gfd::Error& e) {
  std::fprintf(stderr, "registered_caches: %s\n", e.what());
  return 1;
}
