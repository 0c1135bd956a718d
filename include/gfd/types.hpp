// gfd — basic value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gfd {

/// One block to copy: `bytes` bytes from `src` to `dst`.
/// For a host-to-device transfer `src` is host memory (pinned or pageable) and `dst` is
/// device memory of the engine's GPU.
struct BlockCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};

/// How a transfer is carried out.
enum class Backend {
  kGather,  ///< gfd's pipeline: CPU gather into a pinned staging ring, large DMAs (default)
};

/// What kind of pages back the staging ring.
enum class HugepageKind {
  kHugetlb,      ///< reserved hugetlbfs pages (MAP_HUGETLB)
  kTransparent,  ///< transparent huge pages requested with madvise(MADV_HUGEPAGE)
  kNone,         ///< ordinary 4 KB pages
};

const char* to_string(Backend backend) noexcept;
const char* to_string(HugepageKind kind) noexcept;

}  // namespace gfd
