#include "host/host_memory.hpp"

#include <numa.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "gfd/error.hpp"

namespace gfd::detail {
namespace {
constexpr std::size_t kHuge = std::size_t{2} << 20;

// The system's transparent huge page policy, read once.
bool thp_allowed() {
  static const bool allowed = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string text;
    std::getline(f, text);
    return thp_policy_allows_madvise(text);
  }();
  return allowed;
}
}  // namespace

bool thp_policy_allows_madvise(std::string_view enabled) {
  return enabled.find("[never]") == std::string_view::npos;
}

HostMemory::HostMemory(std::size_t bytes, int numa_node, const char* what) {
  rounded_ = (bytes + kHuge - 1) / kHuge * kHuge;
  // 1. Reserved hugetlb pages: fewest TLB misses for the DMA engine and the gather threads.
  // No MAP_NORESERVE: without reserved pages the mmap must fail here, not SIGBUS on touch.
  void* p = mmap(nullptr, rounded_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
  if (p != MAP_FAILED) {
    mapping_ = p;
    mapped_ = rounded_;
    data_ = static_cast<std::byte*>(p);
    kind_ = HugepageKind::kHugetlb;
  } else {
    // 2. Transparent huge pages: over-map by 2 MB so the region can start on a 2 MB boundary,
    // which THP needs to back it with huge pages.
    mapped_ = rounded_ + kHuge;
    p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      mapped_ = 0;
      throw Error(ErrorCode::kSystem, std::string(what) + ": mmap of " +
                                          std::to_string(rounded_ + kHuge) +
                                          " bytes failed: " + std::strerror(err));
    }
    mapping_ = p;
    const auto a = (reinterpret_cast<std::uintptr_t>(p) + kHuge - 1) / kHuge * kHuge;
    data_ = reinterpret_cast<std::byte*>(a);
    // Reported as transparent huge pages only where the request can be granted: with the
    // system's policy at "never" madvise still succeeds and gives 4 KB pages.
    kind_ = madvise(data_, rounded_, MADV_HUGEPAGE) == 0 && thp_allowed()
                ? HugepageKind::kTransparent
                : HugepageKind::kNone;
  }
  // Bind before the first touch so the pages are allocated on the GPU's node.
  if (numa_node >= 0 && numa_available() >= 0 && numa_node <= numa_max_node()) {
    numa_tonode_memory(data_, rounded_, numa_node);
    node_ = numa_node;
  }
}

HostMemory::~HostMemory() { release(); }

HostMemory::HostMemory(HostMemory&& o) noexcept
    : mapping_(std::exchange(o.mapping_, nullptr)),
      mapped_(std::exchange(o.mapped_, 0)),
      data_(std::exchange(o.data_, nullptr)),
      rounded_(std::exchange(o.rounded_, 0)),
      kind_(o.kind_),
      node_(o.node_),
      registered_(std::exchange(o.registered_, nullptr)) {}

HostMemory& HostMemory::operator=(HostMemory&& o) noexcept {
  if (this != &o) {
    release();
    mapping_ = std::exchange(o.mapping_, nullptr);
    mapped_ = std::exchange(o.mapped_, 0);
    data_ = std::exchange(o.data_, nullptr);
    rounded_ = std::exchange(o.rounded_, 0);
    kind_ = o.kind_;
    node_ = o.node_;
    registered_ = std::exchange(o.registered_, nullptr);
  }
  return *this;
}

void HostMemory::populate() { std::memset(data_, 0, rounded_); }

void HostMemory::register_with(Device& device) {
  device.register_host(data_, rounded_);
  registered_ = &device;
}

void HostMemory::release() noexcept {
  // The device must forget the pages before they go back to the kernel.
  if (registered_ != nullptr) registered_->unregister_host(data_);
  registered_ = nullptr;
  if (mapping_ != nullptr) munmap(mapping_, mapped_);
  mapping_ = nullptr;
  data_ = nullptr;
}

}  // namespace gfd::detail
