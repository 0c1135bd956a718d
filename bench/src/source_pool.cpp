#include "source_pool.hpp"

#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "bench_common.hpp"

namespace gfd::bench {
namespace {

// The NUMA node holding the page at `p` (-1 when the kernel does not say), without libnuma:
// get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR) returns the node of the page at that address.
int node_of(const void* p) {
  int node = -1;
  constexpr unsigned long kNode = 1, kAddr = 2;  // MPOL_F_NODE, MPOL_F_ADDR
  if (syscall(SYS_get_mempolicy, &node, nullptr, 0UL, p, kNode | kAddr) != 0) return -1;
  return node;
}

// The pages of the mapping that holds `p`, from /proc/self/smaps: "4K pages" or
// "2M hugetlb pages", and how much of it transparent huge pages back.
std::string pages_of(const void* p) {
  std::ifstream f("/proc/self/smaps");
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool in = false;
  unsigned long long size_kb = 0, page_kb = 0, thp_kb = 0;
  while (std::getline(f, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    // A mapping's first line: "lo-hi perms offset dev inode [path]" (hex addresses).
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      if (in) break;
      in = lo <= a && a < hi;
      continue;
    }
    if (!in) continue;
    std::istringstream kv(line);
    std::string key;
    unsigned long long v = 0;
    if (!(kv >> key >> v)) continue;
    if (key == "Size:")
      size_kb = v;
    else if (key == "KernelPageSize:")
      page_kb = v;
    else if (key == "AnonHugePages:")
      thp_kb = v;
  }
  if (size_kb == 0) return "pages unknown (no smaps entry)";
  if (page_kb >= 2048) return format_size(page_kb << 10) + " hugetlb pages";
  if (thp_kb == 0) return format_size(page_kb << 10) + " pages (smaps: no transparent huge pages)";
  return "smaps: " + std::to_string(100 * thp_kb / size_kb) + "% in transparent huge pages";
}

std::string node_words(int node) { return node < 0 ? "unknown" : std::to_string(node); }

void* map_anonymous(std::size_t bytes, const char* what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error(std::string("--pool=") + what + ": mmap of " + format_size(bytes) +
                             " failed");
  return p;
}

}  // namespace

const char* to_string(PoolKind kind) {
  switch (kind) {
    case PoolKind::kCuda:
      return "cuda";
    case PoolKind::kGfd:
      return "gfd";
    case PoolKind::kMmap:
      return "mmap";
  }
  return "?";
}

std::vector<PoolKind> pool_kinds_flag(const std::string& value) {
  std::vector<PoolKind> out;
  auto add = [&](PoolKind k) {
    for (PoolKind have : out)
      if (have == k) return;
    out.push_back(k);
  };
  for (std::size_t pos = 0; pos <= value.size();) {
    const std::size_t comma = std::min(value.find(',', pos), value.size());
    const std::string name = value.substr(pos, comma - pos);
    if (name == "cuda")
      add(PoolKind::kCuda);
    else if (name == "gfd")
      add(PoolKind::kGfd);
    else if (name == "mmap")
      add(PoolKind::kMmap);
    else if (name == "both")
      add(PoolKind::kCuda), add(PoolKind::kGfd);
    else
      throw std::invalid_argument(
          "--pool=" + value + ": '" + name +
          "' is not a pool (cuda, gfd, mmap, both, or a comma list such as cuda,gfd)");
    pos = comma + 1;
  }
  return out;
}

SourcePool::SourcePool(PoolKind kind, std::size_t bytes, testkit::Device& device, bool pinned)
    : kind_(kind), dev_(device), pinned_(pinned), bytes_(bytes) {
  switch (kind) {
    case PoolKind::kCuda: {
      if (!pinned)
        throw std::invalid_argument(
            "--pool=cuda cannot be pageable (cudaHostAlloc memory is pinned): "
            "with --pageable use --pool=mmap or --pool=gfd");
      if (!dev_.emulated()) {
        dev_.make_current();
        void* p = nullptr;
        // Default flags, as PyTorch's pinned-memory allocator (and so vLLM's and SGLang's host
        // KV caches) call it; with unified addressing the memory is portable and mapped anyway.
        const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (e != cudaSuccess)
          throw std::runtime_error("--pool=cuda: cudaHostAlloc of " + format_size(bytes) +
                                   " failed: " + cudaGetErrorString(e));
        data_ = static_cast<std::byte*>(p);
        cuda_host_alloc_ = true;
        fill_random(data_, bytes_);
        description_ = "cudaHostAlloc, " + pages_of(data_) + ", first page on NUMA node " +
                       node_words(node_of(data_)) + ", pinned";
      } else {
        // No cudaHostAlloc without a GPU. The stand-in gets what cudaHostAlloc gives on Linux, 4 KB
        // pages placed by first touch, and registers them with the emulated device so that the
        // engine treats them as pinned.
        data_ = static_cast<std::byte*>(map_anonymous(bytes, "cuda"));
        mapped_ = bytes;
        (void)madvise(data_, bytes, MADV_NOHUGEPAGE);
        fill_random(data_, bytes_);
        dev_.register_host(data_, bytes_);
        description_ =
            "emulated stand-in for cudaHostAlloc (no GPU: an anonymous mmap with "
            "MADV_NOHUGEPAGE, registered with the emulated device), " +
            pages_of(data_) + ", first page on NUMA node " + node_words(node_of(data_));
      }
      break;
    }
    case PoolKind::kGfd: {
      HostPoolOptions o;
      o.bytes = bytes;
      o.device = dev_.ordinal();
      o.numa_node = -1;  // the GPU's node (none where the system reports no locality)
      o.register_memory = pinned;
      host_pool_ = std::make_unique<HostPool>(testkit::make_host_pool(dev_, o));
      data_ = host_pool_->data();
      fill_random(data_, bytes_);
      description_ =
          std::string("gfd::HostPool, hugepages ") + gfd::to_string(host_pool_->hugepages()) +
          " (" + pages_of(data_) + "), NUMA node " +
          (host_pool_->numa_node() < 0 ? std::string("not bound (no locality reported)")
                                       : std::to_string(host_pool_->numa_node()) + " (bound)") +
          ", " + (host_pool_->registered() ? "registered" : "pageable") +
          (dev_.emulated() ? " with the emulated device" : "");
      break;
    }
    case PoolKind::kMmap: {
      data_ = static_cast<std::byte*>(map_anonymous(bytes, "mmap"));
      mapped_ = bytes;
      fill_random(data_, bytes_);
      if (pinned) dev_.register_host(data_, bytes_);
      description_ = "anonymous mmap" +
                     std::string(pinned ? " + cudaHostRegister" : " (pageable)") + ", " +
                     pages_of(data_) + ", first page on NUMA node " + node_words(node_of(data_)) +
                     (pinned && dev_.emulated() ? ", registered with the emulated device" : "");
      break;
    }
  }
}

SourcePool::~SourcePool() {
  if (cuda_host_alloc_) {
    (void)cudaFreeHost(data_);
  } else if (mapped_ != 0) {
    if (pinned_) dev_.unregister_host(data_);
    munmap(data_, mapped_);
  }
  host_pool_.reset();  // unregisters and unmaps
}

}  // namespace gfd::bench
