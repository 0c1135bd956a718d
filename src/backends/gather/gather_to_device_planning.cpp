// GatherToDevice::submit_planning: a list larger than a first chunk, packed a stretch at a time
// while the gather threads already copy the chunks packed so far.
#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>

#include "backends/gather/gather_to_device.hpp"
#include "gfd/error.hpp"
#include "pipeline/engine_context.hpp"

namespace gfd::detail {

// One transfer's planning under the submission lock. Chunks go to the gather threads as soon as
// they are packed; each chunk's DMA (four driver calls, several microseconds in a VM) is enqueued
// once the next chunk is out too, so that the threads always have a chunk to gather while the
// submitter talks to the driver (and a slot is taken again only once its DMA is enqueued).
class GatherToDevice::Planning {
 public:
  Planning(GatherToDevice& g, const Request& r, const TransferPtr& t, PlanBuilder& builder,
           std::uint64_t& plan_ns, std::uint64_t early_bytes)
      : g_(g),
        p_(g.p_),
        r_(r),
        t_(t),
        plan_(t->plan),
        builder_(builder),
        plan_ns_(plan_ns),
        early_bytes_(early_bytes),
        checked_(early_bytes == 0),
        items_(g.items_) {
    items_.clear();
  }

  // Everything after the check that may throw: a bad block (or a device error before anything
  // was enqueued) is thrown to the caller with what was published gathered into staging that no
  // DMA reads; nothing moved.
  void start() {
    try {
      if (!checked_) publish_early_and_check();
      p_.lanes.begin(*t_, r_.stream);
    } catch (...) {
      release_unenqueued();
      throw;
    }
    p_.ctx->tracer.begin_transfer(*t_, r_.stream);
    p_.ctx->tracer.record(t_->id, TraceEvent::kStage, TraceEvent::kLanesBegun, 0);
  }

  // The rest of the list packed and every DMA enqueued. From here the transfer must be finalized
  // whatever happens, or the caller would wait forever.
  void finish() {
    try {
      // Chunks published before the check: their DMAs may be enqueued now.
      if (p_.preissue && published_ > kLag) enqueue_up_to(published_ - kLag);
      while (builder_.packed() < builder_.size()) {
        pack_stretch();
        enqueue_directs_so_far(false);
      }
      timed([&] { builder_.finish(); });
      publish_packed();
      if (p_.preissue) {
        enqueue_up_to(published_);
        enqueue_directs_so_far(true);
        p_.lanes.enqueue_runs(*t_);
      } else if (!plan_.direct.empty() || !plan_.strided.empty()) {
        g_.add_directs(t_);
      }
    } catch (...) {
      t_->fail(std::current_exception());  // a device error: the rest moves nothing
      if (p_.preissue) release_unenqueued();
    }
    g_.add_finalize(t_);
  }

 private:
  // A chunk's DMA is enqueued once this many chunks after it are published.
  static constexpr std::uint32_t kLag = 1;

  template <class F>
  void timed(F&& step) {
    add_elapsed(plan_ns_, step);
  }

  // Before the check no DMA is enqueued, so no slot taken then is free again until after it: at
  // most all but one of the ring's slots are taken (the next chunk needs one).
  std::size_t early_limit() const { return p_.ring.size() - 1; }

  // The first chunks (early_bytes_) validated, packed and handed to the gather threads, so that
  // they gather while the rest of the list is checked; then the check. Their DMAs are enqueued
  // only after it.
  void publish_early_and_check() {
    std::uint64_t out = 0;  // bytes in the published chunks
    while (builder_.packed() < builder_.size() && out < early_bytes_ &&
           published_ < early_limit()) {
      const std::uint32_t before = published_;
      pack_stretch();
      for (std::uint32_t k = before; k < published_; ++k) out += plan_.chunks[k].data_bytes;
    }
    p_.ctx->tracer.record(t_->id, TraceEvent::kStage, TraceEvent::kEarlyPublished, published_);
    timed([&] { builder_.check(); });
    checked_ = true;
    p_.ctx->tracer.record(t_->id, TraceEvent::kPlanned);
  }

  void enqueue_up_to(std::uint32_t end) {
    for (; enqueued_ < end; ++enqueued_)
      g_.enqueue_issued(*t_, enqueued_, items_[enqueued_]->slot, true);
  }

  void publish_packed() {
    const std::size_t end =
        checked_ ? plan_.chunks.size() : std::min(plan_.chunks.size(), early_limit());
    for (; published_ < end; ++published_) {
      items_.push_back(&g_.publish_chunk(t_, published_));
      if (p_.preissue && checked_ && published_ >= kLag) enqueue_up_to(published_ - kLag + 1);
    }
  }

  // Published chunks whose DMAs were not enqueued: their slots are free once their pieces are
  // done (the items are not reused while this submitter holds the lock).
  void release_unenqueued() {
    for (std::size_t k = enqueued_; k < items_.size(); ++k) {
      while (!items_[k]->ready.load(std::memory_order_acquire))
        if (!p_.queue.run_next_piece(false)) std::this_thread::yield();
      p_.ring[items_[k]->slot].mark_issued();
    }
  }

  // A small stretch first, so that the gather threads get the first chunk at once; then larger
  // ones, up to max_stretch_ blocks: a chunk is published only once the stretch that closes it
  // is packed, and packing beside many gathering threads is slow (about 60 ns a block), so long
  // stretches left the threads without a chunk to gather.
  void pack_stretch() {
    timed([&] { builder_.advance(builder_.packed() + step_); });
    p_.ctx->tracer.record(t_->id, TraceEvent::kStage, TraceEvent::kPacked,
                          static_cast<std::uint32_t>(builder_.packed()));
    step_ = std::min<std::size_t>(step_ * 2, max_stretch_);
    publish_packed();
  }

  // With preissue the direct copies planned so far go out stretch by stretch once the list is
  // checked (a list of large and small blocks spreads them over it), so that the copy engine
  // moves them beside the staged chunks rather than after them; a group of at least kGroup / 4
  // per call.
  void enqueue_directs_so_far(bool all) {
    if (!p_.preissue || (!all && plan_.direct.size() - directs_out_ < CopyLanes::kGroup / 4))
      return;
    p_.lanes.enqueue_direct_copies(*t_, directs_out_, plan_.direct.size());
    directs_out_ = plan_.direct.size();
  }

  GatherToDevice& g_;
  StagingPipeline& p_;
  const Request& r_;
  const TransferPtr& t_;
  const Plan& plan_;
  PlanBuilder& builder_;
  std::uint64_t& plan_ns_;
  const std::uint64_t early_bytes_;
  bool checked_;
  std::vector<Item*>& items_;  // each published chunk's item
  std::uint32_t published_ = 0, enqueued_ = 0;
  std::size_t step_ = 64;
  std::size_t directs_out_ = 0;
};

TransferPtr GatherToDevice::submit_planning(const Request& r, std::uint64_t bytes) {
  EngineContext& ctx = *p_.ctx;
  TransferPtr t = make_transfer(p_.ctx, r.id, Direction::kToDevice);
  const RejectedOnThrow rejected(*t);
  t->plan = ctx.plans.take();
  std::uint64_t plan_ns = 0;
  struct Account {
    Counters& c;
    std::uint64_t& ns;
    ~Account() { Counters::add(c.plan_ns, ns); }
  } account{ctx.counters, plan_ns};
  const PointerClassifier classify = ctx.classifier();  // outlives the builder, which keeps it
  PlanConfig cfg = ctx.plan_config;
  cfg.direction = Direction::kToDevice;
  cfg.trust = r.trust;
  std::optional<PlanBuilder> builder;
  add_elapsed(plan_ns, [&] {
    builder.emplace(r.blocks, cfg, classify, t->plan, &ctx.pageable, true, bytes);
  });
  ctx.tracer.record(t->id, TraceEvent::kStage, TraceEvent::kPlanStorage, 0);
  // Every block is checked before any DMA is enqueued (a bad block throws from here, naming it,
  // and nothing reaches the device). With preissue the first chunks are published before the
  // check (Planning); without it the issuer would enqueue a gathered chunk's DMA at once, so
  // everything is checked first.
  const std::uint64_t early_bytes = p_.preissue && builder->stable() ? early_publish_bytes_ : 0;
  if (early_bytes == 0) {
    add_elapsed(plan_ns, [&] { builder->check(); });
    ctx.tracer.record(t->id, TraceEvent::kPlanned);
  }
  if (!builder->stable()) {
    // Without storage reserved up front (absurd sizes) the plan is packed whole first.
    add_elapsed(plan_ns, [&] { builder->finish(); });
    builder.reset();
    submit(t, r.stream);
    return t;
  }
  {
    std::lock_guard lk(p_.lock);
    Planning planning(*this, r, t, *builder, plan_ns, early_bytes);
    planning.start();
    planning.finish();
  }
  finish_submit(*t, r.stream);
  return t;
}

}  // namespace gfd::detail
