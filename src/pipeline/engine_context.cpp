#include "pipeline/engine_context.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/sync.hpp"
#include "gfd/error.hpp"

namespace gfd::detail {

EventPool::~EventPool() {
  EventHandle e = nullptr;
  while (free_.pop(e)) device_.destroy_event(e);
}

HostFlags::~HostFlags() {
  if (flags_ == nullptr) return;
  device_.unregister_host(flags_);
  std::free(flags_);
}

HostFlags::Flag HostFlags::take() {
  std::unique_lock lk(mutex_);
  if (flags_ == nullptr) {
    const std::size_t bytes = kFlags * kWords * sizeof(std::uint64_t);
    void* f = nullptr;
    if (posix_memalign(&f, 4096, bytes) != 0)
      throw Error(ErrorCode::kSystem, "out of memory for completion flags");
    std::memset(f, 0, bytes);
    try {
      device_.register_host(f, bytes);
    } catch (...) {
      std::free(f);
      throw;
    }
    flags_ = static_cast<std::uint64_t*>(f);
    free_.resize(kFlags);
    for (std::uint32_t i = 0; i < kFlags; ++i) free_[i] = kFlags - 1 - i;
  }
  freed_.wait(lk, [&] { return !free_.empty(); });
  const std::uint32_t i = free_.back();
  free_.pop_back();
  return {flags_ + i * kWords, next_value_++};
}

void HostFlags::signal(const Flag& f) {
  device_.signal_value(f.addr, f.value);
  {
    std::lock_guard lk(mutex_);
    free_.push_back(static_cast<std::uint32_t>((f.addr - flags_) / kWords));
  }
  freed_.notify_one();
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

Plan PlanPool::take() {
  std::lock_guard lk(mutex_);
  if (spare_.empty()) return Plan{};
  Plan p = std::move(spare_.back());
  spare_.pop_back();
  return p;
}

void PlanPool::put(Plan&& plan) noexcept {
  constexpr std::size_t kSparePlans = 16;
  try {
    std::lock_guard lk(mutex_);
    if (spare_.size() < kSparePlans) spare_.push_back(std::move(plan));
  } catch (...) {
    // Out of memory for the list: the plan is simply freed.
  }
}

void Counters::fill(EngineStats& st) const {
  st.bytes = bytes.load();
  st.transfers = transfers.load();
  st.blocks = blocks.load();
  st.chunks = chunks.load();
  st.direct_copies = direct.load();
  st.strided_copies = strided.load();
  st.gather_seconds = static_cast<double>(gather_ns.load()) * 1e-9;
  st.submit_wait_seconds = static_cast<double>(submit_wait_ns.load()) * 1e-9;
  st.plan_seconds = static_cast<double>(plan_ns.load()) * 1e-9;
}

void Counters::fill(TuningStats& st) const {
  st.scattered_chunks = scattered.load();
  st.placements = placements.load();
  st.packings = packings.load();
  st.slots_deferred = slots_deferred.load();
  st.host_direct_chunks = host_direct.load();
  st.id_planned_transfers = id_planned.load();
  st.bounced_runs = bounced.load();
}

namespace {
PlanConfig staged_config(const EngineOptions& o, int device) {
  PlanConfig c;
  c.device = device;
  c.slot_bytes = o.slot_bytes;
  c.chunk_bytes_to_host = o.chunk_bytes_to_host;
  c.first_chunk_bytes = std::min(o.first_chunk_bytes, o.slot_bytes);
  c.piece_bytes = o.piece_bytes;
  c.direct_min_bytes = o.direct_min_bytes;
  c.direct_min_bytes_to_host = o.direct_min_bytes_to_host;
  c.strided_min_rows = o.strided_min_rows;
  c.strided_min_bytes = o.strided_min_bytes;
  c.check_overlaps = o.check_overlaps;
  return c;
}
}  // namespace

EngineContext::EngineContext(const EngineOptions& resolved, const Tuning& t,
                             std::shared_ptr<Device> d)
    : device(std::move(d)),
      options(resolved),
      tuning(t),
      plan_config(staged_config(resolved, device->ordinal())),
      events(*device),
      tracer(*device),
      pageable(static_cast<std::uint32_t>(resolved.pageable_cache_ms)),
      host_flags(*device) {}

Plan EngineContext::plan(std::span<const BlockCopy> blocks, const PlanConfig& config,
                         std::uint32_t id, std::optional<std::uint64_t> bytes) {
  const auto t0 = Clock::now();
  Plan p = plans.take();
  // A rejected list's plan (and its scratch, sized by the list) is freed here, not pooled.
  make_plan(blocks, config, classifier(), p, &pageable, bytes);
  Counters::add(counters.plan_ns, ns_since(t0));
  tracer.record(id, TraceEvent::kPlanned);
  return p;
}

}  // namespace gfd::detail
