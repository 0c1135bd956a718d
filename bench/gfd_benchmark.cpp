// gfd_benchmark: scattered host blocks -> GPU through every backend, each against the
// contiguous pinned DMA of the same bytes measured in the same run. Cold sources by default
// (fresh random blocks of a pool several times the L3 each repetition); --warm reuses the same
// blocks. Every byte is verified once per configuration and backend, outside the timed region.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"
#include "load_kernel.cuh"
#include "paged_bench.hpp"
#include "testkit/testkit.hpp"
#include "source_pool.hpp"
#include "stage_only.hpp"
#include "trace_report.hpp"

namespace {

using namespace gfd;
using namespace gfd::bench;
using Clock = std::chrono::steady_clock;

const std::map<std::string, std::string> kFlags = {
    {"blocks", "=N[,N...]    block counts (default sweep 16..16384 at 4K)"},
    {"block-sizes", "=S[,S...] block sizes, e.g. 512,4K,64K (default sweep 512..256K at N=2048)"},
    {"backends", "=B[,B...]  gather, batch_async, per_block, zero_copy_kernel (default all)"},
    {"iters", "=N           timed repetitions per configuration (default 30, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 5)"},
    {"warm", "              reuse the same source blocks every repetition (default: cold)"},
    {"dst", "=MODE          contiguous | scattered | both (default contiguous)"},
    {"device", "=N          CUDA device (default 0)"},
    {"pool-bytes", "=S      source pool size (default max(8 x L3, 32 x largest transfer), at most RAM/2;\n"
                   "                   host-only: also at most RAM/8 and 1G)"},
    {"csv", "=FILE          write results as CSV"},
    {"json", "=FILE         write results as JSON"},
    {"quick", "             a short grid: 2048 x 4K only"},
    {"batch", "=K           submit K transfers back to back per repetition, one sync (default 1)"},
    {"under-load", "[=M[,M...]] also measure each backend (2048 x 4K, or the first grid point) while compute\n"
                   "                   fills every SM; modes: high (one long kernel, transfers on a highest-priority\n"
                   "                   stream), equal (one long kernel, transfers on a stream of its priority, as a\n"
                   "                   runtime's current stream), short (short kernels back to back, equal priority);\n"
                   "                   all three when no mode is given"},
    {"pool", "=P[,P...]     source pool: cuda (cudaHostAlloc, default), gfd (gfd::HostPool: huge pages, the\n"
             "                   GPU's NUMA node, registered), mmap (mmap + cudaHostRegister), both (= cuda,gfd);\n"
             "                   several: the whole grid once per pool"},
    {"trace", "             print the timeline of the median transfer (gather pipeline, zero-copy kernel)"},
    {"host-load-probe", "   only measure the contiguous DMA while 0 to 15 threads copy host memory"},
    {"direction", "=D       h2d (host to device, default) or d2h (device to host); --dst then names the\n"
                  "                   device side's layout"},
    {"pageable", "          host blocks in pageable memory (not registered); zero_copy_kernel skipped"},
    {"layout", "=L          paged (default: a paged KV cache's 2L cache pairs, scattered both sides, gfd\n"
               "                   against the CUDA peers; --layout paged --help lists its flags), pool (this\n"
               "                   text: random blocks of one pool into one device buffer, every backend) or\n"
               "                   strided (the same, each transfer's blocks in a row at a pitch of --pitch\n"
               "                   blocks from a random start: constant-stride runs)"},
    {"pitch", "=K           blocks between the starts of two source blocks (default 2)"},
    {"help", "              this text"},
};

struct Row {
  std::size_t n = 0, size = 0;
  std::string dst, backend, load = "none", pool;
  Percentiles us;
  double ref_gbps = 0, cpu_s_per_gb = 0, submit_us = 0, slowdown = -1;
  double stage_gbps = -1;  // gather-only (place-only to the host) rate of the same run; -1: none
  double kept = -1;        // under load: P50 GB/s under load / the same backend's idle P50; -1: none
  int threads = 0;
  bool verified = false;
  double p50_gbps() const { return us.p50 > 0 ? n * size / (us.p50 * 1e3) : 0; }
  double p90_gbps() const { return us.p90 > 0 ? n * size / (us.p90 * 1e3) : 0; }  // slower tail
  // The pipeline against the slower of its two halves measured alone: -1 without a gather-only rate.
  double eff() const {
    const double bound = std::min(stage_gbps, ref_gbps);
    return stage_gbps > 0 && bound > 0 ? p50_gbps() / bound : -1;
  }
};

// The --under-load modes, in the order they run, and each one's `load` label in the rows ("sm"
// is the high-priority mode; bench/plot_results.py and bench/summarize.py read these labels).
struct LoadMode {
  const char* name;
  const char* label;
};
constexpr LoadMode kLoadModes[] = {{"high", "sm"}, {"equal", "sm-equal"}, {"short", "sm-short"}};

std::vector<LoadMode> load_modes_flag(const Flags& flags) {
  const std::string v = flags.get("under-load");
  if (v == "1" || v == "all") return {std::begin(kLoadModes), std::end(kLoadModes)};
  std::vector<LoadMode> out;
  for (const std::string& name : flags.get_list("under-load")) {
    const LoadMode* hit = nullptr;
    for (const LoadMode& m : kLoadModes)
      if (name == m.name) hit = &m;
    if (hit == nullptr)
      throw std::invalid_argument("--under-load=" + v + ": '" + name +
                                  "' is not a mode (high, equal, short, or a comma list of them; "
                                  "--under-load alone runs all three)");
    bool seen = false;
    for (const LoadMode& m : out) seen = seen || m.name == hit->name;
    if (!seen) out.push_back(*hit);
  }
  return out;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("under load: ") + what + ": " + cudaGetErrorString(e));
}

double gbps(std::size_t bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0; }
struct BackendEngine {
  Backend backend;
  Engine engine;
};

class Bench {
 public:
  testkit::Device dev;
  cudaStream_t stream = nullptr;
  bool host_only = false, warm = false, trace = false, to_host = false;
  // --layout strided: each transfer's blocks in a row at a pitch of `pitch` blocks (constant-
  // stride runs); otherwise random blocks at that pitch.
  bool strided = false;
  std::size_t pitch = 2;
  int iters = 30, warmup = 5;
  std::size_t batch = 1;
  std::unique_ptr<SourcePool> pool;
  std::unique_ptr<HostPool> stage_buffer;  // declared first: outlives the threads that write it
  std::unique_ptr<StageOnly> stage;  // the gather-only / place-only threads (with a gather engine)
  std::byte* ref_src = nullptr;
  std::byte* dst = nullptr;
  std::size_t max_bytes = 0;
  int failures = 0;
  std::string pool_name;  // the kind of `pool`, for the rows

  // One contiguous pinned cudaMemcpyAsync of `bytes`, timed like the backends (call to sync).
  Percentiles reference(std::size_t bytes) {
    std::vector<double> us;
    for (int i = 0; i < warmup + iters; ++i) {
      const auto t0 = Clock::now();
      if (to_host) dev.copy_d2h(ref_src, dst, bytes, stream);
      else dev.copy_h2d(dst, ref_src, bytes, stream);
      dev.stream_sync(stream);
      if (i >= warmup) us.push_back(since_us(t0));
    }
    return percentiles(us);
  }

  // Block lists of one configuration: fresh random sources each call unless warm.
  struct Blocks {
    SourcePicker picker;
    std::mt19937_64 rng;
    std::vector<std::size_t> dst_pages;
    std::vector<std::vector<BlockCopy>> sets;
  };
  Blocks make_blocks(std::size_t n, std::size_t size, std::size_t sets, std::uint64_t seed = 0xC0FFEE) {
    Blocks b{SourcePicker(pool->bytes(), size, seed + n * 31 + size, pitch, strided), std::mt19937_64(n ^ size),
             std::vector<std::size_t>(2 * n), std::vector<std::vector<BlockCopy>>(sets, std::vector<BlockCopy>(n))};
    std::iota(b.dst_pages.begin(), b.dst_pages.end(), 0);
    return b;
  }
  void refill(Blocks& b, std::size_t size, bool scattered) {
    for (auto& blocks : b.sets) {
      const auto src = b.picker.pick(blocks.size());
      if (scattered) std::shuffle(b.dst_pages.begin(), b.dst_pages.end(), b.rng);
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        std::byte* host = pool->data() + src[i];
        std::byte* device = dst + (scattered ? b.dst_pages[i] : i) * size;
        blocks[i] = to_host ? BlockCopy{device, host, size} : BlockCopy{host, device, size};
      }
    }
  }

  // One transfer in the configured direction; device-to-host handles are waited on by callers.
  Transfer submit(Engine& engine, const std::vector<BlockCopy>& blocks) {
    return to_host ? engine.copy_to_host(blocks, stream) : engine.copy_to_device(blocks, stream);
  }

  // Moves one fresh set and compares every byte: to the device, against the host blocks with the
  // device area cleared first; to the host, against the device area (given fresh bytes first).
  bool verify(Engine& engine, Blocks& b, std::size_t size, bool scattered) {
    const std::size_t span = 2 * b.sets[0].size() * size;
    if (to_host) dev.copy_h2d(dst, ref_src, std::min(span, max_bytes), stream);
    else dev.memset_async(dst, 0, span, stream);
    refill(b, size, scattered);
    const std::vector<BlockCopy>& blocks = b.sets[0];
    submit(engine, blocks).wait();
    std::vector<std::byte> back(span);
    dev.copy_d2h(back.data(), dst, span, stream);
    dev.stream_sync(stream);
    for (const BlockCopy& c : blocks) {
      const std::byte* device = static_cast<const std::byte*>(to_host ? c.src : c.dst);
      const void* host = to_host ? c.dst : c.src;
      if (std::memcmp(back.data() + (device - dst), host, size) != 0) return false;
    }
    return true;
  }

  // Times one backend on one configuration.
  Row measure(BackendEngine& be, std::size_t n, std::size_t size, const std::string& mode, double ref_gbps) {
    const bool scattered = mode == "scattered";
    Blocks b = make_blocks(n, size, batch);
    refill(b, size, scattered);
    std::vector<double> us, submit_us;
    double cpu0 = 0;
    for (int i = 0; i < warmup + iters; ++i) {
      if (!warm && i > 0) refill(b, size, scattered);
      if (i == warmup) {
        cpu0 = process_cpu_seconds();
        if (traced(be.backend)) testkit::start_trace(be.engine, 1 << 20);
      }
      const auto t0 = Clock::now();
      std::vector<Transfer> handles;
      for (const auto& set : b.sets) handles.push_back(submit(be.engine, set));
      const double sub = since_us(t0);
      // To the device the stream's completion means the data is there; to the host the handle's.
      for (Transfer& h : handles) h.wait();
      dev.stream_sync(stream);
      if (i >= warmup) {
        us.push_back(since_us(t0) / static_cast<double>(batch));
        submit_us.push_back(sub / static_cast<double>(batch));
      }
    }
    const double cpu = process_cpu_seconds() - cpu0;
    Row r;
    r.n = n;
    r.size = size;
    r.dst = mode;
    r.backend = to_string(be.backend);
    r.pool = pool_name;
    r.us = percentiles(us);
    r.ref_gbps = ref_gbps;
    r.submit_us = percentiles(submit_us).p50;
    r.threads = be.engine.stats().gather_threads;
    r.cpu_s_per_gb = cpu / (static_cast<double>(n * size) * batch * iters * 1e-9);
    if (traced(be.backend)) {
      const std::vector<testkit::TraceEvent> ev = testkit::take_trace(be.engine);
      if (batch == 1) print_trace(ev, us, n, size, mode, r.backend);
      else std::printf("trace: not with --batch (it needs one transfer per timed repetition)\n");
    }
    r.verified = verify(be.engine, b, size, scattered);
    if (!r.verified) {
      ++failures;
      std::fprintf(stderr, "VERIFY FAILED: %s, %zu x %zu (%s destinations): data on the GPU differs\n",
                   r.backend.c_str(), n, size, mode.c_str());
    }
    return r;
  }

  // The pipeline timeline of the median timed transfer: where the time goes.
  // --trace covers the backends whose engine records a timeline: the gather pipeline's stages, and
  // the zero-copy kernel's planning and launch.
  bool traced(Backend b) const { return trace && (b == Backend::kGather || b == Backend::kZeroCopyKernel); }

  // The gather-only (host to device) or place-only (device to host) rate of one configuration:
  // the stage-only threads copy the same kind of block lists (fresh blocks each repetition unless
  // warm, from the same pool with the same picker, another seed so that they are not the blocks
  // the pipeline just read) between the pool and the staging-sized buffer, timed call to
  // all-done, P50 over the same repetitions. Checks the bytes of the last repetition.
  double stage_only_gbps(std::size_t n, std::size_t size, bool& verified) {
    Blocks b = make_blocks(n, size, 1, 0x57A6E);
    refill(b, size, false);
    std::vector<double> us;
    for (int i = 0; i < warmup + iters; ++i) {
      if (!warm && i > 0) refill(b, size, false);
      const double t = stage->run(b.sets[0]);
      if (i >= warmup) us.push_back(t);
    }
    verified = stage->verify();
    if (!verified) {
      ++failures;
      std::fprintf(stderr, "VERIFY FAILED: %s-only, %zu x %zu: staged bytes differ\n", to_host ? "place" : "gather",
                   n, size);
    }
    return gbps(n * size, percentiles(us).p50);
  }

  // Each backend while compute keeps every SM busy, in each of `modes`: its rate, the rate kept
  // against the same backend idle (`idle_gbps`), and how much longer the compute takes than alone.
  //  - high: one long kernel (many waves of ~20 us thread blocks, ~0.4 s) on a lowest-priority
  //    stream, the transfers on the benchmark's highest-priority stream;
  //  - equal: the same kernel, the transfers on another stream of the kernel's own priority, as a
  //    runtime that copies on its current stream gets it;
  //  - short: short kernels back to back (2 waves of ~50 us blocks, ~0.1 ms each, ~0.4 s in all,
  //    captured in one CUDA graph), like a model's layers, the transfers at equal priority.
  // Each load runs up to 3 times per backend, until `iters` transfers started while it ran; only
  // those are counted (a transfer that cannot start before the load ends counts once, with all
  // of its wait).
  std::vector<Row> under_load(std::vector<BackendEngine>& engines, std::size_t n, std::size_t size,
                              double ref_gbps, int device, const std::vector<LoadMode>& modes,
                              const std::function<double(BackendEngine&)>& idle_gbps) {
    std::vector<Row> rows;
    const int sms = sm_count(device);
    if (sms <= 0) throw std::runtime_error("under load: cannot read the GPU's SM count");
    int least = 0, greatest = 0;
    cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    // The load's stream and the equal-priority transfer stream: both at the least priority, which
    // is also the default priority of streams created without one (torch's, say).
    cudaStream_t load_stream = nullptr, equal_stream = nullptr;
    cuda_ok(cudaStreamCreateWithPriority(&load_stream, cudaStreamNonBlocking, least), "load stream");
    cuda_ok(cudaStreamCreateWithPriority(&equal_stream, cudaStreamNonBlocking, least), "equal-priority stream");
    float* sink = static_cast<float*>(dev.alloc_device(sizeof(float) * kSinkFloats));
    cudaEvent_t a = nullptr, z = nullptr;
    cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&z), "cudaEventCreate");
    cudaGraphExec_t series = nullptr;
    auto cleanup = [&] {
      if (series != nullptr) cudaGraphExecDestroy(series);
      cudaEventDestroy(a);
      cudaEventDestroy(z);
      dev.free_device(sink);
      cudaStreamDestroy(load_stream);
      cudaStreamDestroy(equal_stream);
    };
    try {
      std::function<void()> launch;  // enqueues the current mode's load on load_stream
      auto run_load = [&] {
        cuda_ok(cudaEventRecord(a, load_stream), "cudaEventRecord");
        launch();
        cuda_ok(cudaEventRecord(z, load_stream), "cudaEventRecord");
      };
      auto elapsed_ms = [&] {
        cuda_ok(cudaEventSynchronize(z), "compute load");
        float ms = 0;
        cuda_ok(cudaEventElapsedTime(&ms, a, z), "cudaEventElapsedTime");
        return static_cast<double>(ms);
      };
      auto kernel = [&](std::uint32_t rounds, std::uint32_t waves) {
        launch = [&, rounds, waves] { cuda_ok(launch_fma_load(sink, rounds, waves, sms, load_stream), "load kernel launch"); };
      };
      // Calibrate: rounds for thread blocks of about 20 us. A wave's time is read off a kernel of
      // 10 waves, so that the launch overhead does not count as block time.
      std::uint32_t rounds = 1000;
      kernel(rounds, 1);  // a first launch loads the module
      run_load();
      elapsed_ms();
      kernel(rounds, 10);
      run_load();
      rounds = static_cast<std::uint32_t>(std::max(1.0, rounds * 0.020 / std::max(elapsed_ms() / 10, 1e-4)));
      kernel(rounds, 10);
      run_load();
      const double wave_ms = elapsed_ms() / 10;
      constexpr double kLoadMs = 400;

      for (const LoadMode& mode : modes) {
        const bool high = std::string(mode.name) == "high";
        const bool shorts = std::string(mode.name) == "short";
        cudaStream_t ts = high ? stream : equal_stream;
        std::string what;
        if (!shorts) {
          const auto waves = static_cast<std::uint32_t>(std::clamp(kLoadMs / std::max(wave_ms, 1e-3), 20.0, 1e6));
          kernel(rounds, waves);
          char buf[200];
          std::snprintf(buf, sizeof buf, "one kernel of %u waves of %.3f ms (%d SMs x 8 blocks of 256 threads each)",
                        waves, wave_ms, sms);
          what = buf;
        } else {
          // Blocks of ~50 us, two waves a kernel: ~0.1 ms kernels.
          const auto short_rounds = static_cast<std::uint32_t>(std::max(1.0, rounds * 2.5));
          kernel(short_rounds, 2);
          run_load();
          const double kernel_ms = elapsed_ms();
          const auto count = static_cast<std::uint32_t>(std::clamp(kLoadMs / std::max(kernel_ms, 1e-3), 50.0, 8000.0));
          if (series != nullptr) cudaGraphExecDestroy(series);
          series = nullptr;
          cuda_ok(make_fma_series(sink, short_rounds, 2, sms, count, load_stream, &series), "capturing the kernel series");
          launch = [&] { cuda_ok(cudaGraphLaunch(series, load_stream), "cudaGraphLaunch"); };
          char buf[200];
          std::snprintf(buf, sizeof buf, "%u kernels of %.3f ms back to back (2 waves of %d SMs x 8 blocks each, one CUDA graph)",
                        count, kernel_ms, sms);
          what = buf;
        }
        run_load();  // a first run uploads the graph and settles the clocks
        elapsed_ms();
        double alone_ms = 1e30;
        for (int i = 0; i < 2; ++i) {
          run_load();
          alone_ms = std::min(alone_ms, elapsed_ms());
        }
        std::printf("\nunder load (%s): %s, %.1f ms alone; transfers on %s\n", mode.name, what.c_str(), alone_ms,
                    high ? "the benchmark's highest-priority stream, the load on a lowest-priority one"
                         : "a stream of the load's own priority (the default priority)");
        for (BackendEngine& be : engines) {
          Blocks b = make_blocks(n, size, 1);
          refill(b, size, false);
          for (int i = 0; i < warmup; ++i) {
            const Transfer t = be.engine.copy_to_device(b.sets[0], ts);
            dev.stream_sync(ts);
            t.wait();
          }
          std::vector<double> us, loaded_ms;
          for (int round = 0; round < 3 && static_cast<int>(us.size()) < iters; ++round) {
            run_load();
            while (us.size() < 100000) {
              if (!warm) refill(b, size, false);
              const cudaError_t q = cudaEventQuery(z);
              if (q == cudaSuccess) break;
              if (q != cudaErrorNotReady) cuda_ok(q, "compute load");
              const auto t0 = Clock::now();
              const Transfer t = be.engine.copy_to_device(b.sets[0], ts);
              dev.stream_sync(ts);
              us.push_back(since_us(t0));
              t.wait();  // done with the stream; throws the transfer's error, if any
            }
            loaded_ms.push_back(elapsed_ms());
          }
          Row r;
          r.n = n;
          r.size = size;
          r.dst = "contiguous";
          r.backend = to_string(be.backend);
          r.load = mode.label;
          r.pool = pool_name;
          r.us = percentiles(us);
          r.ref_gbps = ref_gbps;
          r.threads = be.engine.stats().gather_threads;
          r.slowdown = percentiles(loaded_ms).p50 / alone_ms - 1;
          const double idle = idle_gbps(be);
          r.kept = idle > 0 ? r.p50_gbps() / idle : -1;
          r.verified = verify(be.engine, b, size, false);
          if (!r.verified) {
            ++failures;
            std::fprintf(stderr, "VERIFY FAILED under load (%s): %s\n", mode.name, r.backend.c_str());
          }
          std::fprintf(stderr,
                       "under load (%s): %-16s %8.2f GB/s over %zu transfers (%.0f%% of %.2f idle), compute %.1f ms "
                       "(%+.1f%%)\n",
                       mode.name, r.backend.c_str(), r.p50_gbps(), us.size(), 100 * r.kept, idle,
                       percentiles(loaded_ms).p50, 100 * r.slowdown);
          rows.push_back(r);
        }
      }
    } catch (...) {
      cudaDeviceSynchronize();  // nothing of the load may still run when its buffers go
      cleanup();
      throw;
    }
    cleanup();
    return rows;
  }
};

// How much of the host's memory bandwidth the copy engine keeps while CPU threads copy memory
// as the gather threads do: the contiguous pinned DMA of `bytes`, timed as the benchmark does,
// with T threads each copying between two private 64 MB buffers with streaming stores.
void host_load_probe(Bench& b, std::size_t bytes) {
  std::printf("\nhost-load probe: one contiguous pinned %s DMA (P50 of %d) while T threads copy host memory\n",
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
          for (std::size_t off = 0; off < kBuf && !stop.load(std::memory_order_relaxed); off += 1 << 20) {
            testkit::copy_like_staging(c.data() + off, a.data() + off, 1 << 20, StagingWrites::kStreaming);
            copied.fetch_add(1 << 20, std::memory_order_relaxed);
          }
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(t ? 200 : 0));  // buffers touched, threads running
    const std::uint64_t c0 = copied.load();
    const auto t0 = Clock::now();
    const Percentiles p = b.reference(bytes);
    const double secs = since_us(t0) * 1e-6;
    const double copy_gbps = (copied.load() - c0) / secs * 1e-9;
    stop = true;
    for (auto& th : threads) th.join();
    std::printf("%-8u %14.1f %14.1f %12.2f\n", t, copy_gbps, 2 * copy_gbps, gbps(bytes, p.p50));
  }
  std::printf("(copy_traffic = bytes read + bytes written by the threads; the staged path costs three bytes\n"
              " of host memory traffic per byte moved: gather read, staging write, DMA read)\n");
}

void print_rows(const std::vector<Row>& rows, bool to_host, bool host_only) {
  if (host_only)
    std::printf("\nhost-only figures (emulated device: its 'DMA' is a host memcpy; nothing here crosses "
                "PCIe or says how fast a GPU is):");
  // Scripts read these columns by position: new columns go at the end.
  std::printf("\n%-6s %-5s %-10s %-16s %-8s %9s %9s %9s %9s %9s %7s %7s %8s %8s %-8s %-5s %16s %7s %7s\n", "blocks",
              "size", "dst", "backend", "load", "p50_us", "p90_us", "p50_GB/s", "p90_GB/s", "ref_GB/s", "ratio", "thr",
              "cpu_s/GB", "slowdown", "verified", "pool", to_host ? "place_only_GB/s" : "gather_only_GB/s", "eff",
              "kept");
  for (const Row& r : rows) {
    char slow[16] = "-", stage[24] = "-", eff[16] = "-", kept[16] = "-";
    if (r.slowdown >= -0.5) std::snprintf(slow, sizeof slow, "%+.1f%%", 100 * r.slowdown);
    if (r.stage_gbps > 0) std::snprintf(stage, sizeof stage, "%.2f", r.stage_gbps);
    if (r.eff() >= 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * r.eff());
    if (r.kept >= 0) std::snprintf(kept, sizeof kept, "%.1f%%", 100 * r.kept);
    std::printf("%-6zu %-5s %-10s %-16s %-8s %9.1f %9.1f %9.2f %9.2f %9.2f %6.1f%% %7d %8.3f %8s %-8s %-5s %16s %7s %7s\n",
                r.n, format_size(r.size).c_str(), r.dst.c_str(), r.backend.c_str(), r.load.c_str(), r.us.p50, r.us.p90,
                r.p50_gbps(), r.p90_gbps(), r.ref_gbps, r.ref_gbps > 0 ? 100 * r.p50_gbps() / r.ref_gbps : 0,
                r.threads, r.cpu_s_per_gb, slow, r.verified ? "yes" : "NO", r.pool.c_str(), stage, eff, kept);
  }
}

void print_latency(const std::vector<Row>& rows, bool host_only) {
  bool any = false;
  for (const Row& r : rows) any = any || (r.size == 4096 && r.n <= 256 && r.load == "none");
  if (!any) return;
  std::printf("\nsmall-request latency (4 KB blocks, call to stream sync returning), us%s:\n",
              host_only ? ", host-only (emulated device, no PCIe)" : "");
  std::printf("%-16s %-10s %-5s %12s %12s %12s\n", "backend", "dst", "pool", "16 p50/p90", "64 p50/p90",
              "256 p50/p90");
  std::vector<std::string> pools;  // in the order they ran
  for (const Row& r : rows)
    if (std::find(pools.begin(), pools.end(), r.pool) == pools.end()) pools.push_back(r.pool);
  for (const std::string& pool : pools) {
    std::set<std::pair<std::string, std::string>> keys;
    for (const Row& r : rows)
      if (r.load == "none" && r.pool == pool) keys.insert({r.backend, r.dst});
    for (const auto& [backend, dst] : keys) {
      std::printf("%-16s %-10s %-5s", backend.c_str(), dst.c_str(), pool.c_str());
      for (std::size_t n : {16, 64, 256}) {
        const Row* hit = nullptr;
        for (const Row& r : rows)
          if (r.backend == backend && r.dst == dst && r.pool == pool && r.n == n && r.size == 4096 && r.load == "none")
            hit = &r;
        if (hit) std::printf(" %5.1f/%-6.1f", hit->us.p50, hit->us.p90);
        else std::printf(" %12s", "-");
      }
      std::printf("\n");
    }
  }
}

}  // namespace

int main(int argc, char** argv) try {
  // Line-buffered stdout: the notes and header lines reach a pipe in order with the progress
  // lines and the engines' "gfd:" lines, which go to stderr.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string layout = layout_flag(argc, argv);
  if (layout == "paged") return run_paged_benchmark(argc, argv);
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_benchmark --layout pool: scattered host-to-GPU block copies of one pool, every backend\n"
                 "against the contiguous DMA (the default layout is paged: gfd_benchmark --help)\n"
              << Flags::usage(kFlags);
    return 0;
  }
  Bench bench;
  bench.iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 30)));
  bench.warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 5)));
  bench.warm = flags.has("warm");
  bench.trace = flags.has("trace");
  bench.strided = layout == "strided";
  bench.pitch = static_cast<std::size_t>(std::max<long long>(1, flags.get_int("pitch", 2)));
  bench.batch = static_cast<std::size_t>(std::max<long long>(1, flags.get_int("batch", 1)));
  const std::string direction = flags.get("direction", "h2d");
  if (direction != "h2d" && direction != "d2h") throw std::invalid_argument("--direction must be h2d or d2h");
  bench.to_host = direction == "d2h";
  const bool pageable = flags.has("pageable");
  const int device = static_cast<int>(flags.get_int("device", 0));
  const std::string dst_mode = flags.get("dst", "contiguous");
  if (dst_mode != "contiguous" && dst_mode != "scattered" && dst_mode != "both")
    throw std::invalid_argument("--dst must be contiguous, scattered or both");
  std::vector<Backend> backends = backends_flag(flags);
  // --pool: cudaHostAlloc by default, as runtimes allocate their pinned KV pool today; with
  // --pageable (no pinned pool at all), the unregistered mmap the benchmark has always used.
  std::vector<PoolKind> pools{pageable ? PoolKind::kMmap : PoolKind::kCuda};
  if (flags.has("pool")) pools = pool_kinds_flag(flags.get("pool"));
  if (pageable && std::find(pools.begin(), pools.end(), PoolKind::kCuda) != pools.end())
    throw std::invalid_argument("--pool=cuda with --pageable: cudaHostAlloc memory is always pinned; "
                                "use --pool=mmap or --pool=gfd (unregistered) with --pageable");
  std::vector<LoadMode> load_modes;
  if (flags.has("under-load")) load_modes = load_modes_flag(flags);

  // The grid: N sweep at 4 KB, then a block-size sweep at N = 2048 (capped at 256 MB a transfer).
  std::vector<std::pair<std::size_t, std::size_t>> grid;
  if (flags.has("quick")) {
    grid = {{2048, 4096}};
  } else if (flags.has("blocks") || flags.has("block-sizes")) {
    for (std::size_t n : flags.get_sizes("blocks", {2048}))
      for (std::size_t s : flags.get_sizes("block-sizes", {4096})) grid.push_back({n, s});
  } else {
    for (std::size_t n : {16, 64, 256, 1024, 2048, 4096, 16384}) grid.push_back({n, 4096});
    for (std::size_t s : {512, 1024, 16384, 65536, 262144})
      grid.push_back({std::min<std::size_t>(2048, (std::size_t{256} << 20) / s), s});
  }
  auto largest_transfer = [&] {
    std::size_t m = 0;
    for (auto [n, s] : grid) m = std::max(m, n * s);
    return m;
  };

  if (testkit::cuda_device_count() == 0) {
    bench.host_only = true;
    std::printf("No CUDA GPU is visible here: measuring the host side only (gather threads into the\n"
                "real staging ring; the emulated device's 'DMA' is a host memcpy). These figures are\n"
                "labelled host-only and say nothing about PCIe; only the gather backend is run.\n");
    bench.dev = testkit::Device::emulated(0);
    backends = {Backend::kGather};
    if (flags.has("under-load"))
      std::printf("--under-load needs a GPU (its load is compute kernels on the SMs): skipped.\n");
  } else {
    bench.dev = testkit::Device::cuda(device);
  }

  // The source pool: several times the L3 (cold sources) and the largest transfer, within RAM. A
  // host-only run (a CI box, a laptop) keeps it small. A transfer takes its blocks at a 2x
  // stride from half the pool at most, so grid points too large for the pool get fewer blocks.
  const auto phys = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
  const std::size_t default_pool = std::max(8 * l3_bytes(), 32 * largest_transfer());
  std::size_t pool_bytes = 0;
  std::string pool_rule;
  if (flags.has("pool-bytes")) {
    pool_bytes = std::min(parse_size(flags.get("pool-bytes")), phys / 2);
    pool_rule = "--pool-bytes";
  } else if (bench.host_only) {
    pool_bytes = std::min({default_pool, phys / 8, std::size_t{1} << 30});
    pool_rule = "host-only: min(max(8 x L3, 32 x largest transfer) = " + format_size(default_pool) + ", RAM/8, 1G)";
  } else {
    pool_bytes = std::min(default_pool, phys / 2);
    pool_rule = "max(8 x L3, 32 x largest transfer), at most RAM/2";
  }
  pool_bytes = std::max(pool_bytes & ~((std::size_t{1} << 20) - 1), std::size_t{1} << 20);  // whole MiB
  for (auto& [n, s] : grid) {
    const std::size_t fit = pool_bytes / (4 * s);
    if (n > fit) {
      if (fit == 0) throw std::invalid_argument("source pool of " + format_size(pool_bytes) + " cannot hold a block of " + format_size(s));
      std::printf("%zu x %s does not fit a %s source pool: %zu blocks instead\n", n, format_size(s).c_str(),
                  format_size(pool_bytes).c_str(), fit);
      n = fit;
    }
  }
  bench.max_bytes = largest_transfer();

  testkit::Device& d = bench.dev;
  d.make_current();
  bench.stream = d.create_stream();

  if (pageable && std::erase(backends, Backend::kZeroCopyKernel) > 0)
    std::printf("--pageable: zero_copy_kernel needs pinned host memory and is skipped.\n");
  std::vector<BackendEngine> engines;
  for (Backend b : backends) {
    EngineOptions eo = EngineOptions::from_env();
    eo.device = d.ordinal();
    eo.backend = b;
    engines.push_back({b, d.make_engine(eo)});
  }
  for (const BackendEngine& be : engines) {
    const EngineStats st = be.engine.stats();
    const EngineOptions& o = be.engine.options();
    if (be.backend == Backend::kGather)
      std::printf("engine gather: %d gather threads on CPUs %s, NUMA node %d, ring %s in %s slots, hugepages %s, "
                  "%d copy streams (+1 device to host), first chunk %s, pieces %s, staging writes %s, kernel for <= %s\n",
                  st.gather_threads, testkit::format_cpulist(st.cpus).c_str(), st.numa_node,
                  format_size(st.staging_bytes).c_str(), format_size(st.slot_bytes).c_str(),
                  to_string(st.hugepages), o.copy_streams, format_size(o.first_chunk_bytes).c_str(),
                  format_size(o.piece_bytes).c_str(), to_string(st.staging_writes),
                  format_size(o.kernel_max_bytes).c_str());
  }
  std::printf("direction: %s, host blocks %s\n", bench.to_host ? "device to host" : "host to device",
              pageable ? "pageable" : "pinned");
  std::string pool_kinds;
  for (PoolKind k : pools) pool_kinds += (pool_kinds.empty() ? "" : ",") + std::string(to_string(k));
  const std::string stride_text = bench.strided ? "blocks in a row at a pitch of " + std::to_string(bench.pitch) +
                                                      " blocks (--layout strided)"
                                                : std::to_string(bench.pitch) + "x block stride";
  std::printf("device: %s | sources: %s, pool %s%s, %s (%s; L3 %s), %s | %d timed reps after %d "
              "warm-up\n",
              bench.host_only ? "emulated (host-only)" : ("CUDA " + std::to_string(d.ordinal())).c_str(),
              bench.warm ? "warm (same blocks every rep)"
              : bench.strided ? "cold (a fresh random start every rep)"
                              : "cold (fresh random blocks every rep)",
              pool_kinds.c_str(),
              pools.size() > 1 ? " (the whole grid once per pool)" : "", format_size(pool_bytes).c_str(),
              pool_rule.c_str(), format_size(l3_bytes()).c_str(), stride_text.c_str(), bench.iters, bench.warmup);

  {
    void* p = nullptr;
    if (posix_memalign(&p, 1 << 21, bench.max_bytes) != 0) throw std::bad_alloc();
    bench.ref_src = static_cast<std::byte*>(p);
    fill_random(bench.ref_src, bench.max_bytes);
    d.register_host(bench.ref_src, bench.max_bytes);
  }
  bench.dst = static_cast<std::byte*>(d.alloc_device(2 * bench.max_bytes));

  auto release = [&] {
    bench.stage.reset();  // its threads, before the buffer they write
    bench.stage_buffer.reset();
    bench.pool.reset();
    engines.clear();
    d.free_device(bench.dst);
    d.unregister_host(bench.ref_src);
    free(bench.ref_src);
    d.destroy_stream(bench.stream);
  };
  if (flags.has("host-load-probe")) {
    if (bench.host_only) throw std::invalid_argument("--host-load-probe needs a GPU");
    host_load_probe(bench, std::min<std::size_t>(bench.max_bytes, std::size_t{8} << 20));
    release();
    return 0;
  }

  // The gather-only (place-only to the host) threads: as many as copy in the engine
  // (gather_threads, plus the submitting thread when submitter_gathers), pinned to the engine's
  // gather CPUs, into a buffer the size of the engine's ring allocated as the ring is (HostPool:
  // huge pages, the engine's NUMA node, registered).
  const BackendEngine* gather_engine = nullptr;
  for (const BackendEngine& be : engines)
    if (be.backend == Backend::kGather) gather_engine = &be;
  // Whether a transfer of n blocks of `size` is staged at all: blocks of direct_min_bytes and up
  // from pinned memory go to the copy engine directly, and small pinned transfers to the kernel
  // when kernel_max_bytes says so; neither has a gather side to compare with.
  auto staged = [&](std::size_t n, std::size_t size) {
    const EngineOptions& o = gather_engine->engine.options();
    const std::size_t min = bench.to_host ? o.direct_min_bytes_to_host : o.direct_min_bytes;
    const bool direct = !pageable && min != 0 && size >= min;
    const bool kernel = !pageable && n * size <= o.kernel_max_bytes;
    return !direct && !kernel;
  };
  if (gather_engine != nullptr) {
    const EngineStats st = gather_engine->engine.stats();
    const EngineOptions& o = gather_engine->engine.options();
    HostPoolOptions so;
    so.bytes = st.staging_bytes;
    so.device = d.ordinal();
    so.numa_node = st.numa_node >= 0 ? st.numa_node : -2;  // the engine's node, or unbound as its ring
    bench.stage_buffer = std::make_unique<HostPool>(testkit::make_host_pool(d, so));
    StageOnly::Config c;
    c.workers = st.gather_threads;
    c.cpus = st.cpus;
    c.caller_copies = o.submitter_gathers;
    c.spin_us = o.spin_us;
    c.piece_bytes = o.piece_bytes;
    c.inline_bytes = o.inline_gather_bytes;
    c.first_chunk_bytes = std::min(o.first_chunk_bytes, o.slot_bytes);
    c.writes = st.staging_writes;
    c.to_host = bench.to_host;
    bench.stage = std::make_unique<StageOnly>(c, bench.stage_buffer->data(), st.staging_bytes);
    std::printf("%s-only: %d threads (%d pinned to the engine's gather CPUs %s%s), %s pieces in order (a 32nd "
                "of %s for transfers of one chunk), staging writes %s, %s a %s buffer (hugepages %s, NUMA node %d), "
                "transfers up to %s by the calling thread alone; no engine, no DMA\n",
                bench.to_host ? "place" : "gather", bench.stage->threads(), c.workers,
                c.cpus.empty() ? "(none reported: unpinned)" : testkit::format_cpulist(c.cpus).c_str(),
                c.caller_copies ? ", + the calling thread, unpinned, as the submitting thread" : "",
                format_size(c.piece_bytes).c_str(), format_size(c.first_chunk_bytes).c_str(), to_string(c.writes),
                bench.to_host ? "from" : "into",
                format_size(st.staging_bytes).c_str(), to_string(bench.stage_buffer->hugepages()),
                bench.stage_buffer->numa_node(), format_size(c.inline_bytes).c_str());
  }

  std::vector<Row> rows;
  std::vector<std::string> dst_modes;
  if (dst_mode != "scattered") dst_modes.push_back("contiguous");
  if (dst_mode != "contiguous") dst_modes.push_back("scattered");
  const std::size_t total = pools.size() * grid.size() * dst_modes.size() * engines.size();
  std::size_t done = 0;
  const auto start = Clock::now();
  if (!load_modes.empty() && bench.to_host)
    std::printf("--under-load measures host-to-device transfers only: skipped with --direction d2h.\n");
  for (PoolKind kind : pools) {
    bench.pool.reset();  // the last pool goes before the next is made: each may take half the RAM
    bench.pool = std::make_unique<SourcePool>(kind, pool_bytes, d, !pageable);
    bench.pool_name = to_string(kind);
    std::printf("pool %s: %s, %s\n", bench.pool_name.c_str(), format_size(pool_bytes).c_str(),
                bench.pool->description().c_str());
    std::map<std::pair<std::size_t, std::size_t>, double> ref_rates;
    for (auto [n, size] : grid) {
      const std::size_t bytes = n * size;
      const double ref_gbps = gbps(bytes, bench.reference(bytes).p50);
      ref_rates[{n, size}] = ref_gbps;
      const std::size_t first_row = rows.size();
      for (const std::string& mode : dst_modes) {
        for (BackendEngine& be : engines) {
          ++done;
          Row r = bench.measure(be, n, size, mode, ref_gbps);
          std::fprintf(stderr, "[%zu/%zu %5.1fs] %5zu x %-4s %-10s %-16s %8.2f GB/s (%5.1f%% of %.2f)%s%s\n", done,
                       total, since_us(start) * 1e-6, n, format_size(size).c_str(), mode.c_str(), r.backend.c_str(),
                       r.p50_gbps(), 100 * r.p50_gbps() / ref_gbps, ref_gbps, r.verified ? "" : " VERIFY FAILED",
                       bench.host_only ? " [host-only]" : "");
          rows.push_back(r);
        }
      }
      if (gather_engine != nullptr && staged(n, size)) {
        bool ok = false;
        const double g = bench.stage_only_gbps(n, size, ok);
        for (std::size_t i = first_row; i < rows.size(); ++i)
          if (rows[i].backend == to_string(Backend::kGather)) rows[i].stage_gbps = g;
        std::fprintf(stderr, "[%5.1fs] %5zu x %-4s %s-only %8.2f GB/s (%d threads)%s\n", since_us(start) * 1e-6, n,
                     format_size(size).c_str(), bench.to_host ? "place" : "gather", g, bench.stage->threads(),
                     ok ? "" : " VERIFY FAILED");
      }
    }
    if (!load_modes.empty() && !bench.host_only && !bench.to_host) {
      const auto [n, size] = flags.has("blocks") || flags.has("block-sizes")
                                 ? grid.front()
                                 : std::pair<std::size_t, std::size_t>{2048, 4096};
      if (!ref_rates.count({n, size})) ref_rates[{n, size}] = gbps(n * size, bench.reference(n * size).p50);
      const double ref = ref_rates[{n, size}];
      // The same backend idle, single transfers: from the grid's row of this pool, or measured now
      // (once: a row of its own, unless the grid's rows are batched).
      std::map<Backend, double> idle_rates;
      auto idle = [&, n = n, size = size](BackendEngine& be) {
        if (idle_rates.count(be.backend)) return idle_rates[be.backend];
        if (bench.batch == 1)
          for (const Row& r : rows)
            if (r.pool == bench.pool_name && r.load == "none" && r.dst == "contiguous" && r.n == n &&
                r.size == size && r.backend == to_string(be.backend))
              return idle_rates[be.backend] = r.p50_gbps();
        const std::size_t batch = bench.batch;
        bench.batch = 1;
        const Row r = bench.measure(be, n, size, "contiguous", ref);
        bench.batch = batch;
        if (batch == 1) rows.push_back(r);
        return idle_rates[be.backend] = r.p50_gbps();
      };
      for (Row& r : bench.under_load(engines, n, size, ref, d.ordinal(), load_modes, idle)) rows.push_back(r);
    }
  }
  if (bench.stage && !bench.stage->pinned())
    std::printf("note: the %s-only threads could not be pinned to the engine's gather CPUs; they ran unpinned\n",
                bench.to_host ? "place" : "gather");

  if (bench.batch > 1) std::printf("\n(%zu transfers back to back per repetition; times are per transfer)", bench.batch);
  print_rows(rows, bench.to_host, bench.host_only);
  print_latency(rows, bench.host_only);
  for (BackendEngine& be : engines) {
    if (be.backend != Backend::kGather) continue;
    const EngineStats st = be.engine.stats();
    std::printf("\nengine gather: %llu transfers, %llu chunks (%llu scattered), gather %.3f s CPU, "
                "planning %.3f s, submit waited %.3f s%s\n",
                (unsigned long long)st.transfers, (unsigned long long)st.chunks,
                (unsigned long long)testkit::tuning_stats(be.engine).scattered_chunks, st.gather_seconds, st.plan_seconds,
                st.submit_wait_seconds, bench.host_only ? " [host-only]" : "");
  }

  const std::string label = std::string(bench.host_only ? "host-only" : "gpu") + (pageable ? "-pageable" : "");
  const char* dir = bench.to_host ? "d2h" : "h2d";
  const char* sources = bench.warm ? "warm" : "cold";
  auto slowdown = [](const Row& r) { return r.slowdown >= -0.5 ? std::to_string(r.slowdown) : std::string(); };
  // Optional numbers: empty in the CSV, null in the JSON.
  auto opt = [](double v, bool json) { return v >= 0 ? std::to_string(v) : std::string(json ? "null" : ""); };
  if (flags.has("csv")) {
    std::ofstream f(flags.get("csv"));
    f << "mode,sources,direction,load,blocks,block_size,dst,backend,p50_us,p90_us,p50_gbps,p90_gbps,ref_gbps,"
         "ratio_p50,ratio_p90,cpu_s_per_gb,threads,compute_slowdown,verified,pool,gather_only_gbps,eff,"
         "rate_kept,layout,pitch\n";
    for (const Row& r : rows)
      f << label << ',' << sources << ',' << dir << ',' << r.load << ',' << r.n << ',' << r.size << ',' << r.dst << ','
        << r.backend << ',' << r.us.p50 << ',' << r.us.p90 << ',' << r.p50_gbps() << ',' << r.p90_gbps() << ','
        << r.ref_gbps << ',' << r.p50_gbps() / r.ref_gbps << ',' << r.p90_gbps() / r.ref_gbps << ','
        << r.cpu_s_per_gb << ',' << r.threads << ',' << slowdown(r) << ',' << (r.verified ? 1 : 0) << ',' << r.pool
        << ',' << opt(r.stage_gbps, false) << ',' << opt(r.eff(), false) << ',' << opt(r.kept, false) << ','
        << (bench.strided ? "strided" : "pool") << ',' << bench.pitch << '\n';
  }
  if (flags.has("json")) {
    std::ofstream f(flags.get("json"));
    f << "{\"mode\":\"" << label << "\",\"sources\":\"" << sources << "\",\"direction\":\"" << dir << "\",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << (i ? "," : "") << "{\"blocks\":" << r.n << ",\"block_size\":" << r.size << ",\"dst\":\"" << r.dst
        << "\",\"backend\":\"" << r.backend << "\",\"load\":\"" << r.load << "\",\"p50_us\":" << r.us.p50
        << ",\"p90_us\":" << r.us.p90 << ",\"p50_gbps\":" << r.p50_gbps() << ",\"p90_gbps\":" << r.p90_gbps()
        << ",\"ref_gbps\":" << r.ref_gbps << ",\"cpu_s_per_gb\":" << r.cpu_s_per_gb << ",\"threads\":" << r.threads
        << ",\"compute_slowdown\":" << (r.slowdown >= -0.5 ? std::to_string(r.slowdown) : "null")
        << ",\"verified\":" << (r.verified ? "true" : "false") << ",\"pool\":\"" << r.pool
        << "\",\"gather_only_gbps\":" << opt(r.stage_gbps, true) << ",\"eff\":" << opt(r.eff(), true)
        << ",\"rate_kept\":" << opt(r.kept, true) << ",\"layout\":\"" << (bench.strided ? "strided" : "pool")
        << "\",\"pitch\":" << bench.pitch << "}";
    }
    f << "]}\n";
  }

  release();
  if (bench.failures != 0) {
    std::fprintf(stderr, "%d measurement(s) failed verification\n", bench.failures);
    return 2;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gfd_benchmark: %s\n", e.what());
  return 1;
}
