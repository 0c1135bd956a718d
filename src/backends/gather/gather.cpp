#include "backends/gather/gather.hpp"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>

#include "backends/gather/gather_to_device.hpp"
#include "backends/gather/gather_to_host.hpp"
#include "backends/baselines/zero_copy_kernel.hpp"

namespace gfd::detail {

StagingPipeline::StagingPipeline(const BackendSetup& setup)
    : ctx(setup.ctx),
      options(ctx->options),
      ring(*ctx->device, ctx->counters,
           RingConfig{options.staging_bytes / options.slot_bytes, options.slot_bytes, setup.numa_node,
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
      options.gather_threads, setup.cpus, options.spin_us, [this] { return queue.run_next_piece(); },
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
  return std::all_of(blocks.begin(), blocks.end(), [bytes](const BlockCopy& b) { return b.bytes >= bytes; });
}

class GatherBackend final : public BackendImpl {
 public:
  explicit GatherBackend(const BackendSetup& setup)
      : pipe_(setup), to_device_(pipe_), to_host_(pipe_), kernel_(*pipe_.ctx, pipe_.ring, pipe_.lock) {}

  TransferPtr submit(const Request& r) override {
    EngineContext& ctx = *pipe_.ctx;
    const EngineOptions& o = pipe_.options;
    if (!r.runs.empty()) return submit_runs(r);
    if (r.id_ops != nullptr) return submit_id_ops(r);
    const bool several = r.blocks.size() > 1;
    // A list that may be all constant-stride runs is planned whole first: if nothing is staged,
    // its 2D copies go on the caller's stream (CopyLanes::submit_directs_on). It neither sums its
    // bytes first nor wakes the gather pool: one that is a run end to end (2048 x 4 KB at a pitch of 2 blocks, say) is
    // planned in one pass (plan_one_run) and never uses the pool; one that is not wakes it with
    // its first staged chunk.
    const bool strided = several && may_be_strided(r.blocks, ctx.plan_config);
    const bool to_host = r.direction == Direction::kToHost;
    // A CacheSet's transfer of at most one batch of blocks that all go to the copy engine as
    // they are (pinned host caches, every block of at least direct_min_bytes: a layer's pages
    // in a layered load, say) stages nothing: planned whole and moved on the caller's stream,
    // with no pool to wake, no lanes to join and no cross-stream waits on the GPU.
    const bool all_direct = several && !strided && r.trust != nullptr && r.trust->all_pinned &&
                            r.blocks.size() <= CopyLanes::kGroup && all_at_least(r.blocks, direct_min(ctx, r.direction));
    // Wake parked gather threads first: they are back and spinning by the time planning has
    // produced pieces (a futex wake-up costs tens of microseconds, planning about as much).
    if (!strided && !all_direct && !r.blocks.empty() &&
        r.blocks.size() * std::min<std::size_t>(r.blocks[0].bytes, 1u << 30) > o.inline_gather_bytes) {
      pipe_.queue.wake_for_transfer();
      ctx.tracer.record(r.id, TraceEvent::kStage, TraceEvent::kPoolWoken, 0);
    }
    // Summed once, handed on to planning (a strided list's planning sums it where it needs to).
    const std::optional<std::uint64_t> bytes = strided ? std::nullopt : std::optional(total_bytes(r.blocks));
    // Device to host, too large for the kernel: planned a stretch at a time, with the DMAs of
    // the chunks planned first already running (only placing the bytes waits for the whole
    // list to be valid).
    if (to_host && several && !strided && !all_direct && *bytes > o.kernel_max_bytes)
      return to_host_.submit(r, nullptr, *bytes);
    // Host to device, too large for the kernel and for gathering on this thread alone: checked
    // whole, then packed while the first chunks are gathered.
    // A transfer of one first chunk or less is planned whole (one chunk: submit_one_chunk).
    if (!to_host && several && !strided && !all_direct && *bytes > o.kernel_max_bytes && *bytes > o.inline_gather_bytes &&
        *bytes > ctx.plan_config.first_chunk_bytes)
      return to_device_.submit_planning(r, *bytes);
    PlanConfig cfg = ctx.plan_config;
    cfg.direction = r.direction;
    cfg.trust = r.trust;
    TransferPtr t = plan_transfer(pipe_.ctx, r, cfg, bytes);
    if (!t) return nullptr;
    // A small transfer is dominated by the staging pipeline's fixed costs: the kernel takes it
    // where it can read the host memory.
    const Plan& plan = t->plan;
    const bool kernel = o.kernel_max_bytes != 0 && plan.total_bytes <= o.kernel_max_bytes && plan.strided.empty() &&
                        plan.all_pinned_host && ctx.device->host_pointers_usable();
    if (kernel) kernel_.submit(*t, r.stream);
    else if (plan.chunks.empty() && plan.direct.size() <= CopyLanes::kGroup) {
      // Nothing staged, at most one batch of direct copies: all on the caller's stream.
      std::lock_guard lk(pipe_.lock);
      ctx.tracer.begin_transfer(*t, r.stream);
      pipe_.lanes.submit_directs_on(*t, r.stream, r.lead);
    } else if (to_host) to_host_.submit(r, t);
    else to_device_.submit(t, r.stream);
    return t;
  }

  // A CacheSet's transfer given as 2D runs (checked already): the plan is the runs, on the
  // caller's stream.
  TransferPtr submit_runs(const Request& r) {
    EngineContext& ctx = *pipe_.ctx;
    TransferPtr t = make_transfer(pipe_.ctx, r.id, r.direction);
    t->plan = ctx.plans.take();
    Plan& p = t->plan;
    p.reset(r.run_blocks);
    p.strided.assign(r.runs.begin(), r.runs.end());
    for (const StridedCopy& c : r.runs) p.total_bytes += c.width * c.rows;
    std::lock_guard lk(pipe_.lock);
    ctx.tracer.begin_transfer(*t, r.stream);
    if (!bounces(r) || !pipe_.lanes.submit_bounced(*t, r.stream, pipe_.ring))
      pipe_.lanes.submit_directs_on(*t, r.stream, r.lead);
    return t;
  }

  // Whether runs go through the staging ring's device twin: rows short enough that the link
  // moves them slower than whole DMAs, the host side of each run one contiguous stretch no
  // larger than a slot, a stream of the caller's own.
  bool bounces(const Request& r) const {
    if (r.stream == nullptr) return false;
    const bool to_host = r.direction == Direction::kToHost;
    const std::size_t max_width = to_host ? CopyLanes::kBounceMaxStoreWidth : CopyLanes::kBounceMaxLoadWidth;
    return std::all_of(r.runs.begin(), r.runs.end(), [&](const StridedCopy& c) {
      const std::uint64_t host_pitch = to_host ? c.dpitch : c.spitch;
      return c.width <= max_width && host_pitch == c.width && c.width * c.rows <= pipe_.ring.slot_bytes();
    });
  }

  // A CacheSet's transfer as its checked ids: planned by arithmetic (plan_from_ids); the gather
  // threads make the ops of the pieces they take (host to device) or the submitter those of each
  // chunk as it enqueues it (device to host). A plan of one chunk, or one the kernel takes, is
  // made whole here (the paths for small transfers read every op on this thread).
  TransferPtr submit_id_ops(const Request& r) {
    EngineContext& ctx = *pipe_.ctx;
    const EngineOptions& o = pipe_.options;
    const IdOps& ids = *r.id_ops;
    const std::size_t blocks = ids.rows * ids.pairs.size();
    if (blocks == 0) return nullptr;
    const std::uint64_t bytes = blocks * ids.block_bytes;
    if (bytes > o.inline_gather_bytes) {
      pipe_.queue.wake_for_transfer();
      ctx.tracer.record(r.id, TraceEvent::kStage, TraceEvent::kPoolWoken, 0);
    }
    const auto t0 = Clock::now();
    TransferPtr t = make_transfer(pipe_.ctx, r.id, r.direction);
    t->plan = ctx.plans.take();
    Plan& p = t->plan;
    p.reset(blocks);
    p.id_ops = ids;  // into the recycled plan's vectors
    PlanConfig cfg = ctx.plan_config;
    cfg.direction = r.direction;
    plan_from_ids(p, cfg);
    p.all_pinned_host = true;  // takes_id_ops: pinned host caches only
    const bool kernel = o.kernel_max_bytes != 0 && bytes <= o.kernel_max_bytes && ctx.device->host_pointers_usable();
    if (kernel || p.chunks.size() == 1) make_all_ops(p);
    Counters::add(ctx.counters.plan_ns, ns_since(t0));
    Counters::add(ctx.counters.id_planned, 1);
    ctx.tracer.record(r.id, TraceEvent::kPlanned);
    if (kernel) kernel_.submit(*t, r.stream);
    else if (r.direction == Direction::kToHost) to_host_.submit(r, t);
    else to_device_.submit(t, r.stream);
    return t;
  }

  void drain() noexcept override {
    pipe_.queue.drain();  // every published item issued (the pool finishes its pieces)
    pipe_.lanes.drain();
    pipe_.ring.drain();   // kernels on callers' streams read their slots
    pipe_.pool.reset();
  }

  void report(EngineStats& st) override {
    st.hugepages = pipe_.ring.hugepages();
    st.staging_bytes = pipe_.ring.bytes();
    st.gather_threads = pipe_.pool ? pipe_.pool->threads() : 0;
    st.staging_writes = to_public(pipe_.store);
  }

 private:
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
