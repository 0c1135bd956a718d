// gfd_benchmark --layout pool --host-load-probe: how much of the host's memory bandwidth the copy
// engine keeps while CPU threads copy memory as the gather threads do: the contiguous pinned DMA
// of `bytes`, timed as the benchmark does, with T threads each copying between two private 64 MB
// buffers with streaming stores.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "pool_bench.hpp"

namespace gfd::bench::pool {

using Clock = std::chrono::steady_clock;

void host_load_probe(PoolBench& b, std::size_t bytes) {
  std::printf(
      "\nhost-load probe: one contiguous pinned %s DMA (P50 of %d) while T threads copy host "
      "memory\n",
      format_size(bytes).c_str(), b.iters);
  std::printf("%-8s %14s %14s %12s\n", "threads", "copy_GB/s", "copy_traffic", "DMA_GB/s");
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned t : {0u, 2u, 4u, 8u, 12u, 15u}) {
    if (t >= hw) break;
    constexpr std::size_t kBuf = std::size_t{64} << 20;
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> copied{0};
    std::vector<std::thread> threads;
    for (unsigned i = 0; i < t; ++i)
      threads.emplace_back([&] {
        std::vector<std::byte> a(kBuf, std::byte{1}), c(kBuf);
        while (!stop.load(std::memory_order_relaxed)) {
          for (std::size_t off = 0; off < kBuf && !stop.load(std::memory_order_relaxed);
               off += 1 << 20) {
            testkit::copy_like_staging(c.data() + off, a.data() + off, 1 << 20,
                                       StagingWrites::kStreaming);
            copied.fetch_add(1 << 20, std::memory_order_relaxed);
          }
        }
      });
    std::this_thread::sleep_for(
        std::chrono::milliseconds(t ? 200 : 0));  // buffers touched, threads running
    const std::uint64_t c0 = copied.load();
    const auto t0 = Clock::now();
    const Percentiles p = b.reference(bytes);
    const double secs = since_us(t0) * 1e-6;
    const double copy_gbps = (copied.load() - c0) / secs * 1e-9;
    stop = true;
    for (auto& th : threads) th.join();
    std::printf("%-8u %14.1f %14.1f %12.2f\n", t, copy_gbps, 2 * copy_gbps, gbps(bytes, p.p50));
  }
  std::printf(
      "(copy_traffic = bytes read + bytes written by the threads; the staged path costs three "
      "bytes\n"
      " of host memory traffic per byte moved: gather read, staging write, DMA read)\n");
}

}  // namespace gfd::bench::pool
