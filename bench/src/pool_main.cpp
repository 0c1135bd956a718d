#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "layouts.hpp"
#include "pool_bench.hpp"
#include "pool_flags.hpp"
#include "pool_report.hpp"

namespace gfd::bench {
namespace pool {
namespace {

using Clock = std::chrono::steady_clock;

// One run of the pool benchmark: its grid, engines and buffers, set up in the order of the
// functions below and released by the destructor.
class Run {
 public:
  explicit Run(PoolOptions o) : o_(std::move(o)) {
    b_.iters = o_.iters;
    b_.warmup = o_.warmup;
    b_.warm = o_.warm;
    b_.trace = o_.trace;
    b_.strided = o_.strided;
    b_.pitch = o_.pitch;
    b_.batch = o_.batch;
    b_.to_host = o_.to_host;
    for (const Case& c : o_.cases) grid_.push_back({c.blocks, c.block_size});
  }
  ~Run() { release(); }

  int run() {
    open_device();
    size_pool();
    make_engines();
    print_setup();
    allocate();
    if (o_.host_load_probe) {
      if (b_.host_only) throw std::invalid_argument("--host-load-probe needs a GPU");
      host_load_probe(b_, std::min<std::size_t>(b_.max_bytes, std::size_t{8} << 20));
      return 0;
    }
    make_stage_only();
    if (!o_.load_modes.empty() && b_.to_host)
      std::printf(
          "--under-load measures host-to-device transfers only: skipped with --direction d2h.\n");
    for (PoolKind kind : o_.pools) sweep_pool(kind);
    report();
    if (b_.failures != 0) {
      std::fprintf(stderr, "%d measurement(s) failed verification\n", b_.failures);
      return 2;
    }
    return 0;
  }

 private:
  std::size_t largest_transfer() const {
    std::size_t m = 0;
    for (auto [n, s] : grid_) m = std::max(m, n * s);
    return m;
  }

  void open_device() {
    if (testkit::cuda_device_count() == 0) {
      b_.host_only = true;
      std::printf(
          "No CUDA GPU is visible here: measuring the host side only (gather threads into the\n"
          "real staging ring; the emulated device's 'DMA' is a host memcpy). These figures are\n"
          "labelled host-only and say nothing about PCIe; only the gather backend is run.\n");
      b_.dev = testkit::Device::emulated(0);
      o_.backends = {Backend::kGather};
      if (o_.under_load)
        std::printf(
            "--under-load needs a GPU (its load is compute kernels on the SMs): skipped.\n");
      o_.load_modes.clear();
    } else {
      b_.dev = testkit::Device::cuda(o_.device);
    }
    b_.dev.make_current();
    b_.stream = b_.dev.create_stream();
  }

  // The source pool: several times the L3 (cold sources) and the largest transfer, within RAM. A
  // host-only run (a CI box, a laptop) keeps it small. A transfer takes its blocks at a 2x
  // stride from half the pool at most, so grid points too large for the pool get fewer blocks.
  void size_pool() {
    const auto phys = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
    const std::size_t default_pool = std::max(8 * l3_bytes(), 32 * largest_transfer());
    if (o_.pool_bytes) {
      pool_bytes_ = std::min(*o_.pool_bytes, phys / 2);
      pool_rule_ = "--pool-bytes";
    } else if (b_.host_only) {
      pool_bytes_ = std::min({default_pool, phys / 8, std::size_t{1} << 30});
      pool_rule_ =
          "host-only: min(max(8 x L3, 32 x largest transfer) = " + format_size(default_pool) +
          ", RAM/8, 1G)";
    } else {
      pool_bytes_ = std::min(default_pool, phys / 2);
      pool_rule_ = "max(8 x L3, 32 x largest transfer), at most RAM/2";
    }
    pool_bytes_ =
        std::max(pool_bytes_ & ~((std::size_t{1} << 20) - 1), std::size_t{1} << 20);  // whole MiB
    for (auto& [n, s] : grid_) {
      const std::size_t fit = pool_bytes_ / (4 * s);
      if (n <= fit) continue;
      if (fit == 0)
        throw std::invalid_argument("source pool of " + format_size(pool_bytes_) +
                                    " cannot hold a block of " + format_size(s));
      std::printf("%zu x %s does not fit a %s source pool: %zu blocks instead\n", n,
                  format_size(s).c_str(), format_size(pool_bytes_).c_str(), fit);
      n = fit;
    }
    b_.max_bytes = largest_transfer();
  }

  void make_engines() {
    if (o_.pageable && std::erase(o_.backends, Backend::kZeroCopyKernel) > 0)
      std::printf("--pageable: zero_copy_kernel needs pinned host memory and is skipped.\n");
    for (Backend backend : o_.backends) {
      EngineOptions eo = EngineOptions::from_env();
      eo.device = b_.dev.ordinal();
      eo.backend = backend;
      engines_.push_back({backend, b_.dev.make_engine(eo)});
    }
    for (const BackendEngine& be : engines_)
      if (be.backend == Backend::kGather) gather_ = &be;
    if (gather_ == nullptr) return;
    const EngineStats st = gather_->engine.stats();
    const EngineOptions& o = gather_->engine.options();
    std::printf(
        "engine gather: %d gather threads on CPUs %s, NUMA node %d, ring %s in %s slots, hugepages "
        "%s, "
        "%d copy streams (+1 device to host), first chunk %s, pieces %s, staging writes %s, kernel "
        "for <= %s\n",
        st.gather_threads, testkit::format_cpulist(st.cpus).c_str(), st.numa_node,
        format_size(st.staging_bytes).c_str(), format_size(st.slot_bytes).c_str(),
        to_string(st.hugepages), o.copy_streams, format_size(o.first_chunk_bytes).c_str(),
        format_size(o.piece_bytes).c_str(), to_string(st.staging_writes),
        format_size(o.kernel_max_bytes).c_str());
  }

  void print_setup() const {
    std::printf("direction: %s, host blocks %s\n", b_.to_host ? "device to host" : "host to device",
                o_.pageable ? "pageable" : "pinned");
    std::string pool_kinds;
    for (PoolKind k : o_.pools)
      pool_kinds += (pool_kinds.empty() ? "" : ",") + std::string(to_string(k));
    const std::string stride_text = b_.strided ? "blocks in a row at a pitch of " +
                                                     std::to_string(b_.pitch) +
                                                     " blocks (--layout strided)"
                                               : std::to_string(b_.pitch) + "x block stride";
    std::printf(
        "device: %s | sources: %s, pool %s%s, %s (%s; L3 %s), %s | %d timed reps after %d "
        "warm-up\n",
        b_.host_only ? "emulated (host-only)"
                     : ("CUDA " + std::to_string(b_.dev.ordinal())).c_str(),
        b_.warm      ? "warm (same blocks every rep)"
        : b_.strided ? "cold (a fresh random start every rep)"
                     : "cold (fresh random blocks every rep)",
        pool_kinds.c_str(), o_.pools.size() > 1 ? " (the whole grid once per pool)" : "",
        format_size(pool_bytes_).c_str(), pool_rule_.c_str(), format_size(l3_bytes()).c_str(),
        stride_text.c_str(), b_.iters, b_.warmup);
  }

  // The reference's pinned source and the device area (twice the largest transfer: scattered
  // destinations).
  void allocate() {
    void* p = nullptr;
    if (posix_memalign(&p, 1 << 21, b_.max_bytes) != 0) throw std::bad_alloc();
    b_.ref_src = static_cast<std::byte*>(p);
    fill_random(b_.ref_src, b_.max_bytes);
    b_.dev.register_host(b_.ref_src, b_.max_bytes);
    b_.dst = static_cast<std::byte*>(b_.dev.alloc_device(2 * b_.max_bytes));
  }

  void release() noexcept {
    b_.stage.reset();  // its threads, before the buffer they write
    b_.stage_buffer.reset();
    b_.pool.reset();
    engines_.clear();
    try {
      if (b_.dst != nullptr) b_.dev.free_device(b_.dst);
      if (b_.ref_src != nullptr) b_.dev.unregister_host(b_.ref_src);
      if (b_.stream != nullptr) b_.dev.destroy_stream(b_.stream);
    } catch (...) {
    }
    free(b_.ref_src);
    b_.dst = nullptr;
    b_.ref_src = nullptr;
    b_.stream = nullptr;
  }

  void make_stage_only();
  bool staged(std::size_t n, std::size_t size) const;
  void sweep_pool(PoolKind kind);
  void measure_point(std::size_t n, std::size_t size, double ref_gbps);
  void measure_under_load(std::map<std::pair<std::size_t, std::size_t>, double>& ref_rates);
  void report();

  PoolOptions o_;
  PoolBench b_;
  std::vector<std::pair<std::size_t, std::size_t>> grid_;  // (blocks, block size)
  std::size_t pool_bytes_ = 0;
  std::string pool_rule_;
  std::vector<BackendEngine> engines_;
  const BackendEngine* gather_ = nullptr;
  std::vector<Row> rows_;
  std::size_t done_ = 0;
  Clock::time_point start_ = Clock::now();
};

// The gather-only (place-only to the host) threads: as many as copy in the engine
// (gather_threads, plus the submitting thread when submitter_gathers), pinned to the engine's
// gather CPUs, into a buffer the size of the engine's ring allocated as the ring is (HostPool:
// huge pages, the engine's NUMA node, registered).
void Run::make_stage_only() {
  if (gather_ == nullptr) return;
  const EngineStats st = gather_->engine.stats();
  b_.stage_buffer = std::make_unique<HostPool>(StageOnly::buffer_for(b_.dev, gather_->engine));
  const StageOnly::Config c = StageOnly::of_engine(gather_->engine, b_.to_host);
  b_.stage = std::make_unique<StageOnly>(c, b_.stage_buffer->data(), st.staging_bytes);
  std::printf(
      "%s-only: %d threads (%d pinned to the engine's gather CPUs %s%s), %s pieces in order (a "
      "32nd "
      "of %s for transfers of one chunk), staging writes %s, %s a %s buffer (hugepages %s, NUMA "
      "node %d), "
      "transfers up to %s by the calling thread alone; no engine, no DMA\n",
      b_.to_host ? "place" : "gather", b_.stage->threads(), c.workers,
      c.cpus.empty() ? "(none reported: unpinned)" : testkit::format_cpulist(c.cpus).c_str(),
      c.caller_copies ? ", + the calling thread, unpinned, as the submitting thread" : "",
      format_size(c.piece_bytes).c_str(), format_size(c.first_chunk_bytes).c_str(),
      to_string(c.writes), b_.to_host ? "from" : "into", format_size(st.staging_bytes).c_str(),
      to_string(b_.stage_buffer->hugepages()), b_.stage_buffer->numa_node(),
      format_size(c.inline_bytes).c_str());
}

// Whether a transfer of n blocks of `size` is staged at all: blocks of direct_min_bytes and up
// from pinned memory go to the copy engine directly, and small pinned transfers to the kernel
// when kernel_max_bytes says so; neither has a gather side to compare with.
bool Run::staged(std::size_t n, std::size_t size) const {
  const EngineOptions& o = gather_->engine.options();
  const std::size_t min = b_.to_host ? o.direct_min_bytes_to_host : o.direct_min_bytes;
  const bool direct = !o_.pageable && min != 0 && size >= min;
  const bool kernel = !o_.pageable && n * size <= o.kernel_max_bytes;
  return !direct && !kernel;
}

void Run::sweep_pool(PoolKind kind) {
  b_.pool.reset();  // the last pool goes before the next is made: each may take half the RAM
  b_.pool = std::make_unique<SourcePool>(kind, pool_bytes_, b_.dev, !o_.pageable);
  b_.pool_name = to_string(kind);
  std::printf("pool %s: %s, %s\n", b_.pool_name.c_str(), format_size(pool_bytes_).c_str(),
              b_.pool->description().c_str());
  std::map<std::pair<std::size_t, std::size_t>, double> ref_rates;
  for (auto [n, size] : grid_) {
    const double ref_gbps = gbps(n * size, b_.reference(n * size).p50);
    ref_rates[{n, size}] = ref_gbps;
    measure_point(n, size, ref_gbps);
  }
  if (!o_.load_modes.empty() && !b_.to_host) measure_under_load(ref_rates);
}

// Every backend on one point, each destination layout; then the gather-only rate beside gather.
void Run::measure_point(std::size_t n, std::size_t size, double ref_gbps) {
  std::vector<std::string> dst_modes;
  if (o_.dst != "scattered") dst_modes.push_back("contiguous");
  if (o_.dst != "contiguous") dst_modes.push_back("scattered");
  const std::size_t total = o_.pools.size() * grid_.size() * dst_modes.size() * engines_.size();
  const std::size_t first_row = rows_.size();
  for (const std::string& mode : dst_modes)
    for (BackendEngine& be : engines_) {
      ++done_;
      Row r = b_.measure(be, n, size, mode, ref_gbps);
      std::fprintf(
          stderr, "[%zu/%zu %5.1fs] %5zu x %-4s %-10s %-16s %8.2f GB/s (%5.1f%% of %.2f)%s%s\n",
          done_, total, since_us(start_) * 1e-6, n, format_size(size).c_str(), mode.c_str(),
          r.backend.c_str(), r.p50_gbps(), 100 * r.p50_gbps() / ref_gbps, ref_gbps,
          r.verified ? "" : " VERIFY FAILED", b_.host_only ? " [host-only]" : "");
      rows_.push_back(r);
    }
  if (gather_ == nullptr || !staged(n, size)) return;
  bool ok = false;
  const double g = b_.stage_only_gbps(n, size, ok);
  for (std::size_t i = first_row; i < rows_.size(); ++i)
    if (rows_[i].backend == to_string(Backend::kGather)) rows_[i].stage_gbps = g;
  std::fprintf(stderr, "[%5.1fs] %5zu x %-4s %s-only %8.2f GB/s (%d threads)%s\n",
               since_us(start_) * 1e-6, n, format_size(size).c_str(),
               b_.to_host ? "place" : "gather", g, b_.stage->threads(), ok ? "" : " VERIFY FAILED");
}

// Under load: one point, each backend against the same backend idle (single transfers: from
// the grid's row of this pool, or measured now, once: a row of its own unless the grid's rows
// are batched).
void Run::measure_under_load(std::map<std::pair<std::size_t, std::size_t>, double>& ref_rates) {
  const auto [n, size] = o_.cases_from_flags ? grid_.front()
                                             : std::pair<std::size_t, std::size_t>{
                                                   kLoadCase.blocks, kLoadCase.block_size};
  if (!ref_rates.count({n, size}))
    ref_rates[{n, size}] = gbps(n * size, b_.reference(n * size).p50);
  const double ref = ref_rates[{n, size}];
  std::map<Backend, double> idle_rates;
  auto idle = [&, n = n, size = size](BackendEngine& be) {
    if (idle_rates.count(be.backend)) return idle_rates[be.backend];
    if (b_.batch == 1)
      for (const Row& r : rows_)
        if (r.pool == b_.pool_name && r.load == "none" && r.dst == "contiguous" && r.n == n &&
            r.size == size && r.backend == to_string(be.backend))
          return idle_rates[be.backend] = r.p50_gbps();
    const std::size_t batch = b_.batch;
    b_.batch = 1;
    const Row r = b_.measure(be, n, size, "contiguous", ref);
    b_.batch = batch;
    if (batch == 1) rows_.push_back(r);
    return idle_rates[be.backend] = r.p50_gbps();
  };
  for (Row& r : under_load(b_, engines_, n, size, ref, o_.load_modes, idle)) rows_.push_back(r);
}

void Run::report() {
  if (b_.stage && !b_.stage->pinned())
    std::printf(
        "note: the %s-only threads could not be pinned to the engine's gather CPUs; they ran "
        "unpinned\n",
        b_.to_host ? "place" : "gather");
  if (b_.batch > 1)
    std::printf("\n(%zu transfers back to back per repetition; times are per transfer)", b_.batch);
  print_rows(rows_, b_.to_host, b_.host_only);
  print_latency(rows_, b_.host_only);
  if (gather_ != nullptr) {
    const EngineStats st = gather_->engine.stats();
    std::printf(
        "\nengine gather: %llu transfers, %llu chunks (%llu scattered), gather %.3f s CPU, "
        "planning %.3f s, submit waited %.3f s%s\n",
        (unsigned long long)st.transfers, (unsigned long long)st.chunks,
        (unsigned long long)testkit::tuning_stats(gather_->engine).scattered_chunks,
        st.gather_seconds, st.plan_seconds, st.submit_wait_seconds,
        b_.host_only ? " [host-only]" : "");
  }
  const RunLabel label{
      std::string(b_.host_only ? "host-only" : "gpu") + (o_.pageable ? "-pageable" : ""),
      b_.to_host ? "d2h" : "h2d", b_.warm ? "warm" : "cold", b_.strided ? "strided" : "pool",
      b_.pitch};
  if (!o_.csv.empty()) write_csv(o_.csv, rows_, label);
  if (!o_.json.empty()) write_json(o_.json, rows_, label);
}

}  // namespace
}  // namespace pool

int run_pool_benchmark(int argc, char** argv, const std::string& layout) {
  std::optional<pool::PoolOptions> o = pool::parse_pool_flags(argc, argv, layout);
  if (!o) return 0;
  pool::Run run(std::move(*o));
  return run.run();
}

}  // namespace gfd::bench
