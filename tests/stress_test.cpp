// Stress: many threads submit random transfers at once and every byte of every transfer is
// checked. Both directions; random block counts, sizes and alignments; contiguous and scattered
// destinations; pinned and pageable host memory; transfers larger than the staging ring (1 MB),
// and the same through a 32 MB ring (device to host then plans while its DMAs run). Short by
// default (CI); GFD_STRESS_REQUESTS sets the number of requests (the long run uses 100000) and
// GFD_STRESS_THREADS the submitting threads (default 8). It prints the requests, bytes,
// mismatches and the longest wait of one request.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "test_support.hpp"

namespace gfd::test {
namespace {

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end != v && *end == '\0' && x > 0 ? x : fallback;
}

class StressTest : public DeviceParamTest {};

// `staging_bytes`: the ring. 1 MB: the larger requests span it several times. 32 MB: no request
// can wrap around it, so device-to-host requests are planned while their first DMAs run.
void stress(detail::Device& dev, TestDevice& td, std::size_t staging_bytes, const char* label) {
  const long requests = env_long("GFD_STRESS_REQUESTS", 400);
  const int threads = static_cast<int>(env_long("GFD_STRESS_THREADS", 8));
  EngineOptions o = small_options();
  o.staging_bytes = staging_bytes;
  o.kernel_max_bytes = 64 << 10;  // the smallest pinned requests take the kernel path
  Engine engine = td.make_engine(o);

  // Sources: a pinned and a pageable pool; each thread owns a disjoint destination region.
  constexpr std::size_t kPool = 32 << 20, kRegion = 4 << 20, kMaxRequest = 3 << 20;
  HostBuffer pinned(dev, kPool, true), pageable(dev, kPool, false);
  fill_random(pinned.data(), kPool, 70);
  fill_random(pageable.data(), kPool, 71);
  DeviceBuffer dst(dev, kRegion * static_cast<std::size_t>(threads));
  // Device to host: each thread's host landing areas, pinned and pageable.
  HostBuffer out_pinned(dev, kRegion * static_cast<std::size_t>(threads), true);
  HostBuffer out_pageable(dev, kRegion * static_cast<std::size_t>(threads), false);

  std::atomic<long> next{0}, done{0}, mismatches{0}, failures{0};
  std::atomic<std::uint64_t> bytes{0}, longest_ns{0};
  std::mutex report;
  auto worker = [&](int t) {
    std::mt19937_64 rng(1000 + t);
    detail::StreamHandle s = dev.create_stream();
    std::byte* region = dst.data() + kRegion * static_cast<std::size_t>(t);
    std::vector<std::byte> back(kRegion);
    while (next.fetch_add(1) < requests) {
      // Blocks: random sizes (1 B .. 64 KB, half of them 4 KB-ish) at random alignments, laid
      // out without overlap in the region, then shuffled (scattered) or kept in order.
      const std::size_t count = 1 + rng() % 512;
      std::vector<BlockCopy> blocks;
      std::size_t at = 0, total = 0;
      const bool use_pinned = rng() % 2 == 0;
      const std::byte* pool = use_pinned ? pinned.data() : pageable.data();
      for (std::size_t i = 0; i < count; ++i) {
        const std::size_t size = rng() % 2 ? 4096 + rng() % 64 : 1 + rng() % (64 << 10);
        const std::size_t gap = rng() % 4 == 0 ? rng() % 512 : 0;
        if (at + gap + size > kRegion || total + size > kMaxRequest) break;
        at += gap;
        const std::size_t src = rng() % (kPool - size);
        blocks.push_back({pool + src, region + at, size});
        at += size;
        total += size;
      }
      if (blocks.empty()) continue;
      if (rng() % 2) std::shuffle(blocks.begin(), blocks.end(), rng);
      const bool to_host = rng() % 3 == 0;
      std::byte* out = nullptr;
      if (to_host) {
        // The same layout the other way round: the region first gets the pool's bytes, then the
        // blocks go back to a host landing area at the same offsets.
        out = (rng() % 2 ? out_pinned.data() : out_pageable.data()) +
              kRegion * static_cast<std::size_t>(t);
        for (BlockCopy& b : blocks) {
          dev.copy_h2d(b.dst, b.src, b.bytes, s);
          const std::size_t off = static_cast<std::byte*>(b.dst) - region;
          b = {b.dst, out + off, b.bytes};
        }
        std::memset(out, 0, kRegion);
      } else {
        dev.memset_async(region, 0, kRegion, s);
      }
      const auto t0 = std::chrono::steady_clock::now();
      try {
        if (to_host)
          engine.copy_to_host(blocks, static_cast<cudaStream_t>(s)).wait();
        else
          engine.copy_to_device(blocks, static_cast<cudaStream_t>(s)).wait();
      } catch (const std::exception& e) {
        ++failures;
        std::lock_guard lk(report);
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        continue;
      }
      const auto ns =
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - t0)
                                         .count());
      for (std::uint64_t cur = longest_ns.load();
           ns > cur && !longest_ns.compare_exchange_weak(cur, ns);) {
      }
      // Check against the device region's bytes (read back) both ways.
      dev.copy_d2h(back.data(), region, kRegion, s);
      dev.stream_sync(s);
      for (const BlockCopy& b : blocks) {
        const bool same =
            to_host
                ? std::memcmp(b.dst, back.data() + (static_cast<const std::byte*>(b.src) - region),
                              b.bytes) == 0
                : std::memcmp(back.data() + (static_cast<std::byte*>(b.dst) - region), b.src,
                              b.bytes) == 0;
        if (!same) {
          ++mismatches;
          std::lock_guard lk(report);
          ADD_FAILURE() << "thread " << t << ": a block of " << b.bytes << " bytes differs ("
                        << (to_host ? "to host" : "to device") << ")";
          break;
        }
      }
      bytes += total;
      ++done;
    }
    dev.destroy_stream(s);
  };
  std::vector<std::thread> pool_threads;
  for (int t = 0; t < threads; ++t) pool_threads.emplace_back(worker, t);
  for (auto& th : pool_threads) th.join();

  std::printf(
      "stress (%s, %s): %ld requests from %d threads, %.1f MB, %ld mismatches, %ld failures, "
      "longest wait %.2f ms\n",
      to_string(td.kind).c_str(), label, done.load(), threads, bytes.load() / 1e6,
      mismatches.load(), failures.load(), longest_ns.load() / 1e6);
  ::testing::Test::RecordProperty("requests", std::to_string(done.load()));
  ::testing::Test::RecordProperty("bytes", std::to_string(bytes.load()));
  ::testing::Test::RecordProperty("mismatches", std::to_string(mismatches.load()));
  ::testing::Test::RecordProperty("longest_wait_ms", std::to_string(longest_ns.load() / 1e6));
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(done.load(), 0);
}

TEST_P(StressTest, RandomTransfersFromManyThreadsLandExactly) {
  stress(*td_->device, *td_, 1 << 20, "1 MB ring");
}

TEST_P(StressTest, RandomTransfersThroughALargeRingLandExactly) {
  stress(*td_->device, *td_, 32 << 20, "32 MB ring");
}

INSTANTIATE_TEST_SUITE_P(Devices, StressTest,
                         ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace gfd::test
