// The gather threads of one engine. Work arrives through a lock-free queue; idle threads spin
// for a short while (a transfer usually follows another) and then park on a futex, so an idle
// engine costs no CPU.
#pragma once

#include <atomic>
#include <boost/lockfree/queue.hpp>
#include <cstdint>
#include <functional>
#include <span>
#include <thread>
#include <vector>

namespace gfd::detail {

struct PieceRef {
  void* item;            // the chunk's issue item
  std::uint32_t piece;   // index into the transfer's plan
};

class GatherPool {
 public:
  using Runner = std::function<void(const PieceRef&)>;
  using ThreadInit = std::function<void()>;

  GatherPool(int threads, std::vector<int> cpus, int spin_us, Runner run, ThreadInit init);
  ~GatherPool();
  GatherPool(const GatherPool&) = delete;
  GatherPool& operator=(const GatherPool&) = delete;

  void push(std::span<const PieceRef> pieces);
  // The calling thread runs queued pieces until the queue is empty.
  void help();
  int threads() const { return static_cast<int>(threads_.size()); }
  // False when some thread could not be pinned to the requested CPUs.
  bool pinned() const { return pinned_.load(); }

 private:
  void loop();
  boost::lockfree::queue<PieceRef> queue_;
  std::vector<std::thread> threads_;
  std::vector<int> cpus_;
  int spin_us_;
  Runner run_;
  ThreadInit init_;
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> pinned_{true};
};

}  // namespace gfd::detail
