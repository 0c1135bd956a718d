#include "pipeline/tracer.hpp"

#include <algorithm>

#include "common/sync.hpp"
#include "pipeline/transfer.hpp"

namespace gfd::detail {
namespace {
thread_local int tl_thread_index = -1;
}

void Tracer::set_thread_index(int index) { tl_thread_index = index; }

Tracer::~Tracer() {
  for (Pending& p : pending_) {
    for (auto& [chunk, e] : p.dma) device_.destroy_event(e);
    device_.destroy_event(p.start);
  }
}

void Tracer::record_slow(std::uint32_t transfer, TraceEvent::What what, std::uint32_t a,
                         std::uint32_t b, std::uint64_t ns) {
  const std::size_t i = n_.fetch_add(1, std::memory_order_relaxed);
  if (i < events_.size())
    events_[i] = {
        ns != 0 ? ns : now_ns(), transfer, what, static_cast<std::int16_t>(tl_thread_index), a, b};
}

void Tracer::start(std::size_t capacity) {
  std::lock_guard lk(mutex_);
  on_.store(false);
  events_.assign(capacity, TraceEvent{});
  n_.store(0);
  on_.store(capacity > 0);
}

void Tracer::begin_transfer(TransferState& t, StreamHandle stream) {
  if (!on()) return;
  t.trace_start = device_.create_event(true);
  t.trace_start_ns = now_ns();
  device_.record_event(t.trace_start, stream);
}

void Tracer::keep(std::uint32_t id, std::uint64_t start_ns, EventHandle start,
                  std::vector<std::pair<std::uint32_t, EventHandle>>&& dma) {
  std::lock_guard lk(mutex_);
  pending_.push_back({id, start_ns, start, std::move(dma)});
}

std::vector<TraceEvent> Tracer::take() {
  std::lock_guard lk(mutex_);
  // Each traced transfer's DMA completions, on the GPU clock mapped onto the host's.
  for (Pending& p : pending_) {
    for (auto [chunk, e] : p.dma) {
      try {
        device_.event_sync(e);
        const double ms = device_.event_elapsed_ms(p.start, e);
        const std::size_t i = n_.fetch_add(1, std::memory_order_relaxed);
        if (i < events_.size())
          events_[i] = {p.start_ns + static_cast<std::uint64_t>(ms * 1e6),
                        p.id,
                        TraceEvent::kDmaDone,
                        -1,
                        chunk,
                        0};
      } catch (...) {
        // A DMA that failed or never ran: the trace lacks the point.
      }
      device_.destroy_event(e);
    }
    device_.destroy_event(p.start);
  }
  pending_.clear();
  on_.store(false);
  std::vector<TraceEvent> out(
      events_.begin(),
      events_.begin() + static_cast<std::ptrdiff_t>(std::min(n_.load(), events_.size())));
  events_.clear();
  return out;
}

}  // namespace gfd::detail
