// PageableCache: the engine-wide, lossy table of 2 MiB regions known to hold pageable host memory.
#include <algorithm>
#include <chrono>

#include "planning/planner.hpp"

namespace gfd::detail {

PageableCache::PageableCache(std::uint32_t ttl_ms)
    : ttl_ms_(
          std::min<std::uint32_t>(ttl_ms, 1u << (kStampBits - 1))),  // stamps compare modulo 2^24
      table_(std::make_unique<std::atomic<std::uint64_t>[]>(kEntries)) {
  clear();
}

std::uint32_t PageableCache::now_ms() const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
  return static_cast<std::uint32_t>(ms.count()) & ((1u << kStampBits) - 1);
}

std::size_t PageableCache::index(std::uintptr_t granule) const {
  return static_cast<std::size_t>((granule * 0x9E3779B97F4A7C15ull) >> (64 - kIndexBits));
}

// An entry is the region's number above kStampBits and the time it was learned below; 0 is empty
// (region 0, the first 2 MiB of the address space, is never stored).
bool PageableCache::contains(std::uintptr_t address, std::uint32_t now) const {
  const std::uintptr_t g = address >> kGranuleShift;
  const std::uint64_t e = table_[index(g)].load(std::memory_order_relaxed);
  if (g == 0 || (e >> kStampBits) != g) return false;
  const auto stamp = static_cast<std::uint32_t>(e) & ((1u << kStampBits) - 1);
  return ((now - stamp) & ((1u << kStampBits) - 1)) < ttl_ms_;
}

void PageableCache::insert(std::uintptr_t address, std::uint32_t now) {
  const std::uintptr_t g = address >> kGranuleShift;
  if (g == 0 || ttl_ms_ == 0) return;
  table_[index(g)].store((std::uint64_t{g} << kStampBits) | now, std::memory_order_relaxed);
}

void PageableCache::clear() {
  for (std::size_t i = 0; i < kEntries; ++i) table_[i].store(0, std::memory_order_relaxed);
}

}  // namespace gfd::detail
