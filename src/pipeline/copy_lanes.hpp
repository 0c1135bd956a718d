// DMA issue on the engine's copy lanes: dedicated non-blocking, highest-priority streams.
// Host-to-device lanes 0..h2d-1 are taken in turn; then one device-to-host lane (one lane keeps
// those DMAs in order, as the gather threads place chunks in order, and apart from host-to-device
// DMAs that may wait on gathering); then one lane where scattered device blocks are packed for
// it; then two lanes for the direct copies of a transfer that stages blocks too (a list of
// blocks of both sizes), which would otherwise queue behind its chunks' DMAs. A
// transfer's first use of a lane makes the lane wait for the transfer's start event on the
// caller's stream, so nothing starts before the work the caller queued first.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "device/device.hpp"
#include "pipeline/slot_ring.hpp"
#include "pipeline/transfer.hpp"

namespace gfd::detail {

struct EngineContext;

class CopyLanes {
 public:
  // Direct copies (and 2D copies) per driver call at most.
  static constexpr std::size_t kGroup = 256;

  // `ring_slots`: the staging ring's slots, which bound the chunks a lane may leave unplaced.
  // `dma_flags`: the ring's slots have DMA flags (RingConfig::dma_flags), written on a stream of
  // their own (see signal_dma_done).
  CopyLanes(EngineContext& ctx, int h2d_lanes, std::size_t ring_slots, bool dma_flags);
  ~CopyLanes();
  CopyLanes(const CopyLanes&) = delete;
  CopyLanes& operator=(const CopyLanes&) = delete;

  // Gives the transfer its start event (recorded on `stream` now) and its lane events.
  void begin(TransferState& t, StreamHandle stream);
  std::uint32_t next_h2d() {
    return static_cast<std::uint32_t>(rr_.fetch_add(1, std::memory_order_relaxed) % h2d_);
  }
  std::uint32_t d2h() const { return h2d_; }
  std::uint32_t pack() const { return h2d_ + 1; }
  std::uint32_t next_direct() {
    return h2d_ + 2 +
           static_cast<std::uint32_t>(rr_direct_.fetch_add(1, std::memory_order_relaxed) %
                                      kDirectLanes);
  }

  // The plan's direct copies (blocks large enough to need no staging, from or to pinned memory),
  // in cudaMemcpyBatchAsync calls: one driver call per group instead of one per block, which is
  // what makes 64 KB-256 KB blocks cheaper straight than staged; then its constant-stride runs,
  // each one 2D copy, in cudaMemcpy3DBatchAsync groups. On the lanes, or all on `on` where given.
  // `first`: copies in the first driver call (later calls double it, up to kGroup).
  void enqueue_directs(TransferState& t, std::optional<StreamHandle> on = std::nullopt,
                       std::size_t first = kGroup);
  // Its direct copies [from, to) alone: host to device on the direct lanes where the plan stages
  // blocks too (a submitter enqueues them stretch by stretch as it packs), on the host-to-device
  // lanes in turn otherwise; device to host on its lane.
  void enqueue_direct_copies(TransferState& t, std::size_t from, std::size_t to,
                             std::optional<StreamHandle> on = std::nullopt,
                             std::size_t first = kGroup);
  // Its constant-stride runs alone.
  void enqueue_runs(TransferState& t, std::optional<StreamHandle> on = std::nullopt);
  // A transfer with nothing staged (its plan only direct copies and runs) on the caller's
  // stream itself: no start event, lane waits or joins (four driver calls, and on the GPU two
  // cross-stream waits, where the whole transfer may be one 160 us 2D copy). Records its done
  // event there and marks it finalized; a device failure is recorded in the transfer.
  // On the legacy default stream (a null handle) the transfer goes on the lanes instead, joined
  // back to it: that stream serialises with every other anyway, and the caller's-stream path
  // failed a GPU test there.
  // `lead` (SetRequest::lead): the first driver call enqueues kLead copies, the next ones twice as
  // many each, so that the copy engine starts on the first blocks while the rest are enqueued
  // (a batch call costs its caller about as long per copy as the link takes to move a page).
  void submit_directs_on(TransferState& t, StreamHandle stream, bool lead = false);
  static constexpr std::size_t kLead = 8;
  // A transfer of 2D runs whose host side is contiguous in each run, through the device twins of
  // staging slots taken from `ring` without waiting (up to kBounceSlots, at most half the ring):
  // host to device, each slot's runs cross the link in one cudaMemcpyBatchAsync on the caller's
  // `stream` (not the legacy default stream) and a device-to-device 2D copy per run on a lane
  // spreads their rows; device to host the other way round. The slots are reused in turn, each use
  // ordered on the GPU after the last (no waiting here), and they are free again once the
  // transfer's work on them has run. The done event goes on `stream`, which waits for the lane.
  // False, with nothing enqueued, where no slot is free now (the caller moves the runs as they
  // are).
  bool submit_bounced(TransferState& t, StreamHandle stream, SlotRing& ring);
  static constexpr std::size_t kBounceSlots = 8;
  // The widest rows that bounce: the copy engine moves rows of 8-16 KiB across the link well
  // below its rate and whole DMAs at it; loads of 32 KiB rows gain nothing for the second copy
  // submission (docs/performance.md, "Design decisions").
  static constexpr std::size_t kBounceMaxLoadWidth = std::size_t{16} << 10;
  static constexpr std::size_t kBounceMaxStoreWidth = std::size_t{32} << 10;
  // Chunk `index` from slot `s` to the device: with `wait`, behind a wait on the slot's flag
  // reaching `flag_value` (set by the thread that finishes gathering the chunk); scattered
  // destinations go through the slot's device twin and the scatter kernel, or, where the ring
  // has placed flags (Tuning::batch_placement), wait on the lane for one placing launch
  // with the lane's next chunks (flush_placing).
  void enqueue_to_device(TransferState& t, std::uint32_t index, Slot& s, bool wait,
                         std::uint64_t flag_value);
  // The same on stream `l` as it stands (no lane, no wait, no timing event): the DMA (and the
  // scatter kernel for scattered destinations), then `s.done`. With `lane_index` (the lane `l`
  // is) and a ring with placed flags, a scattered chunk's placing waits for flush_placing.
  void move_to_device(TransferState& t, std::uint32_t index, Slot& s, StreamHandle l,
                      int lane_index = -1);
  // Places the chunks waiting on lane `lane_index` in one launch there; their slots are free
  // once it has run. On failure their slots are freed at once and the error is thrown.
  void flush_placing(TransferState& t, std::uint32_t lane_index);
  // Launches the placing of the lane where a chunk that frees `placed` (a slot's flag) waits,
  // if one does: a submitter that takes that slot without waiting (SlotRing::acquire's
  // `free_at`) must see its placing enqueued before the DMA of the slot's next chunk, which
  // could otherwise queue ahead of it on the same lane and wait for it for ever.
  void flush_placing_of(TransferState& t, const std::uint64_t* placed);
  // Chunk `index` from the device into slot `s` (packed on the GPU first when its device blocks
  // are scattered); `s.done` follows the DMA. `in_place` (a host_direct chunk whose transfer is
  // known valid): the packed runs go straight to their host destinations instead.
  void enqueue_to_host(TransferState& t, std::uint32_t index, Slot& s, bool in_place = false);
  // Chunks `index[0..n)` (1..kMaxPlaceChunks, each with scattered device blocks) from the device
  // into slots `slot[0..n)` with one packing launch for all of them: the device-to-host lane
  // waits for that launch once, then each chunk's DMA is followed by its slot's `done`.
  void enqueue_packed_to_host(TransferState& t, const std::uint32_t* index, Slot* const* slot,
                              std::uint32_t n);
  // Device to host: the slot's DMA flag (Slot::dma_flag, where the ring has them) set to the
  // slot's next value once `s.done` (just recorded) has fired: written on the flag stream, not on
  // the device-to-host lane, which then carries a DMA and an event per chunk and nothing else
  // (a stream write on the lane itself slowed 16-32 KB transfers to the host).
  void signal_dma_done(Slot& s);
  // A host_direct chunk's DMAs: each run of its host side to or from its place in the slot's
  // device staging area.
  void copy_runs(const Plan& p, const PlannedChunk& c, Slot& s, bool to_host, StreamHandle l);
  // Places every chunk still waiting on a lane, joins the lanes the transfer used into the first
  // of them, records its done event there and marks it finalized (not on lane 0 regardless: a
  // device-to-host transfer must not wait behind host-to-device DMAs). A device failure is
  // recorded in the transfer.
  void finalize(TransferState& t);
  // Waits for every lane to run dry (shutdown).
  void drain() noexcept;

 private:
  // submit_bounced: one slot's runs `b` across the link on `stream` and spread (or gathered) on
  // the device on lane `l`; `reused`: the slot's last runs are waited for first.
  struct Bounce;
  void bounce(const Bounce& b, Slot& sl, bool reused, bool to_host, StreamHandle stream,
              StreamHandle l);
  // Device to host: writes chunk `c`'s pack entries (its device sources) into slot `s` and
  // returns where the packing kernel reads them: the pinned slot over PCIe, or a copy in the
  // slot's device twin (enqueued on pack lane `pk`) where the GPU cannot read host memory.
  const ScatterEntry* pack_entries(const Plan& p, const PlannedChunk& c, Slot& s, StreamHandle pk);
  StreamHandle lane(TransferState& t, std::uint32_t lane);
  // Tracing only: a timing event after chunk `index`'s DMA on `l`.
  void trace_dma(TransferState& t, std::uint32_t index, StreamHandle l);

  EngineContext& ctx_;
  Device& device_;
  std::uint32_t h2d_;
  std::vector<StreamHandle> lanes_;
  StreamHandle flags_ = nullptr;  // where the DMA flags are written (with dma_flags)
  // Batched placement: chunks a lane leaves unplaced at most (placement_chunks, and the lanes
  // together at most half the ring's slots), so that a submitter waiting for a slot never waits
  // for a placing launch that only it would enqueue.
  std::uint32_t place_limit_;
  std::uint32_t place_blocks_;  // thread blocks of one placing launch at most (placement_blocks)
  std::uint32_t* place_counters_ = nullptr;  // device memory, one counter per lane (64 bytes apart)
  static constexpr std::uint32_t kDirectLanes = 2;
  // Next host-to-device lane, round robin: taken by the issuer and, with preissue, submitters.
  std::atomic<std::uint64_t> rr_{0};
  std::atomic<std::uint64_t> rr_direct_{0};
};

}  // namespace gfd::detail
