#include "backends/gather/gather.hpp"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "backends/baselines/zero_copy_kernel.hpp"
#include "backends/gather/gather_to_device.hpp"
#include "backends/gather/gather_to_host.hpp"

namespace gfd::detail {

StagingPipeline::StagingPipeline(const BackendSetup& setup)
    : ctx(setup.ctx),
      options(ctx->options),
      ring(*ctx->device, ctx->counters,
           RingConfig{
               options.staging_bytes / options.slot_bytes, options.slot_bytes, setup.numa_node,
               /*device_twin=*/true, /*flags=*/ctx->tuning.preissue,
               /*placed_flags=*/ctx->tuning.batch_placement && ctx->device->host_pointers_usable(),
               // Device to host with preissue: a flag in each slot, written once the
               // chunk's DMA is done (CopyLanes' flag stream), which the gather threads
               // read instead of asking about `done` (FaultWatch).
               /*dma_flags=*/ctx->tuning.preissue && ctx->device->supports_wait_value()}),
      lanes(*ctx, options.copy_streams, ring.size(), ring.has_dma_flags()),
      // Room for every slot's chunk plus the direct copies and finalizations between them.
      queue(ring.size() + 4096, ctx->tracer),
      store(resolve_staging_writes(options.staging_writes)),
      preissue(ctx->tuning.preissue),
      watch(*ctx->device) {
  Device* device = ctx->device.get();
  pool = std::make_unique<GatherPool>(
      options.gather_threads, setup.cpus, options.spin_us,
      [this] { return queue.run_next_piece(); },
      [device](int index) {
        Tracer::set_thread_index(index);
        device->make_current();
      });
  queue.set_pool(pool.get());
}

StagingPipeline::~StagingPipeline() { pool.reset(); }

namespace {

// The size from which a block goes to the copy engine as it is, one way (SIZE_MAX: never).
std::size_t direct_min(const EngineContext& ctx, Direction d) {
  PlanConfig c = ctx.plan_config;
  c.direction = d;
  return c.direct_min();
}

bool all_at_least(std::span<const BlockCopy> blocks, std::size_t bytes) {
  return std::all_of(blocks.begin(), blocks.end(),
                     [bytes](const BlockCopy& b) { return b.bytes >= bytes; });
}

// How a transfer is planned: the one choice of the gather backend's way for a transfer, made by
// route() and acted on by one switch (GatherBackend::submit_routed). A plan made whole then
// moves as move_of() says.
enum class Route {
  kRuns,               // a CacheSet's ids, each one constant-stride run: a 2D copy per id
  kFromIds,            // a CacheSet's ids of equal staged blocks: planned by arithmetic
  kListed,             // a CacheSet's ids listed block by block, then routed as a list
  kStretchesToHost,    // a list to host memory: planned a stretch at a time while DMAs run
  kStretchesToDevice,  // a list to the device: packed while its first chunks are gathered
  kWhole,              // a list planned whole here
};

// How a plan made whole moves.
enum class Move {
  kKernel,        // small, pinned: the zero-copy kernel on the caller's stream
  kCallerStream,  // nothing staged, at most one batch of direct copies: on the caller's stream
  kInline,  // one chunk of at most inline_gather_bytes: gathered here, moved on the caller's stream
  kOneChunk,  // one larger chunk: gathered by the pool, moved on the caller's stream
  kLanes,     // host to device through staging on the copy lanes
  kToHost,    // device to host through staging
};

// A transfer as route() sees it: a CacheSet's ids, or a block list and what is known of it.
struct Work {
  const SetRequest* set = nullptr;
  const Request* list = nullptr;
  bool lead = true;         // SetRequest::lead
  bool strided = false;     // the list may be all constant-stride runs (planned whole first)
  bool all_direct = false;  // a CacheSet's list of at most one batch of blocks that all go direct
  std::uint64_t bytes = 0;  // the list's bytes summed (not for a strided list)
};

class GatherBackend final : public BackendImpl {
 public:
  explicit GatherBackend(const BackendSetup& setup)
      : BackendImpl(setup.ctx),
        pipe_(setup),
        to_device_(pipe_),
        to_host_(pipe_),
        kernel_(*ctx_, pipe_.ring, pipe_.lock) {}

  TransferPtr submit(const Request& r) override { return submit_list(r, true); }

  TransferPtr submit_set(const SetRequest& r) override {
    Work w;
    w.set = &r;
    w.lead = r.lead;
    return submit_routed(w);
  }

  void drain() noexcept override {
    pipe_.queue.drain();  // every published item issued (the pool finishes its pieces)
    pipe_.lanes.drain();
    pipe_.ring.drain();  // kernels on callers' streams read their slots
    pipe_.pool.reset();
  }

  void report(EngineStats& st) override {
    st.hugepages = pipe_.ring.hugepages();
    st.staging_bytes = pipe_.ring.bytes();
    st.gather_threads = pipe_.pool ? pipe_.pool->threads() : 0;
    st.staging_writes = to_public(pipe_.store);
  }

 private:
  TransferPtr submit_list(const Request& r, bool lead) {
    Work w;
    w.list = &r;
    w.lead = lead;
    const bool several = r.blocks.size() > 1;
    // A list that may be all constant-stride runs is planned whole first: if nothing is staged,
    // its 2D copies go on the caller's stream. It neither sums its bytes first nor wakes the
    // pool: one that is a run end to end is planned in one pass and never uses the pool.
    w.strided = several && may_be_strided(r.blocks, ctx_->plan_config);
    // A CacheSet's list of at most one batch of blocks that all go to the copy engine as they
    // are (a layer's pages in a layered load, say) stages nothing: no pool to wake, no lanes to
    // join and no cross-stream waits on the GPU.
    w.all_direct = several && !w.strided && r.trust != nullptr && r.trust->all_pinned &&
                   r.blocks.size() <= CopyLanes::kGroup &&
                   all_at_least(r.blocks, direct_min(*ctx_, r.direction));
    // Parked gather threads are woken first, on an estimate from the first block: they are back
    // and spinning by the time planning has produced pieces (a futex wake-up costs tens of
    // microseconds, summing and planning about as much).
    if (!w.strided && !w.all_direct && !r.blocks.empty() &&
        r.blocks.size() * std::min<std::size_t>(r.blocks[0].bytes, 1u << 30) >
            pipe_.options.inline_gather_bytes)
      wake_pool(r.id);
    if (!w.strided) w.bytes = total_bytes(r.blocks);
    return submit_routed(w);
  }

  Route route(const Work& w) const {
    const EngineOptions& o = pipe_.options;
    if (w.set != nullptr) {
      if (takes_runs(w.set->set)) return Route::kRuns;
      if (takes_ids(w.set->set, w.set->direction)) return Route::kFromIds;
      return Route::kListed;
    }
    const Request& r = *w.list;
    if (r.blocks.size() <= 1 || w.strided || w.all_direct || w.bytes <= o.kernel_max_bytes)
      return Route::kWhole;
    if (r.direction == Direction::kToHost) return Route::kStretchesToHost;
    // A transfer of one first chunk or less is planned whole (one chunk: Move::kOneChunk).
    if (w.bytes > o.inline_gather_bytes && w.bytes > ctx_->plan_config.first_chunk_bytes)
      return Route::kStretchesToDevice;
    return Route::kWhole;
  }

  TransferPtr submit_routed(const Work& w) {
    switch (route(w)) {
      case Route::kRuns:
        return submit_runs(*w.set);
      case Route::kFromIds: {
        TransferPtr t;
        if (submit_from_ids(*w.set, t)) return t;
        [[fallthrough]];  // ids that would make coalescing blocks keep the listed path
      }
      case Route::kListed:
        return submit_listed(*w.set, [&](const Request& q) { return submit_list(q, w.lead); });
      case Route::kStretchesToHost:
        return to_host_.submit(*w.list, nullptr, w.bytes);
      case Route::kStretchesToDevice:
        return to_device_.submit_planning(*w.list, w.bytes);
      case Route::kWhole:
        break;
    }
    const Request& r = *w.list;
    PlanConfig cfg = ctx_->plan_config;
    cfg.direction = r.direction;
    cfg.trust = r.trust;
    TransferPtr t = plan_transfer(ctx_, r, cfg, w.strided ? std::nullopt : std::optional(w.bytes));
    if (t) move(t, r, w.lead);
    return t;
  }

  Move move_of(const Plan& p, Direction d) const {
    const EngineOptions& o = pipe_.options;
    // A small transfer is dominated by the staging pipeline's fixed costs: the kernel takes it
    // where it can read the host memory.
    if (o.kernel_max_bytes != 0 && p.total_bytes <= o.kernel_max_bytes && p.strided.empty() &&
        p.all_pinned_host && ctx_->device->host_pointers_usable())
      return Move::kKernel;
    if (p.chunks.empty() && p.direct.size() <= CopyLanes::kGroup) return Move::kCallerStream;
    if (d == Direction::kToHost) return Move::kToHost;
    if (p.direct.empty() && p.strided.empty() && p.chunks.size() == 1)
      return p.total_bytes <= o.inline_gather_bytes ? Move::kInline : Move::kOneChunk;
    return Move::kLanes;
  }

  // Moves transfer `t` of request `r`, planned whole.
  void move(const TransferPtr& t, const Request& r, bool lead) {
    switch (move_of(t->plan, r.direction)) {
      case Move::kKernel:
        kernel_.submit(*t, r.stream);
        return;
      case Move::kCallerStream: {
        std::lock_guard lk(pipe_.lock);
        ctx_->tracer.begin_transfer(*t, r.stream);
        pipe_.lanes.submit_directs_on(*t, r.stream, lead);
        return;
      }
      case Move::kInline:
        to_device_.submit_inline(*t, r.stream);
        return;
      case Move::kOneChunk:
        to_device_.submit_one_chunk(t, r.stream);
        return;
      case Move::kLanes:
        to_device_.submit(t, r.stream);
        return;
      case Move::kToHost:
        to_host_.submit(r, t);
        return;
    }
  }

  void wake_pool(std::uint32_t id) {
    pipe_.queue.wake_for_transfer();
    ctx_->tracer.record(id, TraceEvent::kStage, TraceEvent::kPoolWoken, 0);
  }

  // A CacheSet whose ids are each one constant-stride run (CacheSetState::id_runs), at a pitch
  // a 2D copy takes, goes as one 2D copy per id: the block list is never made (64 ids of 160
  // layers: 64 runs, not 10240 blocks to list and then find the runs in).
  bool takes_runs(const CacheSetState& set) const {
    const PlanConfig& c = ctx_->plan_config;
    return set.id_runs.ok && c.strided_min_rows >= 2 && set.pairs.size() >= c.strided_min_rows &&
           set.bytes_per_id >= c.strided_min_bytes && set.id_runs.host_pitch <= kMax2dPitch &&
           set.id_runs.device_pitch <= kMax2dPitch;
  }

  // Equal blocks, all staged, pinned host caches: the ids are checked and kept, and the chunks
  // cut and the copies made later (plan_from_ids). Host arrays side by side make each id's host
  // side one run, which host_direct chunks move in place: those keep the listed path.
  bool takes_ids(const CacheSetState& set, Direction d) const {
    PlanConfig c = ctx_->plan_config;
    c.direction = d;
    const std::size_t b = set.block_bytes;
    return set.all_pinned && !set.side_by_side && b != 0 && b < c.direct_min() &&
           fits_from_ids(b, c);
  }

  // The runs on the caller's stream, bounced through the staging ring's device twin where they
  // qualify (bounces).
  TransferPtr submit_runs(const SetRequest& r) {
    thread_local std::vector<StridedCopy> runs;
    const auto t0 = Clock::now();
    r.set.build_runs(r.direction, r.src, r.dst, runs);
    Counters::add(ctx_->counters.plan_ns, ns_since(t0));
    TransferPtr t = make_transfer(ctx_, r.id, r.direction);
    t->plan = ctx_->plans.take();
    Plan& p = t->plan;
    p.reset(r.src.count * r.set.pairs.size());
    p.strided.assign(runs.begin(), runs.end());
    for (const StridedCopy& c : runs) p.total_bytes += c.width * c.rows;
    std::lock_guard lk(pipe_.lock);
    ctx_->tracer.begin_transfer(*t, r.stream);
    if (!bounces(runs, r) || !pipe_.lanes.submit_bounced(*t, r.stream, pipe_.ring))
      pipe_.lanes.submit_directs_on(*t, r.stream, r.lead);
    return t;
  }

  // Whether runs go through the staging ring's device twin: rows short enough that the link
  // moves them slower than whole DMAs, the host side of each run one contiguous stretch no
  // larger than a slot, a stream of the caller's own.
  bool bounces(std::span<const StridedCopy> runs, const SetRequest& r) const {
    if (r.stream == nullptr) return false;
    const bool to_host = r.direction == Direction::kToHost;
    const std::size_t max_width =
        to_host ? CopyLanes::kBounceMaxStoreWidth : CopyLanes::kBounceMaxLoadWidth;
    return std::all_of(runs.begin(), runs.end(), [&](const StridedCopy& c) {
      const std::uint64_t host_pitch = to_host ? c.dpitch : c.spitch;
      return c.width <= max_width && host_pitch == c.width &&
             c.width * c.rows <= pipe_.ring.slot_bytes();
    });
  }

  // The ids checked and planned by arithmetic (plan_from_ids): the gather threads make the ops
  // of the pieces they take (host to device) or the submitter those of each chunk as it
  // enqueues it (device to host). A plan of one chunk, or one the kernel takes, is made whole
  // here (those moves read every op on this thread). False, with nothing done, where the ids
  // would make blocks that coalesce (CacheSetState::build_id_ops).
  bool submit_from_ids(const SetRequest& r, TransferPtr& out) {
    thread_local IdOps ids;
    auto t0 = Clock::now();
    const bool taken = r.set.build_id_ops(r.direction, r.src, r.dst, ids);
    Counters::add(ctx_->counters.plan_ns, ns_since(t0));
    if (!taken) return false;
    const std::size_t blocks = ids.rows * ids.pairs.size();
    if (blocks == 0) return true;
    if (blocks * ids.block_bytes > pipe_.options.inline_gather_bytes) wake_pool(r.id);
    t0 = Clock::now();
    TransferPtr t = make_transfer(ctx_, r.id, r.direction);
    t->plan = ctx_->plans.take();
    Plan& p = t->plan;
    p.reset(blocks);
    p.id_ops = ids;  // into the recycled plan's vectors
    PlanConfig cfg = ctx_->plan_config;
    cfg.direction = r.direction;
    plan_from_ids(p, cfg);
    p.all_pinned_host = true;  // takes_ids: pinned host caches only
    const Move m = move_of(p, r.direction);
    if (m == Move::kKernel || p.chunks.size() == 1) make_all_ops(p);
    Counters::add(ctx_->counters.plan_ns, ns_since(t0));
    Counters::add(ctx_->counters.id_planned, 1);
    ctx_->tracer.record(r.id, TraceEvent::kPlanned);
    move(t, Request{{}, r.stream, r.direction, r.id, nullptr}, r.lead);
    out = std::move(t);
    return true;
  }

  StagingPipeline pipe_;
  GatherToDevice to_device_;
  GatherToHost to_host_;
  ZeroCopyKernel kernel_;
};

}  // namespace

std::unique_ptr<BackendImpl> make_gather(const BackendSetup& setup) {
  return std::make_unique<GatherBackend>(setup);
}

}  // namespace gfd::detail
