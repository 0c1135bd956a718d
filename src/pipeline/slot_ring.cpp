#include "pipeline/slot_ring.hpp"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "gfd/error.hpp"
#include "host/gather_copy.hpp"
#include "pipeline/engine_context.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gfd::detail {

SlotRing::SlotRing(Device& device, Counters& counters, const RingConfig& c)
    : device_(device),
      counters_(counters),
      slot_bytes_(c.slot_bytes),
      memory_(c.slots * c.slot_bytes, c.numa_node, "staging"),
      slots_(c.slots) {
  const std::size_t ring = c.slots * c.slot_bytes;
  memory_.populate();  // fault every page in now, not during the first transfer
  memory_.register_with(device);
  try {
    if (c.device_twin) dev_staging_ = static_cast<std::byte*>(device.alloc_device(ring));
    if (c.flags || c.placed_flags || c.dma_flags) {
      // One flag per cache line: threads set them concurrently, and the GPU writes the placed
      // and DMA flags over PCIe beside them. Per slot: its wait flag, its placed flag, its DMA
      // flag.
      constexpr std::size_t kLine = 64;
      const std::size_t bytes = (c.slots * 3 * kLine + 4095) / 4096 * 4096;
      void* f = nullptr;
      if (posix_memalign(&f, 4096, bytes) != 0)
        throw Error(ErrorCode::kSystem, "out of memory for slot flags");
      std::memset(f, 0, bytes);
      try {
        device.register_host(f, bytes);
      } catch (...) {
        std::free(f);
        throw;
      }
      flags_ = static_cast<std::uint64_t*>(f);  // release() unregisters and frees it
    }
    for (std::size_t i = 0; i < c.slots; ++i) {
      Slot& s = slots_[i];
      s.host = memory_.data() + i * c.slot_bytes;
      s.dev = dev_staging_ != nullptr ? dev_staging_ + i * c.slot_bytes : nullptr;
      constexpr std::size_t kWords = 64 / sizeof(std::uint64_t);
      s.flag = c.flags ? flags_ + 3 * i * kWords : nullptr;
      s.placed = c.placed_flags ? flags_ + (3 * i + 1) * kWords : nullptr;
      s.dma_flag = c.dma_flags ? flags_ + (3 * i + 2) * kWords : nullptr;
      s.start = device.create_event(false);
      s.done = device.create_event(false);
    }
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
}

SlotRing::~SlotRing() { release(); }

void SlotRing::release() noexcept {
  for (Slot& s : slots_) {
    if (s.start != nullptr) device_.destroy_event(s.start);
    if (s.done != nullptr) device_.destroy_event(s.done);
    s.start = s.done = nullptr;
  }
  if (dev_staging_ != nullptr) device_.free_device(dev_staging_);
  dev_staging_ = nullptr;
  if (flags_ != nullptr) {
    device_.unregister_host(flags_);
    std::free(flags_);
  }
  flags_ = nullptr;
}

void SlotRing::wait_free(Slot& s) {
  int st = s.state.load(std::memory_order_acquire);
  while (st == Slot::kGathering) {
    s.state.wait(Slot::kGathering, std::memory_order_acquire);
    st = s.state.load(std::memory_order_acquire);
  }
  if (st == Slot::kIssued) {
    try {
      // No slot is reused before its DMA (and its placing kernel) has completed.
      if (s.by_flag)
        wait_placed(s);
      else
        wait_event(device_, s.done);
    } catch (...) {
      // The DMA failed: its own transfer reports that. Nothing runs on the device after a
      // fault, so the slot is free.
    }
  }
}

void SlotRing::wait_placed(const Slot& s) {
  PlacedWait wait(s, s.placed_value);
  while (!wait.poll(device_)) std::this_thread::yield();
}

PlacedWait::PlacedWait(const Slot& s, std::uint64_t value, FaultWatch* watch)
    : s_(&s), value_(value), watch_(watch), since_(Clock::now()), look_(since_) {}

bool PlacedWait::poll(Device& device) {
  for (int i = 0; i < 256; ++i) {
    if (reached(*s_, value_)) return true;
    cpu_relax();
  }
  const auto now = Clock::now();
  if (now - since_ > std::chrono::microseconds(500))
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  if (now - look_ > std::chrono::milliseconds(1)) {
    look_ = now;
    if (watch_ == nullptr) {
      (void)device.event_done(s_->done);
    } else {
      (void)fault_look_.step(*watch_, s_->done, true);
    }
  }
  return reached(*s_, value_);
}

bool FaultLook::step(FaultWatch& watch, EventHandle e, bool due) {
  if (asked_ != 0) {
    std::exception_ptr fault;
    if (!watch.answered(asked_, fault)) return false;
    asked_ = 0;
    if (fault) std::rethrow_exception(fault);
  }
  if (!due) return false;
  asked_ = watch.ask(e);
  return true;
}

FaultWatch::FaultWatch(Device& device) : device_(device), thread_([this] { run(); }) {}

FaultWatch::~FaultWatch() {
  {
    std::lock_guard lk(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::uint64_t FaultWatch::ask(EventHandle e) {
  std::uint64_t n;
  {
    std::lock_guard lk(m_);
    event_ = e;
    n = ++asked_;
  }
  cv_.notify_all();
  return n;
}

bool FaultWatch::answered(std::uint64_t n, std::exception_ptr& fault) const {
  std::lock_guard lk(m_);
  if (answered_ < n) return false;
  fault = fault_;
  return true;
}

void FaultWatch::run() {
  device_.make_current();
  std::unique_lock lk(m_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || asked_ > answered_; });
    if (stop_) return;
    const std::uint64_t n = asked_;
    EventHandle e = event_;
    lk.unlock();
    std::exception_ptr fault;
    try {
      (void)device_.event_done(
          e);  // may block behind another thread's cudaFree: nobody waits for it
    } catch (...) {
      fault = std::current_exception();
    }
    lk.lock();
    answered_ = n;
    fault_ = fault;
  }
}

std::uint32_t SlotRing::acquire(std::uint64_t* free_at) {
  const auto idx = static_cast<std::uint32_t>(next_ % slots_.size());
  Slot& s = slots_[idx];
  if (free_at != nullptr) *free_at = 0;
  if (free_at != nullptr && s.by_flag && s.state.load(std::memory_order_acquire) == Slot::kIssued &&
      !PlacedWait::reached(s, s.placed_value)) {
    *free_at = s.placed_value;
    Counters::add(counters_.slots_deferred, 1);
  } else {
    const auto t0 = Clock::now();
    wait_free(s);
    Counters::add(counters_.submit_wait_ns, ns_since(t0));
  }
  s.by_flag = false;
  s.state.store(Slot::kGathering, std::memory_order_relaxed);
  ++next_;
  return idx;
}

std::optional<std::uint32_t> SlotRing::try_acquire() {
  const auto idx = static_cast<std::uint32_t>(next_ % slots_.size());
  Slot& s = slots_[idx];
  const int st = s.state.load(std::memory_order_acquire);
  if (st == Slot::kGathering) return std::nullopt;
  if (st == Slot::kIssued) {
    try {
      if (s.by_flag ? !PlacedWait::reached(s, s.placed_value) : !device_.event_done(s.done))
        return std::nullopt;
    } catch (...) {
      // As wait_free: a failed DMA's transfer reports it, and the slot is free.
    }
  }
  s.by_flag = false;
  s.state.store(Slot::kGathering, std::memory_order_relaxed);
  ++next_;
  return idx;
}

void SlotRing::drain() noexcept {
  for (Slot& s : slots_) {
    if (s.state.load(std::memory_order_acquire) != Slot::kIssued) continue;
    try {
      if (s.by_flag)
        wait_placed(s);
      else
        device_.event_sync(s.done);
    } catch (...) {
      // Reported to the transfer that enqueued the work.
    }
  }
}

namespace {
// Op i's scatter entry: its device side (the destination host to device, the source device to
// host), where it lies in the slot, and how long it is.
ScatterEntry entry_of(const GatherOp& op, bool to_host) {
  const void* device_side = to_host ? static_cast<const void*>(op.src) : op.dst;
  return {reinterpret_cast<std::uint64_t>(device_side), op.slot_offset, op.bytes};
}
}  // namespace

void write_scatter_entries(const Plan& p, const PlannedChunk& c, std::byte* slot_host,
                           Direction d) {
  auto* entries = reinterpret_cast<ScatterEntry*>(slot_host + c.scatter_offset);
  for (std::uint32_t i = c.op_begin; i < c.op_end; ++i)
    entries[i - c.op_begin] = entry_of(p.ops[i], d == Direction::kToHost);
}

void stream_scatter_entries(const Plan& p, const PlannedChunk& c, std::uint32_t first,
                            std::uint32_t last, std::byte* slot_host, Direction d) noexcept {
  auto* entries = reinterpret_cast<ScatterEntry*>(slot_host + c.scatter_offset);
  for (std::uint32_t i = first; i < last; ++i) {
    const ScatterEntry e = entry_of(p.ops[i], d == Direction::kToHost);
#if defined(__x86_64__)
    auto* w = reinterpret_cast<long long*>(&entries[i - c.op_begin]);
    _mm_stream_si64(w, static_cast<long long>(e.dst));
    _mm_stream_si64(w + 1, static_cast<long long>(e.src_offset));
    _mm_stream_si64(w + 2, static_cast<long long>(e.bytes));
#else
    entries[i - c.op_begin] = e;
#endif
  }
  store_fence();
}

}  // namespace gfd::detail
