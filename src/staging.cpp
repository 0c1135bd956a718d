#include "staging.hpp"

#include <numa.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "gfd/error.hpp"

namespace gfd::detail {
namespace {
constexpr std::size_t kHuge = std::size_t{2} << 20;
}

HostStaging::HostStaging(Device& device, std::size_t bytes, int numa_node)
    : device_(device), bytes_(bytes) {
  const std::size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
  // 1. Reserved hugetlb pages: fewest TLB misses for the DMA engine and the gather threads.
  // No MAP_NORESERVE: without reserved pages the mmap must fail here, not SIGBUS on touch.
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (p != MAP_FAILED) {
    mapping_ = p;
    mapped_ = rounded;
    data_ = static_cast<std::byte*>(p);
    kind_ = HugepageKind::kHugetlb;
  } else {
    // 2. Transparent huge pages: over-map by 2 MB so the region can start on a 2 MB boundary,
    // which THP needs to back it with huge pages.
    mapped_ = rounded + kHuge;
    p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      throw Error(ErrorCode::kSystem, "staging: mmap of " + std::to_string(mapped_) +
                                          " bytes failed: " + std::strerror(errno));
    mapping_ = p;
    const auto a = (reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) / kHuge * kHuge;
    data_ = reinterpret_cast<std::byte*>(a);
    kind_ = madvise(data_, rounded, MADV_HUGEPAGE) == 0 ? HugepageKind::kTransparent
                                                         : HugepageKind::kNone;
  }
  // Bind before the first touch so the pages are allocated on the GPU's node.
  if (numa_node >= 0 && numa_available() >= 0 && numa_node <= numa_max_node()) {
    numa_tonode_memory(data_, rounded, numa_node);
    bound_ = true;
  }
  std::memset(data_, 0, rounded);  // fault every page in now, not during the first transfer
  try {
    device_.register_host(data_, rounded);
  } catch (...) {
    munmap(mapping_, mapped_);
    throw;
  }
}

HostStaging::~HostStaging() {
  device_.unregister_host(data_);
  munmap(mapping_, mapped_);
}

}  // namespace gfd::detail
