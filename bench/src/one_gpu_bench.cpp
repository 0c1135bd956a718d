// gfd_multi_gpu_benchmark --one-gpu: N = 1, 2, 4, 8 caller threads submit at the same moment (a
// barrier per repetition) to ONE GPU, each its own scattered host blocks through its own engine
// and stream, each pinned to a CPU of its own, its engine's gather threads on CPUs of their own.
// The link is shared, so the time until every transfer is done grows with N whatever the host
// does; what should not grow is what a caller pays: how long the call holds its thread and the
// CPU time it spends there. Where the driver serialises the calls of several threads (a lock
// per process or per device), those grow with N. Cold sources by default; every byte is verified
// once per N and backend.
#include "one_gpu_bench.hpp"

#include <time.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"
#include "one_gpu_report.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench::multi_gpu {
namespace {

using Clock = std::chrono::steady_clock;

double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
}

// "0-3,8" as "0-3 8": CSV cells hold no commas.
std::string spaced(std::string s) {
  std::replace(s.begin(), s.end(), ',', ' ');
  return s;
}

// Where caller k and its engine run: the caller on `caller`, the engine's gather threads on
// `gather`, one thread per CPU (the caller's CPU is not among them).
struct CpuShare {
  int caller = -1;
  std::vector<int> gather;
};

// The GPU's CPUs cut into n equal shares: the first CPU of a share is the caller's, the rest its
// engine's. A share of one CPU serves both; with fewer CPUs than callers the shares wrap around.
// `shared` says whether either happened.
std::vector<CpuShare> split_cpus(const std::vector<int>& cpus, int n, bool& shared) {
  const std::size_t c = cpus.size(), m = static_cast<std::size_t>(n);
  std::vector<CpuShare> out(m);
  shared = false;
  for (std::size_t k = 0; k < m; ++k) {
    std::vector<int> share{cpus[k % c]};
    if (c >= m) share.assign(cpus.begin() + k * c / m, cpus.begin() + (k + 1) * c / m);
    out[k].caller = share.front();
    out[k].gather = share.size() > 1 ? std::vector<int>(share.begin() + 1, share.end()) : share;
    shared = shared || share.size() == 1;
  }
  return out;
}

// One caller thread's side: its stream, destination, contiguous source (the peer DMA's), its
// picker of source blocks and the blocks of the current repetition.
struct Caller {
  cudaStream_t stream = nullptr;
  std::byte* ref_src = nullptr;
  std::byte* dst = nullptr;
  std::unique_ptr<SourcePicker> picker;
  std::vector<BlockCopy> blocks;
  Transfer pending;
};

// One case's calls for caller k: `submit` is the call that is timed, `finish` waits until its
// bytes are on the GPU.
struct Ops {
  std::function<void(std::size_t)> submit, finish;
};

struct Samples {
  std::vector<double> call_us, cpu_us, e2e_us;
};

class OneGpuRun {
 public:
  explicit OneGpuRun(MultiGpuOptions o) : o_(std::move(o)), bytes_(o_.blocks * o_.block_size) {}
  ~OneGpuRun() { release(); }

  int run() {
    open_device();
    allocate();
    for (int n : o_.engines) sweep(n);
    fill_ratios(rows_, bytes_);
    print_one_gpu_rows(rows_);
    print_one_gpu_summary(rows_);
    if (!o_.csv.empty()) write_one_gpu_csv(o_.csv, rows_, host_only_ ? "host-only" : "gpu", o_);
    if (failures_ != 0) {
      std::fprintf(stderr, "%d measurement(s) failed verification\n", failures_);
      return 2;
    }
    return 0;
  }

 private:
  // The GPU (or the emulated device) and its CPUs; this thread moves to them, so that the pool
  // is first touched on the GPU's node.
  void open_device() {
    host_only_ = o_.emulated || testkit::cuda_device_count() == 0;
    const int ordinal = o_.gpus.empty() ? 0 : o_.gpus.front();
    if (host_only_)
      std::printf(
          "%s: the emulated device stands in (host-only: the engines' threads, staging rings and "
          "calls are real, each 'DMA' is a host memcpy on the stream's thread; nothing about PCIe "
          "or the driver).\n",
          o_.emulated ? "--emulated" : "No CUDA GPU is visible here");
    dev_ = host_only_ ? testkit::Device::emulated(0) : testkit::Device::cuda(ordinal);
    dev_.make_current();
    const testkit::Locality loc = testkit::gpu_locality(dev_);
    cpus_ = loc.cpus.empty() ? testkit::allowed_cpus() : loc.cpus;
    testkit::pin_current_thread(cpus_);
    std::printf("GPU %d (%s): NUMA node %d, CPUs %s; %d NUMA node(s)\n", ordinal,
                host_only_ ? "emulated" : dev_.pci_bus_id().c_str(), loc.numa_node,
                testkit::format_cpulist(cpus_).c_str(), testkit::numa_nodes());
  }

  // One pool shared by the callers (each picks its own random blocks from all of it, so that
  // one caller alone still reads from several times the LLC); per caller a stream, a
  // destination and the contiguous DMA's pinned source.
  void allocate() {
    const auto most = static_cast<std::size_t>(o_.engines.back());
    std::size_t pool_bytes = std::max(8 * l3_bytes(), 8 * most * bytes_);
    if (host_only_) pool_bytes = std::min<std::size_t>(pool_bytes, std::size_t{512} << 20);
    pool_bytes = o_.pool_bytes.value_or(pool_bytes);
    if (pool_bytes < 4 * bytes_)
      throw std::invalid_argument("--pool-bytes: " + format_size(pool_bytes) +
                                  " is less than 4 x one caller's transfer (" +
                                  format_size(bytes_) + ")");
    allocated_ = true;
    pool_ = std::make_unique<Pool>(pool_bytes);
    dev_.register_host(pool_->data, pool_->bytes);
    callers_.resize(most);
    for (std::size_t k = 0; k < most; ++k) {
      Caller& c = callers_[k];
      c.stream = dev_.create_stream();
      void* p = nullptr;
      if (posix_memalign(&p, 1 << 21, bytes_) != 0) throw std::bad_alloc();
      c.ref_src = static_cast<std::byte*>(p);
      std::memcpy(c.ref_src, pool_->data, bytes_);
      dev_.register_host(c.ref_src, bytes_);
      c.dst = static_cast<std::byte*>(dev_.alloc_device(bytes_));
      c.picker = std::make_unique<SourcePicker>(pool_bytes, o_.block_size, 0xBEEF + 977 * k);
    }
    std::printf(
        "each caller: %zu x %s per repetition, sources %s, pool %s shared, 2x stride | %d reps "
        "after %d warm-up\n",
        o_.blocks, format_size(o_.block_size).c_str(), o_.warm ? "warm" : "cold",
        format_size(pool_bytes).c_str(), o_.iters, o_.warmup);
  }

  void release() noexcept {
    if (!allocated_) return;
    allocated_ = false;
    try {
      dev_.make_current();
      for (Caller& c : callers_) {
        if (c.stream) dev_.destroy_stream(c.stream);
        if (c.dst) dev_.free_device(c.dst);
        if (c.ref_src) dev_.unregister_host(c.ref_src);
        free(c.ref_src);
      }
      if (pool_) dev_.unregister_host(pool_->data);
    } catch (...) {
    }
  }

  void refill(Caller& c) {
    const auto src = c.picker->pick(o_.blocks);
    c.blocks.resize(o_.blocks);
    for (std::size_t i = 0; i < o_.blocks; ++i)
      c.blocks[i] = {pool_->data + src[i], c.dst + i * o_.block_size, o_.block_size};
  }

  // Runs fn(k) for the first n callers at once, each on its own thread pinned to its CPU;
  // rethrows the first exception one of them threw once all have returned.
  void on_callers(int n, const std::function<void(std::size_t)>& fn) {
    std::mutex m;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k)
      threads.emplace_back([&, k] {
        try {
          testkit::pin_current_thread({shares_[k].caller});
          dev_.make_current();
          fn(k);
        } catch (...) {
          std::lock_guard lk(m);
          if (!first) first = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

  // The warm-up and timed repetitions of one case with n callers. The last caller to reach the
  // barrier starts the repetition's clock; a caller that fails leaves the barrier, so that the
  // others finish (its error is rethrown after them).
  Samples timed(int n, const Ops& ops) {
    const auto reps = static_cast<std::size_t>(o_.warmup + o_.iters);
    const auto warmup = static_cast<std::size_t>(o_.warmup);
    std::vector<Clock::time_point> start(reps);
    const auto callers = static_cast<std::size_t>(n);
    std::vector<std::vector<Clock::time_point>> end(callers, std::vector<Clock::time_point>(reps));
    std::vector<std::vector<double>> call(callers), cpu(callers);
    std::size_t phase = 0;
    std::barrier sync(n, [&]() noexcept {
      if (phase < reps) start[phase] = Clock::now();
      ++phase;  // a failed last caller's drop ends one phase more
    });
    on_callers(n, [&](std::size_t k) {
      Caller& c = callers_[k];
      try {
        if (o_.warm) refill(c);
        for (std::size_t r = 0; r < reps; ++r) {
          if (!o_.warm) refill(c);
          sync.arrive_and_wait();
          const double cpu0 = thread_cpu_us();
          const auto t0 = Clock::now();
          ops.submit(k);
          const double held = since_us(t0), spent = thread_cpu_us() - cpu0;
          ops.finish(k);
          end[k][r] = Clock::now();
          if (r < warmup) continue;
          call[k].push_back(held);
          cpu[k].push_back(spent);
        }
      } catch (...) {
        sync.arrive_and_drop();
        throw;
      }
    });
    Samples s;
    for (std::size_t k = 0; k < callers; ++k) {
      s.call_us.insert(s.call_us.end(), call[k].begin(), call[k].end());
      s.cpu_us.insert(s.cpu_us.end(), cpu[k].begin(), cpu[k].end());
    }
    for (std::size_t r = warmup; r < reps; ++r) {
      Clock::time_point last = start[r];
      for (std::size_t k = 0; k < callers; ++k) last = std::max(last, end[k][r]);
      s.e2e_us.push_back(std::chrono::duration<double, std::micro>(last - start[r]).count());
    }
    return s;
  }

  // n engines of backend b, each with its share's gather CPUs; GFD_* settings apply to each.
  std::vector<Engine> make_engines(int n, Backend b) {
    std::vector<Engine> engines;
    for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k) {
      EngineOptions o = EngineOptions::from_env();
      o.backend = b;
      o.cpus = testkit::format_cpulist(shares_[k].gather);
      // One thread per CPU (the caller has a CPU of its own), at most 16 as the engine chooses.
      if (o.gather_threads == 0)
        o.gather_threads = static_cast<int>(std::min<std::size_t>(shares_[k].gather.size(), 16));
      engines.push_back(dev_.make_engine(o));
    }
    return engines;
  }

  // Every caller's bytes of one more transfer, outside the timed region: 1 when all are exact.
  int verify(int n, std::vector<Engine>& engines) {
    std::vector<int> ok(static_cast<std::size_t>(n), 1);
    on_callers(n, [&](std::size_t k) {
      Caller& c = callers_[k];
      dev_.memset_async(c.dst, 0, bytes_, c.stream);
      refill(c);
      engines[k].copy_to_device(c.blocks, c.stream).wait();
      std::vector<std::byte> back(bytes_);
      dev_.copy_d2h(back.data(), c.dst, bytes_, c.stream);
      dev_.stream_sync(c.stream);
      for (std::size_t i = 0; i < o_.blocks && ok[k]; ++i)
        ok[k] = std::memcmp(back.data() + i * o_.block_size, c.blocks[i].src, o_.block_size) == 0;
    });
    const int bad = static_cast<int>(std::count(ok.begin(), ok.end(), 0));
    failures_ += bad;
    return bad == 0 ? 1 : 0;
  }

  // The cases of n callers: the contiguous DMA of each caller's bytes (one cudaMemcpyAsync per
  // call: the driver's own cost of a call), then every backend through engines of its own.
  void sweep(int n) {
    bool shared = false;
    shares_ = split_cpus(cpus_, n, shared);
    if (shared)
      std::printf(
          "N=%d: %zu CPUs for %d callers: a caller shares a CPU with its gather threads%s\n", n,
          cpus_.size(), n, cpus_.size() < static_cast<std::size_t>(n) ? " and other callers" : "");
    const Ops dma{[&](std::size_t k) {
                    Caller& c = callers_[k];
                    dev_.copy_h2d(c.dst, c.ref_src, bytes_, c.stream);
                  },
                  [&](std::size_t k) { dev_.stream_sync(callers_[k].stream); }};
    add_row(n, "contiguous", timed(n, dma), nullptr, -1);
    for (Backend b : o_.backends) {
      std::vector<Engine> engines = make_engines(n, b);
      const Ops ops{[&](std::size_t k) {
                      Caller& c = callers_[k];
                      c.pending = engines[k].copy_to_device(c.blocks, c.stream);
                    },
                    [&](std::size_t k) {
                      Caller& c = callers_[k];
                      dev_.stream_sync(c.stream);
                      c.pending.wait();  // throws the transfer's error, if any
                      c.pending = Transfer();
                    }};
      const Samples s = timed(n, ops);
      add_row(n, to_string(b), s, &engines, verify(n, engines));
    }
  }

  void add_row(int n, const std::string& name, const Samples& s, const std::vector<Engine>* engines,
               int verified) {
    OneGpuRow r{.engines = n,
                .backend = name,
                .call_us = percentiles(s.call_us),
                .cpu_us = percentiles(s.cpu_us),
                .e2e_us = percentiles(s.e2e_us)};
    r.gbps = static_cast<double>(n) * bytes_ / (r.e2e_us.p50 * 1e3);
    r.verified = verified;
    for (std::size_t k = 0; k < static_cast<std::size_t>(n); ++k) {
      const char* sep = k ? " " : "";
      r.caller_cpus += sep + std::to_string(shares_[k].caller);
      if (!engines) continue;
      const EngineStats st = (*engines)[k].stats();
      r.threads = st.gather_threads;
      if (st.gather_threads > 0)
        r.gather_cpus += (k ? "|" : "") + spaced(testkit::format_cpulist(st.cpus));
    }
    rows_.push_back(r);
    std::fprintf(stderr, "[%5.1fs] N=%d %-16s call %8.1f us  cpu %8.1f us  e2e %9.1f us%s\n",
                 since_us(start_) * 1e-6, n, name.c_str(), r.call_us.p50, r.cpu_us.p50,
                 r.e2e_us.p50, verified == 0 ? " VERIFY FAILED" : "");
  }

  MultiGpuOptions o_;
  std::size_t bytes_;
  bool host_only_ = false, allocated_ = false;
  testkit::Device dev_;
  std::vector<int> cpus_;
  std::vector<CpuShare> shares_;  // of the engine count being measured
  std::unique_ptr<Pool> pool_;
  std::vector<Caller> callers_;
  std::vector<OneGpuRow> rows_;
  int failures_ = 0;
  Clock::time_point start_ = Clock::now();
};

}  // namespace

int run_one_gpu(MultiGpuOptions o) {
  // Each engine's placement is in the table; without this its line would come once per engine
  // made (GFD_QUIET=0 brings the lines back).
  setenv("GFD_QUIET", "1", 0);
  OneGpuRun run(std::move(o));
  return run.run();
}

}  // namespace gfd::bench::multi_gpu
