// The memory of gfd_benchmark --layout paged: the 2L host and device caches with the reference
// buffers, and the block ids each repetition moves.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "paged_types.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench::paged {

// Tags of the fill patterns: a host cache and a device cache never hold the same bytes, so a
// copy that moved the wrong side (or nothing) cannot pass.
inline std::uint64_t host_tag(std::size_t tensor) { return tensor; }
inline std::uint64_t device_tag(std::size_t tensor) { return 0x10000 + tensor; }

// Runs fn(i) for every i in [0, n) on up to 16 threads.
template <class F>
void parallel_for(std::size_t n, F fn) {
  const std::size_t threads =
      std::min<std::size_t>(n, std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> ts;
  for (std::size_t t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : ts) t.join();
}

// The 2L cache pairs and the contiguous reference buffers, allocated once for the whole run at
// the largest size any grid point needs; each point views them as arrays of its block size.
// On the GPU: each host cache its own cudaHostAlloc and each device cache its own cudaMalloc,
// as a runtime allocates one tensor per layer and side. Host-only: the emulated device's memory
// and mmaps registered with it (pinned as far as the engine is concerned).
class Caches {
 public:
  Caches(testkit::Device& dev, std::size_t tensors, std::size_t host_bytes,
         std::size_t device_bytes, std::size_t ref_bytes);
  ~Caches() { release(); }
  Caches(const Caches&) = delete;
  Caches& operator=(const Caches&) = delete;

  std::vector<std::byte*> host, device;
  std::size_t host_bytes, device_bytes;  // of one cache
  std::byte* ref_host = nullptr;
  std::byte* ref_device = nullptr;
  std::size_t ref_bytes;

 private:
  std::byte* alloc_host(std::size_t bytes);
  void* alloc_device(std::size_t bytes);
  void release() noexcept;

  testkit::Device& dev_;
  std::vector<std::pair<void*, std::size_t>> host_owned_;
  std::vector<void*> device_owned_;
};

// The ids of successive repetitions: n distinct host ids and n distinct device ids, fresh every
// call (cold) or the first draw every call (warm). Seeded by the grid point alone, so that every
// method of a point moves the same blocks in the same order.
class IdStream {
 public:
  IdStream(const Config& c, bool warm);
  const Ids& next();

 private:
  void draw(std::vector<std::int64_t>& out, std::vector<std::uint32_t>& seen);

  std::mt19937_64 rng_;
  std::size_t n_;
  bool warm_, drawn_ = false;
  std::vector<std::uint32_t> host_seen_, device_seen_;  // the stamp of the draw that took an id
  std::uint32_t stamp_ = 0;
  Ids ids_;
};

}  // namespace gfd::bench::paged
