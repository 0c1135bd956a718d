// gfd_gather_bench: host gather throughput against thread count (no GPU needed). Random cold
// blocks of a large pool are copied into a small staging area (as the engine's gather threads
// do), with plain memcpy or with the source prefetched a block ahead, from a pool backed by
// 4 KB pages or by transparent huge pages.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "bench_common.hpp"

using namespace gfd::bench;

namespace {

std::byte* map(std::size_t bytes, bool thp) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  madvise(p, bytes, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return static_cast<std::byte*>(p);
}

void copy_blocks(std::byte* dst, const std::byte* pool, const std::size_t* offs, std::size_t n,
                 std::size_t block, bool prefetch) {
  for (std::size_t i = 0; i < n; ++i) {
    if (prefetch && i + 2 < n) {
      const std::byte* nx = pool + offs[i + 2];
      for (std::size_t l = 0; l < block && l < 1024; l += 64) __builtin_prefetch(nx + l);
    }
    std::memcpy(dst + i * block, pool + offs[i], block);
  }
}

}  // namespace

int main(int argc, char** argv) try {
  Flags flags(argc, argv, {{"pool-bytes", "=S pool size (default 8 x L3)"},
                           {"block", "=S block size (default 4K)"},
                           {"threads", "=N[,N] thread counts (default 1,2,4,8,12,15)"},
                           {"help", " this text"}});
  if (flags.has("help")) return 0;
  const std::size_t block = flags.get_sizes("block", {4096})[0];
  const std::size_t pool_bytes = flags.has("pool-bytes") ? parse_size(flags.get("pool-bytes")) : 8 * l3_bytes();
  const std::size_t per_rep = 8 << 20;  // one 8 MB transfer
  const std::size_t n = per_rep / block;
  std::vector<std::size_t> threads = flags.get_sizes("threads", {1, 2, 4, 8, 12, 15});
  std::printf("gather: %zu x %s blocks per rep, pool %s, staging 8M (reused: stays in L3)\n", n,
              format_size(block).c_str(), format_size(pool_bytes).c_str());
  std::printf("%-6s %-8s %-8s %10s\n", "pages", "copy", "threads", "GB/s");
  for (bool thp : {false, true}) {
    std::byte* pool = map(pool_bytes, thp);
    for (std::size_t i = 0; i < pool_bytes; i += 4096) std::memset(pool + i, int(i >> 12) | 1, 4096);
    std::byte* staging = map(per_rep, true);
    std::memset(staging, 1, per_rep);
    SourcePicker picker(pool_bytes, block, 42);
    for (bool prefetch : {false, true}) {
      for (std::size_t t : threads) {
        const int reps = 40;
        std::vector<std::vector<std::size_t>> offs;
        for (int r = 0; r < reps; ++r) offs.push_back(picker.pick(n));
        std::barrier sync(static_cast<std::ptrdiff_t>(t + 1));
        std::atomic<int> rep{0};
        std::vector<std::thread> ws;
        for (std::size_t w = 0; w < t; ++w)
          ws.emplace_back([&, w] {
            for (int r = 0; r < reps; ++r) {
              sync.arrive_and_wait();
              const std::size_t lo = n * w / t, hi = n * (w + 1) / t;
              copy_blocks(staging + lo * block, pool, offs[r].data() + lo, hi - lo, block, prefetch);
              sync.arrive_and_wait();
            }
          });
        std::vector<double> us;
        for (int r = 0; r < reps; ++r) {
          sync.arrive_and_wait();
          const auto t0 = std::chrono::steady_clock::now();
          sync.arrive_and_wait();
          us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        }
        for (auto& w : ws) w.join();
        const Percentiles p = percentiles(std::vector<double>(us.begin() + 5, us.end()));
        std::printf("%-6s %-8s %-8zu %10.2f\n", thp ? "thp" : "4k", prefetch ? "prefetch" : "memcpy", t,
                    per_rep / (p.p50 * 1e3));
      }
    }
    munmap(staging, per_rep);
    munmap(pool, pool_bytes);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gfd_gather_bench: %s\n", e.what());
  return 1;
}
