// Unit tests of the work a submitter spreads over the gather threads (SpreadWork in
// src/gather_pool.*): every part runs exactly once per job, pool threads take parts while the
// caller is busy with one, and a second caller whose job cannot be posted runs its parts alone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "gather_pool.hpp"
#include "topology.hpp"

namespace {

using gfd::detail::GatherPool;
using gfd::detail::SpreadWork;
using Clock = std::chrono::steady_clock;

// A pool of `threads` threads whose only work is helping with `spread`'s jobs.
GatherPool helpers(SpreadWork& spread, int threads) {
  return GatherPool(threads, gfd::detail::allowed_cpus(), 200, [&spread] { return spread.help(); }, nullptr);
}

TEST(SpreadWorkTest, EveryPartRunsOncePerJob) {
  SpreadWork spread;
  GatherPool pool = helpers(spread, 3);
  for (std::size_t parts = 0; parts <= 40; ++parts) {
    std::vector<std::atomic<int>> runs(parts);
    spread.run(parts, [&](std::size_t p) { runs[p].fetch_add(1); });
    for (std::size_t p = 0; p < parts; ++p) ASSERT_EQ(runs[p].load(), 1) << parts << " parts, part " << p;
  }
}

// Part 0 (the caller's: it claims first) returns only once another thread has run a part, so the
// job finishes only if the pool's threads help.
TEST(SpreadWorkTest, PoolThreadsTakePartsWhileTheCallerIsBusy) {
  SpreadWork spread;
  GatherPool pool = helpers(spread, 2);
  const std::thread::id caller = std::this_thread::get_id();
  for (int job = 0; job < 20; ++job) {
    std::atomic<int> elsewhere{0};
    std::atomic<bool> gave_up{false};
    pool.wake();  // as a submitter does before it plans: parked threads come back and look
    spread.run(8, [&](std::size_t p) {
      if (std::this_thread::get_id() != caller) elsewhere.fetch_add(1);
      if (p != 0) return;
      const auto until = Clock::now() + std::chrono::seconds(10);
      while (elsewhere.load() == 0 && Clock::now() < until) std::this_thread::yield();
      gave_up = elsewhere.load() == 0;
    });
    ASSERT_FALSE(gave_up.load()) << "job " << job << ": no pool thread took a part within 10 s";
  }
}

// Two submitters at once: one job is posted, the other runs its parts on its own thread; both
// run every part once, and neither waits for the other.
TEST(SpreadWorkTest, ConcurrentCallersEachRunTheirOwnParts) {
  SpreadWork spread;
  GatherPool pool = helpers(spread, 2);
  constexpr std::size_t kParts = 16;
  std::vector<std::atomic<int>> runs(2 * kParts);
  std::vector<std::thread> callers;
  for (int c = 0; c < 2; ++c)
    callers.emplace_back([&, c] {
      for (int job = 0; job < 200; ++job) {
        pool.wake();
        spread.run(kParts, [&](std::size_t p) { runs[c * kParts + p].fetch_add(1); });
      }
    });
  for (auto& t : callers) t.join();
  for (std::size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 200) << "part " << i;
}

}  // namespace
