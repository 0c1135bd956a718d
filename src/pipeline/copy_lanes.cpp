#include "pipeline/copy_lanes.hpp"

#include <algorithm>
#include <atomic>

#include "pipeline/engine_context.hpp"

namespace gfd::detail {

namespace {
constexpr std::size_t kCounterStride = 64 / sizeof(std::uint32_t);
}

CopyLanes::CopyLanes(EngineContext& ctx, int h2d_lanes, std::size_t ring_slots, bool dma_flags)
    : ctx_(ctx),
      device_(*ctx.device),
      h2d_(static_cast<std::uint32_t>(h2d_lanes)),
      place_limit_(static_cast<std::uint32_t>(std::clamp<std::size_t>(
          std::min<std::size_t>(ring_slots / (2 * h2d_),
                                static_cast<std::size_t>(ctx.tuning.placement_chunks)),
          1, kMaxPlaceChunks))),
      place_blocks_(static_cast<std::uint32_t>(ctx.tuning.placement_blocks)) {
  try {
    for (std::uint32_t i = 0; i < h2d_ + 2 + kDirectLanes; ++i)
      lanes_.push_back(device_.create_stream());
    if (dma_flags) flags_ = device_.create_stream();
    const std::size_t bytes = h2d_ * kCounterStride * sizeof(std::uint32_t);
    place_counters_ = static_cast<std::uint32_t*>(device_.alloc_device(bytes));
    device_.memset_async(place_counters_, 0, bytes, lanes_[0]);
    device_.stream_sync(lanes_[0]);
  } catch (...) {
    if (place_counters_ != nullptr) device_.free_device(place_counters_);
    for (StreamHandle l : lanes_) device_.destroy_stream(l);
    if (flags_ != nullptr) device_.destroy_stream(flags_);
    throw;
  }
}

CopyLanes::~CopyLanes() {
  for (StreamHandle l : lanes_) device_.destroy_stream(l);
  if (flags_ != nullptr) device_.destroy_stream(flags_);
  device_.free_device(place_counters_);
}

void CopyLanes::begin(TransferState& t, StreamHandle stream) {
  t.start_event = ctx_.events.get();
  t.lane_events.resize(lanes_.size(), nullptr);
  for (std::size_t l = 1; l < lanes_.size(); ++l) t.lane_events[l] = ctx_.events.get();
  device_.record_event(t.start_event, stream);
}

StreamHandle CopyLanes::lane(TransferState& t, std::uint32_t lane) {
  StreamHandle s = lanes_[lane];
  if ((t.lanes_started & (1u << lane)) == 0) {
    device_.stream_wait_event(s, t.start_event);  // after the work already on the caller's stream
    t.lanes_started |= 1u << lane;
  }
  return s;
}

void CopyLanes::enqueue_directs(TransferState& t, std::optional<StreamHandle> on,
                                std::size_t first) {
  enqueue_direct_copies(t, 0, t.plan.direct.size(), on, first);
  enqueue_runs(t, on);
}

void CopyLanes::enqueue_direct_copies(TransferState& t, std::size_t from, std::size_t to,
                                      std::optional<StreamHandle> on, std::size_t first) {
  // (`on` may be the legacy default stream, a null handle.)
  const std::vector<DirectCopy>& direct = t.plan.direct;
  // Groups of kGroup copies alternate between the host-to-device lanes, so that the copy
  // engines can overlap them (device to host keeps its one lane, in order); beside staged
  // chunks, between the direct lanes.
  const bool beside_chunks = !t.to_host() && (!t.plan.ops.empty() || !t.plan.chunks.empty());
  thread_local std::vector<void*> dsts;
  thread_local std::vector<const void*> srcs;
  thread_local std::vector<std::size_t> sizes;
  std::size_t group = std::clamp<std::size_t>(first, 1, kGroup);
  for (std::size_t i = from, n = 0; i < to; i += n, group = std::min(2 * group, kGroup)) {
    // A group of `group` copies, the next of twice as many; a rest shorter than that next group
    // goes with this one where one call takes both.
    const std::size_t left = to - i;
    n = std::min(group, left);
    if (left - n < 2 * group && left <= kGroup) n = left;
    dsts.resize(n);
    srcs.resize(n);
    sizes.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      dsts[k] = direct[i + k].dst;
      srcs[k] = direct[i + k].src;
      sizes[k] = direct[i + k].bytes;
    }
    StreamHandle l = on ? *on
                        : lane(t, t.to_host()     ? d2h()
                                  : beside_chunks ? next_direct()
                                                  : next_h2d());
    if (n == 1 && t.to_host())
      device_.copy_d2h(dsts[0], srcs[0], sizes[0], l);
    else if (n == 1)
      device_.copy_h2d(dsts[0], srcs[0], sizes[0], l);
    else
      device_.copy_batch(dsts.data(), srcs.data(), sizes.data(), n, t.to_host(), l);
    Counters::add(ctx_.counters.direct, n);
  }
}

void CopyLanes::enqueue_runs(TransferState& t, std::optional<StreamHandle> on) {
  // Constant-stride runs: one 2D copy each, in groups spread over the lanes like direct copies.
  const std::vector<StridedCopy>& runs = t.plan.strided;
  thread_local std::vector<Copy2D> copies;
  for (std::size_t i = 0; i < runs.size(); i += kGroup) {
    const std::size_t n = std::min(kGroup, runs.size() - i);
    copies.resize(n);
    std::uint64_t rows = 0;
    for (std::size_t k = 0; k < n; ++k) {
      const StridedCopy& c = runs[i + k];
      copies[k] = {c.dst, c.dpitch, c.src, c.spitch, c.width, c.rows};
      rows += c.rows;
    }
    StreamHandle l = on ? *on : lane(t, t.to_host() ? d2h() : next_h2d());
    device_.copy_2d_batch(copies.data(), n, t.to_host(), l);
    Counters::add(ctx_.counters.direct, rows);
    Counters::add(ctx_.counters.strided, n);
  }
}

void CopyLanes::submit_directs_on(TransferState& t, StreamHandle stream, bool lead) {
  if (stream == nullptr) {
    try {
      begin(t, stream);
      enqueue_directs(t);
    } catch (...) {
      t.fail(std::current_exception());
    }
    finalize(t);
    t.join_stream(stream);
    return;
  }
  try {
    enqueue_directs(t, stream, lead ? kLead : kGroup);
    device_.record_event(t.done_event, stream);
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.mark_finalized();
}

void CopyLanes::copy_runs(const Plan& p, const PlannedChunk& c, Slot& s, bool to_host,
                          StreamHandle l) {
  // One DMA per contiguous run of the chunk's host side, between it and its place in the
  // device staging area; several in one cudaMemcpyBatchAsync (a driver call costs microseconds,
  // and a chunk of every layer's 8 KB pages has several runs).
  thread_local std::vector<void*> dsts;
  thread_local std::vector<const void*> srcs;
  thread_local std::vector<std::size_t> sizes;
  dsts.clear();
  srcs.clear();
  sizes.clear();
  const GatherOp* ops = p.ops.data();
  std::uint32_t run = c.op_begin;
  for (std::uint32_t i = c.op_begin + 1; i <= c.op_end; ++i) {
    if (i < c.op_end && (to_host ? ops[i - 1].dst + ops[i - 1].bytes == ops[i].dst
                                 : ops[i - 1].src + ops[i - 1].bytes == ops[i].src))
      continue;
    std::byte* staged = s.dev + ops[run].slot_offset;
    dsts.push_back(to_host ? static_cast<void*>(ops[run].dst) : staged);
    srcs.push_back(to_host ? static_cast<const void*>(staged) : ops[run].src);
    sizes.push_back(ops[i - 1].slot_offset + ops[i - 1].bytes - ops[run].slot_offset);
    run = i;
  }
  if (sizes.size() == 1 && to_host)
    device_.copy_d2h(dsts[0], srcs[0], sizes[0], l);
  else if (sizes.size() == 1)
    device_.copy_h2d(dsts[0], srcs[0], sizes[0], l);
  else
    device_.copy_batch(dsts.data(), srcs.data(), sizes.data(), sizes.size(), to_host, l);
}

void CopyLanes::enqueue_to_device(TransferState& t, std::uint32_t index, Slot& s, bool wait,
                                  std::uint64_t flag_value) {
  const std::uint32_t li = next_h2d();
  StreamHandle l = lane(t, li);
  if (wait) device_.wait_value_geq(s.flag, flag_value, l);
  move_to_device(t, index, s, l, static_cast<int>(li));
}

void CopyLanes::move_to_device(TransferState& t, std::uint32_t index, Slot& s, StreamHandle l,
                               int lane_index) {
  const PlannedChunk& c = t.plan.chunks[index];
  if (c.contiguous_device) {
    device_.copy_h2d(t.plan.ops[c.op_begin].dst, s.host, c.data_bytes, l);
  } else {
    // The chunk's data reaches the device staging area, then the scatter kernel places it.
    const auto* entries = reinterpret_cast<const ScatterEntry*>(s.dev + c.scatter_offset);
    if (c.host_direct) {
      // Nothing was gathered: each contiguous run of the sources goes straight from host memory
      // to its place in the staging area. The kernel reads its entries from the pinned slot
      // over PCIe where it can (one driver call less, as the pack kernel does); otherwise they
      // are copied beside the data first.
      copy_runs(t.plan, c, s, false, l);
      if (device_.host_pointers_usable())
        entries = reinterpret_cast<const ScatterEntry*>(s.host + c.scatter_offset);
      else
        device_.copy_h2d(s.dev + c.scatter_offset, s.host + c.scatter_offset, c.entry_bytes(), l);
      Counters::add(ctx_.counters.host_direct, 1);
    } else {
      device_.copy_h2d(s.dev, s.host, c.dma_bytes(), l);  // the data and its entries
    }
    Counters::add(ctx_.counters.scattered, 1);
    if (lane_index >= 0 && s.placed != nullptr) {
      // Placed later with the lane's next chunks (flush_placing): no kernel launch or event for
      // this chunk now, and the lane's next DMAs do not wait behind a kernel for SMs. Its slot
      // is free once the placing kernel writes `placed`.
      if (t.placing.size() < h2d_) t.placing.resize(h2d_);
      TransferState::Placing& w = t.placing[static_cast<std::size_t>(lane_index)];
      w.chunks.push_back({entries, s.dev, s.placed, s.placed_value + 1, c.op_end - c.op_begin, 0});
      w.bytes += c.data_bytes;
      ++s.placed_value;
      s.by_flag = true;
      trace_dma(t, index, l);
      Counters::add(ctx_.counters.chunks, 1);
      if (w.chunks.size() >= place_limit_) flush_placing(t, static_cast<std::uint32_t>(lane_index));
      return;
    }
    device_.scatter(entries, c.op_end - c.op_begin, s.dev, l);
  }
  device_.record_event(s.done, l);
  trace_dma(t, index, l);
  Counters::add(ctx_.counters.chunks, 1);
}

void CopyLanes::trace_dma(TransferState& t, std::uint32_t index, StreamHandle l) {
  if (t.trace_start == nullptr) return;
  // Made as the DMA is enqueued: chunks may be planned later.
  t.trace_dma.emplace_back(index, device_.create_event(true));
  device_.record_event(t.trace_dma.back().second, l);
}

void CopyLanes::flush_placing(TransferState& t, std::uint32_t lane_index) {
  if (lane_index >= t.placing.size() || t.placing[lane_index].chunks.empty()) return;
  TransferState::Placing& w = t.placing[lane_index];
  try {
    device_.place(w.chunks.data(), static_cast<std::uint32_t>(w.chunks.size()), w.bytes,
                  place_blocks_, place_counters_ + lane_index * kCounterStride, lanes_[lane_index]);
  } catch (...) {
    // Nothing will write their flags: free the slots now (the transfer has failed; a device
    // that cannot launch a kernel runs nothing more), or the next submitter would wait forever.
    for (const PlaceChunk& c : w.chunks)
      std::atomic_ref<std::uint64_t>(*c.flag).store(c.value, std::memory_order_release);
    w.chunks.clear();
    w.bytes = 0;
    throw;
  }
  Counters::add(ctx_.counters.placements, 1);
  w.chunks.clear();
  w.bytes = 0;
}

void CopyLanes::flush_placing_of(TransferState& t, const std::uint64_t* placed) {
  for (std::uint32_t li = 0; li < t.placing.size(); ++li)
    for (const PlaceChunk& c : t.placing[li].chunks)
      if (c.flag == placed) {
        flush_placing(t, li);
        return;
      }
}

void CopyLanes::enqueue_to_host(TransferState& t, std::uint32_t index, Slot& s, bool in_place) {
  const Plan& p = t.plan;
  const PlannedChunk& c = p.chunks[index];
  StreamHandle l = lane(t, d2h());
  if (c.contiguous_device) {
    device_.copy_d2h(s.host, p.ops[c.op_begin].src, c.data_bytes, l);
  } else {
    // The kernel packs the device blocks into the slot's device twin, then one DMA brings the
    // data back. It reads its entries from the pinned slot over PCIe (one read per thread block,
    // all in parallel); where the GPU cannot read host memory at its host address they are
    // copied to the device first. The packing runs on a lane of its own, so that it overlaps the
    // previous chunk's DMA; the device-to-host lane waits for it (the slot's start event, unused
    // for timing here).
    StreamHandle pk = lane(t, pack());
    device_.gather(pack_entries(p, c, s, pk), c.op_end - c.op_begin, s.dev, pk);
    device_.record_event(s.start, pk);
    device_.stream_wait_event(l, s.start);
    if (in_place) {
      // Each contiguous run of the host destinations straight from the device staging area:
      // nothing is left for the gather threads to place.
      copy_runs(p, c, s, true, l);
      Counters::add(ctx_.counters.host_direct, 1);
    } else {
      device_.copy_d2h(s.host, s.dev, c.data_bytes, l);
    }
    Counters::add(ctx_.counters.scattered, 1);
  }
  device_.record_event(s.done, l);
  // An in-place chunk is not polled (nothing is left to place; `done` frees its slot): no flag.
  if (!in_place) signal_dma_done(s);
  trace_dma(t, index, l);
  ctx_.tracer.record(t.id, TraceEvent::kChunkIssued, index,
                     static_cast<std::uint32_t>(c.data_bytes));
}

void CopyLanes::signal_dma_done(Slot& s) {
  if (s.dma_flag == nullptr) return;
  device_.stream_wait_event(flags_, s.done);
  device_.write_value(s.dma_flag, ++s.dma_value, flags_);
}

const ScatterEntry* CopyLanes::pack_entries(const Plan& p, const PlannedChunk& c, Slot& s,
                                            StreamHandle pk) {
  stream_scatter_entries(p, c, c.op_begin, c.op_end, s.host, Direction::kToHost);
  if (device_.host_pointers_usable())
    return reinterpret_cast<const ScatterEntry*>(s.host + c.scatter_offset);
  const std::size_t entry_bytes = (c.op_end - c.op_begin) * sizeof(ScatterEntry);
  device_.copy_h2d(s.dev + c.scatter_offset, s.host + c.scatter_offset, entry_bytes, pk);
  return reinterpret_cast<const ScatterEntry*>(s.dev + c.scatter_offset);
}

void CopyLanes::enqueue_packed_to_host(TransferState& t, const std::uint32_t* index,
                                       Slot* const* slot, std::uint32_t n) {
  const Plan& p = t.plan;
  StreamHandle pk = lane(t, pack());
  StreamHandle l = lane(t, d2h());
  thread_local std::vector<PackChunk> packs;
  packs.resize(n);
  std::uint64_t bytes = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const PlannedChunk& c = p.chunks[index[i]];
    Slot& s = *slot[i];
    packs[i] = PackChunk{pack_entries(p, c, s, pk), s.dev, c.op_end - c.op_begin, 0};
    bytes += c.data_bytes;
  }
  device_.pack(packs.data(), n, bytes, place_blocks_, pk);
  // One wait for the launch (the last slot's start event, unused for timing here).
  Slot& last = *slot[n - 1];
  device_.record_event(last.start, pk);
  device_.stream_wait_event(l, last.start);
  Counters::add(ctx_.counters.packings, 1);
  for (std::uint32_t i = 0; i < n; ++i) {
    const PlannedChunk& c = p.chunks[index[i]];
    Slot& s = *slot[i];
    device_.copy_d2h(s.host, s.dev, c.data_bytes, l);
    device_.record_event(s.done, l);
    signal_dma_done(s);
    Counters::add(ctx_.counters.scattered, 1);
    trace_dma(t, index[i], l);
    ctx_.tracer.record(t.id, TraceEvent::kChunkIssued, index[i],
                       static_cast<std::uint32_t>(c.data_bytes));
  }
}

void CopyLanes::finalize(TransferState& t) {
  for (std::uint32_t li = 0; li < t.placing.size(); ++li) {
    try {
      flush_placing(t, li);
    } catch (...) {
      t.fail(std::current_exception());
    }
  }
  try {
    std::size_t home = 0;
    while (home < lanes_.size() && (t.lanes_started & (1u << home)) == 0) ++home;
    if (home == lanes_.size()) home = 0;
    for (std::size_t l = home + 1; l < lanes_.size(); ++l) {
      if ((t.lanes_started & (1u << l)) == 0) continue;
      device_.record_event(t.lane_events[l], lanes_[l]);
      device_.stream_wait_event(lanes_[home], t.lane_events[l]);
    }
    device_.record_event(t.done_event, lanes_[home]);
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.mark_finalized();
}

void CopyLanes::drain() noexcept {
  for (StreamHandle l : lanes_) {
    try {
      device_.stream_sync(l);
    } catch (...) {
      // A failed lane was reported to the transfers it carried; nothing more to do here.
    }
  }
  if (flags_ != nullptr) {
    try {
      device_.stream_sync(flags_);
    } catch (...) {
      // As a lane's: the flag's waiters see the fault through `done`.
    }
  }
}

}  // namespace gfd::detail
