#include "paged_caches.hpp"

#include <sys/mman.h>

#include <stdexcept>
#include <string>

#include "bench_cuda.hpp"

namespace gfd::bench::paged {

Caches::Caches(testkit::Device& dev, std::size_t tensors, std::size_t host_bytes,
               std::size_t device_bytes, std::size_t ref_bytes)
    : host_bytes(host_bytes), device_bytes(device_bytes), ref_bytes(ref_bytes), dev_(dev) {
  try {
    for (std::size_t t = 0; t < tensors; ++t) {
      host.push_back(alloc_host(host_bytes));
      device.push_back(static_cast<std::byte*>(alloc_device(device_bytes)));
    }
    ref_host = alloc_host(ref_bytes);
    ref_device = static_cast<std::byte*>(alloc_device(ref_bytes));
  } catch (...) {
    release();
    throw;
  }
}

std::byte* Caches::alloc_host(std::size_t bytes) {
  if (!dev_.emulated()) {
    void* p = nullptr;
    // Default flags, as PyTorch's pinned allocator (and so vLLM's host caches) calls it.
    GFD_BENCH_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    host_owned_.push_back({p, bytes});
    return static_cast<std::byte*>(p);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap of " + format_size(bytes) + " failed");
  host_owned_.push_back({p, bytes});
  dev_.register_host(p, bytes);
  return static_cast<std::byte*>(p);
}

void* Caches::alloc_device(std::size_t bytes) {
  void* p = nullptr;
  if (dev_.emulated()) {
    p = dev_.alloc_device(bytes);
  } else {
    GFD_BENCH_CUDA(cudaMalloc(&p, bytes));
  }
  device_owned_.push_back(p);
  return p;
}

void Caches::release() noexcept {
  for (auto [p, bytes] : host_owned_) {
    if (!dev_.emulated()) {
      (void)cudaFreeHost(p);
      continue;
    }
    try {
      dev_.unregister_host(p);
    } catch (...) {
    }
    munmap(p, bytes);
  }
  for (void* p : device_owned_) {
    if (!dev_.emulated()) {
      (void)cudaFree(p);
      continue;
    }
    try {
      dev_.free_device(p);
    } catch (...) {
    }
  }
  host_owned_.clear();
  device_owned_.clear();
}

IdStream::IdStream(const Config& c, bool warm)
    : rng_(0xC0FFEE ^ (c.size * 1315423911u) ^ (c.n << 20)),
      n_(c.n),
      warm_(warm),
      host_seen_(c.host_blocks, 0),
      device_seen_(c.gpu_blocks, 0) {}

const Ids& IdStream::next() {
  if (warm_ && drawn_) return ids_;
  ++stamp_;
  draw(ids_.host, host_seen_);
  draw(ids_.device, device_seen_);
  drawn_ = true;
  return ids_;
}

void IdStream::draw(std::vector<std::int64_t>& out, std::vector<std::uint32_t>& seen) {
  std::uniform_int_distribution<std::int64_t> pick(0, static_cast<std::int64_t>(seen.size()) - 1);
  out.clear();
  while (out.size() < n_) {
    const std::int64_t id = pick(rng_);
    if (seen[id] == stamp_) continue;
    seen[id] = stamp_;
    out.push_back(id);
  }
}

}  // namespace gfd::bench::paged
