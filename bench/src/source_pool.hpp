// gfd_benchmark's source pool (--pool): the host memory the KV blocks are taken from, allocated
// the way a runtime might allocate its host KV pool.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "gfd/gfd.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench {

enum class PoolKind {
  kCuda,  // cudaHostAlloc, as runtimes allocate their pinned KV pool today (the default)
  kGfd,   // gfd::HostPool: huge pages where the system gives them, on the GPU's NUMA node
  kMmap,  // an anonymous mmap registered with cudaHostRegister (the benchmark's old source)
};

const char* to_string(PoolKind kind);

// The kinds named by --pool=VALUE: cuda, gfd, mmap, "both" (cuda,gfd) or a comma list of those,
// each once, in the order given. Throws std::invalid_argument naming --pool for anything else.
std::vector<PoolKind> pool_kinds_flag(const std::string& value);

// One source pool of `bytes` random bytes. `pinned` false (--pageable): the memory is not
// registered (kCuda is then refused: cudaHostAlloc memory is always pinned).
class SourcePool {
 public:
  SourcePool(PoolKind kind, std::size_t bytes, testkit::Device& device, bool pinned);
  ~SourcePool();
  SourcePool(const SourcePool&) = delete;
  SourcePool& operator=(const SourcePool&) = delete;

  PoolKind kind() const { return kind_; }
  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // What the pool got, in words: the allocator, the pages (from /proc/self/smaps or the
  // HostPool), the NUMA node, and whether it is registered.
  const std::string& description() const { return description_; }

 private:
  PoolKind kind_;
  testkit::Device& dev_;
  bool pinned_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t mapped_ = 0;        // kMmap and the emulated kCuda: bytes to munmap
  bool cuda_host_alloc_ = false;  // kCuda on a GPU: cudaFreeHost
  std::unique_ptr<HostPool> host_pool_;
  std::string description_;
};

}  // namespace gfd::bench
