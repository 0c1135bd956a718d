// The gather threads of one engine. They take work from the engine (a callable that runs one
// waiting piece and says whether there was one); idle threads spin for a short while (a
// transfer usually follows another) and then park on a futex, so an idle engine costs no CPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace gfd::detail {

class GatherPool {
 public:
  // Runs one waiting unit of work; false when there was none.
  using Work = std::function<bool()>;
  // Runs once on each thread before it takes work (argument: the thread's index).
  using ThreadInit = std::function<void(int)>;

  GatherPool(int threads, std::vector<int> cpus, int spin_us, Work work, ThreadInit init);
  ~GatherPool();
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;

  // New work is published, or about to be: parked threads come back and spin while they look
  // for it. Cheap when no thread is parked.
  void wake();
  // The same, with the cost of waking moved off the caller: it wakes one thread, which wakes
  // the others (a transfer's submitter, before it plans).
  void wake_one();
  int threads() const { return static_cast<int>(threads_.size()); }
  // False when some thread could not be pinned to the requested CPUs.
  bool pinned() const { return pinned_.load(); }

 private:
  void loop(int index);
  std::vector<std::thread> threads_;
  std::vector<int> cpus_;
  int spin_us_;
  Work work_;
  ThreadInit init_;
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> chain_{false};  // wake_one() woke one thread: the first back wakes the rest
  std::atomic<bool> stop_{false};
  std::atomic<bool> pinned_{true};
};

}  // namespace gfd::detail
