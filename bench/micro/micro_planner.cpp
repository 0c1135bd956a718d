// micro_planner: cost of planning one transfer (gfd::detail::make_plan) against its block count,
// for pinned sources and (pageable_src_*) for pageable sources on random pages of a large pool.
//
// N blocks of 4 KB, sources at a 2x-block stride (so nothing coalesces) in one fake pinned host
// range, destinations in one fake device range (GPU 0), either in ascending order (one DMA per
// chunk) or shuffled (the scattered pages of a paged KV cache: scatter entries, and a sort for
// the overlap check). A lambda classifier reports the two ranges, so no device is needed and no
// pointer is ever dereferenced. Single-threaded CPU time; reports blocks/s (items_per_second) and
// ns_per_block, and the plan's chunks and ops and the classifier queries per plan.
#include <benchmark/benchmark.h>
#include <time.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "planning/planner.hpp"

namespace {

using gfd::BlockCopy;

double thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}
using gfd::detail::PlanConfig;
using gfd::detail::PointerInfo;
using gfd::detail::PointerKind;

constexpr std::size_t kBlock = 4096;
// Fake address ranges, far apart and never touched.
constexpr std::uintptr_t kSrcBase = std::uintptr_t{0x100000000000};
constexpr std::uintptr_t kDstBase = std::uintptr_t{0x200000000000};

enum class DstOrder { kAscending, kShuffled };
// Pinned: sources at a 2x-block stride in one pinned range. Pageable: sources on random pages of
// a 2.4 GB pageable pool (as gfd_benchmark --pageable picks them), which the driver reports with
// no range; the planner gets a PageableCache that lives across plans, as in the engine.
enum class Source { kPinned, kPageable };
constexpr std::uintptr_t kPageablePool = std::uintptr_t{2400} << 20;

std::vector<BlockCopy> make_blocks(std::size_t n, DstOrder order, Source source) {
  std::vector<std::size_t> dst_slot(n);
  std::iota(dst_slot.begin(), dst_slot.end(), std::size_t{0});
  if (order == DstOrder::kShuffled)
    std::shuffle(dst_slot.begin(), dst_slot.end(), std::mt19937_64(7));
  std::vector<std::uintptr_t> src_slot(n);
  for (std::size_t i = 0; i < n; ++i) src_slot[i] = 2 * i;
  if (source == Source::kPageable) {  // distinct random slots of the pool
    std::vector<std::uintptr_t> all(kPageablePool / (2 * kBlock));
    std::iota(all.begin(), all.end(), std::uintptr_t{0});
    std::shuffle(all.begin(), all.end(), std::mt19937_64(11));
    for (std::size_t i = 0; i < n; ++i) src_slot[i] = 2 * all[i];
  }
  std::vector<BlockCopy> blocks(n);
  for (std::size_t i = 0; i < n; ++i) {
    blocks[i].src = reinterpret_cast<const void*>(kSrcBase + src_slot[i] * kBlock);
    blocks[i].dst = reinterpret_cast<void*>(kDstBase + dst_slot[i] * kBlock);
    blocks[i].bytes = kBlock;
  }
  return blocks;
}

// The two fake ranges of n blocks as the driver would report them (pinned sources: one pinned
// range; pageable: no range), counting the queries in `*queries` where given.
gfd::detail::PointerClassifier fake_classifier(std::size_t n, Source source,
                                               std::uint64_t* queries) {
  const std::uintptr_t src_end = source == Source::kPinned ? kSrcBase + 2 * n * kBlock : kSrcBase;
  const std::uintptr_t dst_end = kDstBase + n * kBlock;
  return [=](const void* p) {
    if (queries != nullptr) ++*queries;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    PointerInfo info;  // pageable, unknown range
    if (a >= kSrcBase && a < src_end) {
      info.kind = PointerKind::kPinnedHost;
      info.begin = kSrcBase;
      info.end = src_end;
    } else if (a >= kDstBase && a < dst_end) {
      info.kind = PointerKind::kDevice;
      info.device = 0;
      info.begin = kDstBase;
      info.end = dst_end;
    }
    return info;
  };
}

// `strided_min_rows`, `strided_min_bytes`: the constant-stride run detection (rows 0: off; the
// engine's defaults, 2 rows and 512 KiB: on), to see what following runs costs a random list
// that has none, and what planning one constant-stride run (ascending_dst) costs with it.
void BM_MakePlan(benchmark::State& state, DstOrder order, bool check_overlaps, Source source,
                 std::size_t strided_min_rows = 0, std::size_t strided_min_bytes = 0) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<BlockCopy> blocks = make_blocks(n, order, source);
  std::uint64_t queries = 0;
  const gfd::detail::PointerClassifier classify = fake_classifier(n, source, &queries);
  PlanConfig config;  // the engine's defaults (2 MB slots, 32 KB pieces, ...)
  config.device = 0;
  config.check_overlaps = check_overlaps;
  config.strided_min_rows = strided_min_rows;
  config.strided_min_bytes = strided_min_bytes;

  gfd::detail::PageableCache pageable(60000);
  gfd::detail::PageableCache* shared = source == Source::kPageable ? &pageable : nullptr;
  (void)gfd::detail::make_plan(blocks, config, classify, shared);  // steady state: regions known
  queries = 0;
  std::size_t chunks = 0, ops = 0;
  const double t0 = thread_cpu_ns();
  for (auto _ : state) {
    gfd::detail::Plan plan = gfd::detail::make_plan(blocks, config, classify, shared);
    benchmark::DoNotOptimize(plan.ops.data());
    chunks = plan.chunks.size();
    ops = plan.ops.size();
  }
  const double cpu_ns = thread_cpu_ns() - t0;
  const auto iters = static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  // CPU time of this thread, as the reported rate (so preemption on a busy machine is left out).
  state.counters["ns_per_block"] = cpu_ns / (std::max(iters, 1.0) * static_cast<double>(n));
  state.counters["chunks"] = static_cast<double>(chunks);
  state.counters["ops"] = static_cast<double>(ops);
  state.counters["queries"] = static_cast<double>(queries) / std::max(iters, 1.0);
}

// What a host-to-device transfer does before its first chunk is packed: PlanBuilder::check (every
// block validated, the overlap check), on a recycled plan as in the engine.
void BM_Check(benchmark::State& state, DstOrder order) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<BlockCopy> blocks = make_blocks(n, order, Source::kPinned);
  const gfd::detail::PointerClassifier classify = fake_classifier(n, Source::kPinned, nullptr);
  PlanConfig config;
  config.device = 0;
  gfd::detail::Plan plan;
  const double t0 = thread_cpu_ns();
  for (auto _ : state) {
    gfd::detail::PlanBuilder builder(blocks, config, classify, plan, nullptr, true);
    builder.check();
    benchmark::DoNotOptimize(plan.all_pinned_host);
  }
  const double cpu_ns = thread_cpu_ns() - t0;
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  state.counters["ns_per_block"] =
      cpu_ns / (std::max(static_cast<double>(state.iterations()), 1.0) * static_cast<double>(n));
}

void BlockCounts(benchmark::internal::Benchmark* b) {
  b->ArgName("blocks");
  for (std::int64_t n : {16, 256, 2048, 16384}) b->Arg(n);
}

BENCHMARK_CAPTURE(BM_MakePlan, ascending_dst, DstOrder::kAscending, true, Source::kPinned)
    ->Apply(BlockCounts);
BENCHMARK_CAPTURE(BM_MakePlan, shuffled_dst, DstOrder::kShuffled, true, Source::kPinned)
    ->Apply(BlockCounts);
BENCHMARK_CAPTURE(BM_MakePlan, ascending_dst_nocheck, DstOrder::kAscending, false, Source::kPinned)
    ->Apply(BlockCounts);
BENCHMARK_CAPTURE(BM_MakePlan, shuffled_dst_nocheck, DstOrder::kShuffled, false, Source::kPinned)
    ->Apply(BlockCounts);
BENCHMARK_CAPTURE(BM_MakePlan, shuffled_dst_runs_off, DstOrder::kShuffled, true, Source::kPinned, 0)
    ->Arg(4096);
BENCHMARK_CAPTURE(BM_MakePlan, shuffled_dst_runs_on, DstOrder::kShuffled, true, Source::kPinned, 2,
                  512 << 10)
    ->Arg(4096);
BENCHMARK_CAPTURE(BM_MakePlan, seed_layout_runs_off, DstOrder::kAscending, true, Source::kPinned, 0)
    ->Arg(2048)
    ->Arg(16384);
BENCHMARK_CAPTURE(BM_MakePlan, seed_layout_runs_on, DstOrder::kAscending, true, Source::kPinned, 2,
                  512 << 10)
    ->Arg(2048)
    ->Arg(16384);
BENCHMARK_CAPTURE(BM_Check, ascending_dst, DstOrder::kAscending)->Apply(BlockCounts);
BENCHMARK_CAPTURE(BM_Check, shuffled_dst, DstOrder::kShuffled)->Apply(BlockCounts);
BENCHMARK_CAPTURE(BM_MakePlan, pageable_src_ascending_dst, DstOrder::kAscending, true,
                  Source::kPageable)
    ->Apply(BlockCounts);

}  // namespace

BENCHMARK_MAIN();
