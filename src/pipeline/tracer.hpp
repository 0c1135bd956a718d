// Tracing of an engine's pipeline: submitters, gather threads and the issuer record points into
// a preallocated buffer (one relaxed fetch_add each while tracing is on, one relaxed load while
// it is off); the DMA completions of traced transfers are read from timing events when the trace
// is taken, never on the gather threads, which must not wait for the GPU.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "common/trace_event.hpp"
#include "device/device.hpp"

namespace gfd::detail {

struct TransferState;

class Tracer {
 public:
  explicit Tracer(Device& device) : device_(device) {}
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  bool on() const { return on_.load(std::memory_order_relaxed); }
  // Records a point (`ns` = 0: now) when tracing is on.
  void record(std::uint32_t transfer, TraceEvent::What what, std::uint32_t a = 0,
              std::uint32_t b = 0, std::uint64_t ns = 0) {
    if (on()) record_slow(transfer, what, a, b, ns);
  }
  // Records up to `capacity` points from now on (0 stops).
  void start(std::size_t capacity);
  // The points recorded, with the DMA completions of the traced transfers; stops tracing.
  std::vector<TraceEvent> take();

  // A traced transfer: a timing event for its start on the caller's stream (the copy lanes add
  // one after each chunk's DMA as they enqueue it). No-op when tracing is off.
  void begin_transfer(TransferState& t, StreamHandle stream);
  // Called as a traced transfer goes away: its events are read when the trace is taken.
  void keep(std::uint32_t id, std::uint64_t start_ns, EventHandle start,
            std::vector<std::pair<std::uint32_t, EventHandle>>&& dma);

  // The calling thread's gather-thread index in recorded points (-1: not a gather thread).
  static void set_thread_index(int index);

 private:
  void record_slow(std::uint32_t transfer, TraceEvent::What what, std::uint32_t a, std::uint32_t b,
                   std::uint64_t ns);
  struct Pending {
    std::uint32_t id;
    std::uint64_t start_ns;
    EventHandle start;
    std::vector<std::pair<std::uint32_t, EventHandle>> dma;
  };
  Device& device_;
  std::atomic<bool> on_{false};
  std::atomic<std::size_t> n_{0};
  std::vector<TraceEvent> events_;
  std::mutex mutex_;
  std::vector<Pending> pending_;
};

}  // namespace gfd::detail
