// GatherToHost::submit: a transfer to host memory, planned whole already or planned here a
// stretch at a time while the DMAs of its first chunks run.
#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>

#include "backends/gather/gather_to_host.hpp"
#include "gfd/error.hpp"
#include "pipeline/engine_context.hpp"

namespace gfd::detail {

// One transfer's enqueues, under the submission lock. First the leading chunks (3.75 MB with the
// default sizes), so that the copy engine has work at once and while the rest of the list is
// checked; then the next chunk is enqueued and placing may begin; then the rest is packed and
// its chunks enqueued as they close. Chunks enqueued before the check keep their slots until it
// is done, so never more of them than the ring has slots.
class GatherToHost::Submission {
 public:
  Submission(GatherToHost& g, const Request& r, const TransferPtr& t, PlanBuilder* builder,
             std::uint64_t& plan_ns)
      : g_(g), p_(g.p_), r_(r), t_(t), plan_(t->plan), builder_(builder), plan_ns_(plan_ns) {}

  // Enqueues every chunk; returns the rejection of a bad block (nothing reaches host memory),
  // or null. A device error is recorded in the transfer.
  std::exception_ptr run() {
    try {
      if (planning()) check_while_first_chunks_move();
      if (!rejected_) enqueue_rest();
    } catch (...) {
      t_->fail(std::current_exception());  // a device error: the pieces place nothing
    }
    // Chunks still pending after a rejection or a device error: enqueued (a rejected transfer's
    // first chunks read valid device blocks) and published, so that their pieces run and free
    // their slots.
    try {
      g_.flush_packs(t_);
    } catch (...) {
      t_->fail(std::current_exception());
    }
    // Rejected: the chunks enqueued so far are dropped as their DMAs complete. (After a device
    // error the verdict is kValid, and the failed transfer's pieces place nothing either.)
    release_held(rejected_ ? TransferState::kRejected : TransferState::kValid);
    p_.lanes.finalize(*t_);
    return rejected_;
  }

 private:
  template <class F>
  void timed(F&& step) {
    add_elapsed(plan_ns_, step);
  }

  bool planning() const {
    return t_->plan_state.load(std::memory_order_relaxed) == TransferState::kPlanning;
  }

  // The first chunks packed and enqueued (the copy engine works while the list is checked),
  // then the check.
  void check_while_first_chunks_move() {
    const std::size_t early_chunks = std::min<std::size_t>(4, p_.ring.size());
    try {
      constexpr std::size_t kStretch = 32;
      while (builder_->packed() < builder_->size() && plan_.chunks.size() < early_chunks) {
        timed([&] { builder_->advance(builder_->packed() + kStretch); });
        enqueue_planned(early_chunks);
      }
      g_.flush_packs(t_);
      timed([&] { builder_->check(); });
    } catch (const Error&) {
      rejected_ = std::current_exception();
    }
  }

  // Valid: the copy engine first (it may have run dry during the check, if a slot is left that
  // this transfer does not hold), then the threads may place the held chunks (waking them costs
  // tens of microseconds), then the rest of the list.
  void enqueue_rest() {
    p_.ctx->tracer.record(t_->id, TraceEvent::kPlanned);  // validated; packing goes on
    if (builder_ != nullptr) {
      const std::size_t next = enqueued_ + 1;
      while (builder_->packed() < builder_->size() && plan_.chunks.size() < next) pack_more();
    }
    enqueue_planned(p_.ring.size());
    g_.flush_packs(t_);
    release_held(TransferState::kValid);
    if (builder_ != nullptr) {
      while (builder_->packed() < builder_->size()) {
        pack_more();
        enqueue_planned(plan_.chunks.size());
      }
      timed([&] { builder_->finish(); });
    }
    enqueue_planned(plan_.chunks.size());
    g_.flush_packs(t_);
    p_.lanes.enqueue_directs(*t_);
  }

  // A chunk may write its host destinations in place (host_direct) only once the transfer is
  // known valid: a transfer on a CacheSet is from the start (its ids were checked).
  void enqueue_planned(std::size_t limit) {
    const bool planning_now = planning();
    for (; enqueued_ < std::min(plan_.chunks.size(), limit); ++enqueued_)
      g_.enqueue_chunk(t_, enqueued_, planning_now ? &held_ : nullptr,
                       !planning_now || r_.trust != nullptr);
  }

  // Publishes the verdict (kValid or kRejected) to the gather threads, then lets them at the
  // held chunks: placed, or dropped.
  void release_held(int verdict) {
    t_->plan_state.store(verdict, std::memory_order_release);
    for (Item* it : held_) it->held.store(false, std::memory_order_release);
    if (!held_.empty()) p_.queue.wake();
    held_.clear();
  }

  // Packs the next stretch of blocks, in stretches that double up to 2048 blocks.
  void pack_more() {
    timed([&] { builder_->advance(builder_->packed() + step_); });
    step_ = std::min<std::size_t>(step_ * 2, 2048);
  }

  GatherToHost& g_;
  StagingPipeline& p_;
  const Request& r_;
  const TransferPtr& t_;
  const Plan& plan_;
  PlanBuilder* builder_;  // null: planned whole already
  std::uint64_t& plan_ns_;
  std::exception_ptr rejected_;
  std::uint32_t enqueued_ = 0;
  std::vector<Item*> held_;  // enqueued before the check: placing waits for release_held()
  std::size_t step_ = 256;
};

TransferPtr GatherToHost::submit(const Request& r, TransferPtr planned,
                                 std::optional<std::uint64_t> bytes) {
  EngineContext& ctx = *p_.ctx;
  const bool plan_here = !planned;
  TransferPtr t = plan_here ? make_transfer(p_.ctx, r.id, Direction::kToHost) : std::move(planned);
  const RejectedOnThrow rejected_guard(*t);
  std::uint64_t plan_ns = 0;
  const PointerClassifier classify = ctx.classifier();  // outlives the builder, which keeps it
  std::optional<PlanBuilder> builder;
  if (plan_here) {
    t->plan = ctx.plans.take();
    t->plan_state.store(TransferState::kPlanning, std::memory_order_relaxed);
    PlanConfig cfg = ctx.plan_config;
    cfg.direction = Direction::kToHost;
    cfg.trust = r.trust;
    add_elapsed(plan_ns, [&] {
      builder.emplace(r.blocks, cfg, classify, t->plan, &ctx.pageable, true, bytes);
    });
    // Without storage reserved up front (absurd sizes) the plan is made whole before anything
    // moves.
    if (!builder->stable()) {
      add_elapsed(plan_ns, [&] { builder->finish(); });
      builder.reset();
      t->plan_state.store(TransferState::kValid, std::memory_order_relaxed);
    }
  }
  // Stream-ordered: host_left holds one more until the submitter has added every chunk and
  // set the flag, so that no placing thread sees zero before.
  if (ctx.options.stream_ordered_to_host) t->host_left.fetch_add(1, std::memory_order_relaxed);
  std::exception_ptr rejected;
  {
    std::lock_guard lk(p_.lock);
    p_.lanes.begin(*t, r.stream);
    ctx.tracer.begin_transfer(*t, r.stream);
    rejected = Submission(*this, r, t, builder ? &*builder : nullptr, plan_ns).run();
  }
  Counters::add(ctx.counters.plan_ns, plan_ns);
  join_caller(r, *t, rejected);
  return t;
}

void GatherToHost::join_caller(const Request& r, TransferState& t, std::exception_ptr rejected) {
  EngineContext& ctx = *p_.ctx;
  const bool ordered = ctx.options.stream_ordered_to_host;
  // Stream-ordered with staged chunks: the caller's stream waits on a flag that the thread
  // placing the last bytes writes (where the device cannot wait on host memory, the call waits
  // for the transfer instead). A rejected transfer needs none: nothing reaches host memory.
  HostFlags::Flag flag;
  const bool staged = !t.plan.chunks.empty();
  const bool by_flag = ordered && staged && !rejected && ctx.device->supports_wait_value();
  if (by_flag) {
    flag = ctx.host_flags.take();
    t.host_flag = flag.addr;
    t.host_flag_value = flag.value;
  }
  if (ordered && t.host_left.fetch_sub(1, std::memory_order_acq_rel) == 1) placed_all(t);
  if (rejected) {
    // Nothing reaches host memory, but DMAs already enqueued read the (valid) device blocks
    // planned first: later work on the caller's stream must not free or change them under it.
    t.join_stream(r.stream, false);
    std::rethrow_exception(rejected);
  }
  Counters::add(ctx.counters.chunks, t.plan.chunks.size());
  p_.queue.try_issue();
  t.join_stream(r.stream);
  if (by_flag) {
    try {
      ctx.device->wait_value_geq(flag.addr, flag.value, r.stream);
    } catch (...) {
      t.fail(std::current_exception());
    }
  } else if (ordered && staged) {
    t.wait();
  }
}

}  // namespace gfd::detail
