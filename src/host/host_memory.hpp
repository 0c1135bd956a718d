// Host memory for the GPU to read and write at the copy engine's full rate: one mapping backed by
// huge pages where the system gives them, bound to a NUMA node, optionally registered with the
// device. The staging ring (pipeline/slot_ring.cpp) and the public HostPool (host_pool.cpp) are
// both made of it, so that they get pages the same way.
#pragma once

#include <cstddef>
#include <string_view>

#include "device/device.hpp"
#include "gfd/types.hpp"

namespace gfd::detail {

// Whether madvise(MADV_HUGEPAGE) can give transparent huge pages under the policy `enabled`
// (the text of /sys/kernel/mm/transparent_hugepage/enabled, e.g. "always [madvise] never"): not
// when "never" is the one selected. Empty text (no such file): assumed yes.
bool thp_policy_allows_madvise(std::string_view enabled);

class HostMemory {
 public:
  HostMemory() = default;
  // Maps `bytes` rounded up to a whole number of 2 MiB huge pages: reserved hugetlb pages if the
  // system has them, else a 2 MiB-aligned mapping with madvise(MADV_HUGEPAGE), else ordinary
  // pages. numa_node >= 0 binds it to that node (mbind, before any page is touched) where libnuma
  // works and the node exists; numa_node < 0 leaves it to the kernel. `what` starts error
  // messages. Throws gfd::Error(kSystem) when the memory cannot be had.
  HostMemory(std::size_t bytes, int numa_node, const char* what);
  ~HostMemory();
  HostMemory(HostMemory&& o) noexcept;
  HostMemory& operator=(HostMemory&& o) noexcept;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // Writes every page now, so that neither the first transfer nor registration pays the faults.
  void populate();
  // Registers the whole rounded range with `device` (page-locked, portable and mapped, see
  // Device::register_host); it is unregistered before the memory is unmapped. `device` must
  // outlive this object.
  void register_with(Device& device);

  std::byte* data() const { return data_; }
  // The usable range: `bytes` rounded up to 2 MiB.
  std::size_t size() const { return rounded_; }
  HugepageKind hugepages() const { return kind_; }
  // The node the memory is bound to, or -1.
  int numa_node() const { return node_; }
  bool registered() const { return registered_ != nullptr; }

 private:
  void release() noexcept;
  void* mapping_ = nullptr;
  std::size_t mapped_ = 0;
  std::byte* data_ = nullptr;
  std::size_t rounded_ = 0;
  HugepageKind kind_ = HugepageKind::kNone;
  int node_ = -1;
  Device* registered_ = nullptr;
};

}  // namespace gfd::detail
