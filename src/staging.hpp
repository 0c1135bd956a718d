// Pinned host staging memory for one engine: hugepage-backed where the system allows, bound to
// the GPU's NUMA node, registered with the device once for the engine's whole life.
#pragma once

#include <cstddef>

#include "device.hpp"
#include "gfd/types.hpp"

namespace gfd::detail {

class HostStaging {
 public:
  // numa_node < 0: no binding. Throws gfd::Error when memory cannot be had or registered.
  HostStaging(Device& device, std::size_t bytes, int numa_node);
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  HugepageKind hugepages() const { return kind_; }
  bool numa_bound() const { return bound_; }

 private:
  Device& device_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t mapped_ = 0;
  void* mapping_ = nullptr;
  HugepageKind kind_ = HugepageKind::kNone;
  bool bound_ = false;
};

}  // namespace gfd::detail
