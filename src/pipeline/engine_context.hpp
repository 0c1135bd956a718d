// What the engine lends every backend and every transfer: the device, reusable events and plans,
// the tracer, the counters and the planning settings. Transfers hold it by shared_ptr, so a
// handle can be waited on (and its events returned) after its engine is gone.
#pragma once

#include <atomic>
#include <boost/lockfree/stack.hpp>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "common/tuning.hpp"
#include "device/device.hpp"
#include "gfd/options.hpp"
#include "gfd/stats.hpp"
#include "pipeline/tracer.hpp"
#include "planning/planner.hpp"

namespace gfd::detail {

// Events without timing, reused across transfers. Taken by submitters and returned by whichever
// thread drops a transfer's last handle, so the free list is a lock-free stack.
class EventPool {
 public:
  explicit EventPool(Device& d) : device_(d), free_(64) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;
  EventHandle get();
  void put(EventHandle e);

 private:
  Device& device_;
  boost::lockfree::stack<EventHandle> free_;
};

// Plans are recycled: a transfer's plan returns here when its handle goes away, so that steady
// traffic allocates (and page-faults) nothing.
// Completion flags in pinned host memory that streams wait on (Device::wait_value_geq): a
// device-to-host transfer ordered on its caller's stream takes one, the thread that places its
// last staged bytes writes the value it was given, and the caller's stream goes on past that.
// Values only grow, so a flag is reused as soon as it is written: a stream still waiting for an
// older value is released by any newer one, and a newer one is only written after the older.
class HostFlags {
 public:
  explicit HostFlags(Device& d) : device_(d) {}
  ~HostFlags();
  HostFlags(const HostFlags&) = delete;
  HostFlags& operator=(const HostFlags&) = delete;
  struct Flag {
    std::uint64_t* addr = nullptr;
    std::uint64_t value = 0;
  };
  // A free flag and the value to write to it; waits while every flag is taken.
  Flag take();
  // Writes the flag's value (from any thread, no driver call) and frees the flag.
  void signal(const Flag& f);

 private:
  static constexpr std::size_t kFlags = 1024, kWords = 8;  // a flag per cache line
  Device& device_;
  std::mutex mutex_;
  std::condition_variable freed_;
  std::uint64_t* flags_ = nullptr;  // registered with the device; allocated at first use
  std::vector<std::uint32_t> free_;
  std::uint64_t next_value_ = 1;
};

class PlanPool {
 public:
  Plan take();
  void put(Plan&& plan) noexcept;

 private:
  std::mutex mutex_;
  std::vector<Plan> spare_;
};

// The engine's counters (EngineStats), bumped with relaxed atomics from any thread.
struct Counters {
  std::atomic<std::uint64_t> bytes{0}, transfers{0}, blocks{0}, chunks{0}, scattered{0},
      host_direct{0}, direct{0}, strided{0}, id_planned{0}, bounced{0}, placements{0}, packings{0},
      slots_deferred{0}, gather_ns{0}, submit_wait_ns{0}, plan_ns{0};
  static void add(std::atomic<std::uint64_t>& c, std::uint64_t v) {
    c.fetch_add(v, std::memory_order_relaxed);
  }
  void fill(EngineStats& st) const;
  void fill(TuningStats& st) const;
};

struct EngineContext {
  EngineContext(const EngineOptions& resolved, const Tuning& tuning, std::shared_ptr<Device> d);
  EngineContext(const EngineContext&) = delete;
  EngineContext& operator=(const EngineContext&) = delete;

  // Plans `blocks` of transfer `id` whole with `config` (validation first, all-or-nothing;
  // throws gfd::Error naming the first bad block), timed into the counters and traced.
  // `bytes`: the blocks' sizes summed (total_bytes), where the caller has them.
  Plan plan(std::span<const BlockCopy> blocks, const PlanConfig& config, std::uint32_t id,
            std::optional<std::uint64_t> bytes = std::nullopt);
  PointerClassifier classifier() {
    return [this](const void* p) { return device->query_pointer(p); };
  }

  // Declared first: destroyed last, after everything that returns events or streams to it.
  std::shared_ptr<Device> device;
  EngineOptions options;   // the options in force, automatic choices resolved
  Tuning tuning;           // the mechanisms in force, resolved for the device and backend
  PlanConfig plan_config;  // staged planning with the engine's sizes
  EventPool events;
  PlanPool plans;
  Tracer tracer;
  Counters counters;
  PageableCache pageable;  // pageable host regions, across transfers
  HostFlags host_flags;    // stream-ordered device-to-host completion
};

}  // namespace gfd::detail
