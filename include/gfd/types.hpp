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

/// Which way a transfer moves data.
enum class Direction : std::uint8_t {
  kToDevice,  ///< host memory to the engine's GPU
  kToHost,    ///< the engine's GPU to host memory
};

/// How a transfer is carried out. Every backend goes through the same validation, returns the
/// same Transfer handle and keeps the same stream semantics; only the mechanism differs.
enum class Backend {
  kGather,          ///< gfd's pipeline: CPU gather into a pinned staging ring, large DMAs (default)
  kBatchAsync,      ///< cudaMemcpyBatchAsync over the blocks, one call per slot_bytes of blocks
                    ///< (on a default stream, which that call rejects, one cudaMemcpyAsync each)
  kPerBlock,        ///< one cudaMemcpyAsync per block
  kZeroCopyKernel,  ///< an SM kernel reading pinned host memory directly (sources must be pinned)
};

/// Every backend, in the order above.
inline constexpr Backend kAllBackends[] = {Backend::kGather, Backend::kBatchAsync,
                                           Backend::kPerBlock, Backend::kZeroCopyKernel};

/// How the gather threads write the pinned staging ring that the copy engine then reads (and,
/// for device-to-host transfers, how they place blocks; see EngineOptions::staging_writes).
enum class StagingWrites {
  kAuto,       ///< kStreaming where the CPU has it, else kPlain (default; measured fastest)
  kCldemote,   ///< plain stores, then CLDEMOTE of every written line (to the shared L3)
  kStreaming,  ///< non-temporal (streaming) stores, straight to memory
  kPlain,      ///< plain stores only
};

/// Every staging write mode, in the order above.
inline constexpr StagingWrites kAllStagingWrites[] = {
    StagingWrites::kAuto, StagingWrites::kCldemote, StagingWrites::kStreaming,
    StagingWrites::kPlain};

/// What kind of pages back the staging ring.
enum class HugepageKind {
  kHugetlb,      ///< reserved hugetlbfs pages (MAP_HUGETLB)
  kTransparent,  ///< transparent huge pages requested with madvise(MADV_HUGEPAGE)
  kNone,         ///< ordinary 4 KB pages
};

/// "gather", "batch_async", "per_block", "zero_copy_kernel".
const char* to_string(Backend backend) noexcept;
/// The backend named `name` (as to_string gives it); throws gfd::Error listing the names.
Backend backend_from_string(std::string_view name);
const char* to_string(HugepageKind kind) noexcept;
/// "auto", "cldemote", "streaming", "plain".
const char* to_string(StagingWrites writes) noexcept;
/// The mode named `name` (as to_string gives it); throws gfd::Error listing the names.
StagingWrites staging_writes_from_string(std::string_view name);

}  // namespace gfd
