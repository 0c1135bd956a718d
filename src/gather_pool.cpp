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
  // costs the waker an interrupt to another CPU, and waking all fifteen from the submitting
  // thread took it 10-25 us on the H200 host (a VM) before it could start planning
  // (gfd_benchmark --trace).
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    chain_.store(true, std::memory_order_seq_cst);
    epoch_.notify_one();
  }
}

bool SpreadWork::run_parts(Job& job) {
  bool ran = false;
  for (std::size_t p = job.next.fetch_add(1, std::memory_order_relaxed); p < job.parts;
       p = job.next.fetch_add(1, std::memory_order_relaxed)) {
    (*job.part)(p);
    job.done.fetch_add(1, std::memory_order_release);
    ran = true;
  }
  return ran;
}

void SpreadWork::run(std::size_t parts, const Part& part) {
  std::unique_lock lk(one_, std::try_to_lock);
  if (!lk.owns_lock() || parts < 2) {
    for (std::size_t p = 0; p < parts; ++p) part(p);
    return;
  }
  Job job{&part, parts};
  job_.store(&job, std::memory_order_seq_cst);
  run_parts(job);
  while (job.done.load(std::memory_order_acquire) < parts) GFD_PAUSE();
  // No helper may still hold `job` (on this stack) once this returns: withdraw it, then wait
  // for every thread that might have read it before the withdrawal.
  job_.store(nullptr, std::memory_order_seq_cst);
  while (helpers_.load(std::memory_order_seq_cst) != 0) GFD_PAUSE();
}

bool SpreadWork::help() {
  if (job_.load(std::memory_order_relaxed) == nullptr) return false;
  helpers_.fetch_add(1, std::memory_order_seq_cst);
  Job* job = job_.load(std::memory_order_seq_cst);
  const bool ran = job != nullptr && run_parts(*job);
  helpers_.fetch_sub(1, std::memory_order_seq_cst);
  return ran;
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
      for (int i = 0; i < 16; ++i) GFD_PAUSE();
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
