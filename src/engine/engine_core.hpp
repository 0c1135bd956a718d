// The engine core: creates an engine (options resolved, placement chosen, backend built from the
// table), submits (the shutdown gate, then the backend), and reports. Everything that moves
// bytes lives in the backends (backends/) and the pipeline stages they use (pipeline/);
// docs/ARCHITECTURE.md draws the flow.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backends/backend.hpp"
#include "device/device.hpp"
#include "gfd/engine.hpp"
#include "pipeline/engine_context.hpp"
#include "planning/cache_set.hpp"

namespace gfd::detail {

// Admits submissions until shutdown closes it; close() waits for those in flight. The one place
// that says "the engine is shutting down".
class SubmitGate {
 public:
  // Throws gfd::Error(kShutdown) naming `call` once closed.
  void enter(const char* call);
  void leave() noexcept;
  void close() noexcept;
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> closed_{false};
  std::atomic<int> inside_{0};
};

class EngineCore {
 public:
  // Validates `options` (before any device work), resolves them for `device` and builds the
  // backend they name.
  // `tuning`: the mechanisms' settings (tuning.hpp), for tests and benchmarks that compare them.
  static std::shared_ptr<EngineCore> create(const EngineOptions& options,
                                            std::shared_ptr<Device> device,
                                            const Tuning& tuning = {});
  // An Engine over any device implementation (the emulated one in tests and benchmarks).
  static Engine make_engine(const EngineOptions& options, std::shared_ptr<Device> device,
                            const Tuning& tuning = {});
  // The core behind an Engine (throws gfd::Error for a moved-from Engine).
  static EngineCore& of(const Engine& engine);

  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  Transfer submit(std::span<const BlockCopy> blocks, StreamHandle stream, Direction direction);
  // Engine::register_caches; `names` name the arrays in messages (CacheSetState::make).
  CacheSet register_caches(std::span<const CachePair> pairs, std::vector<std::string> names = {});
  // Engine::copy_blocks; `lead` as SetRequest::lead.
  Transfer submit_blocks(const CacheSet& caches, Direction direction, const BlockIds& src,
                         const BlockIds& dst, StreamHandle stream, bool lead = true);
  EngineStats stats() const;
  const EngineOptions& options() const { return ctx_->options; }
  // The mechanisms in force (resolved for the device and backend) and their counters.
  const Tuning& tuning() const { return ctx_->tuning; }
  TuningStats tuning_stats() const;
  Device& device() { return *ctx_->device; }
  // Waits for every transfer submitted, then stops the backend's threads. Later submissions
  // throw kShutdown. Idempotent.
  void shutdown() noexcept;

  // Tracing: records up to `capacity` points from now on (0 stops); take_trace returns them.
  void start_trace(std::size_t capacity) { ctx_->tracer.start(capacity); }
  std::vector<TraceEvent> take_trace() { return ctx_->tracer.take(); }

 private:
  EngineCore(const EngineOptions& options, std::shared_ptr<Device> device, const Tuning& tuning);
  // Numbers the transfer, hands it to the backend (`submit`) and counts it (`blocks` of them).
  Transfer dispatch(std::size_t blocks, const std::function<TransferPtr(std::uint32_t id)>& submit);

  std::shared_ptr<EngineContext> ctx_;
  std::vector<int> cpus_;
  int numa_node_ = -1;
  int cpu_sharing_ = 1;
  std::unique_ptr<BackendImpl> backend_;
  SubmitGate gate_;
  std::atomic<bool> drained_{false};
  std::atomic<std::uint32_t> next_id_{0};  // transfer numbers for the trace
};

}  // namespace gfd::detail
