// gfd_multi_gpu_benchmark: every GPU moves its own scattered host blocks at the same moment, one
// thread per GPU (EngineGroup), for G = 1 ... all GPUs. Reports per-GPU and aggregate GB/s for
// every backend, the scaling efficiency against G x the 1-GPU aggregate, and each GPU's
// contiguous pinned DMA rate measured in the same run. Repetitions start together (a barrier);
// cold sources by default; every byte is verified once per G, backend and GPU. With --one-gpu it
// runs engines on one GPU instead (one_gpu_bench.cpp).
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"
#include "multi_gpu_flags.hpp"
#include "one_gpu_bench.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench::multi_gpu {
namespace {

using Clock = std::chrono::steady_clock;
using Times = std::vector<std::vector<double>>;  // [repetition][gpu] microseconds

// One GPU's side of the benchmark: its device, stream, source pool and destination.
struct Gpu {
  int ordinal = 0;
  testkit::Device dev;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Pool> pool;
  std::byte* ref_src = nullptr;
  std::byte* dst = nullptr;
  std::unique_ptr<SourcePicker> picker;
  std::vector<BlockCopy> blocks;

  void refill(std::size_t n, std::size_t size) {
    const auto src = picker->pick(n);
    blocks.resize(n);
    for (std::size_t i = 0; i < n; ++i) blocks[i] = {pool->data + src[i], dst + i * size, size};
  }
};

// Each repetition's slowest GPU.
std::vector<double> slowest(const Times& us) {
  std::vector<double> out;
  for (const auto& rep : us) out.push_back(*std::max_element(rep.begin(), rep.end()));
  return out;
}

class Run {
 public:
  explicit Run(MultiGpuOptions o) : o_(std::move(o)), bytes_(o_.blocks * o_.block_size) {}
  ~Run() { release(); }

  int run() {
    open_devices();
    make_groups();
    print_topology();
    allocate();
    for (int G : counts_) sweep(G);
    print_rows(rows_);
    const std::string label = host_only_ ? "host-only" : "gpu";
    if (!o_.csv.empty()) write_csv(o_.csv, rows_, label, o_);
    if (!o_.json.empty()) write_json(o_.json, rows_, label, o_);
    if (failures_ != 0) {
      std::fprintf(stderr, "%d GPU measurement(s) failed verification\n", failures_);
      return 2;
    }
    return 0;
  }

 private:
  // Devices: the CUDA GPUs, or two emulated ones (host-only) where there is none; the counts G.
  void open_devices() {
    host_only_ = o_.emulated || testkit::cuda_device_count() == 0;
    std::vector<int> ordinals = o_.gpus;
    if (host_only_) {
      std::printf(
          "%s: two emulated devices stand in (host-only: the gather\n"
          "threads and staging rings are real, the 'DMA' is a host memcpy; nothing about PCIe).\n",
          o_.emulated ? "--emulated" : "No CUDA GPU is visible here");
      ordinals = {0, 1};
      o_.backends = {Backend::kGather};
    } else if (ordinals.empty()) {
      ordinals = visible_devices();
    }
    const int all = static_cast<int>(ordinals.size());
    for (int g : o_.counts)
      if (g >= 1 && g <= all) counts_.push_back(g);
    if (o_.counts.empty()) {
      for (int g = 1; g < all; g *= 2) counts_.push_back(g);
      counts_.push_back(all);
    }
    if (counts_.empty())
      throw std::invalid_argument("--counts: no count between 1 and " + std::to_string(all));
    gpus_.resize(static_cast<std::size_t>(all));
    for (int i = 0; i < all; ++i) {
      Gpu& g = gpus_[static_cast<std::size_t>(i)];
      g.ordinal = ordinals[static_cast<std::size_t>(i)];
      g.dev = host_only_ ? testkit::Device::emulated(i) : testkit::Device::cuda(g.ordinal);
    }
  }

  // One group of engines per backend; engines of one backend never share CPUs. GFD_* settings
  // apply to every engine: EngineOptions::from_env() is passed explicitly (a group made with
  // default options does not read the environment).
  void make_groups() {
    for (Backend b : o_.backends) {
      std::vector<Engine> engines;
      for (Gpu& g : gpus_) {
        EngineOptions o = EngineOptions::from_env();
        o.backend = b;
        engines.push_back(g.dev.make_engine(o));
      }
      groups_[b] = std::make_unique<EngineGroup>(std::move(engines));
    }
    first_ = groups_.begin()->second.get();
  }

  void print_topology() {
    std::printf("topology: %d NUMA node(s); %zu CPUs this process may use\n", testkit::numa_nodes(),
                testkit::allowed_cpus().size());
    EngineGroup& gather = groups_.count(Backend::kGather) ? *groups_[Backend::kGather] : *first_;
    for (std::size_t i = 0; i < gpus_.size(); ++i) {
      Gpu& g = gpus_[i];
      const testkit::Locality loc = testkit::gpu_locality(g.dev);
      const EngineStats st = gather[i].stats();
      const std::string split =
          st.cpu_sharing > 1
              ? ", CPUs split with " + std::to_string(st.cpu_sharing - 1) + " other GPU(s)"
              : "";
      std::printf(
          "  GPU %d (%s): NUMA node %d, local CPUs %s | gather engine: CPUs %s, %d threads%s, ring "
          "on node %d\n",
          g.ordinal, host_only_ ? "emulated" : g.dev.pci_bus_id().c_str(), loc.numa_node,
          testkit::format_cpulist(loc.cpus).c_str(), testkit::format_cpulist(st.cpus).c_str(),
          st.gather_threads, split.c_str(), st.numa_node);
    }
  }

  // Per-GPU memory, allocated by a thread on that GPU's engine CPUs (first touch: its node).
  void allocate() {
    std::size_t pool_bytes =
        o_.pool_bytes.value_or(std::max(8 * l3_bytes() / gpus_.size(), 32 * bytes_));
    if (host_only_) pool_bytes = std::min<std::size_t>(pool_bytes, std::size_t{512} << 20);
    first_->run([&](std::size_t i, Engine&) {
      Gpu& g = gpus_[i];
      g.stream = g.dev.create_stream();
      g.pool = std::make_unique<Pool>(pool_bytes);
      g.dev.register_host(g.pool->data, g.pool->bytes);
      void* p = nullptr;
      if (posix_memalign(&p, 1 << 21, bytes_) != 0) throw std::bad_alloc();
      g.ref_src = static_cast<std::byte*>(p);
      std::memcpy(g.ref_src, g.pool->data, bytes_);
      g.dev.register_host(g.ref_src, bytes_);
      g.dst = static_cast<std::byte*>(g.dev.alloc_device(bytes_));
      g.picker = std::make_unique<SourcePicker>(g.pool->bytes, o_.block_size, 0xBEEF + 977 * i);
    });
    allocated_ = true;
    std::printf(
        "each GPU: %zu x %s per repetition, sources %s, pool %s per GPU, 2x stride | %d reps after "
        "%d warm-up\n",
        o_.blocks, format_size(o_.block_size).c_str(), o_.warm ? "warm" : "cold",
        format_size(pool_bytes).c_str(), o_.iters, o_.warmup);
  }

  void release() noexcept {
    if (!allocated_) return;
    try {
      first_->run([&](std::size_t i, Engine&) {
        Gpu& g = gpus_[i];
        g.dev.free_device(g.dst);
        g.dev.unregister_host(g.ref_src);
        free(g.ref_src);
        g.dev.unregister_host(g.pool->data);
        g.dev.destroy_stream(g.stream);
      });
    } catch (...) {
    }
    allocated_ = false;
    groups_.clear();
  }

  // Each GPU's contiguous DMA alone.
  std::vector<double> alone_rates(int G) {
    std::vector<double> alone(static_cast<std::size_t>(G));
    for (int i = 0; i < G; ++i) {
      Gpu& g = gpus_[static_cast<std::size_t>(i)];
      g.dev.make_current();
      std::vector<double> us;
      for (int r = 0; r < o_.warmup + o_.iters; ++r) {
        const auto t0 = Clock::now();
        g.dev.copy_h2d(g.dst, g.ref_src, bytes_, g.stream);
        g.dev.stream_sync(g.stream);
        if (r >= o_.warmup) us.push_back(since_us(t0));
      }
      alone[static_cast<std::size_t>(i)] = bytes_ / (percentiles(us).p50 * 1e3);
    }
    return alone;
  }

  // Runs `body(i, engine)` on the first G GPUs at once, repetitions aligned by a barrier;
  // returns each timed repetition's time per GPU.
  Times timed(int G, EngineGroup& group, const std::function<void(std::size_t, Engine&)>& body) {
    Times us(static_cast<std::size_t>(o_.warmup + o_.iters), std::vector<double>(G));
    std::barrier sync(G);
    group.run([&](std::size_t i, Engine& e) {
      if (static_cast<int>(i) >= G) return;
      Gpu& g = gpus_[i];
      if (o_.warm) g.refill(o_.blocks, o_.block_size);
      for (int r = 0; r < o_.warmup + o_.iters; ++r) {
        if (!o_.warm) g.refill(o_.blocks, o_.block_size);
        sync.arrive_and_wait();
        const auto t0 = Clock::now();
        body(i, e);
        us[static_cast<std::size_t>(r)][i] = since_us(t0);
      }
    });
    us.erase(us.begin(), us.begin() + o_.warmup);
    return us;
  }

  // Every GPU's bytes of one more transfer, outside the timed region.
  std::vector<bool> verify(int G, EngineGroup& group) {
    std::vector<bool> ok(G, true);
    group.run([&](std::size_t i, Engine& e) {
      if (static_cast<int>(i) >= G) return;
      Gpu& g = gpus_[i];
      g.dev.memset_async(g.dst, 0, bytes_, g.stream);
      g.refill(o_.blocks, o_.block_size);
      e.copy_to_device(g.blocks, g.stream).wait();
      std::vector<std::byte> back(bytes_);
      g.dev.copy_d2h(back.data(), g.dst, bytes_, g.stream);
      g.dev.stream_sync(g.stream);
      for (std::size_t k = 0; k < o_.blocks && ok[i]; ++k)
        ok[i] = std::memcmp(back.data() + k * o_.block_size, g.blocks[k].src, o_.block_size) == 0;
    });
    for (bool v : ok) failures_ += v ? 0 : 1;
    return ok;
  }

  // All G contiguous DMAs at once (the aggregate line rate of this G), then every backend.
  void sweep(int G) {
    const std::vector<double> alone = alone_rates(G);
    const Times dma = timed(G, *first_, [&](std::size_t i, Engine&) {
      Gpu& g = gpus_[i];
      g.dev.copy_h2d(g.dst, g.ref_src, bytes_, g.stream);
      g.dev.stream_sync(g.stream);
    });
    const double ref_aggregate =
        static_cast<double>(G) * bytes_ / (percentiles(slowest(dma)).p50 * 1e3);
    summarize(G, "contiguous", dma, alone, -1, nullptr, std::vector<bool>(G, true));
    for (Backend b : o_.backends) {
      EngineGroup& group = *groups_[b];
      const Times t = timed(G, group, [&](std::size_t i, Engine& e) {
        Gpu& g = gpus_[i];
        const Transfer t = e.copy_to_device(g.blocks, g.stream);
        g.dev.stream_sync(g.stream);
        t.wait();  // done with the stream; throws the transfer's error, if any
      });
      summarize(G, to_string(b), t, alone, ref_aggregate, &group, verify(G, group));
    }
  }

  // A row per GPU and the aggregate: all G GPUs' bytes over the slowest GPU's time, per repetition.
  void summarize(int G, const std::string& name, const Times& us, const std::vector<double>& ref,
                 double ref_aggregate, EngineGroup* group, const std::vector<bool>& ok) {
    for (int i = 0; i < G; ++i) {
      const auto k = static_cast<std::size_t>(i);
      std::vector<double> mine;
      for (const auto& rep : us) mine.push_back(rep[k]);
      Row r{.gpus = G,
            .backend = name,
            .gpu = std::to_string(gpus_[k].ordinal),
            .us = percentiles(mine)};
      r.gbps = bytes_ / (r.us.p50 * 1e3);
      r.ref_gbps = ref[k];
      r.verified = ok[k];
      if (group) {
        const EngineStats st = (*group)[k].stats();
        r.threads = st.gather_threads;
        r.cpus = testkit::format_cpulist(st.cpus);
      }
      rows_.push_back(r);
    }
    Row a{.gpus = G, .backend = name, .gpu = "all", .us = percentiles(slowest(us))};
    a.gbps = static_cast<double>(G) * bytes_ / (a.us.p50 * 1e3);
    a.ref_gbps = ref_aggregate < 0 ? a.gbps : ref_aggregate;
    a.verified = std::all_of(ok.begin(), ok.begin() + G, [](bool b) { return b; });
    if (G == 1) one_gpu_aggregate_[name] = a.gbps;
    if (one_gpu_aggregate_.count(name)) a.efficiency = a.gbps / (G * one_gpu_aggregate_[name]);
    rows_.push_back(a);
    const std::string eff =
        a.efficiency >= 0
            ? " (" + std::to_string(static_cast<int>(100 * a.efficiency + 0.5)) + "% of G x 1 GPU)"
            : "";
    std::fprintf(stderr, "[%5.1fs] G=%d %-16s aggregate %8.2f GB/s%s%s\n", since_us(start_) * 1e-6,
                 G, name.c_str(), a.gbps, eff.c_str(), a.verified ? "" : " VERIFY FAILED");
  }

  MultiGpuOptions o_;
  std::size_t bytes_;
  bool host_only_ = false, allocated_ = false;
  std::vector<int> counts_;
  std::vector<Gpu> gpus_;
  std::map<Backend, std::unique_ptr<EngineGroup>> groups_;
  EngineGroup* first_ = nullptr;
  std::vector<Row> rows_;
  std::map<std::string, double> one_gpu_aggregate_;  // backend -> aggregate at G = 1
  int failures_ = 0;
  Clock::time_point start_ = Clock::now();
};

}  // namespace
}  // namespace gfd::bench::multi_gpu

int main(int argc, char** argv) try {
  // Line-buffered stdout: notes and tables reach a pipe in order with the progress on stderr.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::optional<gfd::bench::multi_gpu::MultiGpuOptions> o =
      gfd::bench::multi_gpu::parse_multi_gpu_flags(argc, argv);
  if (!o) return 0;
  if (o->one_gpu) return gfd::bench::multi_gpu::run_one_gpu(std::move(*o));
  gfd::bench::multi_gpu::Run run(std::move(*o));
  return run.run();
} catch (const std::exception& e) {
  std::fprintf(stderr, "gfd_multi_gpu_benchmark: %s\n", e.what());
  return 1;
}
