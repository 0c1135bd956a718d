// ref_pipeline: the staged gather pipeline with nothing around it, as a yardstick for the engine
// on the machine at hand (on an H200 host such a stand-alone pipeline moved 66-75% of the line
// rate). Needs a GPU.
//
// N blocks of S bytes are picked cold (fresh random blocks at a 2x stride from a cudaHostAlloc
// pool of --pool-bytes, default 8 x L3, each repetition) and moved to contiguous device memory:
// T persistent threads claim P-byte pieces of C-byte chunks in order and copy them into the
// chunk's staging slot with the engine's copy loop (gather_ops, --writes as the engine's
// staging_writes); the timing thread opens each chunk once its slot's previous DMA is done
// (event query), and issues the chunk's DMA as soon as its last piece is in, round robin over K
// streams. No validation, no planning beyond cutting the list. Timed from the first claim to the
// streams' synchronisation; P50 of --iters after 5 warm-up repetitions; ratio to one contiguous
// pinned cudaMemcpyAsync of the same bytes measured in the same run. Every byte is verified once.
// Also reports the gather alone (same threads, no DMA) and the DMA alone (the slots' DMAs with
// nothing gathered), so a reader sees which side limits.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "host/gather_copy.hpp"
#include "host/topology.hpp"
#include "micro_cuda.hpp"

namespace {

using gfd::bench::Flags;
using gfd::micro::check;
using Clock = std::chrono::steady_clock;

const std::map<std::string, std::string> kFlags = {
    {"blocks", "=N          blocks per transfer (default 2048)"},
    {"block-size", "=S      block size (default 4K)"},
    {"threads", "=T         gather threads (default: allowed CPUs - 1)"},
    {"chunk", "=C           chunk (slot) size (default 1M)"},
    {"piece", "=P           piece size (default 32K)"},
    {"slots", "=R           staging slots (default 8)"},
    {"streams", "=K         copy streams (default 2)"},
    {"writes", "=W          cldemote | streaming | plain (default streaming)"},
    {"prefetch", "=L        where source lines are prefetched: l2 | l1 | nta | none (default l2)"},
    {"ahead", "=A           blocks prefetched ahead (default 2)"},
    {"window",
     "=B          and more, until B bytes are prefetched ahead (default 8K, the engine's)"},
    {"iters", "=N           timed repetitions (default 30)"},
    {"pool-bytes", "=S      source pool (default 8 x L3)"},
    {"warm", "              the same blocks every repetition"},
    {"help", "              this text"},
};

struct Op {  // what gather_ops needs
  const std::byte* src;
  std::uint64_t slot_offset;
  std::uint64_t bytes;
};

struct Pipeline {
  std::size_t n, bs, chunk, piece, slots, streams;
  bool dma = true, gather = true;
  gfd::detail::StoreKind kind;
  gfd::detail::Prefetch prefetch;
  std::byte* staging = nullptr;
  std::byte* dst = nullptr;
  std::vector<Op> ops;  // block i -> chunk i / per_chunk, offset within the slot
  std::size_t per_chunk = 0, per_piece = 0, nchunks = 0, npieces = 0;
  std::vector<cudaStream_t> lanes;
  std::vector<cudaEvent_t> slot_done;
  std::unique_ptr<std::atomic<std::uint32_t>[]> chunk_left;  // pieces not yet copied
  std::unique_ptr<std::atomic<bool>[]> chunk_open;
  std::atomic<std::uint64_t> next_piece{0};
  std::atomic<std::uint64_t> generation{0};
  std::atomic<int> idle{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;

  void worker(int cpu) {
    gfd::detail::pin_current_thread({cpu});
    std::uint64_t seen = 0;
    for (;;) {
      while (generation.load(std::memory_order_acquire) == seen &&
             !stop.load(std::memory_order_relaxed)) {
      }
      if (stop.load()) return;
      seen = generation.load(std::memory_order_acquire);
      for (;;) {
        const std::uint64_t p = next_piece.fetch_add(1, std::memory_order_acq_rel);
        if (p >= npieces) break;
        const std::size_t c = p * per_piece / per_chunk;
        while (!chunk_open[c].load(std::memory_order_acquire)) {
        }
        const std::size_t b = p * per_piece, e = std::min(n, b + per_piece);
        gfd::detail::gather_ops(ops.data() + b, e - b, staging + (c % slots) * chunk, kind,
                                prefetch);
        chunk_left[c].fetch_sub(1, std::memory_order_acq_rel);
      }
      idle.fetch_add(1, std::memory_order_acq_rel);
    }
  }

  // One transfer of the blocks in `ops`; returns microseconds.
  double run() {
    per_chunk = chunk / bs;
    per_piece = std::max<std::size_t>(1, piece / bs);
    nchunks = (n + per_chunk - 1) / per_chunk;
    npieces = 0;
    for (std::size_t c = 0; c < nchunks; ++c) {
      const std::size_t blocks = std::min(per_chunk, n - c * per_chunk);
      const std::size_t pieces = (blocks + per_piece - 1) / per_piece;
      chunk_left[c].store(static_cast<std::uint32_t>(pieces));
      chunk_open[c].store(false);
      npieces += pieces;
    }
    // Pieces are numbered across chunks by block: per_chunk must be a multiple of per_piece.
    next_piece.store(gather ? 0 : npieces);
    idle.store(0);
    const auto t0 = Clock::now();
    generation.fetch_add(1, std::memory_order_acq_rel);
    std::size_t opened = 0, issued = 0;
    while (issued < nchunks) {
      // A slot opens once the chunk that used it last has been issued and its DMA is done.
      while (opened < nchunks &&
             (opened < slots || (opened - slots < issued &&
                                 cudaEventQuery(slot_done[opened % slots]) == cudaSuccess)))
        chunk_open[opened++].store(true, std::memory_order_release);
      if (issued < opened && (!gather || chunk_left[issued].load(std::memory_order_acquire) == 0)) {
        const std::size_t bytes = std::min(per_chunk, n - issued * per_chunk) * bs;
        cudaStream_t s = lanes[issued % streams];
        if (dma) {
          check(cudaMemcpyAsync(dst + issued * per_chunk * bs, staging + (issued % slots) * chunk,
                                bytes, cudaMemcpyHostToDevice, s),
                "cudaMemcpyAsync");
        }
        check(cudaEventRecord(slot_done[issued % slots], s), "cudaEventRecord");
        ++issued;
      }
    }
    for (cudaStream_t s : lanes) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    while (idle.load(std::memory_order_acquire) < static_cast<int>(threads.size())) {
    }
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
};

int run_main(int argc, char** argv) {
  Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("ref_pipeline", flags, kFlags)) return 0;
  const std::vector<int> cpus = gfd::detail::allowed_cpus();
  Pipeline p;
  p.n = static_cast<std::size_t>(flags.get_int("blocks", 2048));
  p.bs = gfd::bench::parse_size(flags.get("block-size", "4K"));
  p.chunk = gfd::bench::parse_size(flags.get("chunk", "1M"));
  p.piece = gfd::bench::parse_size(flags.get("piece", "32K"));
  p.slots = static_cast<std::size_t>(flags.get_int("slots", 8));
  p.streams = static_cast<std::size_t>(flags.get_int("streams", 2));
  const int threads =
      static_cast<int>(flags.get_int("threads", static_cast<long long>(cpus.size()) - 1));
  const std::string writes = flags.get("writes", "streaming");
  const int iters = static_cast<int>(flags.get_int("iters", 30));
  const bool warm = flags.has("warm");
  gfd::StagingWrites w = gfd::StagingWrites::kStreaming;
  if (writes == "cldemote")
    w = gfd::StagingWrites::kCldemote;
  else if (writes == "plain")
    w = gfd::StagingWrites::kPlain;
  else if (writes != "streaming")
    throw std::invalid_argument("--writes: cldemote, streaming or plain");
  p.kind = gfd::detail::resolve_staging_writes(w);
  const std::string prefetch = flags.get("prefetch", "l2");
  using Level = gfd::detail::Prefetch::Level;
  if (prefetch == "l1")
    p.prefetch.level = Level::kL1;
  else if (prefetch == "nta")
    p.prefetch.level = Level::kNonTemporal;
  else if (prefetch == "none")
    p.prefetch.bytes = 0;
  else if (prefetch != "l2")
    throw std::invalid_argument("--prefetch: l2, l1, nta or none");
  p.prefetch.ahead = static_cast<std::size_t>(flags.get_int("ahead", 2));
  p.prefetch.window = gfd::bench::parse_size(flags.get("window", "8K"));
  if (p.bs == 0 || p.chunk % p.bs != 0 || p.chunk < p.bs ||
      (p.chunk / p.bs) % std::max<std::size_t>(1, p.piece / p.bs) != 0)
    throw std::invalid_argument("--chunk must be a multiple of --piece and of --block-size");
  if (p.slots < 2 || p.streams < 1 || threads < 1 || threads >= static_cast<int>(cpus.size()) ||
      iters < 1)
    throw std::invalid_argument(
        "--slots >= 2, --streams >= 1, 1 <= --threads < allowed CPUs, --iters >= 1");

  const std::size_t bytes = p.n * p.bs;
  const std::size_t pool_bytes = flags.has("pool-bytes")
                                     ? gfd::bench::parse_size(flags.get("pool-bytes"))
                                     : std::max(8 * gfd::bench::l3_bytes(), 4 * bytes);
  check(cudaSetDevice(0), "cudaSetDevice");
  std::byte* pool = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&pool), pool_bytes, cudaHostAllocDefault),
        "cudaHostAlloc pool");
  {  // random bytes, written by several threads
    std::vector<std::thread> fill;
    const std::size_t share = pool_bytes / 8 / 8 * 8;
    for (int t = 0; t < 8; ++t)
      fill.emplace_back([&, t] {
        auto* w64 = reinterpret_cast<std::uint64_t*>(pool + t * share);
        std::uint64_t x = 0x9E3779B97F4A7C15ull * (t + 1);
        const std::size_t words = (t == 7 ? pool_bytes - 7 * share : share) / 8;
        for (std::size_t i = 0; i < words; ++i) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          w64[i] = x;
        }
      });
    for (auto& t : fill) t.join();
  }
  check(
      cudaHostAlloc(reinterpret_cast<void**>(&p.staging), p.slots * p.chunk, cudaHostAllocDefault),
      "cudaHostAlloc staging");
  std::memset(p.staging, 0, p.slots * p.chunk);
  check(cudaMalloc(reinterpret_cast<void**>(&p.dst), bytes), "cudaMalloc");
  std::byte* ref_src = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&ref_src), bytes, cudaHostAllocDefault),
        "cudaHostAlloc reference");
  std::memset(ref_src, 1, bytes);
  p.lanes.resize(p.streams);
  for (auto& s : p.lanes)
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  p.slot_done.resize(p.slots);
  for (auto& e : p.slot_done)
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  const std::size_t max_chunks = (p.n + p.chunk / p.bs - 1) / (p.chunk / p.bs);
  p.chunk_left = std::make_unique<std::atomic<std::uint32_t>[]>(max_chunks);
  p.chunk_open = std::make_unique<std::atomic<bool>[]>(max_chunks);
  p.ops.resize(p.n);
  // The timing thread keeps the first CPU; the gather threads take the next ones.
  gfd::detail::pin_current_thread({cpus[0]});
  for (int t = 0; t < threads; ++t)
    p.threads.emplace_back([&p, cpu = cpus[1 + t]] { p.worker(cpu); });

  gfd::bench::SourcePicker picker(pool_bytes, p.bs, 0xC0FFEE);
  auto refill = [&] {
    const std::vector<std::size_t> src = picker.pick(p.n);
    const std::size_t per_chunk = p.chunk / p.bs;
    for (std::size_t i = 0; i < p.n; ++i) p.ops[i] = {pool + src[i], (i % per_chunk) * p.bs, p.bs};
  };
  auto measure = [&](bool gather, bool dma) {
    p.gather = gather;
    p.dma = dma;
    std::vector<double> us;
    for (int i = 0; i < 5 + iters; ++i) {
      if (!warm || i == 0) refill();
      const double t = p.run();
      if (i >= 5) us.push_back(t);
    }
    return gfd::bench::percentiles(us);
  };
  const double ref = gfd::micro::contiguous_dma_gbps(p.dst, ref_src, bytes, p.lanes[0], iters);
  const auto full = measure(true, true);
  // Verify the last transfer.
  std::vector<std::byte> back(bytes);
  check(cudaMemcpy(back.data(), p.dst, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  std::size_t bad = 0;
  for (std::size_t i = 0; i < p.n; ++i)
    bad += std::memcmp(back.data() + i * p.bs, p.ops[i].src, p.bs) != 0;
  const auto gather_only = measure(true, false);
  const auto dma_only = measure(false, true);
  auto gbps = [&](double us) { return bytes / (us * 1e3); };
  std::printf(
      "ref_pipeline: %zu x %zu %s, %d threads, chunk %zu, piece %zu, %zu slots, %zu streams, "
      "writes %s, "
      "prefetch %s x %zu (window %zu), pool %.1f GB\n",
      p.n, p.bs, warm ? "warm" : "cold", threads, p.chunk, p.piece, p.slots, p.streams,
      gfd::to_string(gfd::detail::to_public(p.kind)), prefetch.c_str(), p.prefetch.ahead,
      p.prefetch.window, pool_bytes * 1e-9);
  std::printf(
      "contiguous DMA %.2f GB/s | pipeline p50 %.1f us %.2f GB/s ratio %.1f%% | gather only %.2f "
      "GB/s | "
      "DMA only (slot chunks) %.2f GB/s | verified %s\n",
      ref, full.p50, gbps(full.p50), 100 * gbps(full.p50) / ref, gbps(gather_only.p50),
      gbps(dma_only.p50), bad == 0 ? "yes" : "NO");
  p.stop.store(true);
  p.generation.fetch_add(1);
  for (auto& t : p.threads) t.join();
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("ref_pipeline", [&] { return run_main(argc, argv); });
}
