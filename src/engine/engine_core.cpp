#include "engine/engine_core.hpp"

#include <algorithm>
#include <string>

#include "common/sync.hpp"
#include "gfd/error.hpp"
#include "host/gather_copy.hpp"
#include "host/placement.hpp"
#include "host/topology.hpp"
#include "planning/cache_set.hpp"

namespace gfd::detail {
namespace {
constexpr int kAutoThreadCap = 16;  // host memory bandwidth is saturated well before this
}

void SubmitGate::enter(const char* call) {
  inside_.fetch_add(1, std::memory_order_seq_cst);
  if (closed_.load(std::memory_order_seq_cst)) {
    leave();
    throw Error(ErrorCode::kShutdown, std::string(call) + ": the engine is shutting down");
  }
}

void SubmitGate::leave() noexcept {
  if (inside_.fetch_sub(1, std::memory_order_seq_cst) == 1) inside_.notify_all();
}

void SubmitGate::close() noexcept {
  closed_.store(true, std::memory_order_seq_cst);
  for (int n = inside_.load(std::memory_order_seq_cst); n != 0;
       n = inside_.load(std::memory_order_seq_cst))
    inside_.wait(n, std::memory_order_seq_cst);
}

std::shared_ptr<EngineCore> EngineCore::create(const EngineOptions& options,
                                               std::shared_ptr<Device> device,
                                               const Tuning& tuning) {
  return std::shared_ptr<EngineCore>(new EngineCore(options, std::move(device), tuning));
}

Engine EngineCore::make_engine(const EngineOptions& options, std::shared_ptr<Device> device,
                               const Tuning& tuning) {
  return Engine(create(options, std::move(device), tuning));
}

EngineCore& EngineCore::of(const Engine& engine) {
  if (!engine.core_)
    throw Error(ErrorCode::kInvalidArgument,
                "Engine: this engine was moved from; use the one it was moved to");
  return *engine.core_;
}

EngineCore::EngineCore(const EngineOptions& o, std::shared_ptr<Device> device,
                       const Tuning& tuning) {
  o.validate();
  tuning.validate();
  const BackendEntry& entry = backend_entry(o.backend);
  if (entry.caps.reads_host_pointers && !device->host_pointers_usable())
    throw Error(ErrorCode::kInvalidArgument,
                std::string("EngineOptions::backend: ") + to_string(o.backend) +
                    " needs a GPU that reads pinned host memory at its host address (unified "
                    "addressing); this one does not");
  const Placement pl = place_engine(o, *device);
  cpus_ = pl.cpus;
  numa_node_ = pl.numa_node;
  cpu_sharing_ = pl.cpu_sharing;

  // The options in force: automatic choices resolved, and what the backend does not use zeroed.
  EngineOptions r = o;
  r.numa_node = numa_node_;
  r.gather_threads = !entry.caps.gather_pool ? 0
                     : o.gather_threads != 0
                         ? o.gather_threads
                         : std::clamp(static_cast<int>(cpus_.size()) - 1, 1, kAutoThreadCap);
  r.staging_writes = to_public(resolve_staging_writes(o.staging_writes));
  // The hardware's fallbacks: no preissue without 64-bit stream memory operations, no batched
  // placement where the GPU cannot read pinned memory at its host address.
  Tuning t = tuning;
  t.preissue = tuning.preissue && entry.caps.copy_lanes && device->supports_wait_value();
  t.batch_placement = tuning.batch_placement && device->host_pointers_usable();
  ctx_ = std::make_shared<EngineContext>(r, t, std::move(device));

  const ScopedCurrentDevice current(*ctx_->device);
  backend_ = entry.make(BackendSetup{ctx_, cpus_, numa_node_});
}

EngineCore::~EngineCore() {
  shutdown();
  const ScopedCurrentDevice current(*ctx_->device);
  backend_.reset();
}

void EngineCore::shutdown() noexcept {
  gate_.close();  // waits for the submissions in flight
  if (drained_.exchange(true)) return;
  backend_->drain();
}

namespace {
struct Leave {
  SubmitGate& gate;
  ~Leave() { gate.leave(); }
};
}  // namespace

Transfer EngineCore::submit(std::span<const BlockCopy> blocks, StreamHandle stream,
                            Direction direction) {
  gate_.enter(direction == Direction::kToHost ? "copy_to_host" : "copy_to_device");
  Leave leave{gate_};
  // Every resource below belongs to this engine's GPU; the caller's current device is restored.
  const ScopedCurrentDevice current(*ctx_->device);
  return dispatch(blocks.size(), [&](std::uint32_t id) {
    return backend_->submit(Request{blocks, stream, direction, id, nullptr});
  });
}

CacheSet EngineCore::register_caches(std::span<const CachePair> pairs,
                                     std::vector<std::string> names) {
  gate_.enter("register_caches");
  Leave leave{gate_};
  const ScopedCurrentDevice current(*ctx_->device);
  return CacheSetState::make(pairs, *ctx_->device, this, std::move(names));
}

Transfer EngineCore::submit_blocks(const CacheSet& caches, Direction d, const BlockIds& src,
                                   const BlockIds& dst, StreamHandle stream, bool lead) {
  gate_.enter("copy_blocks");
  Leave leave{gate_};
  const CacheSetState& set = CacheSetState::of(caches, this);
  const ScopedCurrentDevice current(*ctx_->device);
  return dispatch(src.count * set.pairs.size(), [&](std::uint32_t id) {
    return backend_->submit_set(SetRequest{set, src, dst, stream, d, id, lead});
  });
}

Transfer EngineCore::dispatch(std::size_t blocks,
                              const std::function<TransferPtr(std::uint32_t id)>& submit) {
  const std::uint32_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  ctx_->tracer.record(id, TraceEvent::kSubmit);
  TransferPtr t = submit(id);
  // Counted once validated (a rejected transfer has thrown by now).
  Counters& c = ctx_->counters;
  Counters::add(c.transfers, 1);
  Counters::add(c.blocks, blocks);
  if (t) Counters::add(c.bytes, t->plan.total_bytes);
  ctx_->tracer.record(id, TraceEvent::kReturn);
  return Transfer(std::move(t));
}

EngineStats EngineCore::stats() const {
  EngineStats st;
  ctx_->counters.fill(st);
  backend_->report(st);
  st.numa_node = numa_node_;
  st.cpus = cpus_;
  st.cpu_sharing = cpu_sharing_;
  st.slot_bytes = ctx_->options.slot_bytes;
  return st;
}

TuningStats EngineCore::tuning_stats() const {
  TuningStats st;
  ctx_->counters.fill(st);
  return st;
}

}  // namespace gfd::detail
