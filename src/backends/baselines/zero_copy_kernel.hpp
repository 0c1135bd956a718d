// zero_copy_kernel: an SM kernel reads pinned host memory through unified addressing and writes
// the device blocks (or the reverse), on the caller's stream. The block list goes into staging
// slots (pinned, read by the kernel over PCIe); each slot is reused only after the kernel that
// reads it has finished. Also used by the gather backend for small transfers with pinned host
// memory (EngineOptions::kernel_max_bytes), on the gather backend's own ring.
#pragma once

#include <memory>

#include "backends/backend.hpp"
#include "common/sync.hpp"
#include "pipeline/slot_ring.hpp"

namespace gfd::detail {

class ZeroCopyKernel {
 public:
  // Entries go into `ring`'s slots, taken under `submit_lock` (shared with the ring's other users).
  ZeroCopyKernel(EngineContext& ctx, SlotRing& ring, FifoMutex& submit_lock)
      : ctx_(ctx), ring_(ring), lock_(submit_lock) {}
  // Launches the planned transfer (its ops and direct copies alike) on `stream` and finalizes it.
  void submit(TransferState& t, StreamHandle stream);

 private:
  EngineContext& ctx_;
  SlotRing& ring_;
  FifoMutex& lock_;
};

std::unique_ptr<BackendImpl> make_zero_copy_kernel(const BackendSetup& setup);

}  // namespace gfd::detail
