// gfd — pinned host memory for a runtime's KV pool, laid out the way the gather path reads fastest.
#pragma once

#include <cstddef>
#include <memory>

#include "gfd/types.hpp"

namespace gfd {

namespace detail {
class Device;
struct HostPoolAccess;
}  // namespace detail

/// Options of a HostPool.
struct HostPoolOptions {
  /// Bytes wanted (> 0). The pool maps whole 2 MiB huge pages, so it may get slightly more.
  std::size_t bytes = 0;
  /// CUDA device the pool serves, for NUMA locality (the memory goes on that GPU's node) and for
  /// registration. -1: no GPU in particular: no locality, and registration (if any) through
  /// device 0. Registration is portable, so every GPU of the process can use the pool whatever
  /// this says; one pool may serve the engines of several GPUs.
  int device = 0;
  /// NUMA node the memory is bound to: -1 = the device's node (none where the system reports no
  /// locality, or device is -1); >= 0 = that node; -2 = no binding.
  int numa_node = -1;
  /// Page-lock the pool and register it with CUDA (cudaHostRegister, portable and mapped), so
  /// that the copy engine and kernels of any GPU read it directly. false: ordinary pageable
  /// memory with the same pages and placement (no GPU needed).
  bool register_memory = true;
};

/// An allocator for a serving runtime's host KV pool: one mapping of huge pages where the system
/// gives them (reserved hugetlb pages, else transparent huge pages on a 2 MiB-aligned mapping,
/// else ordinary pages), bound to the GPU's NUMA node and registered with CUDA, reporting what it
/// got. Where host memory is contended, the gather threads then pay fewer page walks per block.
/// The memory is zero-filled, lives as long as the pool and is freed (unregistered and unmapped)
/// on destruction; no transfer may use it after that. Move-only (a moved-from pool is empty).
class HostPool {
 public:
  /// Throws gfd::Error: kInvalidArgument naming the option (bytes 0, a device or NUMA node that
  /// does not exist), kSystem when the memory cannot be had, kCuda (or the code for a missing
  /// GPU) when the device cannot be used or registration fails.
  explicit HostPool(const HostPoolOptions& options);
  /// A pool of `bytes` for `device` with the other options at their defaults.
  explicit HostPool(std::size_t bytes, int device = 0);
  ~HostPool();
  HostPool(HostPool&&) noexcept;
  HostPool& operator=(HostPool&&) noexcept;
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  /// Start of the pool (2 MiB-aligned).
  std::byte* data() const;
  /// Usable bytes: the requested size rounded up to 2 MiB.
  std::size_t bytes() const;
  /// Which pages back the pool.
  HugepageKind hugepages() const;
  /// NUMA node the memory is bound to, or -1 when it is not bound.
  int numa_node() const;
  /// Whether the pool is registered with CUDA (page-locked, usable by every GPU).
  bool registered() const;
  /// The device the pool was made for (HostPoolOptions::device).
  int device() const;

 private:
  struct Impl;
  friend struct detail::HostPoolAccess;
  HostPool(const HostPoolOptions& options, std::shared_ptr<detail::Device> device);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gfd
