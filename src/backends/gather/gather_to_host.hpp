// Device to host through staging. Each chunk's device side is moved into its slot on the
// device-to-host lane (packed on the GPU first when its device blocks are scattered), then the
// gather threads place the slot's bytes at the host destinations. A large transfer is planned a
// stretch of blocks at a time and each chunk's DMA is enqueued as soon as the chunk is planned
// (its device blocks are validated by then, so the DMA reads only valid memory, and it writes
// only the slot); a gather thread notices a chunk's DMA has completed (poll_head_dma), and the
// chunk's pieces become claimable once the whole block list has been found valid. A bad block
// anywhere rejects the transfer: its chunks are then dropped without touching host memory. The
// caller's stream waits for the DMAs (after them the device blocks may change); the handle is
// done when the last piece is placed.
#pragma once

#include <atomic>
#include <optional>
#include <vector>

#include "backends/gather/gather.hpp"

namespace gfd::detail {

class GatherToHost final : public ItemHandler {
 public:
  explicit GatherToHost(StagingPipeline& pipe);
  // Enqueues request `r`: `planned`, a transfer planned whole already, or (nullptr) a new one
  // planned here while its first chunks move. Throws gfd::Error for a bad block (nothing
  // reaches host memory).
  // `bytes`: the blocks' sizes summed (total_bytes), where the caller has them.
  TransferPtr submit(const Request& r, TransferPtr planned,
                     std::optional<std::uint64_t> bytes = std::nullopt);

  Claim claimable(Item& item, bool may_poll) override;
  void run_piece(Item& item, std::uint32_t piece) override;
  void chunk_done(Item& item) override;
  // Every staged chunk of `t` is placed: writes its stream-ordered flag, wakes its waiters.
  static void placed_all(TransferState& t);
  void issue(Item&) override {}  // each chunk's DMA is enqueued at submission

 private:
  // Takes a slot for chunk k, enqueues the chunk's DMA into it and publishes its pieces (caller
  // holds the submission lock). Items enqueued while the transfer is planned go into `held`.
  // `valid`: the transfer is known valid, so a host_direct chunk may write host memory in place.
  void enqueue_chunk(const TransferPtr& t, std::uint32_t k, std::vector<Item*>* held, bool valid);
  // A host_direct chunk of a transfer known valid, in slot `slot`: its DMAs write the host
  // destinations in place.
  void enqueue_in_place(const TransferPtr& t, std::uint32_t k, std::uint32_t slot);
  bool poll_head_dma(Item& item);
  // After the enqueues: the stream-ordered flag, the caller's stream joined (or, rejected, the
  // rejection thrown once the stream waits for the DMAs that read device blocks).
  void join_caller(const Request& r, TransferState& t, std::exception_ptr rejected);
  // The head item's DMA flag is not written yet: every 1 ms of that wait, asks the FaultWatch
  // about the slot's event, and throws the device fault it found (poller only).
  void check_fault(const Item& item, const Slot& s);
  // Batched packing: enqueues the chunks left in pending_ with one
  // packing launch, then lets the gather threads poll their `done` events (Item::awaiting_dma).
  // Caller holds the submission lock. On a device error every pending item is made ready (its
  // pieces place nothing) and the error is thrown.
  void flush_packs(const TransferPtr& t);

  class Submission;  // submit's enqueues for one transfer (gather_to_host_submit.cpp)

  // A chunk published whose packing and DMA wait for flush_packs.
  struct PendingPack {
    Item* item;
    std::uint32_t chunk;
    std::uint32_t slot;
  };
  StagingPipeline& p_;
  std::vector<PendingPack> pending_;     // under the submission lock; empty between submissions
  std::uint32_t pack_limit_ = 1;         // chunks one packing launch takes at most
  std::atomic<bool> dma_poller_{false};  // a thread is polling the head item's DMA
  // check_fault's wait (the poller's): the item and flag value waited for, the last look, and
  // its requests to the FaultWatch.
  const Item* waiting_for_ = nullptr;
  std::uint64_t waiting_value_ = 0;
  Clock::time_point look_{};
  FaultLook fault_look_;
};

}  // namespace gfd::detail
