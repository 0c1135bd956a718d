// Small synchronisation helpers shared by the engine's stages.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace gfd::detail {

using Clock = std::chrono::steady_clock;

// One spin-wait step (PAUSE on x86: the core yields to its sibling and saves power).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

inline std::uint64_t ns_since(Clock::time_point t0) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// Runs `step` and adds the nanoseconds it took to `ns` (also when it throws).
template <class F>
void add_elapsed(std::uint64_t& ns, F&& step) {
  struct Add {
    std::uint64_t& ns;
    Clock::time_point t0;
    ~Add() { ns += ns_since(t0); }
  } add{ns, Clock::now()};
  step();
}

inline std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

// A first-come, first-served lock. Submitters hold it while they take staging slots, which can
// mean waiting for DMAs when the ring is full; with an ordinary mutex one thread could then lose
// the race for it again and again (a 5 s wait was seen with 8 threads on a small ring).
class FifoMutex {
 public:
  void lock() noexcept {
    const std::uint32_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
    for (std::uint32_t s = serving_.load(std::memory_order_acquire); s != ticket;
         s = serving_.load(std::memory_order_acquire))
      serving_.wait(s, std::memory_order_acquire);
  }
  void unlock() noexcept {
    serving_.fetch_add(1, std::memory_order_release);
    serving_.notify_all();
  }

 private:
  std::atomic<std::uint32_t> next_{0};
  std::atomic<std::uint32_t> serving_{0};
};

}  // namespace gfd::detail
