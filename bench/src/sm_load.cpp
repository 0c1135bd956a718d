// gfd_benchmark --layout pool --under-load: each backend while compute kernels keep every SM
// busy, in each mode:
//  - high: one long kernel (many waves of ~20 us thread blocks, ~0.4 s) on a lowest-priority
//    stream, the transfers on the benchmark's highest-priority stream;
//  - equal: the same kernel, the transfers on another stream of the kernel's own priority, as a
//    runtime that copies on its current stream gets it;
//  - short: short kernels back to back (2 waves of ~50 us blocks, ~0.1 ms each, ~0.4 s in all,
//    captured in one CUDA graph), like a model's layers, the transfers at equal priority.
// Each load runs up to 3 times per backend, until `iters` transfers started while it ran; only
// those are counted (a transfer that cannot start before the load ends counts once, with all of
// its wait). The row gets the backend's rate, the rate kept against the same backend idle, and
// how much longer the compute took than alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>

#include "load_kernel.cuh"
#include "pool_bench.hpp"

namespace gfd::bench::pool {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kLoadMs = 400;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("under load: ") + what + ": " + cudaGetErrorString(e));
}

// The compute load: its stream, the equal-priority transfer stream, and the kernels of the
// current mode, timed by a pair of events around each run.
class SmLoad {
 public:
  SmLoad(testkit::Device& dev, int device) : dev_(dev) {
    sms_ = sm_count(device);
    if (sms_ <= 0) throw std::runtime_error("under load: cannot read the GPU's SM count");
    int least = 0, greatest = 0;
    cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest),
            "cudaDeviceGetStreamPriorityRange");
    // The load's stream and the equal-priority transfer stream: both at the least priority, which
    // is also the default priority of streams created without one (torch's, say).
    cuda_ok(cudaStreamCreateWithPriority(&load_stream_, cudaStreamNonBlocking, least),
            "load stream");
    cuda_ok(cudaStreamCreateWithPriority(&equal_stream, cudaStreamNonBlocking, least),
            "equal-priority stream");
    sink_ = static_cast<float*>(dev_.alloc_device(sizeof(float) * kSinkFloats));
    cuda_ok(cudaEventCreate(&a_), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&z_), "cudaEventCreate");
  }
  ~SmLoad() {
    if (series_ != nullptr) cudaGraphExecDestroy(series_);
    cudaEventDestroy(a_);
    cudaEventDestroy(z_);
    dev_.free_device(sink_);
    cudaStreamDestroy(load_stream_);
    cudaStreamDestroy(equal_stream);
  }
  SmLoad(const SmLoad&) = delete;
  SmLoad& operator=(const SmLoad&) = delete;

  cudaStream_t equal_stream = nullptr;

  void run() {
    cuda_ok(cudaEventRecord(a_, load_stream_), "cudaEventRecord");
    launch_();
    cuda_ok(cudaEventRecord(z_, load_stream_), "cudaEventRecord");
  }
  double elapsed_ms() {
    cuda_ok(cudaEventSynchronize(z_), "compute load");
    float ms = 0;
    cuda_ok(cudaEventElapsedTime(&ms, a_, z_), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  }
  // Whether the last run is still going (throws its error, if any).
  bool running() {
    const cudaError_t q = cudaEventQuery(z_);
    if (q == cudaSuccess) return false;
    if (q != cudaErrorNotReady) cuda_ok(q, "compute load");
    return true;
  }

  // Rounds for thread blocks of about 20 us. A wave's time is read off a kernel of 10 waves, so
  // that the launch overhead does not count as block time.
  void calibrate() {
    kernel(rounds_, 1);  // a first launch loads the module
    run();
    elapsed_ms();
    kernel(rounds_, 10);
    run();
    rounds_ = static_cast<std::uint32_t>(
        std::max(1.0, rounds_ * 0.020 / std::max(elapsed_ms() / 10, 1e-4)));
    kernel(rounds_, 10);
    run();
    wave_ms_ = elapsed_ms() / 10;
  }

  // Makes `mode`'s load the one run() enqueues; returns what it is.
  std::string prepare(const LoadMode& mode) {
    char buf[200];
    if (std::string(mode.name) != "short") {
      const auto waves =
          static_cast<std::uint32_t>(std::clamp(kLoadMs / std::max(wave_ms_, 1e-3), 20.0, 1e6));
      kernel(rounds_, waves);
      std::snprintf(buf, sizeof buf,
                    "one kernel of %u waves of %.3f ms (%d SMs x 8 blocks of 256 threads each)",
                    waves, wave_ms_, sms_);
      return buf;
    }
    // Blocks of ~50 us, two waves a kernel: ~0.1 ms kernels.
    const auto short_rounds = static_cast<std::uint32_t>(std::max(1.0, rounds_ * 2.5));
    kernel(short_rounds, 2);
    run();
    const double kernel_ms = elapsed_ms();
    const auto count =
        static_cast<std::uint32_t>(std::clamp(kLoadMs / std::max(kernel_ms, 1e-3), 50.0, 8000.0));
    if (series_ != nullptr) cudaGraphExecDestroy(series_);
    series_ = nullptr;
    cuda_ok(make_fma_series(sink_, short_rounds, 2, sms_, count, load_stream_, &series_),
            "capturing the kernel series");
    launch_ = [this] { cuda_ok(cudaGraphLaunch(series_, load_stream_), "cudaGraphLaunch"); };
    std::snprintf(
        buf, sizeof buf,
        "%u kernels of %.3f ms back to back (2 waves of %d SMs x 8 blocks each, one CUDA graph)",
        count, kernel_ms, sms_);
    return buf;
  }

  // The load's time alone: a first run uploads the graph and settles the clocks, then the
  // shorter of two.
  double alone_ms() {
    run();
    elapsed_ms();
    double best = 1e30;
    for (int i = 0; i < 2; ++i) {
      run();
      best = std::min(best, elapsed_ms());
    }
    return best;
  }

 private:
  void kernel(std::uint32_t rounds, std::uint32_t waves) {
    launch_ = [this, rounds, waves] {
      cuda_ok(launch_fma_load(sink_, rounds, waves, sms_, load_stream_), "load kernel launch");
    };
  }

  testkit::Device& dev_;
  int sms_ = 0;
  cudaStream_t load_stream_ = nullptr;
  float* sink_ = nullptr;
  cudaEvent_t a_ = nullptr, z_ = nullptr;
  cudaGraphExec_t series_ = nullptr;
  std::function<void()> launch_;  // enqueues the current mode's load on load_stream_
  std::uint32_t rounds_ = 1000;
  double wave_ms_ = 0;
};

// One backend under the prepared load: transfers on `ts` while the load runs.
// `loaded_ms`: the load's time in each of its runs; `transfers`: how many were timed.
Row measure_loaded(PoolBench& bench, SmLoad& load, BackendEngine& be, std::size_t n,
                   std::size_t size, cudaStream_t ts, double alone_ms,
                   std::vector<double>& loaded_ms, std::size_t& transfers) {
  PoolBench::Blocks b = bench.make_blocks(n, size, 1);
  bench.refill(b, size, false);
  for (int i = 0; i < bench.warmup; ++i) {
    const Transfer t = be.engine.copy_to_device(b.sets[0], ts);
    bench.dev.stream_sync(ts);
    t.wait();
  }
  std::vector<double> us;
  for (int round = 0; round < 3 && static_cast<int>(us.size()) < bench.iters; ++round) {
    load.run();
    while (us.size() < 100000) {
      if (!bench.warm) bench.refill(b, size, false);
      if (!load.running()) break;
      const auto t0 = Clock::now();
      const Transfer t = be.engine.copy_to_device(b.sets[0], ts);
      bench.dev.stream_sync(ts);
      us.push_back(since_us(t0));
      t.wait();  // done with the stream; throws the transfer's error, if any
    }
    loaded_ms.push_back(load.elapsed_ms());
  }
  transfers = us.size();
  Row r;
  r.n = n;
  r.size = size;
  r.dst = "contiguous";
  r.backend = to_string(be.backend);
  r.pool = bench.pool_name;
  r.us = percentiles(us);
  r.threads = be.engine.stats().gather_threads;
  r.slowdown = percentiles(loaded_ms).p50 / alone_ms - 1;
  r.verified = bench.verify(be.engine, b, size, false);
  return r;
}

std::vector<Row> run_modes(PoolBench& bench, SmLoad& load, std::vector<BackendEngine>& engines,
                           std::size_t n, std::size_t size, double ref_gbps,
                           const std::vector<LoadMode>& modes,
                           const std::function<double(BackendEngine&)>& idle_gbps) {
  std::vector<Row> rows;
  for (const LoadMode& mode : modes) {
    const bool high = std::string(mode.name) == "high";
    const std::string what = load.prepare(mode);
    const double alone = load.alone_ms();
    std::printf("\nunder load (%s): %s, %.1f ms alone; transfers on %s\n", mode.name, what.c_str(),
                alone,
                high ? "the benchmark's highest-priority stream, the load on a lowest-priority one"
                     : "a stream of the load's own priority (the default priority)");
    for (BackendEngine& be : engines) {
      std::vector<double> loaded_ms;
      std::size_t transfers = 0;
      Row r = measure_loaded(bench, load, be, n, size, high ? bench.stream : load.equal_stream,
                             alone, loaded_ms, transfers);
      r.load = mode.label;
      r.ref_gbps = ref_gbps;
      const double idle = idle_gbps(be);
      r.kept = idle > 0 ? r.p50_gbps() / idle : -1;
      if (!r.verified) {
        ++bench.failures;
        std::fprintf(stderr, "VERIFY FAILED under load (%s): %s\n", mode.name, r.backend.c_str());
      }
      std::fprintf(stderr,
                   "under load (%s): %-16s %8.2f GB/s over %zu transfers (%.0f%% of %.2f idle), "
                   "compute %.1f ms "
                   "(%+.1f%%)\n",
                   mode.name, r.backend.c_str(), r.p50_gbps(), transfers, 100 * r.kept, idle,
                   percentiles(loaded_ms).p50, 100 * r.slowdown);
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace

std::vector<Row> under_load(PoolBench& bench, std::vector<BackendEngine>& engines, std::size_t n,
                            std::size_t size, double ref_gbps, const std::vector<LoadMode>& modes,
                            const std::function<double(BackendEngine&)>& idle_gbps) {
  SmLoad load(bench.dev, bench.dev.ordinal());
  try {
    load.calibrate();
    return run_modes(bench, load, engines, n, size, ref_gbps, modes, idle_gbps);
  } catch (...) {
    cudaDeviceSynchronize();  // nothing of the load may still run when its buffers go
    throw;
  }
}

}  // namespace gfd::bench::pool
