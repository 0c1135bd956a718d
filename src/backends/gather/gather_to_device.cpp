#include "backends/gather/gather_to_device.hpp"

#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>

#include "gfd/error.hpp"
#include "pipeline/engine_context.hpp"

namespace gfd::detail {

GatherToDevice::GatherToDevice(StagingPipeline& pipe)
    : p_(pipe), early_publish_bytes_(std::uint64_t{4} * p_.ctx->plan_config.first_chunk_bytes) {}

void GatherToDevice::submit(const TransferPtr& t, StreamHandle stream) {
  const Plan& p = t->plan;
  {
    std::lock_guard lk(p_.lock);
    p_.lanes.begin(*t, stream);
    p_.ctx->tracer.begin_transfer(*t, stream);
    // From here the transfer must be finalized whatever happens, or the caller would wait forever.
    try {
      if (!p.direct.empty() || !p.strided.empty()) add_directs(t);
      for (std::uint32_t k = 0; k < p.chunks.size(); ++k) {
        const Item& it = publish_chunk(t, k);
        // The DMA waits on the GPU for the gather threads' flag: no driver call is left
        // between the end of the gather and the start of the DMA.
        if (p_.preissue) enqueue_issued(*t, k, it.slot, true);
      }
    } catch (...) {
      t->fail(std::current_exception());
    }
    add_finalize(t);
  }
  finish_submit(*t, stream);
}

// A small transfer: this thread gathers its one chunk and the DMA goes on the caller's stream
// itself, ordered with the caller's work as the copy lanes would be, with three driver calls
// (DMA, slot event, done event) instead of the lanes' six (start event, lane wait, DMA, slot
// event, lane join, stream join): each costs microseconds, about what a 64 KB DMA takes.
void GatherToDevice::submit_inline(TransferState& t, StreamHandle stream) {
  const Plan& p = t.plan;
  const PlannedChunk& c = p.chunks[0];
  {
    std::lock_guard lk(p_.lock);
    p_.ctx->tracer.begin_transfer(t, stream);
    try {
      Slot& s = p_.ring[p_.ring.acquire()];
      p_.ctx->tracer.record(t.id, TraceEvent::kStage, TraceEvent::kSlotTaken, 0);
      if (!c.contiguous_device) write_scatter_entries(p, c, s.host, Direction::kToDevice);
      if (!c.host_direct) {
        const auto t0 = Clock::now();
        gather_ops(p.ops.data() + c.op_begin, c.op_end - c.op_begin, s.host, p_.store);
        Counters::add(p_.ctx->counters.gather_ns, ns_since(t0));
      }
      p_.ctx->tracer.record(t.id, TraceEvent::kStage, TraceEvent::kGathered, 0);
      move_on_stream(t, s, stream);
    } catch (...) {
      t.fail(std::current_exception());
    }
  }
  t.mark_finalized();
}

// A one-chunk transfer too large for this thread alone: the pool gathers it with this thread,
// which then moves it on the caller's stream like submit_inline (no lanes, no joins): with one
// chunk there is nothing for the lanes to overlap, and each join costs the GPU microseconds.
void GatherToDevice::submit_one_chunk(const TransferPtr& t, StreamHandle stream) {
  {
    std::lock_guard lk(p_.lock);
    p_.ctx->tracer.begin_transfer(*t, stream);
    try {
      Item& it = publish_chunk(t, 0, own_chunk_);
      while (!it.ready.load(std::memory_order_acquire))
        if (!p_.queue.run_next_piece(false)) cpu_relax();
      move_on_stream(*t, p_.ring[it.slot], stream);
      p_.ctx->tracer.record(t->id, TraceEvent::kChunkIssued, 0,
                            static_cast<std::uint32_t>(t->plan.chunks[0].data_bytes));
    } catch (...) {
      t->fail(std::current_exception());
    }
  }
  t->mark_finalized();
}

void GatherToDevice::move_on_stream(TransferState& t, Slot& s, StreamHandle stream) {
  s.issue([&] { p_.lanes.move_to_device(t, 0, s, stream); });
  p_.ctx->device->record_event(t.done_event, stream);
}

void GatherToDevice::add_directs(const TransferPtr& t) {
  if (p_.preissue)
    p_.lanes.enqueue_directs(*t);
  else
    p_.queue.publish(p_.queue.append(Item::Kind::kDirect, this, t, 0, 0, true), 0);
}

void GatherToDevice::add_finalize(const TransferPtr& t) {
  if (p_.preissue)
    p_.lanes.finalize(*t);
  else
    p_.queue.publish(p_.queue.append(Item::Kind::kFinalize, this, t, 0, 0, true), 0);
}

void GatherToDevice::finish_submit(TransferState& t, StreamHandle stream) {
  // The submitting thread would only wait now: it gathers too, while parked pool threads wake
  // up (a futex wake-up costs tens of microseconds, a 4 KB block a microsecond). It leaves
  // device-to-host chunks whose DMA is still running to the pool.
  if (p_.options.submitter_gathers)
    while (p_.queue.run_next_piece(false)) {
    }
  // Advances the issue order past what is ready (gathered inline here, say): with preissue
  // nothing else would for a transfer that had no pieces for the pool.
  p_.queue.try_issue();
  if (!p_.preissue) {
    // The caller's stream must not wait on the GPU for anything the host has yet to do with
    // the driver: cudaFree, lazy module loading and other implicit device synchronisations on
    // any thread would then deadlock with the threads that still have to issue this transfer's
    // DMAs. So return once the last DMA is enqueued and make the stream wait on its event.
    // (With preissue every DMA is enqueued already and waits only on flags that the gather
    // threads set without calling the driver.)
    t.finalized.wait(false, std::memory_order_acquire);
  }
  t.join_stream(stream);
}

Item& GatherToDevice::publish_chunk(const TransferPtr& t, std::uint32_t k, ItemHandler& handler) {
  const Plan& p = t->plan;
  const PlannedChunk& c = p.chunks[k];
  // Only chunks the gather threads write into the slot may take it before it is free (the copy
  // engine writes a host_direct chunk's sources into the slot's device side, unasked), and only
  // where every DMA is enqueued in this call: the placing that frees the slot is then enqueued
  // in it too (at the latest here, or at the transfer's end), before anything that waits for it.
  const bool may_defer = p_.preissue && &handler == this && !c.host_direct;
  std::uint64_t free_at = 0;
  const std::uint32_t slot = p_.ring.acquire(may_defer ? &free_at : nullptr);
  Slot& s = p_.ring[slot];
  if (free_at != 0) p_.lanes.flush_placing_of(*t, s.placed);
  Item& it = p_.queue.append(Item::Kind::kChunk, &handler, t, k, slot, c.host_direct);
  if (c.host_direct) {
    if (!c.contiguous_device) write_scatter_entries(p, c, s.host, Direction::kToDevice);
    // Nothing to gather: the copy engine reads the sources in place (CopyLanes::move_to_device),
    // and its DMAs wait for no flag.
    p_.queue.publish_empty(it);
    p_.ctx->tracer.record(t->id, TraceEvent::kChunkPublished, k, 0);
    // Without preissue the issuer enqueues ready chunks, and no gather thread finishes this one
    // to call it: the submitter does, or a transfer longer than the ring would wait for a slot
    // that only issuing frees.
    if (!p_.preissue) p_.queue.try_issue();
    return it;
  }
  const std::uint32_t pieces = c.piece_end - c.piece_begin;
  it.piece_begin = c.piece_begin;
  it.flag_value = ++s.flag_value;
  it.slot_free_at.store(free_at, std::memory_order_relaxed);  // published with the pieces
  it.pieces_left.store(pieces, std::memory_order_relaxed);
  p_.queue.publish_for_pool(it, pieces, k == 0);
  p_.ctx->tracer.record(t->id, TraceEvent::kChunkPublished, k, pieces);
  return it;
}

// Enqueues a chunk at submission (preissue) and marks its slot as carrying a DMA.
void GatherToDevice::enqueue_issued(TransferState& t, std::uint32_t index, std::uint32_t slot,
                                    bool wait) {
  Slot& s = p_.ring[slot];
  const PlannedChunk& c = t.plan.chunks[index];
  s.issue([&] { p_.lanes.enqueue_to_device(t, index, s, wait && !c.host_direct, s.flag_value); });
  p_.ctx->tracer.record(t.id, TraceEvent::kStage, TraceEvent::kEnqueued, index);
  // Nothing to gather, so no thread says when it is ready: its enqueue is the point to trace.
  if (c.host_direct)
    p_.ctx->tracer.record(t.id, TraceEvent::kChunkIssued, index,
                          static_cast<std::uint32_t>(c.data_bytes));
}

ItemHandler::Claim GatherToDevice::claimable(Item& item, bool /*may_poll*/) {
  if (item.slot_free_at.load(std::memory_order_acquire) == 0) return Claim::kYes;
  if (slot_watcher_.exchange(true, std::memory_order_acq_rel)) return Claim::kNotNow;
  // Checked again as the watcher: while slot_free_at is set no piece is claimed, so the item
  // cannot have been issued and reused (nor `item.t` reset) under us.
  const std::uint64_t value = item.slot_free_at.load(std::memory_order_acquire);
  bool freed = value == 0;
  if (!freed) {
    // A long wait (the placing kernel waits for SMs that a model holds) backs off; a device
    // fault is reported to the transfer (its bytes move nowhere) and frees the chunk's pieces.
    thread_local std::optional<PlacedWait> wait;
    const Slot& s = p_.ring[item.slot];
    if (!wait || !wait->waits_for(s, value)) wait.emplace(s, value, &p_.watch);
    try {
      freed = wait->poll(*p_.ctx->device);
    } catch (...) {
      item.t->fail(std::current_exception());
      freed = true;
    }
    if (freed) {
      wait.reset();
      item.slot_free_at.store(0, std::memory_order_release);
    }
  }
  slot_watcher_.store(false, std::memory_order_release);
  if (!freed) return Claim::kBusy;
  if (value != 0) p_.queue.wake();  // the threads that found nothing to do may have parked
  return Claim::kYes;
}

void GatherToDevice::run_piece(Item& item, std::uint32_t piece) {
  const Plan& p = item.t->plan;
  const PlannedPiece& pc = p.pieces[piece];
  const PlannedChunk& c = p.chunks[item.index];
  std::byte* slot = p_.ring[item.slot].host;
  const auto t0 = Clock::now();
  // A plan made from ids: this piece's ops are made here, from the ids, by the thread that uses
  // them.
  if (ops_to_make(p, c)) make_ops(p, pc.op_begin, pc.op_end, c.op_begin);
  // Each piece writes its own ops' scatter entries (which the chunk's DMA carries with the data):
  // spread over the threads instead of written by the submitter as it packs.
  if (!c.contiguous_device)
    stream_scatter_entries(p, c, pc.op_begin, pc.op_end, slot, Direction::kToDevice);
  gather_ops(p.ops.data() + pc.op_begin, pc.op_end - pc.op_begin, slot, p_.store);
  Counters::add(p_.ctx->counters.gather_ns, ns_since(t0));
}

void GatherToDevice::chunk_done(Item& item) {
  if (!p_.preissue) return;  // the issuer enqueues the DMA (issue_chunk)
  p_.ctx->device->signal_value(p_.ring[item.slot].flag, item.flag_value);  // the DMA may start
  p_.ctx->tracer.record(item.t->id, TraceEvent::kChunkIssued, item.index,
                        static_cast<std::uint32_t>(item.t->plan.chunks[item.index].data_bytes));
}

void GatherToDevice::issue(Item& item) {
  if (p_.preissue) return;  // everything was enqueued at submission
  switch (item.kind) {
    case Item::Kind::kChunk:
      issue_chunk(item);
      break;
    case Item::Kind::kDirect:
      try {
        p_.lanes.enqueue_directs(*item.t);
      } catch (...) {
        item.t->fail(std::current_exception());
      }
      break;
    case Item::Kind::kFinalize:
      p_.lanes.finalize(*item.t);
      break;
  }
}

void GatherToDevice::issue_chunk(Item& item) {
  TransferState& t = *item.t;
  Slot& s = p_.ring[item.slot];
  try {
    if (!t.failure()) {  // a failed transfer moves nothing more; its slot is free again at once
      p_.lanes.enqueue_to_device(t, item.index, s, false, 0);
      p_.ctx->tracer.record(t.id, TraceEvent::kChunkIssued, item.index,
                            static_cast<std::uint32_t>(t.plan.chunks[item.index].data_bytes));
    }
  } catch (...) {
    t.fail(std::current_exception());
  }
  s.mark_issued();
}

}  // namespace gfd::detail
