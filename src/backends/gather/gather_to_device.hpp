// Host to device through staging. Each chunk takes the next slot; its pieces are claimed in
// order by the gather threads (and the submitter); the thread that finishes the chunk's last
// piece lets its DMA go: with preissue by setting the slot's flag that the already-enqueued DMA
// waits on, otherwise by marking the item ready for the in-order issuer. The caller's stream
// waits on the transfer's done event. A large transfer is packed while it is gathered
// (submit_planning); its DMAs are enqueued once every block has been checked.
#pragma once

#include <atomic>
#include <vector>

#include "backends/gather/gather.hpp"

namespace gfd::detail {

class GatherToDevice final : public ItemHandler {
 public:
  explicit GatherToDevice(StagingPipeline& pipe);
  // Enqueues the planned transfer `t` on the copy lanes; returns once every DMA is enqueued.
  void submit(const TransferPtr& t, StreamHandle stream);
  // A one-chunk transfer of at most inline_gather_bytes: gathered here, moved on `stream` with
  // three driver calls (DMA, slot event, done event) instead of the lanes' seven.
  void submit_inline(TransferState& t, StreamHandle stream);
  // A one-chunk transfer larger than that: the pool gathers with this thread, which then moves
  // it on `stream` (with one chunk there is nothing for the lanes to overlap).
  void submit_one_chunk(const TransferPtr& t, StreamHandle stream);
  // Plans `r` while its chunks are gathered: packs the list a stretch at a time, and the gather
  // threads start on each chunk as soon as it is packed; every block is checked before the
  // first DMA is enqueued (a bad block throws gfd::Error naming it, and nothing moves). Returns
  // once every DMA is enqueued, like submit().
  // `bytes`: the blocks' sizes summed (total_bytes).
  TransferPtr submit_planning(const Request& r, std::uint64_t bytes);

  // A chunk whose slot is still being placed from its last chunk: one thread at a time watches
  // the slot's flag (kBusy), the others find nothing to do; the watcher wakes them once it is
  // free. Any thread may watch, a submitter too (it asks the device about faults as
  // SlotRing::acquire would have: the pool's threads may all have parked meanwhile).
  Claim claimable(Item& item, bool may_poll) override;
  void run_piece(Item& item, std::uint32_t piece) override;
  void chunk_done(Item& item) override;
  void issue(Item& item) override;

 private:
  // Both: the one chunk from slot `s` on `stream`, and the transfer's done event after it.
  void move_on_stream(TransferState& t, Slot& s, StreamHandle stream);
  // Takes the next slot for chunk `k`, writes its scatter entries and hands its pieces to the
  // pool, as an item of `handler` (this one: its DMA is enqueued or issued as a lane's).
  // With preissue, a gathered chunk of this handler may take a slot whose last chunk is still
  // to be placed (SlotRing::acquire's `free_at`): its pieces wait for the slot (claimable), so
  // that a transfer larger than the ring does not hold its caller until slots come back.
  Item& publish_chunk(const TransferPtr& t, std::uint32_t k, ItemHandler& handler);
  Item& publish_chunk(const TransferPtr& t, std::uint32_t k) { return publish_chunk(t, k, *this); }
  void enqueue_issued(TransferState& t, std::uint32_t index, std::uint32_t slot, bool wait);
  // The transfer's direct copies, and its finalization (lanes joined, done event recorded):
  // enqueued now with preissue, otherwise handed to the in-order issuer.
  void add_directs(const TransferPtr& t);
  void add_finalize(const TransferPtr& t);
  // After the enqueues: the submitter gathers too, then issues what is ready and makes the
  // caller's stream wait for the transfer.
  void finish_submit(TransferState& t, StreamHandle stream);
  void issue_chunk(Item& item);

  // The items of submit_one_chunk's chunks: gathered like any other, but their submitter moves
  // them itself once they are ready, so finishing one sets no flag and the issuer skips it.
  class OwnChunk final : public ItemHandler {
   public:
    explicit OwnChunk(GatherToDevice& g) : g_(g) {}
    void run_piece(Item& item, std::uint32_t piece) override { g_.run_piece(item, piece); }
    void chunk_done(Item&) override {}
    void issue(Item&) override {}

   private:
    GatherToDevice& g_;
  };

  StagingPipeline& p_;
  OwnChunk own_chunk_{*this};
  std::atomic<bool> slot_watcher_{false};  // a thread watches the head chunk's slot (claimable)
  std::vector<Item*> items_;  // submit_planning: each chunk's item (under the submission lock)
  // submit_planning: the chunks published before the whole list is checked hold at least this
  // much (the ramp's first three chunks by default: 1.75 MB), so that the gather threads start
  // while the rest of the list is checked.
  const std::uint64_t early_publish_bytes_;
  // submit_planning: blocks packed at most between two looks for closed chunks to publish.
  static constexpr std::size_t max_stretch_ = 128;
  class Planning;  // submit_planning's state for one transfer (gather_to_device_planning.cpp)
};

}  // namespace gfd::detail
