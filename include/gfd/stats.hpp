// gfd — EngineStats: what an engine has done since it was created (Engine::stats()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gfd/types.hpp"

namespace gfd {

/// Counters of one engine since it was created.
struct EngineStats {
  std::uint64_t bytes = 0;          ///< payload bytes submitted
  std::uint64_t transfers = 0;      ///< transfers submitted
  std::uint64_t blocks = 0;         ///< blocks submitted (before coalescing)
  std::uint64_t chunks = 0;         ///< staged chunks moved (one DMA each)
  std::uint64_t direct_copies = 0;  ///< blocks sent straight from pinned memory, unstaged
  /// 2D copies of constant-stride runs (their blocks are in direct_copies).
  std::uint64_t strided_copies = 0;
  double gather_seconds = 0;       ///< CPU time spent gathering, summed over threads
  double plan_seconds = 0;         ///< time spent validating and planning transfers
  double submit_wait_seconds = 0;  ///< time submitting calls waited for a free staging slot
  HugepageKind hugepages = HugepageKind::kNone;  ///< pages the staging ring got
  int numa_node = -1;             ///< node the ring and threads are bound to (-1: none)
  int gather_threads = 0;         ///< gather threads running
  std::size_t staging_bytes = 0;  ///< staging ring size
  std::size_t slot_bytes = 0;     ///< slot size
  std::vector<int> cpus;          ///< CPUs the gather threads may run on
  int cpu_sharing = 1;            ///< GPUs whose engines split this GPU's local CPUs (1: none)
  /// How the gather threads write staging: EngineOptions::staging_writes as resolved for this
  /// CPU (never kAuto).
  StagingWrites staging_writes = StagingWrites::kPlain;
};

}  // namespace gfd
