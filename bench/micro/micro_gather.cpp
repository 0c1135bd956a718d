// micro_gather: host gather throughput against the number of threads and the staging write mode
// (no GPU needed). Replaces the plain program gfd_gather_bench.
//
// One iteration gathers 2048 random cold 4 KB blocks (8 MB), picked at a 2x-block stride from a
// pool of 8 x the L3 size (env GFD_MICRO_POOL_BYTES, e.g. 1G, overrides the size), into an 8 MB
// staging area, as the engine's gather threads fill a staging slot: T persistent threads each
// copy a contiguous share of the blocks with the engine's copy loop (gfd::detail::gather_ops,
// which prefetches the next sources), writing staging in one of the modes of
// EngineOptions::staging_writes: cldemote (plain stores, then CLDEMOTE of each line), streaming
// (non-temporal stores) or plain. A mode the CPU lacks falls back as the engine's would; the
// label then says what ran. The threads meet at a barrier before and after each iteration;
// wall-clock time. Several sets of picks are cycled so that a set's blocks have left the caches
// when it comes round again. Reports bytes_per_second (payload bytes gathered).
//
// BM_GatherRead/<mode> stands in for the copy engine's read of the slot: T threads gather 1 MB
// (256 blocks) into one of 8 slots of the staging area, then the timing thread, pinned to a CPU
// of its own (the writers get the others), reads the slot, one load per line. read_GB/s is that
// read's rate: lines left in a gather core's private cache (plain), pushed to the L3 (cldemote)
// or sent to DRAM (streaming). It is a CPU core's read, not the DMA's, so it only hints at what
// the copy engine sees; only the GPU runs measure that.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "host/gather_copy.hpp"
#include "host/topology.hpp"

namespace {

using gfd::StagingWrites;
using gfd::detail::StoreKind;

constexpr std::size_t kBlock = 4096;
constexpr std::size_t kStagingBytes = std::size_t{8} << 20;
constexpr std::size_t kBlocksPerIteration = kStagingBytes / kBlock;
constexpr std::size_t kPickSets = 16;

// What gather_ops needs of an op.
struct CopyOp {
  const std::byte* src;
  std::uint64_t slot_offset;
  std::uint64_t bytes;
};

std::size_t pool_bytes() {
  std::size_t bytes = 8 * gfd::bench::l3_bytes();
  if (const char* env = std::getenv("GFD_MICRO_POOL_BYTES"); env != nullptr && *env != '\0') {
    try {
      bytes = gfd::bench::parse_size(env);
    } catch (const std::exception&) {
      throw std::invalid_argument(std::string("GFD_MICRO_POOL_BYTES=") + env +
                                  ": not a size (such as 512M or 1G)");
    }
  }
  // SourcePicker draws from every other block and wants at most half of those per set.
  const std::size_t least = 4 * kStagingBytes;
  if (bytes < least)
    throw std::invalid_argument("pool of " + gfd::bench::format_size(bytes) +
                                " is too small: at least " + gfd::bench::format_size(least) +
                                " (GFD_MICRO_POOL_BYTES)");
  return bytes;
}

// The source pool, the staging area and the sets of picked blocks, made once for all runs.
struct Fixture {
  gfd::bench::Pool pool;
  std::byte* staging = nullptr;
  std::vector<std::vector<CopyOp>> sets;

  explicit Fixture(std::size_t bytes) : pool(bytes) {
    // 2 MB aligned and on huge pages where the kernel gives them, like the engine's ring.
    staging = static_cast<std::byte*>(std::aligned_alloc(std::size_t{2} << 20, kStagingBytes));
    if (staging == nullptr) throw std::bad_alloc();
    madvise(staging, kStagingBytes, MADV_HUGEPAGE);
    std::memset(staging, 1, kStagingBytes);
    gfd::bench::SourcePicker picker(bytes, kBlock, 42);
    for (std::size_t s = 0; s < kPickSets; ++s) {
      const std::vector<std::size_t> offs = picker.pick(kBlocksPerIteration);
      std::vector<CopyOp> ops(offs.size());
      for (std::size_t i = 0; i < offs.size(); ++i)
        ops[i] = {pool.data + offs[i], i * kBlock, kBlock};
      sets.push_back(std::move(ops));
    }
  }
  ~Fixture() { std::free(staging); }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;
};

Fixture& fixture() {
  static Fixture f(pool_bytes());
  return f;
}

// The fixture, or nullptr after marking the benchmark skipped when it cannot be set up.
Fixture* fixture_or_skip(benchmark::State& state) {
  try {
    return &fixture();
  } catch (const std::exception& e) {
    state.SkipWithError((std::string("setup failed: ") + e.what()).c_str());
    return nullptr;
  }
}

// The mode as the engine resolves it on this CPU, and a label saying so where it falls back.
StoreKind resolve(StagingWrites mode, std::string* label) {
  const StoreKind kind = gfd::detail::resolve_staging_writes(mode);
  if (gfd::detail::to_public(kind) != mode)
    *label += std::string(", ") + gfd::to_string(mode) +
              " unsupported: " + gfd::to_string(gfd::detail::to_public(kind));
  return kind;
}

void BM_Gather(benchmark::State& state, StagingWrites mode, gfd::detail::Prefetch pf) {
  Fixture* f = fixture_or_skip(state);
  if (f == nullptr) return;
  std::string label = "pool " + gfd::bench::format_size(f->pool.bytes);
  const StoreKind kind = resolve(mode, &label);
  const auto threads = static_cast<std::size_t>(state.range(0));
  const std::size_t n = kBlocksPerIteration;

  std::barrier sync(static_cast<std::ptrdiff_t>(threads + 1));
  std::size_t set = 0;  // written by the timing thread before the first barrier of a round
  bool stop = false;    // likewise
  std::vector<std::thread> workers;
  for (std::size_t w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      const std::size_t lo = n * w / threads, hi = n * (w + 1) / threads;
      for (;;) {
        sync.arrive_and_wait();
        if (stop) return;
        gfd::detail::gather_ops(f->sets[set].data() + lo, hi - lo, f->staging, kind, pf);
        sync.arrive_and_wait();
      }
    });
  }
  for (auto _ : state) {
    set = (set + 1) % f->sets.size();
    sync.arrive_and_wait();  // go
    sync.arrive_and_wait();  // every share copied
  }
  stop = true;
  sync.arrive_and_wait();
  for (auto& t : workers) t.join();

  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(n * kBlock));
  state.SetLabel(label);
}

// Gather one 1 MB slot, then read it from the timing thread (see the top of the file).
void BM_GatherRead(benchmark::State& state, StagingWrites mode) {
  Fixture* f = fixture_or_skip(state);
  if (f == nullptr) return;
  std::string label = "pool " + gfd::bench::format_size(f->pool.bytes);
  const StoreKind kind = resolve(mode, &label);
  const auto threads = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t kSlotBlocks = 256, kSlotBytes = kSlotBlocks * kBlock;
  constexpr std::size_t kSlots = kStagingBytes / kSlotBytes;

  // The reader (this thread) on the first allowed CPU, the writers on the others, so that the
  // read crosses cores as the copy engine's does (where there are too few CPUs, writers share).
  const std::vector<int> cpus = gfd::detail::allowed_cpus();
  const bool pin = cpus.size() >= 2;
  auto pin_to = [](int cpu) { gfd::detail::pin_current_thread({cpu}); };
  if (pin) pin_to(cpus[0]);

  std::barrier sync(static_cast<std::ptrdiff_t>(threads + 1));
  std::size_t round = 0;  // written by the timing thread before the first barrier of a round
  bool stop = false;      // likewise
  std::vector<std::thread> workers;
  for (std::size_t w = 0; w < threads; ++w) {
    workers.emplace_back([&, w] {
      if (pin) pin_to(cpus[1 + w % (cpus.size() - 1)]);
      const std::size_t lo = kSlotBlocks * w / threads, hi = kSlotBlocks * (w + 1) / threads;
      std::vector<CopyOp> ops(hi - lo);
      for (;;) {
        sync.arrive_and_wait();
        if (stop) return;
        // Blocks of this round's part of a pick set, into this round's slot.
        const std::vector<CopyOp>& set = f->sets[(round / kSlots) % f->sets.size()];
        const std::size_t first = (round % kSlots) * kSlotBlocks;
        for (std::size_t i = lo; i < hi; ++i)
          ops[i - lo] = {set[first + i].src, (round % kSlots) * kSlotBytes + i * kBlock, kBlock};
        gfd::detail::gather_ops(ops.data(), ops.size(), f->staging, kind);
        sync.arrive_and_wait();
      }
    });
  }
  double read_seconds = 0;
  std::uint64_t sink = 0;
  for (auto _ : state) {
    ++round;
    sync.arrive_and_wait();  // go
    sync.arrive_and_wait();  // the slot is written
    const auto t0 = std::chrono::steady_clock::now();
    const auto* slot =
        reinterpret_cast<const std::uint64_t*>(f->staging + (round % kSlots) * kSlotBytes);
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < kSlotBytes / 8; i += 8) sum += slot[i];
    sink += sum;
    read_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  stop = true;
  sync.arrive_and_wait();
  for (auto& t : workers) t.join();
  if (pin) gfd::detail::pin_current_thread(cpus);  // back to every allowed CPU
  benchmark::DoNotOptimize(sink);

  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kSlotBytes));
  state.counters["read_GB/s"] =
      read_seconds > 0 ? static_cast<double>(state.iterations()) * kSlotBytes / read_seconds / 1e9
                       : 0;
  state.SetLabel(label);
}

// 1, 2, 4, 8, 12, 15 threads, capped at the CPUs of this machine, without repeats.
void ThreadCounts(benchmark::internal::Benchmark* b) {
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  std::set<unsigned> seen;
  b->ArgName("threads");
  for (unsigned t : {1u, 2u, 4u, 8u, 12u, 15u}) {
    const unsigned c = std::min(t, hw);
    if (seen.insert(c).second) b->Arg(c);
  }
}

// The engine's copy loop (defaults) in each staging write mode, then the prefetch choices changed
// one at a time (bytes, ops ahead; streaming stores, as measured before the modes existed).
constexpr gfd::detail::Prefetch kDefault{};
constexpr auto kL1 = gfd::detail::Prefetch::Level::kL1;
constexpr auto kNta = gfd::detail::Prefetch::Level::kNonTemporal;
BENCHMARK_CAPTURE(BM_Gather, cldemote, StagingWrites::kCldemote, kDefault)
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming, StagingWrites::kStreaming, kDefault)
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, plain, StagingWrites::kPlain, kDefault)
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_GatherRead, cldemote, StagingWrites::kCldemote)
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_GatherRead, streaming, StagingWrites::kStreaming)
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_GatherRead, plain, StagingWrites::kPlain)->Apply(ThreadCounts)->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_no_prefetch, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{0, 0})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_prefetch_1K_2, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{1024, 2})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_prefetch_4K_4, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{4096, 4})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_prefetch_1K_2_l1, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{1024, 2, kL1})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_prefetch_4K_2_l1, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{4096, 2, kL1})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_prefetch_4K_2_nta, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{4096, 2, kNta})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, cldemote_prefetch_4K_2_nta, StagingWrites::kCldemote,
                  gfd::detail::Prefetch{4096, 2, kNta})
    ->Apply(ThreadCounts)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_Gather, streaming_prefetch_4K_1, StagingWrites::kStreaming,
                  gfd::detail::Prefetch{4096, 1, gfd::detail::Prefetch::Level::kL2, 0})
    ->Apply(ThreadCounts)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
