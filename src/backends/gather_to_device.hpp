// Host to device through staging. Each chunk takes the next slot; its pieces are claimed in
// order by the gather threads (and the submitter); the thread that finishes the chunk's last
// piece lets its DMA go: with preissue by setting the slot's flag that the already-enqueued DMA
// waits on, otherwise by marking the item ready for the in-order issuer. The caller's stream
// waits on the transfer's done event.
#pragma once

#include "backends/gather.hpp"

namespace gfd::detail {

class GatherToDevice final : public ItemHandler {
 public:
  explicit GatherToDevice(StagingPipeline& pipe) : p_(pipe) {}
  // Enqueues the planned transfer `t`; returns once every DMA is enqueued.
  void submit(const TransferPtr& t, StreamHandle stream);

  void run_piece(Item& item, std::uint32_t piece) override;
  void chunk_done(Item& item) override;
  void issue(Item& item) override;

 private:
  void gather_piece(const Item& item, std::uint32_t piece);
  void enqueue_issued(TransferState& t, std::uint32_t index, std::uint32_t slot, bool wait);
  void issue_chunk(Item& item);

  StagingPipeline& p_;
};

}  // namespace gfd::detail
