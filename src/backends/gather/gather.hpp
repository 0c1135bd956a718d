// gather: gfd's own path. CPU gather threads pack scattered host blocks into a pinned staging
// ring and the copy engine moves each slot in one large DMA on a dedicated lane (host to device,
// gather_to_device.hpp); device to host runs the other way round (gather_to_host.hpp). Small
// transfers with pinned host memory may go through the zero-copy kernel instead
// (kernel_max_bytes), on this backend's ring.
#pragma once

#include <memory>

#include "backends/backend.hpp"
#include "common/sync.hpp"
#include "host/gather_copy.hpp"
#include "host/gather_pool.hpp"
#include "pipeline/copy_lanes.hpp"
#include "pipeline/slot_ring.hpp"
#include "pipeline/work_queue.hpp"

namespace gfd::detail {

// The staging pipeline's stages, assembled once per engine and shared by both directions.
struct StagingPipeline {
  explicit StagingPipeline(const BackendSetup& setup);
  ~StagingPipeline();
  StagingPipeline(const StagingPipeline&) = delete;
  StagingPipeline& operator=(const StagingPipeline&) = delete;

  std::shared_ptr<EngineContext> ctx;
  const EngineOptions& options;
  // Serialises submissions: slots and items are taken in ring order, one transfer at a time.
  FifoMutex lock;
  SlotRing ring;
  CopyLanes lanes;
  WorkQueue queue;
  StoreKind store;
  // DMAs are enqueued at submission behind slot flags (stream memory operations), so that no
  // driver call sits between the end of a chunk's gathering and its DMA.
  bool preissue;
  // Asks the device about faults for the gather threads (before the pool: it outlives them).
  FaultWatch watch;
  // Declared last: its threads stop before the stages they work on go away.
  std::unique_ptr<GatherPool> pool;
};

std::unique_ptr<BackendImpl> make_gather(const BackendSetup& setup);

}  // namespace gfd::detail
