// block_list: move a list of scattered blocks, each given by its addresses and size, from host
// memory to the GPU (Engine::copy_to_device) and back (Engine::copy_to_host), and check every byte.
//   build/examples/block_list [device]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <gfd/gfd.hpp>
#include <numeric>
#include <random>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "block_list: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const int device = argc > 1 ? std::atoi(argv[1]) : 0;
  if (gfd::visible_devices().empty()) {
    std::printf("block_list: needs an NVIDIA GPU; none is visible here, nothing to do.\n");
    return 0;
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  // 1024 blocks of 8 KB, from random places of an ordinary (pageable) host buffer to random
  // places of a device buffer of twice as many blocks.
  constexpr std::size_t kBlocks = 1024, kBlockBytes = 8 << 10;
  std::vector<std::byte> host(kBlocks * kBlockBytes), back(kBlocks * kBlockBytes);
  std::mt19937_64 rng(1);
  for (auto& b : host) b = static_cast<std::byte>(rng());
  void* raw = nullptr;
  check(cudaMalloc(&raw, 2 * kBlocks * kBlockBytes), "cudaMalloc");
  auto* dev = static_cast<std::byte*>(raw);
  std::vector<std::size_t> src(kBlocks), dst(2 * kBlocks);
  std::iota(src.begin(), src.end(), 0);
  std::iota(dst.begin(), dst.end(), 0);
  std::shuffle(src.begin(), src.end(), rng);
  std::shuffle(dst.begin(), dst.end(), rng);

  std::vector<gfd::BlockCopy> to_device(kBlocks), to_host(kBlocks);
  for (std::size_t i = 0; i < kBlocks; ++i) {
    to_device[i] = {host.data() + src[i] * kBlockBytes, dev + dst[i] * kBlockBytes, kBlockBytes};
    to_host[i] = {dev + dst[i] * kBlockBytes, back.data() + src[i] * kBlockBytes, kBlockBytes};
  }
  gfd::Engine engine(device);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  // Both ordered on `stream`: the copy to host starts after the copy to the device.
  const gfd::Transfer in = engine.copy_to_device(to_device, stream);
  const gfd::Transfer out = engine.copy_to_host(to_host, stream);
  in.wait();
  out.wait();  // every byte is in host memory once the handle is done

  const bool ok = back == host;
  std::printf("block_list: %zu blocks of %zu KB to the GPU and back: %s\n", kBlocks,
              kBlockBytes >> 10, ok ? "every byte matches" : "MISMATCH");
  check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  check(cudaFree(dev), "cudaFree");
  return ok ? 0 : 2;
} catch (const gfd::Error& e) {
  std::fprintf(stderr, "block_list: %s\n", e.what());
  return 1;
}
