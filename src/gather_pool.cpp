#include "gather_pool.hpp"

#include <chrono>

#include "topology.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GFD_PAUSE() _mm_pause()
#else
#define GFD_PAUSE() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace gfd::detail {

GatherPool::GatherPool(int threads, std::vector<int> cpus, int spin_us, Runner run, ThreadInit init)
    : queue_(1024), cpus_(std::move(cpus)), spin_us_(spin_us), run_(std::move(run)),
      init_(std::move(init)) {
  threads_.reserve(static_cast<std::size_t>(threads));
  try {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { loop(); });
  } catch (...) {
    stop_.store(true);
    epoch_.fetch_add(1);
    epoch_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

GatherPool::~GatherPool() {
  stop_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (auto& t : threads_) t.join();
}

void GatherPool::push(std::span<const PieceRef> pieces) {
  for (const PieceRef& p : pieces) queue_.push(p);
  // Pairs with loop(): a thread that registered as a sleeper either sees the new epoch (and
  // through it the pushed pieces) or is woken by this notify.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
}

void GatherPool::help() {
  PieceRef p{};
  while (queue_.pop(p)) run_(p);
}

void GatherPool::loop() {
  if (!pin_current_thread(cpus_)) pinned_.store(false);
  if (init_) init_();
  using Clock = std::chrono::steady_clock;
  PieceRef p{};
  while (true) {
    if (queue_.pop(p)) {
      run_(p);
      continue;
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // Spin briefly: back-to-back transfers should not pay a futex wake-up each.
    const auto deadline = Clock::now() + std::chrono::microseconds(spin_us_);
    bool got = false;
    while (!got && Clock::now() < deadline && !stop_.load(std::memory_order_relaxed)) {
      for (int i = 0; i < 32; ++i) GFD_PAUSE();
      got = queue_.pop(p);
    }
    if (got) {
      run_(p);
      continue;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t e = epoch_.load(std::memory_order_seq_cst);
    if (queue_.empty() && !stop_.load(std::memory_order_seq_cst)) epoch_.wait(e, std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

}  // namespace gfd::detail
