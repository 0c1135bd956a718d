#include "engine_core.hpp"

#include <numa.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "gfd/error.hpp"
#include "topology.hpp"

namespace gfd::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t ns_since(Clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

[[noreturn]] void bad_option(const std::string& msg) {
  throw Error(ErrorCode::kInvalidArgument, "EngineOptions::" + msg);
}

// Waits for an event: spin first (a DMA of one slot lasts tens of microseconds, less than a
// futex round trip), then block in the driver.
void wait_event(Device& d, EventHandle e) {
  const auto until = Clock::now() + std::chrono::microseconds(200);
  while (!d.event_done(e)) {
    if (Clock::now() > until) {
      d.event_sync(e);
      return;
    }
    std::this_thread::yield();
  }
}

constexpr int kMaxLanes = 16;
constexpr int kAutoThreadCap = 16;  // host memory bandwidth is saturated well before this

}  // namespace

// ---------------------------------------------------------------------------------------------
EventPool::~EventPool() {
  for (EventHandle e : free_) device_.destroy_event(e);
}

EventHandle EventPool::get() {
  {
    std::lock_guard lk(m_);
    if (!free_.empty()) {
      EventHandle e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  return device_.create_event(false);
}

void EventPool::put(EventHandle e) {
  if (e == nullptr) return;
  std::lock_guard lk(m_);
  free_.push_back(e);
}

// ---------------------------------------------------------------------------------------------
void TransferState::fail(std::exception_ptr e) {
  std::lock_guard lk(error_mutex);
  if (!error) error = std::move(e);
}

std::exception_ptr TransferState::failure() {
  std::lock_guard lk(error_mutex);
  return error;
}

TransferState::~TransferState() {
  if (!core) return;
  // Every wait on these events was enqueued when the transfer was issued (CUDA captures the
  // record current at the time of the wait), so the events can be re-recorded by others now.
  EventPool& pool = core->events();
  pool.put(start_event);
  pool.put(done_event);
  for (EventHandle e : lane_events) pool.put(e);
}

// ---------------------------------------------------------------------------------------------
std::shared_ptr<EngineCore> EngineCore::create(const EngineOptions& options,
                                               std::shared_ptr<Device> device) {
  std::shared_ptr<EngineCore> core(new EngineCore(options, std::move(device)));
  core->start();
  return core;
}

Engine EngineCore::make_engine(const EngineOptions& options, std::shared_ptr<Device> device) {
  return Engine(create(options, std::move(device)));
}

EngineCore::EngineCore(const EngineOptions& options, std::shared_ptr<Device> device)
    : options_(options), device_(std::move(device)) {
  const EngineOptions& o = options_;
  if (o.copy_streams < 1 || o.copy_streams > kMaxLanes)
    bad_option("copy_streams: " + std::to_string(o.copy_streams) + " is outside 1.." +
               std::to_string(kMaxLanes));
  if (o.slot_bytes < 4096) bad_option("slot_bytes: " + std::to_string(o.slot_bytes) + " is below 4096");
  if (o.slot_bytes % 16 != 0) bad_option("slot_bytes: " + std::to_string(o.slot_bytes) + " is not a multiple of 16");
  if (o.staging_bytes / o.slot_bytes < 2)
    bad_option("staging_bytes: " + std::to_string(o.staging_bytes) +
               " must hold at least two slots of slot_bytes " + std::to_string(o.slot_bytes) +
               " so that gathering and DMA overlap");
  if (o.staging_bytes / o.slot_bytes > 65536)
    bad_option("staging_bytes: " + std::to_string(o.staging_bytes / o.slot_bytes) +
               " slots is more than 65536; use larger slots");
  if (o.spin_us < 0) bad_option("spin_us: " + std::to_string(o.spin_us) + " is negative");
  if (o.numa_node < -2) bad_option("numa_node: " + std::to_string(o.numa_node) + " is below -2");

  plan_config_.device = device_->ordinal();
  plan_config_.slot_bytes = o.slot_bytes;
  plan_config_.first_chunk_bytes = std::min(o.first_chunk_bytes, o.slot_bytes);
  plan_config_.piece_bytes = o.piece_bytes;
  plan_config_.direct_min_bytes = o.direct_min_bytes;
  plan_config_.check_overlaps = o.check_overlaps;
  try {
    validate_plan_config(plan_config_);
  } catch (const Error& e) {
    bad_option(e.what());
  }

  // Locality: the GPU's node and CPUs (sysfs), or the node the caller asked for.
  const GpuLocality loc = read_gpu_locality(device_->pci_bus_id());
  numa_node_ = o.numa_node == -1 ? loc.numa_node : o.numa_node;
  if (o.numa_node == -2) numa_node_ = -1;
  cpus_ = loc.cpus;
  if (o.numa_node >= 0) {
    if (numa_available() < 0 || o.numa_node > numa_max_node())
      bad_option("numa_node: " + std::to_string(o.numa_node) + " does not exist on this machine");
    bitmask* mask = numa_allocate_cpumask();
    std::vector<int> node_cpus;
    if (numa_node_to_cpus(o.numa_node, mask) == 0) {
      const std::vector<int> allowed = allowed_cpus();
      for (int c : allowed)
        if (numa_bitmask_isbitset(mask, static_cast<unsigned>(c))) node_cpus.push_back(c);
    }
    numa_free_cpumask(mask);
    if (!node_cpus.empty()) cpus_ = node_cpus;
  }
  const int ncpu = static_cast<int>(allowed_cpus().size());
  if (o.gather_threads < 0) bad_option("gather_threads: " + std::to_string(o.gather_threads) + " is negative");
  if (o.gather_threads > ncpu)
    bad_option("gather_threads: " + std::to_string(o.gather_threads) + " is more than the " +
               std::to_string(ncpu) + " CPUs this process may use");
  options_.gather_threads = o.gather_threads != 0
                                ? o.gather_threads
                                : std::clamp(static_cast<int>(cpus_.size()) - 1, 1, kAutoThreadCap);
  options_.numa_node = numa_node_;
}

void EngineCore::start() {
  Device& d = *device_;
  d.make_current();
  events_ = std::make_unique<EventPool>(d);
  const std::size_t nslots = options_.staging_bytes / options_.slot_bytes;
  const std::size_t ring = nslots * options_.slot_bytes;
  for (int i = 0; i < options_.copy_streams; ++i) lanes_.push_back(d.create_stream());
  staging_ = std::make_unique<HostStaging>(d, ring, numa_node_);
  dev_staging_ = static_cast<std::byte*>(d.alloc_device(ring));
  slots_ = std::vector<Slot>(nslots);
  for (std::size_t i = 0; i < nslots; ++i) {
    slots_[i].host = staging_->data() + i * options_.slot_bytes;
    slots_[i].dev = dev_staging_ + i * options_.slot_bytes;
    slots_[i].start = d.create_event(true);
    slots_[i].done = d.create_event(true);
  }
  items_ = std::vector<Item>(nslots + 4096);
  pool_ = std::make_unique<GatherPool>(
      options_.gather_threads, cpus_, options_.spin_us,
      [this](const PieceRef& p) { run_piece(p); }, [this] { device_->make_current(); });
}

EngineCore::~EngineCore() {
  shutdown();
  Device& d = *device_;
  for (Slot& s : slots_) {
    d.destroy_event(s.start);
    d.destroy_event(s.done);
  }
  events_.reset();
  for (StreamHandle l : lanes_) d.destroy_stream(l);
  if (dev_staging_ != nullptr) d.free_device(dev_staging_);
  staging_.reset();
}

void EngineCore::shutdown() noexcept {
  {
    std::lock_guard lk(submit_mutex_);
    if (shutting_down_ && !pool_) return;
    shutting_down_ = true;
  }
  // Drain: every published item gets issued (the pool finishes its pieces), then the lanes run dry.
  while (issued_.load(std::memory_order_acquire) < tail_.load(std::memory_order_acquire)) {
    try_issue();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  for (StreamHandle l : lanes_) {
    try {
      device_->stream_sync(l);
    } catch (...) {
      // A failed lane was reported to the transfers it carried; nothing more to do here.
    }
  }
  pool_.reset();
}

// ---------------------------------------------------------------------------------------------
void EngineCore::wait_slot_free(Slot& s) {
  int st = s.state.load(std::memory_order_acquire);
  while (st == kGathering) {
    s.state.wait(kGathering, std::memory_order_acquire);
    st = s.state.load(std::memory_order_acquire);
  }
  if (st == kIssued) {
    wait_event(*device_, s.done);  // no slot is reused before its DMA has completed
    account_dma(s);
  }
}

// Adds a completed chunk's copy-engine time to the stats, once (caller holds submit_mutex_).
void EngineCore::account_dma(Slot& s) {
  if (!s.timed) return;
  s.timed = false;
  st_dma_ms_.fetch_add(device_->event_elapsed_ms(s.start, s.done));
}

std::uint32_t EngineCore::acquire_slot() {
  const auto idx = static_cast<std::uint32_t>(next_slot_ % slots_.size());
  Slot& s = slots_[idx];
  const auto t0 = Clock::now();
  wait_slot_free(s);
  st_submit_wait_ns_.fetch_add(ns_since(t0), std::memory_order_relaxed);
  s.state.store(kGathering, std::memory_order_relaxed);
  ++next_slot_;
  return idx;
}

EngineCore::Item& EngineCore::append_item(ItemKind kind, const std::shared_ptr<TransferState>& t,
                                          std::uint32_t index, std::uint32_t slot, bool ready) {
  const std::uint64_t n = tail_.load(std::memory_order_relaxed);
  while (n - issued_.load(std::memory_order_acquire) >= items_.size()) {
    tail_waiters_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint64_t v = issued_.load(std::memory_order_seq_cst);
    if (n - v >= items_.size()) issued_.wait(v, std::memory_order_seq_cst);
    tail_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
  Item& it = items_[n % items_.size()];
  it.kind = kind;
  it.t = t;
  it.index = index;
  it.slot = slot;
  it.ready.store(ready, std::memory_order_relaxed);
  return it;
}

void EngineCore::publish_item() {
  tail_.store(tail_.load(std::memory_order_relaxed) + 1, std::memory_order_seq_cst);
}

Transfer EngineCore::submit(std::span<const BlockCopy> blocks, StreamHandle stream) {
  const auto t_plan = Clock::now();
  Plan plan = make_plan(blocks, plan_config_,
                        [this](const void* p) { return device_->query_pointer(p); });
  st_plan_ns_.fetch_add(ns_since(t_plan), std::memory_order_relaxed);
  st_blocks_.fetch_add(blocks.size(), std::memory_order_relaxed);
  st_transfers_.fetch_add(1, std::memory_order_relaxed);
  if (plan.total_bytes == 0) return Transfer{};

  auto t = std::make_shared<TransferState>();
  t->core = shared_from_this();
  t->plan = std::move(plan);
  t->start_event = events_->get();
  t->done_event = events_->get();
  t->lane_events.resize(lanes_.size(), nullptr);
  for (std::size_t l = 1; l < lanes_.size(); ++l) t->lane_events[l] = events_->get();
  const Plan& p = t->plan;
  const bool inline_gather = p.direct.empty() && p.chunks.size() == 1 &&
                             p.total_bytes <= options_.inline_gather_bytes;
  device_->make_current();

  std::vector<PieceRef> refs;
  {
    std::unique_lock lk(submit_mutex_);
    if (shutting_down_) throw Error(ErrorCode::kShutdown, "copy_to_device: the engine is shutting down");
    device_->record_event(t->start_event, stream);
    // From here a finalize item must be published whatever happens, or submit would not return.
    try {
      for (std::uint32_t i = 0; i < p.direct.size(); ++i) {
        append_item(ItemKind::kDirect, t, i, 0, true);
        publish_item();
      }
      for (std::uint32_t k = 0; k < p.chunks.size(); ++k) {
        const std::uint32_t slot = acquire_slot();
        Item& it = append_item(ItemKind::kChunk, t, k, slot, false);
        const PlannedChunk& c = p.chunks[k];
        if (!c.contiguous_dst) {
          auto* entries = reinterpret_cast<ScatterEntry*>(slots_[slot].host + c.scatter_offset);
          for (std::uint32_t i = c.op_begin; i < c.op_end; ++i)
            entries[i - c.op_begin] = {reinterpret_cast<std::uint64_t>(p.ops[i].dst),
                                       p.ops[i].slot_offset, p.ops[i].bytes};
        }
        it.pieces_left.store(c.piece_end - c.piece_begin, std::memory_order_relaxed);
        publish_item();
        if (inline_gather) {
          for (std::uint32_t q = c.piece_begin; q < c.piece_end; ++q) gather_piece(it, q);
          it.ready.store(true, std::memory_order_seq_cst);
        } else {
          refs.clear();
          for (std::uint32_t q = c.piece_begin; q < c.piece_end; ++q) refs.push_back({&it, q});
          pool_->push(refs);
        }
      }
    } catch (...) {
      t->fail(std::current_exception());
    }
    append_item(ItemKind::kFinalize, t, 0, 0, true);
    publish_item();
  }
  // The submitting thread would only wait now: it gathers too, while the parked pool threads
  // wake up (a futex wake-up costs tens of microseconds, a 4 KB block a microsecond).
  if (!inline_gather && options_.submitter_gathers) pool_->help();
  try_issue();
  // The caller's stream must not wait on the GPU for anything the host has yet to do: cudaFree,
  // lazy module loading and other implicit device synchronisations on any thread would then
  // deadlock with the threads that still have to issue this transfer's DMAs. So return once the
  // last DMA is enqueued (gathering is done by then) and make the stream wait on its event.
  t->finalized.wait(false, std::memory_order_acquire);
  try {
    device_->stream_wait_event(stream, t->done_event);
  } catch (...) {
    t->fail(std::current_exception());
  }
  st_bytes_.fetch_add(p.total_bytes, std::memory_order_relaxed);
  return Transfer(t);
}

// ---------------------------------------------------------------------------------------------
void EngineCore::gather_piece(const Item& item, std::uint32_t piece) {
  const Plan& p = item.t->plan;
  const PlannedPiece& pc = p.pieces[piece];
  std::byte* base = slots_[item.slot].host;
  const auto t0 = Clock::now();
  // Cold KV blocks are scattered over a pool far larger than the caches, and the hardware
  // prefetcher does not cross pages: start the loads of the blocks two ahead while copying.
  auto prefetch = [&](std::uint32_t i) {
    const auto* src = reinterpret_cast<const char*>(p.ops[i].src);
    const std::uint64_t n = std::min<std::uint64_t>(p.ops[i].bytes, 1024);
    for (std::uint64_t l = 0; l < n; l += 64) __builtin_prefetch(src + l);
  };
  for (std::uint32_t i = pc.op_begin; i < pc.op_end && i < pc.op_begin + 2; ++i) prefetch(i);
  for (std::uint32_t i = pc.op_begin; i < pc.op_end; ++i) {
    if (i + 2 < pc.op_end) prefetch(i + 2);
    std::memcpy(base + p.ops[i].slot_offset, p.ops[i].src, p.ops[i].bytes);
  }
  st_gather_ns_.fetch_add(ns_since(t0), std::memory_order_relaxed);
}

void EngineCore::run_piece(const PieceRef& ref) {
  auto* item = static_cast<Item*>(ref.item);
  gather_piece(*item, ref.piece);
  // The thread that completes a chunk's last piece issues it (or hands it to the issuer).
  if (item->pieces_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    item->ready.store(true, std::memory_order_seq_cst);
    try_issue();
  }
}

// Items are issued strictly in publication order. That keeps every lane free of work that
// depends on a later transfer, so a transfer's DMAs never wait behind a DMA that waits for it
// (which could deadlock through the caller's stream), and the copy engine sees chunks in ring
// order. Whoever holds the baton issues every ready item; the others leave.
void EngineCore::try_issue() {
  for (;;) {
    if (issuing_.exchange(true, std::memory_order_seq_cst)) return;
    std::uint64_t n = issued_.load(std::memory_order_relaxed);
    const std::uint64_t start = n;
    while (n < tail_.load(std::memory_order_seq_cst)) {
      Item& it = items_[n % items_.size()];
      if (!it.ready.load(std::memory_order_seq_cst)) break;
      issue(it);
      it.t.reset();
      ++n;
      issued_.store(n, std::memory_order_seq_cst);
    }
    issuing_.store(false, std::memory_order_seq_cst);
    if (n != start && tail_waiters_.load(std::memory_order_seq_cst) > 0) issued_.notify_all();
    // A piece may have completed between our last check and the release of the baton.
    if (n < tail_.load(std::memory_order_seq_cst) &&
        items_[n % items_.size()].ready.load(std::memory_order_seq_cst))
      continue;
    return;
  }
}

StreamHandle EngineCore::lane_for(TransferState& t, std::uint32_t lane) {
  StreamHandle s = lanes_[lane];
  if ((t.lanes_started & (1u << lane)) == 0) {
    device_->stream_wait_event(s, t.start_event);  // after the work already on the caller's stream
    t.lanes_started |= 1u << lane;
  }
  return s;
}

void EngineCore::issue(Item& item) {
  switch (item.kind) {
    case ItemKind::kChunk: issue_chunk(item); break;
    case ItemKind::kDirect: issue_direct(item); break;
    case ItemKind::kFinalize: issue_finalize(item); break;
  }
}

void EngineCore::issue_chunk(Item& item) {
  TransferState& t = *item.t;
  Slot& s = slots_[item.slot];
  const PlannedChunk& c = t.plan.chunks[item.index];
  s.timed = false;
  try {
    if (t.failure()) {  // a failed transfer moves nothing more; its slot is free again at once
      s.state.store(kIssued, std::memory_order_release);
      s.state.notify_all();
      return;
    }
    const auto lane = static_cast<std::uint32_t>(lane_rr_++ % lanes_.size());
    StreamHandle l = lane_for(t, lane);
    device_->record_event(s.start, l);
    if (c.contiguous_dst) {
      device_->copy_h2d(t.plan.ops[c.op_begin].dst, s.host, c.data_bytes, l);
    } else {
      device_->copy_h2d(s.dev, s.host, c.dma_bytes(), l);
      device_->scatter(reinterpret_cast<const ScatterEntry*>(s.dev + c.scatter_offset),
                       c.op_end - c.op_begin, s.dev, l);
      st_scattered_.fetch_add(1, std::memory_order_relaxed);
    }
    device_->record_event(s.done, l);
    s.timed = true;
    st_chunks_.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    t.fail(std::current_exception());
  }
  s.state.store(kIssued, std::memory_order_release);
  s.state.notify_all();
}

void EngineCore::issue_direct(Item& item) {
  TransferState& t = *item.t;
  const DirectCopy& dc = t.plan.direct[item.index];
  try {
    const auto lane = static_cast<std::uint32_t>(lane_rr_++ % lanes_.size());
    device_->copy_h2d(dc.dst, dc.src, dc.bytes, lane_for(t, lane));
    st_direct_.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    t.fail(std::current_exception());
  }
}

void EngineCore::issue_finalize(Item& item) {
  TransferState& t = *item.t;
  try {
    StreamHandle l0 = lanes_[0];
    for (std::size_t l = 1; l < lanes_.size(); ++l) {
      if ((t.lanes_started & (1u << l)) == 0) continue;
      device_->record_event(t.lane_events[l], lanes_[l]);
      device_->stream_wait_event(l0, t.lane_events[l]);
    }
    device_->record_event(t.done_event, l0);
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.finalized.store(true, std::memory_order_release);
  t.finalized.notify_all();
}

// ---------------------------------------------------------------------------------------------
void EngineCore::wait(TransferState& t) {
  if (t.complete.load(std::memory_order_acquire)) return;
  t.finalized.wait(false, std::memory_order_acquire);
  try {
    wait_event(*device_, t.done_event);
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.complete.store(true, std::memory_order_release);
}

bool EngineCore::poll(TransferState& t) {
  if (t.complete.load(std::memory_order_acquire)) return true;
  if (!t.finalized.load(std::memory_order_acquire)) return false;
  try {
    if (!device_->event_done(t.done_event)) return false;
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.complete.store(true, std::memory_order_release);
  return true;
}

EngineStats EngineCore::stats() const {
  auto* self = const_cast<EngineCore*>(this);
  {
    // Account the DMA time of chunks that finished but whose slots were not reused yet.
    std::lock_guard lk(self->submit_mutex_);
    for (Slot& s : self->slots_) {
      if (s.state.load(std::memory_order_acquire) != kIssued || !s.timed) continue;
      try {
        if (!device_->event_done(s.done)) continue;
        self->account_dma(s);
      } catch (...) {
        s.timed = false;
      }
    }
  }
  EngineStats st;
  st.bytes = st_bytes_.load();
  st.transfers = st_transfers_.load();
  st.blocks = st_blocks_.load();
  st.chunks = st_chunks_.load();
  st.scattered_chunks = st_scattered_.load();
  st.direct_copies = st_direct_.load();
  st.gather_seconds = static_cast<double>(st_gather_ns_.load()) * 1e-9;
  st.dma_seconds = st_dma_ms_.load() * 1e-3;
  st.submit_wait_seconds = static_cast<double>(st_submit_wait_ns_.load()) * 1e-9;
  st.plan_seconds = static_cast<double>(st_plan_ns_.load()) * 1e-9;
  st.hugepages = staging_ ? staging_->hugepages() : HugepageKind::kNone;
  st.numa_node = numa_node_;
  st.gather_threads = pool_ ? pool_->threads() : 0;
  st.staging_bytes = slots_.size() * options_.slot_bytes;
  st.slot_bytes = options_.slot_bytes;
  st.cpus = cpus_;
  return st;
}

}  // namespace gfd::detail
