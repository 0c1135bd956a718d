#include "pipeline/transfer.hpp"

#include "common/sync.hpp"
#include "pipeline/engine_context.hpp"

namespace gfd::detail {

TransferState::TransferState(std::shared_ptr<EngineContext> context, std::uint32_t transfer_id,
                             Direction d)
    : ctx(std::move(context)), id(transfer_id), direction(d) {}

TransferPtr make_transfer(const std::shared_ptr<EngineContext>& ctx, std::uint32_t id,
                          Direction d) {
  auto t = std::make_shared<TransferState>(ctx, id, d);
  t->done_event = ctx->events.get();
  return t;
}

TransferState::~TransferState() {
  // Every wait on these events was enqueued when the transfer was issued (CUDA captures the
  // record current at the time of the wait), so the events can be re-recorded by others now.
  if (keep_plan) ctx->plans.put(std::move(plan));
  // Tracing: the DMA points are read when the trace is taken, not here (this may run on a
  // gather thread, which must not wait for the GPU).
  if (trace_start != nullptr)
    ctx->tracer.keep(id, trace_start_ns, trace_start, std::move(trace_dma));
  EventPool& pool = ctx->events;
  pool.put(start_event);
  pool.put(done_event);
  for (EventHandle e : lane_events) pool.put(e);
}

void TransferState::fail(std::exception_ptr e) {
  std::lock_guard lk(error_mutex_);
  if (!error_) error_ = std::move(e);
  failed.store(true, std::memory_order_release);
}

std::exception_ptr TransferState::failure() {
  std::lock_guard lk(error_mutex_);
  return error_;
}

void TransferState::mark_finalized() {
  ctx->tracer.record(id, TraceEvent::kFinalized);
  finalized.store(true, std::memory_order_release);
  finalized.notify_all();
}

void TransferState::join_stream(StreamHandle stream, bool report) {
  try {
    ctx->device->stream_wait_event(stream, done_event);
  } catch (...) {
    if (report) fail(std::current_exception());
  }
}

void TransferState::wait() {
  if (complete.load(std::memory_order_acquire)) return;
  finalized.wait(false, std::memory_order_acquire);
  try {
    wait_event(*ctx->device, done_event);
  } catch (...) {
    fail(std::current_exception());
  }
  // Device to host: the gather threads place the last bytes after the DMAs.
  for (std::uint32_t left = host_left.load(std::memory_order_acquire); left != 0;
       left = host_left.load(std::memory_order_acquire))
    host_left.wait(left, std::memory_order_acquire);
  complete.store(true, std::memory_order_release);
}

bool TransferState::poll() {
  if (complete.load(std::memory_order_acquire)) return true;
  if (!finalized.load(std::memory_order_acquire)) return false;
  try {
    if (!ctx->device->event_done(done_event)) return false;
  } catch (...) {
    fail(std::current_exception());
  }
  if (host_left.load(std::memory_order_acquire) != 0) return false;
  complete.store(true, std::memory_order_release);
  return true;
}

void LiveTransfers::add(const TransferPtr& t) {
  std::lock_guard lk(mutex_);
  std::erase_if(live_, [](const std::weak_ptr<TransferState>& w) { return w.expired(); });
  live_.push_back(t);
}

void LiveTransfers::wait_all() noexcept {
  std::vector<TransferPtr> live;
  {
    std::lock_guard lk(mutex_);
    for (auto& w : live_)
      if (auto t = w.lock()) live.push_back(std::move(t));
    live_.clear();
  }
  for (auto& t : live) t->wait();
}

}  // namespace gfd::detail
