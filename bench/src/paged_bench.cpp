#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>

#include "bench_cuda.hpp"
#include "layouts.hpp"
#include "paged_flags.hpp"
#include "paged_report.hpp"
#include "paged_runner.hpp"
#include "peer_kernels.cuh"

namespace gfd::bench {
namespace paged {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kMiB2 = std::size_t{2} << 20;
// Under the load each method (and the DMA, the floor) runs for at least this much of matmuls.
constexpr double kWindowMs = 250;

// The memory of a run: the grid points after the caps, one host and one device cache's bytes,
// the reference buffer's, and the longest descriptor list.
struct Plan {
  std::vector<Config> grid;
  std::size_t host_cache = 0, device_cache = 0, ref_bytes = 0, entries = 0, largest = 0;
};

std::size_t physical_memory() {
  return static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
}

// The host caches share --host-cache-bytes (far above the L3: cold sources), each a whole number
// of 2 MiB and at least the largest block.
std::size_t host_cache_bytes(const PagedOptions& o, bool host_only, std::size_t largest) {
  std::size_t total =
      o.host_cache_bytes.value_or(host_only ? std::size_t{256} << 20 : std::size_t{4} << 30);
  if (total > physical_memory() / 2) {
    std::printf("--host-cache-bytes %s is more than half the RAM: %s instead\n",
                format_size(total).c_str(), format_size(physical_memory() / 2).c_str());
    total = physical_memory() / 2;
  }
  return std::max(total / o.tensors / kMiB2 * kMiB2, (largest + kMiB2 - 1) / kMiB2 * kMiB2);
}

// The cap on device memory: --device-cache-bytes and 70% of the free memory. Host-only the
// device caches are host memory too, and the checks poison all of it.
std::size_t device_cap(const PagedOptions& o, bool host_only) {
  std::size_t cap =
      o.device_cache_bytes.value_or(host_only ? std::size_t{1} << 30 : std::size_t{40} << 30);
  if (host_only) return cap;
  std::size_t free_b = 0, total_b = 0;
  GFD_BENCH_CUDA(cudaMemGetInfo(&free_b, &total_b));
  if (cap > free_b / 10 * 7) {
    std::printf("device memory: %s free; caches capped at 70%% of it\n",
                format_size(free_b).c_str());
    cap = free_b / 10 * 7;
  }
  return cap;
}

// The cases as grid points: one transfer is at most --max-transfer and a quarter of a host
// cache's blocks (so that fresh ids are drawn from many more than they take).
void fit_cases(const PagedOptions& o, bool host_only, Plan& p) {
  const std::size_t max_transfer =
      o.max_transfer.value_or(host_only ? std::size_t{64} << 20 : std::size_t{1} << 30);
  for (const Case& k : o.cases) {
    const std::size_t s = k.block_size, n = k.blocks;
    Config c{.size = s,
             .n = 0,
             .requested = n,
             .host_blocks = p.host_cache / s,
             .gpu_blocks = 0,
             .under_load = k.under_load};
    c.n = std::min({n, max_transfer / (o.tensors * s), c.host_blocks / 4});
    if (c.n == 0) {
      std::printf(
          "%zu x %s x %zu caches: skipped (a transfer would pass --max-transfer %s or a "
          "quarter of a host cache)\n",
          n, format_size(s).c_str(), o.tensors, format_size(max_transfer).c_str());
      continue;
    }
    if (c.n < n)
      std::printf(
          "%zu x %s x %zu caches: %zu blocks instead (at most --max-transfer %s and a "
          "quarter of a host cache's %zu blocks)\n",
          n, format_size(s).c_str(), o.tensors, c.n, format_size(max_transfer).c_str(),
          c.host_blocks);
    bool seen = false;
    for (const Config& g : p.grid) seen = seen || (g.size == c.size && g.n == c.n);
    if (seen) continue;  // capped onto an earlier point
    p.grid.push_back(c);
    p.ref_bytes = std::max(p.ref_bytes, c.n * o.tensors * s);
    p.device_cache = std::max(p.device_cache, std::max<std::size_t>(4 * c.n, 1024) * s);
  }
  if (p.grid.empty()) throw std::invalid_argument("no grid point fits");
}

// A device cache: 4 times the blocks of a transfer and at least 1024 blocks (ids drawn from
// many), within the cap with the reference buffer and the descriptor lists.
void fit_device_caches(const PagedOptions& o, bool host_only, Plan& p) {
  for (const Config& c : p.grid) p.entries = std::max(p.entries, c.n * o.tensors);
  const std::size_t cap = device_cap(o, host_only);
  const std::size_t fixed = p.ref_bytes + p.entries * sizeof(PatternCheck);
  if (cap <= fixed + o.tensors * p.largest)
    throw std::invalid_argument("--device-cache-bytes " + format_size(cap) + " cannot hold " +
                                std::to_string(o.tensors) + " device caches of " +
                                format_size(p.largest) + " blocks and a reference buffer of " +
                                format_size(p.ref_bytes));
  p.device_cache = std::min(p.device_cache, (cap - fixed) / o.tensors) / p.largest * p.largest;
  for (Config& c : p.grid) {
    c.gpu_blocks = p.device_cache / c.size;
    if (c.gpu_blocks < 2 * c.n) {
      std::printf("%zu x %s: %zu blocks instead (half of a device cache's %zu blocks)\n", c.n,
                  format_size(c.size).c_str(), c.gpu_blocks / 2, c.gpu_blocks);
      c.n = c.gpu_blocks / 2;
    }
  }
  std::erase_if(p.grid, [](const Config& c) { return c.n == 0; });
  if (p.grid.empty()) throw std::invalid_argument("no grid point fits the device caches");
}

Plan plan(const PagedOptions& o, bool host_only) {
  Plan p;
  for (const Case& k : o.cases) p.largest = std::max(p.largest, k.block_size);
  p.host_cache = host_cache_bytes(o, host_only, p.largest);
  fit_cases(o, host_only, p);
  fit_device_caches(o, host_only, p);
  return p;
}

// The device: the GPU, or without one the emulated device, on which gfd alone runs.
void open_device(PagedRunner& b, PagedOptions& o) {
  if (testkit::cuda_device_count() == 0) {
    b.host_only = true;
    std::printf(
        "No CUDA GPU is visible here: host-only. Only gfd (and gather_only where named) runs, "
        "on the emulated device (its device caches are host memory and its 'DMA' a host "
        "memcpy); the CUDA peers are skipped and the figures say nothing about PCIe.\n");
    b.dev = testkit::Device::emulated(0);
    auto named = [&o](Method m) {
      return std::find(o.methods.begin(), o.methods.end(), m) != o.methods.end();
    };
    if (named(Method::kPlaceOnly))
      std::printf("place_only: gfd's placing kernel needs a GPU: skipped\n");
    const bool gather_only = named(Method::kGatherOnly);
    o.methods = {Method::kGfd};
    if (gather_only) o.methods.push_back(Method::kGatherOnly);
    if (o.under_load) std::printf("--under-load needs a GPU (cuBLAS matmuls): skipped.\n");
  } else {
    b.dev = testkit::Device::cuda(o.device);
  }
  b.dev.make_current();
}

// The caches, the transfers' stream and the descriptor lists' buffers.
void allocate(PagedRunner& b, const Plan& p) {
  b.caches = std::make_unique<Caches>(b.dev, b.tensors, p.host_cache, p.device_cache, p.ref_bytes);
  if (b.host_only) {
    b.stream = b.dev.create_stream();
  } else {
    // The transfers' stream at the default priority (a runtime's current stream), which is also
    // the load's: equal priority.
    int least = 0, greatest = 0;
    GFD_BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    b.stream_priority = least;
    GFD_BENCH_CUDA(cudaStreamCreateWithPriority(&b.stream, cudaStreamNonBlocking, least));
    GFD_BENCH_CUDA(preload_peer_kernels());
    testkit::preload_uva_copy(b.dev);
  }
  b.make_scratch(p.entries);
}

// The engines of gfd's methods; returns the methods that will run (gfd_zero_copy goes where its
// engine is refused). The GFD_* variables apply (A/B runs of engine settings).
std::vector<Method> make_engines(PagedRunner& b, const std::vector<Method>& methods) {
  std::vector<Method> run;
  for (Method m : methods) {
    // gfd's engine; a stage alone takes its settings from it, made for it where gfd itself is
    // not measured.
    if ((m == Method::kGfd || is_stage(m)) && !b.gfd) {
      b.gfd.emplace(b.dev.make_engine(EngineOptions::from_env()));
    } else if (m == Method::kGfdZeroCopy) {
      EngineOptions o = EngineOptions::from_env();
      o.backend = Backend::kZeroCopyKernel;
      try {
        b.zero_copy.emplace(b.dev.make_engine(o));
      } catch (const gfd::Error& e) {
        std::printf("gfd_zero_copy: the engine was refused (%s): skipped\n", e.what());
        continue;
      }
    }
    run.push_back(m);
  }
  return run;
}

void print_engine(PagedRunner& b) {
  if (!b.gfd) return;
  const EngineStats st = b.gfd->stats();
  std::string from = "default options";  // or the GFD_* variables that changed them
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "GFD_", 4) == 0)
      from += std::string(from == "default options" ? " but " : " ") + *e;
  std::printf(
      "engine gfd (gather, %s): %d gather threads on CPUs %s, NUMA node %d, "
      "ring %s in %s slots, hugepages %s\n",
      from.c_str(), st.gather_threads, testkit::format_cpulist(st.cpus).c_str(), st.numa_node,
      format_size(st.staging_bytes).c_str(), format_size(st.slot_bytes).c_str(),
      to_string(st.hugepages));
}

void print_setup(const PagedRunner& b, const PagedOptions& o, const Plan& p) {
  std::printf(
      "device: %s | %d layers: %zu cache pairs | host caches %s each (%s, %s in all; L3 %s) "
      "| device caches %s each (%s in all) | reference %s pinned + %s device\n",
      b.host_only ? "emulated (host-only)" : ("CUDA " + std::to_string(b.dev.ordinal())).c_str(),
      o.layers, b.tensors, format_size(p.host_cache).c_str(),
      b.host_only ? "mmap registered with the emulated device" : "cudaHostAlloc",
      format_size(p.host_cache * b.tensors).c_str(), format_size(l3_bytes()).c_str(),
      format_size(p.device_cache).c_str(), format_size(p.device_cache * b.tensors).c_str(),
      format_size(p.ref_bytes).c_str(), format_size(p.ref_bytes).c_str());
  std::printf(
      "ids: %s | %d timed reps after %d warm-up | peers' descriptor lists built before the "
      "timer (gfd builds its list from the ids inside copy_blocks)\n",
      b.warm ? "warm (the same ids every rep)" : "cold (fresh random distinct ids every rep)",
      b.iters, b.warmup);
}

// Every method on every grid point, idle and (with a load) beside it: the rows, one line per
// measured point on stderr as it completes.
class Sweep {
 public:
  Sweep(PagedRunner& b, const Plan& p, std::vector<Method> methods, std::size_t directions)
      : b_(b),
        p_(p),
        methods_(std::move(methods)),
        total_(directions * p.grid.size() * (methods_.size() + 1)),
        start_(Clock::now()) {}

  std::vector<Row> rows;

  void direction(bool to_host) {
    if (to_host) b_.fill_device_caches();  // the loads' checks poisoned them
    for (const Config& c : p_.grid) idle(c, to_host);
    if (!b_.load) return;
    for (const Config& c : p_.grid)
      if (c.under_load) loaded(c, to_host);
  }

 private:
  void idle(const Config& c, bool to_host) {
    b_.register_caches(c);
    ++done_;
    Row ref = *run_one(Method::kDma, c, to_host, 0, nullptr, 0);
    note(ref);
    rows.push_back(ref);
    for (Method m : methods_) {
      ++done_;
      if (std::optional<Row> r = run_one(m, c, to_host, ref.p50_gbps(), nullptr, 0)) {
        note(*r);
        rows.push_back(*r);
      }
    }
  }

  // Under the load the ratio is to the DMA under the same load, and `kept` to the same method
  // idle.
  void loaded(const Config& c, bool to_host) {
    b_.register_caches(c);
    std::printf(
        "under load (decode, %s): %dx%dx%d bf16 matmuls back to back on a stream of the "
        "transfers' priority; each row's slowdown against the same matmuls alone %.0f ms before "
        "and after its transfers\n",
        to_host ? "d2h" : "h2d", DecodeLoad::kDim, DecodeLoad::kDim, DecodeLoad::kDim,
        PagedRunner::kAloneMs);
    std::vector<Method> all{Method::kDma};
    all.insert(all.end(), methods_.begin(), methods_.end());
    double ref_loaded = 0;
    for (Method m : all) {
      std::optional<Row> r = run_one(m, c, to_host, ref_loaded, b_.load.get(), kWindowMs);
      if (!r) continue;
      if (m == Method::kDma) ref_loaded = r->p50_gbps();
      for (const Row& idle : rows)
        if (idle.load == "none" && idle.direction == r->direction && idle.size == r->size &&
            idle.n == r->n && idle.method == r->method && idle.p50_gbps() > 0)
          r->kept = r->p50_gbps() / idle.p50_gbps();
      note(*r);
      rows.push_back(*r);
    }
  }

  // One method on one point, idle (no load) or under the load; gfd_zero_copy is skipped
  // where its engine refuses the direction. A peer's failed call (a batch too large, say) is
  // reported and the rest of the grid still runs; the contiguous DMA's ends the run.
  std::optional<Row> run_one(Method m, const Config& c, bool to_host, double ref_gbps,
                             DecodeLoad* load, double min_ms) {
    if (m == Method::kGfdZeroCopy && to_host && !zero_copy_d2h_) return std::nullopt;
    const char* dir = to_host ? "d2h" : "h2d";
    if (is_stage(m) && !b_.staged(c, to_host)) {
      if (load == nullptr)
        std::printf(
            "%s %s, %s blocks: gfd moves them straight by the copy engine (direct_min_bytes): "
            "no stage to measure\n",
            method_name(m), dir, format_size(c.size).c_str());
      return std::nullopt;
    }
    try {
      Row r = b_.measure(m, c, to_host, load, min_ms);
      r.ref_gbps = m == Method::kDma ? r.p50_gbps() : ref_gbps;
      return r;
    } catch (const gfd::Error& e) {
      b_.drain();
      if (m == Method::kGfdZeroCopy) {
        std::printf("gfd_zero_copy %s: %s: skipped%s\n", dir, e.what(),
                    to_host ? " (for every d2h point)" : "");
        if (to_host) zero_copy_d2h_ = false;
        return std::nullopt;
      }
      if (m == Method::kDma) throw;
      failed(m, c, dir, e.what());
    } catch (const std::exception& e) {
      if (m == Method::kDma) throw;
      b_.drain();
      failed(m, c, dir, e.what());
    }
    return std::nullopt;
  }

  void failed(Method m, const Config& c, const char* dir, const char* what) {
    ++b_.failures;
    std::fprintf(stderr, "FAILED: %s %s, %zu x %s: %s\n", dir, method_name(m), c.n,
                 format_size(c.size).c_str(), what);
  }

  void note(const Row& r) const {
    std::fprintf(stderr,
                 "[%zu/%zu %6.1fs] %s %5zu x %-4s %-14s %-6s %9.2f GB/s (%5.1f%% of %.2f), "
                 "submit %.1f us%s%s\n",
                 done_, total_, since_us(start_) * 1e-6, r.direction.c_str(), r.n,
                 format_size(r.size).c_str(), r.method.c_str(), r.load.c_str(), r.p50_gbps(),
                 r.ref_gbps > 0 ? 100 * r.p50_gbps() / r.ref_gbps : 0, r.ref_gbps, r.submit_us,
                 r.verified == 0 ? " VERIFY FAILED" : "", b_.host_only ? " [host-only]" : "");
  }

  PagedRunner& b_;
  const Plan& p_;
  std::vector<Method> methods_;
  std::size_t total_, done_ = 0;
  Clock::time_point start_;
  bool zero_copy_d2h_ = true;
};

int run(PagedOptions& o) {
  PagedRunner b;
  b.iters = o.iters;
  b.warmup = o.warmup;
  b.warm = o.warm;
  b.trace = o.trace;
  b.tensors = o.tensors;
  open_device(b, o);
  const Plan p = plan(o, b.host_only);
  allocate(b, p);
  const std::vector<Method> methods = make_engines(b, o.methods);
  print_engine(b);
  if (o.under_load && !b.host_only)
    b.load = std::make_unique<DecodeLoad>(b.dev.ordinal(), b.stream_priority);
  print_setup(b, o, p);
  Sweep sweep(b, p, methods, o.to_host.size());
  std::printf(
      "filling the host caches, then measuring %zu points (one line each on stderr as it "
      "completes)%s\n",
      o.to_host.size() * p.grid.size() * (methods.size() + 1), b.host_only ? " [host-only]" : "");
  b.fill_host_caches();
  for (bool to_host : o.to_host) sweep.direction(to_host);

  const std::string label = b.host_only ? "host-only" : "gpu";
  print_table(sweep.rows,
              label + (b.load ? "; under load, ratio is to the DMA under the same load; kept = "
                                "P50 under load / idle P50, slowdown = the matmuls' mean time "
                                "during the transfers / alone just before and after - 1"
                              : ""));
  if (!o.csv.empty()) write_csv(o.csv, sweep.rows, label, b.warm, o.layers, b.tensors);
  if (b.failures != 0) {
    std::fprintf(stderr, "%d measurement(s) failed (verification, or an error above)\n",
                 b.failures);
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace paged

int run_paged_benchmark(int argc, char** argv) {
  std::optional<paged::PagedOptions> o = paged::parse_paged_flags(argc, argv);
  return o ? paged::run(*o) : 0;
}

}  // namespace gfd::bench
