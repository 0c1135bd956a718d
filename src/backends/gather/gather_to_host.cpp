#include "backends/gather/gather_to_host.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>

#include "gfd/error.hpp"
#include "pipeline/engine_context.hpp"

namespace gfd::detail {

GatherToHost::GatherToHost(StagingPipeline& pipe) : p_(pipe) {
  // A packing launch never takes more than half the ring, so the slot a submitter waits for is
  // never one of a launch still to be made.
  const std::size_t limit =
      std::min<std::size_t>({static_cast<std::size_t>(std::max(p_.ctx->tuning.placement_chunks, 1)),
                             p_.ring.size() / 2, kMaxPlaceChunks});
  pack_limit_ = static_cast<std::uint32_t>(std::max<std::size_t>(limit, 1));
  pending_.reserve(pack_limit_);
}

void GatherToHost::placed_all(TransferState& t) {
  if (t.host_flag != nullptr) t.ctx->host_flags.signal({t.host_flag, t.host_flag_value});
  t.host_left.notify_all();
}

void GatherToHost::enqueue_chunk(const TransferPtr& t, std::uint32_t k, std::vector<Item*>* held,
                                 bool valid) {
  const PlannedChunk& c = t->plan.chunks[k];
  // Batched packing: a chunk whose device blocks are scattered waits in pending_ for one packing
  // launch with the next ones; pending chunks go out before any other chunk (the lane's order).
  // The submitter may wait for a slot with chunks pending: the slot it waits for was taken at
  // least half the ring earlier (pack_limit_), by a chunk whose DMA is enqueued.
  const bool grouped = !c.contiguous_device && !(c.host_direct && valid);
  if (!grouped) flush_packs(t);
  const std::uint32_t slot = p_.ring.acquire();
  if (c.host_direct && valid) return enqueue_in_place(t, k, slot);
  // A plan made from ids: the chunk's ops, which the pack kernel's entries and then the pieces
  // that place the bytes read, are made now.
  if (ops_to_make(t->plan, c)) make_ops(t->plan, c.op_begin, c.op_end, c.op_begin);
  Item& it = p_.queue.append(Item::Kind::kChunk, this, t, k, slot, false);
  if (held != nullptr) {
    it.held.store(true, std::memory_order_relaxed);
    held->push_back(&it);
  }
  const std::uint32_t pieces = c.piece_end - c.piece_begin;
  it.piece_begin = c.piece_begin;
  it.dma_ready.store(false, std::memory_order_relaxed);
  it.pieces_left.store(pieces, std::memory_order_relaxed);
  // The slot stays taken (kGathering) until its bytes are placed, not just until the DMA has
  // filled it: the last piece frees it (chunk_done).
  t->host_left.fetch_add(1, std::memory_order_relaxed);
  if (grouped) {
    // Published now (the queue takes items in order), claimable once flush_packs has enqueued
    // its DMA and `done`.
    it.awaiting_dma.store(true, std::memory_order_relaxed);
    pending_.push_back(PendingPack{&it, k, slot});
    p_.queue.publish_for_pool(it, pieces, k == 0);
    p_.ctx->tracer.record(t->id, TraceEvent::kChunkPublished, k, pieces);
    // The transfer's first chunk alone, so that the copy engine starts at once.
    if (k == 0 || pending_.size() >= pack_limit_) flush_packs(t);
    return;
  }
  try {
    p_.lanes.enqueue_to_host(*t, k, p_.ring[slot]);
  } catch (...) {
    // Nothing will arrive in the slot: let the pieces run (a failed transfer's pieces place
    // nothing) so that the items behind keep moving.
    it.dma_ready.store(true, std::memory_order_release);
    p_.queue.publish(it, pieces);
    p_.queue.wake();
    throw;
  }
  p_.queue.publish_for_pool(it, pieces, k == 0);
  p_.ctx->tracer.record(t->id, TraceEvent::kChunkPublished, k, pieces);
}

void GatherToHost::enqueue_in_place(const TransferPtr& t, std::uint32_t k, std::uint32_t slot) {
  // The copy engine writes the host destinations itself: no piece to place, and the slot is
  // free again once its DMAs are done (as a host-to-device slot).
  Item& it = p_.queue.append(Item::Kind::kChunk, this, t, k, slot, true);
  Slot& s = p_.ring[slot];
  try {
    s.issue([&] { p_.lanes.enqueue_to_host(*t, k, s, true); });
  } catch (...) {
    p_.queue.publish_empty(it);
    throw;
  }
  p_.queue.publish_empty(it);
  p_.ctx->tracer.record(t->id, TraceEvent::kChunkPublished, k, 0);
}

void GatherToHost::flush_packs(const TransferPtr& t) {
  if (pending_.empty()) return;
  std::uint32_t index[kMaxPlaceChunks];
  Slot* slots[kMaxPlaceChunks];
  const auto n = static_cast<std::uint32_t>(pending_.size());
  for (std::uint32_t i = 0; i < n; ++i) {
    index[i] = pending_[i].chunk;
    slots[i] = &p_.ring[pending_[i].slot];
  }
  std::exception_ptr failed;
  try {
    p_.lanes.enqueue_packed_to_host(*t, index, slots, n);
  } catch (...) {
    failed = std::current_exception();
  }
  for (const PendingPack& pp : pending_) {
    // Failed: nothing will arrive in the slot; the pieces run (placing nothing) and free it.
    if (failed) pp.item->dma_ready.store(true, std::memory_order_release);
    pp.item->awaiting_dma.store(false, std::memory_order_release);
  }
  pending_.clear();
  if (failed) {
    p_.queue.wake();
    std::rethrow_exception(failed);
  }
}

ItemHandler::Claim GatherToHost::claimable(Item& item, bool may_poll) {
  if (item.dma_ready.load(std::memory_order_acquire)) return Claim::kYes;
  if (!may_poll) return Claim::kNotNow;
  if (poll_head_dma(item)) return Claim::kYes;
  // The chunk's bytes are not in the slot yet. The polling thread keeps looking (it counts as
  // busy, so it does not park); the others have nothing to do.
  return dma_poller_.load(std::memory_order_acquire) ? Claim::kNotNow : Claim::kBusy;
}

// The head item's DMA may not have completed: one thread at a time asks the device; the others
// find no work and park. True when the chunk can be placed (or its DMA failed, which its
// transfer then reports).
bool GatherToHost::poll_head_dma(Item& item) {
  if (item.dma_ready.load(std::memory_order_acquire)) return true;
  // The transfer is still being planned: its bytes may be placed only once it is found valid.
  // Or its DMA waits for a packing launch with the next chunks: its `done` is not recorded yet.
  if (item.held.load(std::memory_order_acquire) ||
      item.awaiting_dma.load(std::memory_order_acquire))
    return false;
  if (dma_poller_.exchange(true, std::memory_order_acq_rel)) return false;
  // Only a poller sets dma_ready: checked again while holding the poller's flag, the chunk
  // cannot have been placed and issued (and `item.t` reset) under us.
  if (item.dma_ready.load(std::memory_order_acquire) || item.held.load(std::memory_order_acquire) ||
      item.awaiting_dma.load(std::memory_order_acquire)) {
    dma_poller_.store(false, std::memory_order_release);
    return item.dma_ready.load(std::memory_order_acquire);
  }
  bool ready = false;
  try {
    const Slot& s = p_.ring[item.slot];
    if (s.dma_flag != nullptr) {
      // The flag stream writes the slot's DMA flag once the DMA is done: no driver call here (see
      // FaultWatch).
      ready = std::atomic_ref<std::uint64_t>(*s.dma_flag).load(std::memory_order_acquire) >=
              s.dma_value;
      if (!ready) check_fault(item, s);
    } else {
      ready = p_.ctx->device->event_done(s.done);
    }
  } catch (...) {
    item.t->fail(std::current_exception());
    ready = true;
  }
  if (ready) item.dma_ready.store(true, std::memory_order_release);
  dma_poller_.store(false, std::memory_order_release);
  if (ready) p_.queue.wake();
  return ready;
}

void GatherToHost::check_fault(const Item& item, const Slot& s) {
  const auto now = Clock::now();
  if (waiting_for_ != &item || waiting_value_ != s.dma_value) {
    waiting_for_ = &item;
    waiting_value_ = s.dma_value;
    look_ = now;
    fault_look_ = FaultLook{};
    return;
  }
  if (fault_look_.step(p_.watch, s.done, now - look_ >= std::chrono::milliseconds(1))) look_ = now;
}

void GatherToHost::run_piece(Item& item, std::uint32_t piece) {
  const TransferState& t = *item.t;
  const Plan& p = t.plan;
  const PlannedPiece& pc = p.pieces[piece];
  const auto t0 = Clock::now();
  // A rejected or failed transfer places nothing: its slot holds nothing worth placing.
  if (t.plan_state.load(std::memory_order_acquire) == TransferState::kValid &&
      !t.failed.load(std::memory_order_acquire))
    scatter_ops(p.ops.data() + pc.op_begin, pc.op_end - pc.op_begin, p_.ring[item.slot].host,
                p_.store);
  Counters::add(p_.ctx->counters.gather_ns, ns_since(t0));
}

void GatherToHost::chunk_done(Item& item) {
  // Placed: the slot may be reused. Its DMA is known to be done (the chunk became placeable when
  // its event completed), so the next user need not ask the device again; after a failure that
  // is not known.
  Slot& s = p_.ring[item.slot];
  TransferState& t = *item.t;
  s.state.store(t.failure() ? Slot::kIssued : Slot::kFree, std::memory_order_release);
  s.state.notify_all();
  if (t.host_left.fetch_sub(1, std::memory_order_acq_rel) == 1) placed_all(t);
}

}  // namespace gfd::detail
