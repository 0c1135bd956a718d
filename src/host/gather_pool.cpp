#include "host/gather_pool.hpp"

#include <chrono>

#include "common/sync.hpp"
#include "host/topology.hpp"

namespace gfd::detail {

GatherPool::GatherPool(int threads, std::vector<int> cpus, int spin_us, Work work, ThreadInit init)
    : cpus_(std::move(cpus)), spin_us_(spin_us), work_(std::move(work)), init_(std::move(init)) {
  threads_.reserve(static_cast<std::size_t>(threads));
  try {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { loop(i); });
  } catch (...) {
    stop_.store(true);
    wake();
    for (auto& t : threads_) t.join();
    throw;
  }
}

GatherPool::~GatherPool() {
  stop_.store(true, std::memory_order_seq_cst);
  wake();
  for (auto& t : threads_) t.join();
}

void GatherPool::wake() {
  // Pairs with loop(): a thread that registered as a sleeper either sees the new epoch (and
  // through it the work published before this call) or is woken by this notify.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();
}

void GatherPool::wake_one() {
  // As wake(), but only one thread is woken here, and it wakes the others: each thread woken
  // costs the waker an interrupt to another CPU, and waking them all held the submitting thread
  // for tens of microseconds before it could start planning (gfd_benchmark --trace).
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    chain_.store(true, std::memory_order_seq_cst);
    epoch_.notify_one();
  }
}

void GatherPool::loop(int index) {
  if (!pin_current_thread(cpus_)) pinned_.store(false);
  if (init_) init_(index);
  using Clock = std::chrono::steady_clock;
  while (!stop_.load(std::memory_order_acquire)) {
    if (work_()) continue;
    // Spin briefly: back-to-back transfers should not pay a futex wake-up each.
    const auto deadline = Clock::now() + std::chrono::microseconds(spin_us_);
    bool got = false;
    while (!got && Clock::now() < deadline && !stop_.load(std::memory_order_relaxed)) {
      for (int i = 0; i < 16; ++i) cpu_relax();
      got = work_();
    }
    if (got) continue;
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint32_t e = epoch_.load(std::memory_order_seq_cst);
    if (!stop_.load(std::memory_order_seq_cst)) {
      if (work_()) {
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        continue;
      }
      epoch_.wait(e, std::memory_order_seq_cst);
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    // Woken by wake_one(): work is coming, so the threads still parked come back too. The first
    // thread back pays for it, while the submitter plans.
    if (chain_.exchange(false, std::memory_order_seq_cst)) epoch_.notify_all();
  }
}

}  // namespace gfd::detail
