// gfd — a runtime's caches described to an engine once; transfers then pass only block ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "gfd/types.hpp"

namespace gfd {

namespace detail {
struct CacheSetState;
}  // namespace detail

/// An array of fixed-size blocks: block i is the `block_bytes` bytes at `base + i * stride`.
struct BlockArray {
  void* base = nullptr;
  std::size_t blocks = 0;       ///< how many blocks (ids 0 .. blocks - 1)
  std::size_t block_bytes = 0;  ///< bytes of one block
  std::size_t stride = 0;       ///< bytes from one block's start to the next's; 0 = block_bytes
};

/// One host cache and the device cache it mirrors (one layer's K or V array, say). Block ids
/// of a transfer index both: a swap-in moves host block `src_ids[i]` to device block
/// `dst_ids[i]`, a swap-out device block `src_ids[i]` to host block `dst_ids[i]`.
struct CachePair {
  BlockArray host;    ///< host memory, pinned (fastest) or pageable
  BlockArray device;  ///< device memory of the engine's GPU
};

/// A read-only view of block ids: `count` signed integers of `width` bytes (4 or 8), the i-th
/// at byte `i * stride` from `data` (a column of an [N, 2] mapping has stride 16 for int64).
struct BlockIds {
  const void* data = nullptr;
  std::size_t count = 0;
  std::ptrdiff_t stride = 8;
  std::uint8_t width = 8;

  BlockIds() = default;
  BlockIds(const void* d, std::size_t n, std::ptrdiff_t stride_bytes, std::uint8_t w)
      : data(d), count(n), stride(stride_bytes), width(w) {}
  BlockIds(std::span<const std::int64_t> s)
      : data(s.data()), count(s.size()), stride(8), width(8) {}
  BlockIds(std::span<const std::int32_t> s)
      : data(s.data()), count(s.size()), stride(4), width(4) {}
  BlockIds(const std::vector<std::int64_t>& v) : BlockIds(std::span<const std::int64_t>(v)) {}
  BlockIds(const std::vector<std::int32_t>& v) : BlockIds(std::span<const std::int32_t>(v)) {}

  /// Element i (no bounds check).
  std::int64_t operator[](std::size_t i) const {
    const auto* p = static_cast<const std::byte*>(data) + static_cast<std::ptrdiff_t>(i) * stride;
    if (width == 4) return *reinterpret_cast<const std::int32_t*>(p);
    return *reinterpret_cast<const std::int64_t*>(p);
  }
};

/// A set of cache pairs registered with one engine (Engine::register_caches): checked once
/// when made (every device array lies in device memory of the engine's GPU, every host array
/// in host memory, both sides of a pair have one block size, no two arrays of the set overlap,
/// whether each host array is pinned), so that a transfer (Engine::copy_blocks) checks only its
/// block ids and builds its copy list in one loop with no driver call per block or per array.
///
/// The memory must stay allocated while the set is used; the set does not own it. Cheap to
/// copy: copies share one description. A default-constructed set is empty and cannot be used.
class CacheSet {
 public:
  CacheSet() = default;

  /// Cache pairs in the set.
  std::size_t size() const;
  /// Pair i as registered (strides resolved: never 0).
  const CachePair& pair(std::size_t i) const;
  /// Whether every host array lies in pinned (page-locked, registered) memory.
  bool host_pinned() const;
  /// Whether host array i lies in pinned memory.
  bool host_pinned(std::size_t i) const;
  /// The CUDA device the set was registered for.
  int device() const;
  /// Bytes one block id moves: the sum of every pair's block size.
  std::size_t bytes_per_id() const;
  /// The fewest blocks any host array has, and any device array has (ids beyond are rejected).
  std::size_t host_blocks() const;
  std::size_t device_blocks() const;

 private:
  friend struct detail::CacheSetState;
  explicit CacheSet(std::shared_ptr<const detail::CacheSetState> s) : state_(std::move(s)) {}
  std::shared_ptr<const detail::CacheSetState> state_;
};

}  // namespace gfd
