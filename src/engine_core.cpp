#include "engine_core.hpp"

#include <numa.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
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

// One line on stderr about a choice the engine made for the user (GFD_QUIET=1 silences it).
void log_info(const std::string& msg) {
  const char* quiet = std::getenv("GFD_QUIET");
  if (quiet != nullptr && std::string(quiet) == "1") return;
  std::fprintf(stderr, "gfd: %s\n", msg.c_str());
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
constexpr std::uint64_t kClaimOne = std::uint64_t{1} << 16;  // one piece in an Item's claim word

thread_local int tl_gather_thread = -1;  // index of a gather thread, -1 elsewhere

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}
constexpr int kAutoThreadCap = 16;  // host memory bandwidth is saturated well before this

}  // namespace

// ---------------------------------------------------------------------------------------------
EventPool::~EventPool() {
  EventHandle e = nullptr;
  while (free_.pop(e)) device_.destroy_event(e);
}

EventHandle EventPool::get() {
  EventHandle e = nullptr;
  if (free_.pop(e)) return e;
  return device_.create_event(false);
}

void EventPool::put(EventHandle e) {
  if (e == nullptr) return;
  bool kept = false;
  try {
    kept = free_.push(e);
  } catch (...) {
    // No memory for the list: the event is freed instead.
  }
  if (!kept) device_.destroy_event(e);
}

// ---------------------------------------------------------------------------------------------
Plan EngineCore::take_plan() {
  std::lock_guard lk(plans_mutex_);
  if (spare_plans_.empty()) return Plan{};
  Plan p = std::move(spare_plans_.back());
  spare_plans_.pop_back();
  return p;
}

void EngineCore::recycle_plan(Plan&& plan) noexcept {
  constexpr std::size_t kSparePlans = 16;
  try {
    std::lock_guard lk(plans_mutex_);
    if (spare_plans_.size() < kSparePlans) spare_plans_.push_back(std::move(plan));
  } catch (...) {
    // Out of memory for the list: the plan is simply freed.
  }
}

// ---------------------------------------------------------------------------------------------
void TransferState::fail(std::exception_ptr e) {
  std::lock_guard lk(error_mutex);
  if (!error) error = std::move(e);
  failed.store(true, std::memory_order_release);
}

std::exception_ptr TransferState::failure() {
  std::lock_guard lk(error_mutex);
  return error;
}

TransferState::~TransferState() {
  if (!core) return;
  // Every wait on these events was enqueued when the transfer was issued (CUDA captures the
  // record current at the time of the wait), so the events can be re-recorded by others now.
  core->recycle_plan(std::move(plan));
  // Tracing: the DMA points are read when the trace is taken, not here (this may run on a
  // gather thread, which must not wait for the GPU).
  if (trace_start != nullptr) core->keep_trace_events(id, trace_start_ns, trace_start, std::move(trace_dma));
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
  if (o.slot_bytes / std::max<std::size_t>(o.piece_bytes, 1) > 32768)
    bad_option("piece_bytes: " + std::to_string(o.piece_bytes) + " cuts a slot of " +
               std::to_string(o.slot_bytes) + " bytes into more than 32768 pieces");
  if ((o.backend == Backend::kZeroCopyKernel) && !device_->host_pointers_usable())
    bad_option("backend: zero_copy_kernel needs a GPU that reads pinned host memory at its host "
               "address (unified addressing); this one does not");
  if (o.spin_us < 0) bad_option("spin_us: " + std::to_string(o.spin_us) + " is negative");
  if (o.pageable_cache_ms < 0 || o.pageable_cache_ms > 3600000)
    bad_option("pageable_cache_ms: " + std::to_string(o.pageable_cache_ms) +
               " is outside 0..3600000 (an hour)");
  pageable_cache_ = std::make_unique<PageableCache>(static_cast<std::uint32_t>(o.pageable_cache_ms));
  if (o.numa_node < -2) bad_option("numa_node: " + std::to_string(o.numa_node) + " is below -2");

  plan_config_.device = device_->ordinal();
  plan_config_.slot_bytes = o.slot_bytes;
  plan_config_.first_chunk_bytes = std::min(o.first_chunk_bytes, o.slot_bytes);
  plan_config_.piece_bytes = o.piece_bytes;
  plan_config_.direct_min_bytes = o.direct_min_bytes;
  plan_config_.check_overlaps = o.check_overlaps;
  pass_config_ = plan_config_;
  pass_config_.mode = PlanConfig::Mode::kPassThrough;
  pass_config_.require_pinned_host = o.backend == Backend::kZeroCopyKernel;
  pass_config_.pinned_reason = "the zero_copy_kernel backend reads sources with SM loads over PCIe and";
  store_kind_ = o.nontemporal_stores && nontemporal_supported() ? StoreKind::kNonTemporal
                                                               : StoreKind::kNormal;
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
  if (o.numa_node == -1 && !o.use_all_local_cpus) {
    // One engine per GPU: GPUs that share these CPUs get equal, disjoint parts of them.
    const CpuShare share = share_cpus(device_->pci_bus_id(), loc, device_->all_bus_ids());
    cpu_sharing_ = share.sharing;
    if (share.sharing > 1) {
      cpus_ = share.cpus;
      log_info("GPU " + std::to_string(device_->ordinal()) + " shares its " +
               std::to_string(loc.cpus.size()) + " local CPUs with " +
               std::to_string(share.sharing - 1) + " other GPU(s): its engine takes CPUs " +
               format_cpulist(cpus_) + " (set use_all_local_cpus or GFD_USE_ALL_LOCAL_CPUS=1 to use all)");
    }
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
  if (o.backend != Backend::kGather) options_.gather_threads = 0;  // no pool: nothing to gather
}

void EngineCore::start() {
  Device& d = *device_;
  const ScopedCurrentDevice current(d);
  events_ = std::make_unique<EventPool>(d);
  const std::size_t nslots = options_.staging_bytes / options_.slot_bytes;
  const std::size_t ring = nslots * options_.slot_bytes;
  const Backend b = options_.backend;
  if (b == Backend::kBatchAsync || b == Backend::kPerBlock) return;  // caller's stream only
  // The zero-copy kernel reads its block lists from staging slots; the pipeline stages data.
  staging_ = std::make_unique<HostStaging>(d, ring, numa_node_);
  slots_ = std::vector<Slot>(nslots);
  if (b == Backend::kGather) {
    // copy_streams lanes for host to device, one for device to host (one lane keeps those DMAs
    // in order, as the gather threads place chunks in order, and apart from host-to-device DMAs
    // that may wait on gathering), and one where scattered device blocks are packed for it.
    for (int i = 0; i < options_.copy_streams + 2; ++i) lanes_.push_back(d.create_stream());
    dev_staging_ = static_cast<std::byte*>(d.alloc_device(ring));
  }
  for (std::size_t i = 0; i < nslots; ++i) {
    slots_[i].host = staging_->data() + i * options_.slot_bytes;
    slots_[i].dev = dev_staging_ != nullptr ? dev_staging_ + i * options_.slot_bytes : nullptr;
    slots_[i].start = d.create_event(true);
    slots_[i].done = d.create_event(true);
  }
  if (b != Backend::kGather) return;
  preissue_ = options_.preissue && d.supports_wait_value();
  options_.preissue = preissue_;
  if (preissue_) {
    constexpr std::size_t kLine = 64;  // one flag per cache line: threads set them concurrently
    const std::size_t bytes = (nslots * kLine + 4095) / 4096 * 4096;
    void* f = nullptr;
    if (posix_memalign(&f, 4096, bytes) != 0) throw Error(ErrorCode::kSystem, "out of memory for slot flags");
    std::memset(f, 0, bytes);
    flags_ = static_cast<std::uint64_t*>(f);
    try {
      d.register_host(flags_, bytes);
    } catch (...) {
      std::free(flags_);
      flags_ = nullptr;
      throw;
    }
    for (std::size_t i = 0; i < nslots; ++i) slots_[i].flag = flags_ + i * (kLine / sizeof(std::uint64_t));
  }
  items_ = std::vector<Item>(nslots + 4096);
  pool_ = std::make_unique<GatherPool>(
      options_.gather_threads, cpus_, options_.spin_us, [this] { return run_next_piece(); },
      [this](int index) {
        tl_gather_thread = index;
        device_->make_current();
      });
}

EngineCore::~EngineCore() {
  shutdown();
  Device& d = *device_;
  for (PendingTrace& pt : trace_pending_) {
    for (auto& [chunk, e] : pt.dma) d.destroy_event(e);
    d.destroy_event(pt.start);
  }
  for (Slot& s : slots_) {
    d.destroy_event(s.start);
    d.destroy_event(s.done);
  }
  events_.reset();
  for (StreamHandle l : lanes_) d.destroy_stream(l);
  if (dev_staging_ != nullptr) d.free_device(dev_staging_);
  staging_.reset();
  if (flags_ != nullptr) {
    d.unregister_host(flags_);
    std::free(flags_);
  }
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
  // Slots whose zero-copy kernel runs on a caller's stream: the kernel reads the slot.
  for (Slot& s : slots_) {
    if (s.state.load(std::memory_order_acquire) != kIssued) continue;
    try {
      device_->event_sync(s.done);
    } catch (...) {
      // Reported to the transfer that launched the kernel.
    }
  }
  // Transfers of the block-by-block backends run on callers' streams: wait for those whose
  // handles are still held, as the engine promises.
  std::vector<std::shared_ptr<TransferState>> live;
  {
    std::lock_guard lk(live_mutex_);
    for (auto& w : live_)
      if (auto t = w.lock()) live.push_back(std::move(t));
    live_.clear();
  }
  for (auto& t : live) wait(*t);
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
    try {
      wait_event(*device_, s.done);  // no slot is reused before its DMA has completed
      account_dma(s);
    } catch (...) {
      // The DMA failed: its own transfer reports that. Nothing runs on the device after a
      // fault, so the slot is free.
      s.timed = false;
    }
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
  it.piece_begin = 0;
  it.to_host = false;
  it.dma_ready.store(true, std::memory_order_relaxed);
  it.held.store(false, std::memory_order_relaxed);
  it.ready.store(ready, std::memory_order_relaxed);
  return it;
}

// Makes `item` visible to the issuer and its `pieces` claimable by the gather threads.
void EngineCore::publish_item(Item& item, std::uint32_t pieces) {
  const std::uint64_t n = tail_.load(std::memory_order_relaxed);
  item.claim.store((n << 32) | pieces, std::memory_order_release);
  tail_.store(n + 1, std::memory_order_seq_cst);
}

// Publishes an item with pieces for the pool and wakes the pool where it may be idle: for a
// transfer's first item, and when every earlier item has been taken (the threads may have run
// dry and parked). Otherwise the threads are busy with earlier items and reach this one by
// themselves; waking them again would cost a futex call per chunk (tens of microseconds in a VM
// while they are still waking up). A thread that parks has first seen the head reach the tail.
void EngineCore::publish_for_pool(Item& item, std::uint32_t pieces, bool first) {
  const std::uint64_t seq = tail_.load(std::memory_order_relaxed);
  publish_item(item, pieces);
  if (first || gather_head_.load(std::memory_order_seq_cst) >= seq) pool_->wake();
}

void EngineCore::trace(std::uint32_t transfer, TraceEvent::What what, std::uint32_t a,
                       std::uint32_t b, std::uint64_t ns) {
  if (!trace_on_.load(std::memory_order_relaxed)) return;
  const std::size_t i = trace_n_.fetch_add(1, std::memory_order_relaxed);
  if (i < trace_.size())
    trace_[i] = {ns != 0 ? ns : now_ns(), transfer, what, static_cast<std::int16_t>(tl_gather_thread), a, b};
}

void EngineCore::start_trace(std::size_t capacity) {
  std::lock_guard lk(trace_mutex_);
  trace_on_.store(false);
  trace_.assign(capacity, TraceEvent{});
  trace_n_.store(0);
  trace_on_.store(capacity > 0);
}

void EngineCore::keep_trace_events(std::uint32_t id, std::uint64_t start_ns, EventHandle start,
                                   std::vector<std::pair<std::uint32_t, EventHandle>>&& dma) {
  std::lock_guard lk(trace_mutex_);
  trace_pending_.push_back({id, start_ns, start, std::move(dma)});
}

std::vector<TraceEvent> EngineCore::take_trace() {
  std::lock_guard lk(trace_mutex_);
  // Each traced transfer's DMA completions, on the GPU clock mapped onto the host's.
  for (PendingTrace& pt : trace_pending_) {
    for (auto [chunk, e] : pt.dma) {
      try {
        device_->event_sync(e);
        const double ms = device_->event_elapsed_ms(pt.start, e);
        const std::size_t i = trace_n_.fetch_add(1, std::memory_order_relaxed);
        if (i < trace_.size())
          trace_[i] = {pt.start_ns + static_cast<std::uint64_t>(ms * 1e6), pt.id, TraceEvent::kDmaDone, -1,
                       chunk, 0};
      } catch (...) {
        // A DMA that failed or never ran: the trace lacks the point.
      }
      device_->destroy_event(e);
    }
    device_->destroy_event(pt.start);
  }
  trace_pending_.clear();
  trace_on_.store(false);
  std::vector<TraceEvent> out(trace_.begin(),
                              trace_.begin() + static_cast<std::ptrdiff_t>(
                                                   std::min(trace_n_.load(), trace_.size())));
  trace_.clear();
  return out;
}

Transfer EngineCore::submit(std::span<const BlockCopy> blocks, StreamHandle stream, Direction direction) {
  // Every resource below belongs to this engine's GPU; the caller's current device is restored.
  const ScopedCurrentDevice current(*device_);
  const bool gather = options_.backend == Backend::kGather;
  // Wake parked gather threads first: they are back and spinning by the time planning has
  // produced pieces (a futex wake-up costs tens of microseconds, planning about as much).
  if (gather && !blocks.empty() &&
      blocks.size() * std::min<std::size_t>(blocks[0].bytes, 1u << 30) > options_.inline_gather_bytes)
    pool_->wake();
  const auto id = static_cast<std::uint32_t>(next_id_.fetch_add(1, std::memory_order_relaxed));
  trace(id, TraceEvent::kSubmit);
  const bool to_host = direction == Direction::kToHost;
  if (gather && to_host && blocks.size() > 1) {
    // Device to host, too large for the kernel: planned a stretch at a time, with the DMAs of
    // the chunks planned first already running (only placing the bytes waits for the whole
    // list to be valid).
    std::uint64_t bytes = 0;
    for (const BlockCopy& b : blocks) bytes = b.bytes > UINT64_MAX - bytes ? UINT64_MAX : bytes + b.bytes;
    if (bytes > options_.kernel_max_bytes) return submit_to_host_streamed(blocks, stream, id);
  }
  const auto t_plan = Clock::now();
  Plan plan = take_plan();
  try {
    PlanConfig cfg = gather ? plan_config_ : pass_config_;
    cfg.direction = direction;
    make_plan(blocks, cfg, [this](const void* p) { return device_->query_pointer(p); }, plan,
              pageable_cache_.get());
  } catch (...) {
    recycle_plan(std::move(plan));
    throw;
  }
  st_plan_ns_.fetch_add(ns_since(t_plan), std::memory_order_relaxed);
  st_blocks_.fetch_add(blocks.size(), std::memory_order_relaxed);
  st_transfers_.fetch_add(1, std::memory_order_relaxed);  // counted once validated
  trace(id, TraceEvent::kPlanned);
  if (plan.total_bytes == 0) {
    recycle_plan(std::move(plan));
    return Transfer{};
  }

  auto t = std::make_shared<TransferState>();
  t->core = shared_from_this();
  t->id = id;
  t->to_host = to_host;
  t->plan = std::move(plan);
  t->done_event = events_->get();
  const Plan& p = t->plan;
  if (gather) {
    const bool small = options_.kernel_max_bytes != 0 && p.total_bytes <= options_.kernel_max_bytes &&
                       p.all_pinned_host && device_->host_pointers_usable();
    if (small) submit_kernel(t, stream);
    else if (to_host) submit_gather_to_host(t, stream);
    else submit_gather(t, stream);
  } else if (options_.backend == Backend::kZeroCopyKernel) {
    submit_kernel(t, stream);
  } else {
    submit_copies(t, stream);
  }
  if (!gather) {
    std::lock_guard lk(live_mutex_);
    std::erase_if(live_, [](const std::weak_ptr<TransferState>& w) { return w.expired(); });
    live_.push_back(t);
  }
  st_bytes_.fetch_add(p.total_bytes, std::memory_order_relaxed);
  trace(id, TraceEvent::kReturn);
  return Transfer(t);
}

void EngineCore::submit_gather(const std::shared_ptr<TransferState>& t, StreamHandle stream) {
  t->start_event = events_->get();
  t->lane_events.resize(lanes_.size(), nullptr);
  for (std::size_t l = 1; l < lanes_.size(); ++l) t->lane_events[l] = events_->get();
  const Plan& p = t->plan;
  const bool inline_gather = p.direct.empty() && p.chunks.size() == 1 &&
                             p.total_bytes <= options_.inline_gather_bytes;
  {
    std::unique_lock lk(submit_mutex_);
    if (shutting_down_) throw Error(ErrorCode::kShutdown, "copy_to_device: the engine is shutting down");
    device_->record_event(t->start_event, stream);
    begin_trace(*t, stream, true);
    // From here the transfer must be finalized whatever happens, or submit would not return.
    try {
      for (std::uint32_t i = 0; i < p.direct.size(); ++i) {
        if (preissue_) enqueue_direct(*t, i);
        else publish_item(append_item(ItemKind::kDirect, t, i, 0, true), 0);
      }
      for (std::uint32_t k = 0; k < p.chunks.size(); ++k) {
        const std::uint32_t slot = acquire_slot();
        Item& it = append_item(ItemKind::kChunk, t, k, slot, false);
        const PlannedChunk& c = p.chunks[k];
        if (!c.contiguous_device) {
          auto* entries = reinterpret_cast<ScatterEntry*>(slots_[slot].host + c.scatter_offset);
          for (std::uint32_t i = c.op_begin; i < c.op_end; ++i)
            entries[i - c.op_begin] = {reinterpret_cast<std::uint64_t>(p.ops[i].dst),
                                       p.ops[i].slot_offset, p.ops[i].bytes};
        }
        const std::uint32_t pieces = c.piece_end - c.piece_begin;
        Slot& s = slots_[slot];
        it.piece_begin = c.piece_begin;
        it.flag_value = ++s.flag_value;
        it.pieces_left.store(pieces, std::memory_order_relaxed);
        if (inline_gather) {
          publish_item(it, 0);
          for (std::uint32_t q = c.piece_begin; q < c.piece_end; ++q) gather_piece(it, q);
          it.ready.store(true, std::memory_order_seq_cst);
          if (preissue_) enqueue_issued(*t, k, slot, false);
        } else {
          publish_for_pool(it, pieces, k == 0);
          // The DMA waits on the GPU for the gather threads' flag: no driver call is left
          // between the end of the gather and the start of the DMA.
          if (preissue_) enqueue_issued(*t, k, slot, true);
        }
        trace(t->id, TraceEvent::kChunkPublished, k, pieces);
      }
    } catch (...) {
      t->fail(std::current_exception());
    }
    if (preissue_) finalize(*t);
    else publish_item(append_item(ItemKind::kFinalize, t, 0, 0, true), 0);
  }
  // The submitting thread would only wait now: it gathers too, while parked pool threads wake
  // up (a futex wake-up costs tens of microseconds, a 4 KB block a microsecond).
  // (It leaves device-to-host chunks whose DMA is still running to the pool.)
  if (!inline_gather && options_.submitter_gathers)
    while (run_next_piece(false)) {
    }
  // Advances the issue order past what is ready (gathered inline here, say): with preissue
  // nothing else would for a transfer that had no pieces for the pool.
  try_issue();
  if (!preissue_) {
    // The caller's stream must not wait on the GPU for anything the host has yet to do with
    // the driver: cudaFree, lazy module loading and other implicit device synchronisations on
    // any thread would then deadlock with the threads that still have to issue this transfer's
    // DMAs. So return once the last DMA is enqueued and make the stream wait on its event.
    // (With preissue every DMA is enqueued already and waits only on flags that the gather
    // threads set without calling the driver.)
    t->finalized.wait(false, std::memory_order_acquire);
  }
  try {
    device_->stream_wait_event(stream, t->done_event);
  } catch (...) {
    t->fail(std::current_exception());
  }
}

// Tracing: timing events for the transfer's start on the caller's stream and, with
// `dma_events`, for each chunk's DMA (created here, not on the issue path, so that tracing does
// not slow the issuer).
void EngineCore::begin_trace(TransferState& t, StreamHandle stream, bool dma_events) {
  if (!trace_on_.load(std::memory_order_relaxed)) return;
  t.trace_start = device_->create_event(true);
  for (std::uint32_t k = 0; dma_events && k < t.plan.chunks.size(); ++k)
    t.trace_dma.emplace_back(k, device_->create_event(true));
  t.trace_start_ns = now_ns();
  device_->record_event(t.trace_start, stream);
}

// Enqueues a chunk at submission (preissue) and marks its slot as carrying a DMA.
void EngineCore::enqueue_issued(TransferState& t, std::uint32_t index, std::uint32_t slot, bool wait) {
  Slot& s = slots_[slot];
  s.timed = false;
  try {
    enqueue_chunk(t, index, slot, wait, s.flag_value);
  } catch (...) {
    s.state.store(kIssued, std::memory_order_release);
    throw;
  }
  s.state.store(kIssued, std::memory_order_release);
}

void EngineCore::enqueue_direct(TransferState& t, std::uint32_t index) {
  const DirectCopy& dc = t.plan.direct[index];
  const std::uint32_t lane = t.to_host ? d2h_lane() : next_h2d_lane();
  if (t.to_host) device_->copy_d2h(dc.dst, dc.src, dc.bytes, lane_for(t, lane));
  else device_->copy_h2d(dc.dst, dc.src, dc.bytes, lane_for(t, lane));
  st_direct_.fetch_add(1, std::memory_order_relaxed);
}

// Device to host through staging. Each chunk's device side is moved into its slot on the
// device-to-host lane (packed on the GPU first when its device blocks are scattered), then the
// gather threads place the slot's bytes at the host destinations. The transfer is planned a
// stretch of blocks at a time and each chunk's DMA is enqueued as soon as the chunk is planned
// (its device blocks are validated by then, so the DMA reads only valid memory, and it writes
// only the slot); a gather thread notices a chunk's DMA has completed (poll_head_dma), and the
// chunk's pieces become claimable once the whole block list has been found valid. A bad block
// anywhere rejects the transfer: its chunks are then dropped without touching host memory. The
// caller's stream waits for the DMAs (after them the device blocks may change); the handle is
// done when the last piece is placed.
Transfer EngineCore::submit_to_host_streamed(std::span<const BlockCopy> blocks, StreamHandle stream,
                                             std::uint32_t id) {
  auto t = std::make_shared<TransferState>();
  t->core = shared_from_this();
  t->id = id;
  t->to_host = true;
  t->plan = take_plan();
  t->plan_state.store(TransferState::kPlanning, std::memory_order_relaxed);
  PlanConfig cfg = plan_config_;
  cfg.direction = Direction::kToHost;
  const PointerClassifier classify = [this](const void* p) { return device_->query_pointer(p); };
  std::uint64_t plan_ns = 0;
  auto timed = [&](auto&& step) {
    const auto t0 = Clock::now();
    step();
    plan_ns += ns_since(t0);
  };
  std::optional<PlanBuilder> builder;
  timed([&] { builder.emplace(blocks, cfg, classify, t->plan, pageable_cache_.get(), true); });
  // Without storage reserved up front (absurd sizes) the plan is made whole before anything moves.
  if (!builder->stable()) {
    timed([&] { builder->finish(); });
    t->plan_state.store(TransferState::kValid, std::memory_order_relaxed);
  }
  t->done_event = events_->get();
  t->start_event = events_->get();
  t->lane_events.resize(lanes_.size(), nullptr);
  for (std::size_t l = 1; l < lanes_.size(); ++l) t->lane_events[l] = events_->get();
  const Plan& p = t->plan;
  std::exception_ptr rejected;
  {
    std::unique_lock lk(submit_mutex_);
    if (shutting_down_) throw Error(ErrorCode::kShutdown, "copy_to_host: the engine is shutting down");
    device_->record_event(t->start_event, stream);
    begin_trace(*t, stream, false);  // each chunk's DMA event is made as the chunk is enqueued
    // First the leading chunks (3.75 MB with the default sizes), so that the copy engine has
    // work at once and while the rest of the list is checked; then the next chunk is enqueued
    // and placing may begin; then the rest is packed and its chunks enqueued as they close.
    // Chunks enqueued before the check keep their slots until it is done, so never more of
    // them than the ring has slots.
    std::uint32_t enqueued = 0;
    std::vector<Item*> held;  // enqueued before the check: placing waits for release_held()
    auto enqueue_planned = [&](std::size_t limit) {
      const bool planning = t->plan_state.load(std::memory_order_relaxed) == TransferState::kPlanning;
      for (; enqueued < std::min(p.chunks.size(), limit); ++enqueued)
        enqueue_to_host_chunk(t, enqueued, planning ? &held : nullptr);
    };
    // Publishes the verdict (kValid or kRejected) to the gather threads, then lets them at the
    // held chunks: placed, or dropped.
    auto release_held = [&](int verdict) {
      t->plan_state.store(verdict, std::memory_order_release);
      for (Item* it : held) it->held.store(false, std::memory_order_release);
      if (!held.empty()) pool_->wake();
      held.clear();
    };
    const std::size_t early_chunks = std::min<std::size_t>(4, slots_.size());
    constexpr std::size_t kStretch = 32;
    try {
      if (t->plan_state.load(std::memory_order_relaxed) == TransferState::kPlanning) {
        try {
          while (builder->packed() < builder->size() && p.chunks.size() < early_chunks) {
            timed([&] { builder->advance(builder->packed() + kStretch); });
            enqueue_planned(early_chunks);
          }
          timed([&] { builder->check(); });
        } catch (const Error&) {
          rejected = std::current_exception();
        }
      }
      if (!rejected) {
        trace(id, TraceEvent::kPlanned);  // validated; packing goes on
        // The copy engine first: it may have run dry during the check (if a slot is left that
        // this transfer does not hold). Then the threads may place the held chunks (waking
        // them costs tens of microseconds).
        const std::size_t next = enqueued + 1;
        std::size_t step = 256;
        while (builder->packed() < builder->size() && p.chunks.size() < next) {
          timed([&] { builder->advance(builder->packed() + step); });
          step = std::min<std::size_t>(step * 2, 2048);
        }
        enqueue_planned(slots_.size());
        release_held(TransferState::kValid);
        while (builder->packed() < builder->size()) {
          timed([&] { builder->advance(builder->packed() + step); });
          enqueue_planned(p.chunks.size());
          step = std::min<std::size_t>(step * 2, 2048);
        }
        timed([&] { builder->finish(); });
        enqueue_planned(p.chunks.size());
        for (std::uint32_t i = 0; i < p.direct.size(); ++i) enqueue_direct(*t, i);
      }
    } catch (...) {
      t->fail(std::current_exception());  // a device error: the pieces place nothing
    }
    // Rejected: the chunks enqueued so far are dropped as their DMAs complete. (After a device
    // error the verdict is kValid, and the failed transfer's pieces place nothing either.)
    release_held(rejected ? TransferState::kRejected : TransferState::kValid);
    finalize(*t);
  }
  st_plan_ns_.fetch_add(plan_ns, std::memory_order_relaxed);
  if (rejected) {
    // Nothing reaches host memory, but DMAs already enqueued read the (valid) device blocks
    // planned first: later work on the caller's stream must not free or change them under it.
    try {
      device_->stream_wait_event(stream, t->done_event);
    } catch (...) {
      // The device failed as well; the rejection is what the caller needs to hear about.
    }
    std::rethrow_exception(rejected);
  }
  st_blocks_.fetch_add(blocks.size(), std::memory_order_relaxed);
  st_transfers_.fetch_add(1, std::memory_order_relaxed);  // counted once validated
  st_chunks_.fetch_add(p.chunks.size(), std::memory_order_relaxed);
  st_bytes_.fetch_add(p.total_bytes, std::memory_order_relaxed);
  try_issue();
  try {
    device_->stream_wait_event(stream, t->done_event);
  } catch (...) {
    t->fail(std::current_exception());
  }
  trace(id, TraceEvent::kReturn);
  return Transfer(t);
}

// Device to host for a transfer planned whole (small ones that the kernel cannot take).
void EngineCore::submit_gather_to_host(const std::shared_ptr<TransferState>& t, StreamHandle stream) {
  t->start_event = events_->get();
  t->lane_events.resize(lanes_.size(), nullptr);
  for (std::size_t l = 1; l < lanes_.size(); ++l) t->lane_events[l] = events_->get();
  const Plan& p = t->plan;
  {
    std::unique_lock lk(submit_mutex_);
    if (shutting_down_) throw Error(ErrorCode::kShutdown, "copy_to_host: the engine is shutting down");
    device_->record_event(t->start_event, stream);
    begin_trace(*t, stream, false);  // each chunk's DMA event is made as the chunk is enqueued
    try {
      for (std::uint32_t i = 0; i < p.direct.size(); ++i) enqueue_direct(*t, i);
      for (std::uint32_t k = 0; k < p.chunks.size(); ++k) enqueue_to_host_chunk(t, k);
    } catch (...) {
      t->fail(std::current_exception());
    }
    finalize(*t);
  }
  st_chunks_.fetch_add(p.chunks.size(), std::memory_order_relaxed);
  try_issue();
  try {
    device_->stream_wait_event(stream, t->done_event);
  } catch (...) {
    t->fail(std::current_exception());
  }
}

// Takes a slot for chunk k of a device-to-host transfer, enqueues the chunk's DMA into it and
// publishes the chunk's pieces (caller holds submit_mutex_).
void EngineCore::enqueue_to_host_chunk(const std::shared_ptr<TransferState>& t, std::uint32_t k,
                                       std::vector<Item*>* held) {
  const Plan& p = t->plan;
  const std::uint32_t slot = acquire_slot();
  Slot& s = slots_[slot];
  Item& it = append_item(ItemKind::kChunk, t, k, slot, false);
  if (held != nullptr) {
    it.held.store(true, std::memory_order_relaxed);
    held->push_back(&it);
  }
  const PlannedChunk& c = p.chunks[k];
  const std::uint32_t pieces = c.piece_end - c.piece_begin;
  it.piece_begin = c.piece_begin;
  it.to_host = true;
  it.dma_ready.store(false, std::memory_order_relaxed);
  it.pieces_left.store(pieces, std::memory_order_relaxed);
  s.timed = false;
  // The slot stays taken (kGathering) until its bytes are placed, not just until the DMA has
  // filled it: the last piece frees it (run_piece).
  t->host_left.fetch_add(1, std::memory_order_relaxed);
  try {
    // No timing event (one driver call less per chunk on the submission path): device-to-host
    // chunks are not in EngineStats::dma_seconds.
    StreamHandle l = lane_for(*t, d2h_lane());
    if (c.contiguous_device) {
      device_->copy_d2h(s.host, p.ops[c.op_begin].src, c.data_bytes, l);
    } else {
      // The kernel packs the device blocks into the slot's device staging area, then one DMA
      // brings the data back. It reads its entries from the pinned slot over PCIe (one read per
      // thread block, all in parallel); where the GPU cannot read host memory at its host
      // address they are copied to the device first. The packing runs on a lane of its own, so
      // that it overlaps the previous chunk's DMA; the device-to-host lane waits for it (the
      // slot's start event, unused for timing here).
      auto* entries = reinterpret_cast<ScatterEntry*>(s.host + c.scatter_offset);
      for (std::uint32_t i = c.op_begin; i < c.op_end; ++i)
        entries[i - c.op_begin] = {reinterpret_cast<std::uint64_t>(p.ops[i].src), p.ops[i].slot_offset,
                                   p.ops[i].bytes};
      StreamHandle pack = lane_for(*t, pack_lane());
      const ScatterEntry* read_from = entries;
      if (!device_->host_pointers_usable()) {
        const std::size_t entry_bytes = (c.op_end - c.op_begin) * sizeof(ScatterEntry);
        device_->copy_h2d(s.dev + c.scatter_offset, s.host + c.scatter_offset, entry_bytes, pack);
        read_from = reinterpret_cast<const ScatterEntry*>(s.dev + c.scatter_offset);
      }
      device_->gather(read_from, c.op_end - c.op_begin, s.dev, pack);
      device_->record_event(s.start, pack);
      device_->stream_wait_event(l, s.start);
      device_->copy_d2h(s.host, s.dev, c.data_bytes, l);
      st_scattered_.fetch_add(1, std::memory_order_relaxed);
    }
    device_->record_event(s.done, l);
    if (t->trace_start != nullptr) {
      t->trace_dma.emplace_back(k, device_->create_event(true));
      device_->record_event(t->trace_dma.back().second, l);
    }
    trace(t->id, TraceEvent::kChunkIssued, k, static_cast<std::uint32_t>(c.data_bytes));
  } catch (...) {
    // Nothing will arrive in the slot: let the pieces run (a failed transfer's pieces place
    // nothing) so that the items behind keep moving.
    it.dma_ready.store(true, std::memory_order_release);
    publish_item(it, pieces);
    pool_->wake();
    throw;
  }
  publish_for_pool(it, pieces, k == 0);
  trace(t->id, TraceEvent::kChunkPublished, k, pieces);
}

// The head item is a device-to-host chunk whose DMA may not have completed: one thread at a time
// asks the device; the others find no work and park. Returns true when the chunk can be placed
// (or its DMA failed, which its transfer then reports).
bool EngineCore::poll_head_dma(Item& item) {
  if (item.dma_ready.load(std::memory_order_acquire)) return true;
  // The transfer is still being planned: its bytes may be placed only once it is found valid.
  if (item.held.load(std::memory_order_acquire)) return false;
  if (dma_poller_.exchange(true, std::memory_order_acq_rel)) return false;
  // Only a poller sets dma_ready: checked again while holding the poller's flag, the chunk
  // cannot have been placed and issued (and `item.t` reset) under us.
  if (item.dma_ready.load(std::memory_order_acquire) || item.held.load(std::memory_order_acquire)) {
    dma_poller_.store(false, std::memory_order_release);
    return item.dma_ready.load(std::memory_order_acquire);
  }
  bool ready = false;
  try {
    ready = device_->event_done(slots_[item.slot].done);
  } catch (...) {
    item.t->fail(std::current_exception());
    ready = true;
  }
  if (ready) item.dma_ready.store(true, std::memory_order_release);
  dma_poller_.store(false, std::memory_order_release);
  if (ready) pool_->wake();
  return ready;
}

// The zero-copy kernel, for its backend and for the gather backend's small transfers. The block
// list goes into staging slots (pinned, read by the kernel over PCIe); each slot is reused only
// after the kernel that reads it has finished.
void EngineCore::submit_kernel(const std::shared_ptr<TransferState>& t, StreamHandle stream) {
  const Plan& p = t->plan;
  const std::size_t total = p.ops.size() + p.direct.size();
  const std::size_t per_slot = options_.slot_bytes / sizeof(ZeroCopyEntry);
  auto entry = [&](std::size_t i) -> ZeroCopyEntry {
    if (i < p.ops.size())
      return {reinterpret_cast<std::uint64_t>(p.ops[i].src),
              reinterpret_cast<std::uint64_t>(p.ops[i].dst), p.ops[i].bytes};
    const DirectCopy& d = p.direct[i - p.ops.size()];
    return {reinterpret_cast<std::uint64_t>(d.src), reinterpret_cast<std::uint64_t>(d.dst), d.bytes};
  };
  {
    std::unique_lock lk(submit_mutex_);
    if (shutting_down_) throw Error(ErrorCode::kShutdown, "copy_to_device: the engine is shutting down");
    try {
      for (std::size_t i = 0; i < total; i += per_slot) {
        const auto n = static_cast<std::uint32_t>(std::min(per_slot, total - i));
        Slot& s = slots_[acquire_slot()];
        auto* entries = reinterpret_cast<ZeroCopyEntry*>(s.host);
        for (std::uint32_t k = 0; k < n; ++k) entries[k] = entry(i + k);
        s.timed = false;
        try {
          device_->zero_copy(entries, n, stream);
          device_->record_event(s.done, stream);
        } catch (...) {
          s.state.store(kIssued, std::memory_order_release);
          throw;
        }
        s.state.store(kIssued, std::memory_order_release);
      }
      device_->record_event(t->done_event, stream);
    } catch (...) {
      t->fail(std::current_exception());
    }
  }
  t->finalized.store(true, std::memory_order_release);
  t->finalized.notify_all();
}

// batch_async and per_block: the caller's stream carries the copies itself.
void EngineCore::submit_copies(const std::shared_ptr<TransferState>& t, StreamHandle stream) {
  const std::vector<DirectCopy>& c = t->plan.direct;
  const bool to_host = t->to_host;
  try {
    if (options_.backend == Backend::kPerBlock) {
      for (const DirectCopy& d : c) {
        if (to_host) device_->copy_d2h(d.dst, d.src, d.bytes, stream);
        else device_->copy_h2d(d.dst, d.src, d.bytes, stream);
      }
    } else {
      // One cudaMemcpyBatchAsync per slot_bytes of blocks (at least one block each).
      thread_local std::vector<void*> dsts;
      thread_local std::vector<const void*> srcs;
      thread_local std::vector<std::size_t> sizes;
      for (std::size_t i = 0; i < c.size();) {
        dsts.clear();
        srcs.clear();
        sizes.clear();
        std::size_t bytes = 0;
        do {
          dsts.push_back(c[i].dst);
          srcs.push_back(c[i].src);
          sizes.push_back(c[i].bytes);
          bytes += c[i].bytes;
          ++i;
        } while (i < c.size() && bytes + c[i].bytes <= options_.slot_bytes);
        device_->copy_batch(dsts.data(), srcs.data(), sizes.data(), dsts.size(), to_host, stream);
        st_chunks_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    device_->record_event(t->done_event, stream);
  } catch (...) {
    t->fail(std::current_exception());
  }
  t->finalized.store(true, std::memory_order_release);
  t->finalized.notify_all();
}

// ---------------------------------------------------------------------------------------------
// The gather threads (and submitters, when they help) take pieces in publication order: the
// first unclaimed piece of the earliest item that has one. A claim is one compare-and-swap on
// the item's claim word, whose sequence number makes a stale claim on a reused item fail.
bool EngineCore::run_next_piece(bool may_poll) {
  for (;;) {
    std::uint64_t h = gather_head_.load(std::memory_order_acquire);
    if (h >= tail_.load(std::memory_order_acquire)) return false;
    Item& it = items_[h % items_.size()];
    std::uint64_t c = it.claim.load(std::memory_order_acquire);
    const std::uint32_t next = static_cast<std::uint32_t>(c >> 16) & 0xffff;
    const std::uint32_t count = static_cast<std::uint32_t>(c) & 0xffff;
    if ((c >> 32) != (h & 0xffffffff) || next >= count) {
      // Every piece of item h is taken (or it was reused, which means the same): move on.
      gather_head_.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel);
      continue;
    }
    if (it.to_host && !it.dma_ready.load(std::memory_order_acquire) && !may_poll) return false;
    if (it.to_host && !poll_head_dma(it)) {
      // The chunk's bytes are not in the slot yet. The polling thread keeps looking (it counts
      // as busy, so it does not park); the others have nothing to do.
      if (dma_poller_.load(std::memory_order_acquire)) return false;
      std::this_thread::yield();
      return true;
    }
    if (!it.claim.compare_exchange_weak(c, c + kClaimOne, std::memory_order_acq_rel)) continue;
    run_piece(it, it.piece_begin + next);
    return true;
  }
}

void EngineCore::gather_piece(const Item& item, std::uint32_t piece) {
  const Plan& p = item.t->plan;
  const PlannedPiece& pc = p.pieces[piece];
  const auto t0 = Clock::now();
  if (item.to_host) {
    // A rejected or failed transfer places nothing: its slot holds nothing worth placing.
    const TransferState& t = *item.t;
    if (t.plan_state.load(std::memory_order_acquire) == TransferState::kValid &&
        !t.failed.load(std::memory_order_acquire))
      scatter_ops(p.ops.data() + pc.op_begin, pc.op_end - pc.op_begin, slots_[item.slot].host, store_kind_);
  } else {
    gather_ops(p.ops.data() + pc.op_begin, pc.op_end - pc.op_begin, slots_[item.slot].host, store_kind_);
  }
  st_gather_ns_.fetch_add(ns_since(t0), std::memory_order_relaxed);
}

void EngineCore::run_piece(Item& item, std::uint32_t piece) {
  const std::uint32_t id = item.t->id, chunk = item.index;
  trace(id, TraceEvent::kPieceStart, chunk, piece);
  gather_piece(item, piece);
  trace(id, TraceEvent::kPieceEnd, chunk, piece);
  // The thread that completes a chunk's last piece issues it (or hands it to the issuer).
  if (item.pieces_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (item.to_host) {
      // Placed: the slot may be reused. Its DMA is known to be done (the chunk became
      // placeable when its event completed), so the next user need not ask the device again;
      // after a failure that is not known.
      Slot& s = slots_[item.slot];
      TransferState& t = *item.t;
      s.state.store(t.failure() ? kIssued : kFree, std::memory_order_release);
      s.state.notify_all();
      if (t.host_left.fetch_sub(1, std::memory_order_acq_rel) == 1) t.host_left.notify_all();
    } else if (preissue_) {
      device_->signal_value(slots_[item.slot].flag, item.flag_value);  // the DMA may start
      trace(id, TraceEvent::kChunkIssued, chunk,
            static_cast<std::uint32_t>(item.t->plan.chunks[chunk].data_bytes));
    }
    item.ready.store(true, std::memory_order_seq_cst);
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

// Enqueues chunk `index` of `t` from `slot` on the next lane; with `wait`, behind a wait on the
// slot's flag reaching `flag_value` (set by the thread that finishes gathering the chunk).
void EngineCore::enqueue_chunk(TransferState& t, std::uint32_t index, std::uint32_t slot, bool wait,
                               std::uint64_t flag_value) {
  Slot& s = slots_[slot];
  const PlannedChunk& c = t.plan.chunks[index];
  const std::uint32_t lane = next_h2d_lane();
  StreamHandle l = lane_for(t, lane);
  if (wait) device_->wait_value_geq(s.flag, flag_value, l);
  device_->record_event(s.start, l);
  if (c.contiguous_device) {
    device_->copy_h2d(t.plan.ops[c.op_begin].dst, s.host, c.data_bytes, l);
  } else {
    device_->copy_h2d(s.dev, s.host, c.dma_bytes(), l);
    device_->scatter(reinterpret_cast<const ScatterEntry*>(s.dev + c.scatter_offset),
                     c.op_end - c.op_begin, s.dev, l);
    st_scattered_.fetch_add(1, std::memory_order_relaxed);
  }
  device_->record_event(s.done, l);
  if (t.trace_start != nullptr) device_->record_event(t.trace_dma[index].second, l);
  s.timed = true;
  st_chunks_.fetch_add(1, std::memory_order_relaxed);
}

void EngineCore::issue_chunk(Item& item) {
  // Enqueued at submission: device-to-host chunks always, the others with preissue (their flag
  // was set when the chunk was gathered).
  if (preissue_ || item.to_host) return;
  TransferState& t = *item.t;
  Slot& s = slots_[item.slot];
  s.timed = false;
  try {
    if (!t.failure()) {  // a failed transfer moves nothing more; its slot is free again at once
      enqueue_chunk(t, item.index, item.slot, false, 0);
      trace(t.id, TraceEvent::kChunkIssued, item.index,
            static_cast<std::uint32_t>(t.plan.chunks[item.index].data_bytes));
    }
  } catch (...) {
    t.fail(std::current_exception());
  }
  s.state.store(kIssued, std::memory_order_release);
  s.state.notify_all();
}

void EngineCore::issue_direct(Item& item) {
  try {
    enqueue_direct(*item.t, item.index);
  } catch (...) {
    item.t->fail(std::current_exception());
  }
}

// Joins the lanes the transfer used into the first of them and records its done event there
// (not on lane 0 regardless: a device-to-host transfer must not wait behind host-to-device DMAs).
void EngineCore::finalize(TransferState& t) {
  try {
    std::size_t home = 0;
    while (home < lanes_.size() && (t.lanes_started & (1u << home)) == 0) ++home;
    if (home == lanes_.size()) home = 0;
    for (std::size_t l = home + 1; l < lanes_.size(); ++l) {
      if ((t.lanes_started & (1u << l)) == 0) continue;
      device_->record_event(t.lane_events[l], lanes_[l]);
      device_->stream_wait_event(lanes_[home], t.lane_events[l]);
    }
    device_->record_event(t.done_event, lanes_[home]);
  } catch (...) {
    t.fail(std::current_exception());
  }
  trace(t.id, TraceEvent::kFinalized);
  t.finalized.store(true, std::memory_order_release);
  t.finalized.notify_all();
}

void EngineCore::issue_finalize(Item& item) {
  if (!preissue_) finalize(*item.t);
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
  // Device to host: the gather threads place the last bytes after the DMAs.
  for (std::uint32_t left = t.host_left.load(std::memory_order_acquire); left != 0;
       left = t.host_left.load(std::memory_order_acquire))
    t.host_left.wait(left, std::memory_order_acquire);
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
  if (t.host_left.load(std::memory_order_acquire) != 0) return false;
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
  st.cpu_sharing = cpu_sharing_;
  return st;
}

}  // namespace gfd::detail
