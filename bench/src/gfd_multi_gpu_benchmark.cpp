// gfd_multi_gpu_benchmark: every GPU moves its own scattered host blocks at the same moment, one
// thread per GPU (EngineGroup), for G = 1 ... all GPUs. Reports per-GPU and aggregate GB/s for
// every backend, the scaling efficiency against G x the 1-GPU aggregate, and each GPU's
// contiguous pinned DMA rate measured in the same run. Repetitions start together (a barrier);
// cold sources by default; every byte is verified once per G, backend and GPU.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"
#include "probe.hpp"

namespace {

using namespace gfd;
using namespace gfd::bench;
using Clock = std::chrono::steady_clock;

const std::map<std::string, std::string> kFlags = {
    {"gpus", "=N[,N...]     devices to use (default: every visible GPU)"},
    {"counts", "=G[,G...]   GPU counts to run (default 1, 2, 4, ... up to all, and all)"},
    {"blocks", "=N          blocks per GPU per repetition (default 2048)"},
    {"block-size", "=S      block size (default 4K)"},
    {"backends", "=B[,B...] gather, batch_async, per_block, zero_copy_kernel (default all)"},
    {"iters", "=N           timed repetitions (default 30, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 5)"},
    {"warm", "              reuse the same source blocks every repetition (default: cold)"},
    {"pool-bytes", "=S      source pool per GPU (default max(8 x L3 / GPUs, 32 x transfer))"},
    {"csv", "=FILE          write results as CSV"},
    {"json", "=FILE         write results as JSON"},
    {"help", "              this text"},
};

// One GPU's side of the benchmark: its device, stream, source pool and destination.
struct Gpu {
  int ordinal = 0;
  probe::Device dev;
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

struct Row {
  int gpus = 0;
  std::string backend, gpu;  // gpu: ordinal or "all"
  Percentiles us;
  double gbps = 0, ref_gbps = 0, efficiency = -1;
  int threads = 0;
  std::string cpus;
  bool verified = true;
};

}  // namespace

int main(int argc, char** argv) try {
  // Line-buffered stdout: notes and tables reach a pipe in order with the progress on stderr.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_multi_gpu_benchmark: one thread per GPU, every backend, G = 1 ... all GPUs\n"
              << Flags::usage(kFlags);
    return 0;
  }
  const int iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 30)));
  const int warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 5)));
  const bool warm = flags.has("warm");
  const std::size_t n = flags.get_sizes("blocks", {2048})[0];
  const std::size_t size = flags.get_sizes("block-size", {4096})[0];
  const std::size_t bytes = n * size;
  std::vector<Backend> backends = backends_flag(flags);

  // Devices: the CUDA GPUs, or two emulated ones (host-only) where there is none.
  const bool host_only = probe::cuda_device_count() == 0;
  std::vector<int> ordinals;
  if (host_only) {
    std::printf("No CUDA GPU is visible here: two emulated devices stand in (host-only: the gather\n"
                "threads and staging rings are real, the 'DMA' is a host memcpy; nothing about PCIe).\n");
    ordinals = {0, 1};
    backends = {Backend::kGather};
  } else if (flags.has("gpus")) {
    for (std::size_t g : flags.get_sizes("gpus", {})) ordinals.push_back(static_cast<int>(g));
  } else {
    ordinals = visible_devices();
  }
  const int all = static_cast<int>(ordinals.size());
  std::vector<int> counts;
  if (flags.has("counts")) {
    for (std::size_t g : flags.get_sizes("counts", {}))
      if (g >= 1 && static_cast<int>(g) <= all) counts.push_back(static_cast<int>(g));
  } else {
    for (int g = 1; g < all; g *= 2) counts.push_back(g);
    counts.push_back(all);
  }
  if (counts.empty()) throw std::invalid_argument("--counts: no count between 1 and " + std::to_string(all));

  std::vector<Gpu> gpus(static_cast<std::size_t>(all));
  for (int i = 0; i < all; ++i) {
    Gpu& g = gpus[static_cast<std::size_t>(i)];
    g.ordinal = ordinals[static_cast<std::size_t>(i)];
    g.dev = host_only ? probe::Device::emulated(i) : probe::Device::cuda(g.ordinal);
  }
  // One group of engines per backend; engines of one backend never share CPUs. GFD_* settings
  // apply to every engine: EngineOptions::from_env() is passed explicitly (a group made with
  // default options does not read the environment).
  std::map<Backend, std::unique_ptr<EngineGroup>> groups;
  for (Backend b : backends) {
    std::vector<Engine> engines;
    for (Gpu& g : gpus) {
      EngineOptions o = EngineOptions::from_env();
      o.backend = b;
      engines.push_back(g.dev.make_engine(o));
    }
    groups[b] = std::make_unique<EngineGroup>(std::move(engines));
  }

  // Topology.
  std::printf("topology: %d NUMA node(s); %zu CPUs this process may use\n",
              probe::numa_nodes(), probe::allowed_cpus().size());
  EngineGroup& first = *groups.begin()->second;
  for (int i = 0; i < all; ++i) {
    Gpu& g = gpus[static_cast<std::size_t>(i)];
    const probe::Locality loc = probe::gpu_locality(g.dev);
    EngineGroup& gather = groups.count(Backend::kGather) ? *groups[Backend::kGather] : first;
    const EngineStats st = gather[static_cast<std::size_t>(i)].stats();
    std::printf("  GPU %d (%s): NUMA node %d, local CPUs %s | gather engine: CPUs %s, %d threads%s, ring on node %d\n",
                g.ordinal, host_only ? "emulated" : g.dev.pci_bus_id().c_str(), loc.numa_node,
                probe::format_cpulist(loc.cpus).c_str(), probe::format_cpulist(st.cpus).c_str(),
                st.gather_threads,
                st.cpu_sharing > 1 ? (", CPUs split with " + std::to_string(st.cpu_sharing - 1) + " other GPU(s)").c_str()
                                   : "",
                st.numa_node);
  }

  // Per-GPU memory, allocated by a thread on that GPU's engine CPUs (first touch: its node).
  std::size_t pool_bytes = flags.has("pool-bytes") ? parse_size(flags.get("pool-bytes"))
                                                   : std::max(8 * l3_bytes() / static_cast<std::size_t>(all), 32 * bytes);
  if (host_only) pool_bytes = std::min<std::size_t>(pool_bytes, std::size_t{512} << 20);
  first.run([&](std::size_t i, Engine&) {
    Gpu& g = gpus[i];
    g.stream = g.dev.create_stream();
    g.pool = std::make_unique<Pool>(pool_bytes);
    g.dev.register_host(g.pool->data, g.pool->bytes);
    void* p = nullptr;
    if (posix_memalign(&p, 1 << 21, bytes) != 0) throw std::bad_alloc();
    g.ref_src = static_cast<std::byte*>(p);
    std::memcpy(g.ref_src, g.pool->data, bytes);
    g.dev.register_host(g.ref_src, bytes);
    g.dst = static_cast<std::byte*>(g.dev.alloc_device(bytes));
    g.picker = std::make_unique<SourcePicker>(g.pool->bytes, size, 0xBEEF + 977 * i);
  });
  std::printf("each GPU: %zu x %s per repetition, sources %s, pool %s per GPU, 2x stride | %d reps after %d warm-up\n",
              n, format_size(size).c_str(), warm ? "warm" : "cold", format_size(pool_bytes).c_str(), iters, warmup);

  std::vector<Row> rows;
  std::map<std::string, double> one_gpu_aggregate;  // backend -> aggregate at G = 1
  int failures = 0;
  const auto start = Clock::now();
  for (int G : counts) {
    // Contiguous reference: each GPU alone, then all G at once.
    std::vector<double> alone(static_cast<std::size_t>(G));
    for (int i = 0; i < G; ++i) {
      Gpu& g = gpus[static_cast<std::size_t>(i)];
      g.dev.make_current();
      std::vector<double> us;
      for (int r = 0; r < warmup + iters; ++r) {
        const auto t0 = Clock::now();
        g.dev.copy_h2d(g.dst, g.ref_src, bytes, g.stream);
        g.dev.stream_sync(g.stream);
        if (r >= warmup) us.push_back(since_us(t0));
      }
      alone[static_cast<std::size_t>(i)] = bytes / (percentiles(us).p50 * 1e3);
    }
    // Runs `body(i, engine)` on the first G GPUs at once, repetitions aligned by a barrier;
    // returns each repetition's time per GPU.
    auto timed = [&](EngineGroup& group, const std::function<void(std::size_t, Engine&)>& body) {
      std::vector<std::vector<double>> us(static_cast<std::size_t>(warmup + iters), std::vector<double>(G));
      std::barrier sync(G);
      group.run([&](std::size_t i, Engine& e) {
        if (static_cast<int>(i) >= G) return;
        Gpu& g = gpus[i];
        if (warm) g.refill(n, size);
        for (int r = 0; r < warmup + iters; ++r) {
          if (!warm) g.refill(n, size);
          sync.arrive_and_wait();
          const auto t0 = Clock::now();
          body(i, e);
          us[static_cast<std::size_t>(r)][i] = since_us(t0);
        }
      });
      us.erase(us.begin(), us.begin() + warmup);
      return us;
    };
    auto slowest = [](const std::vector<std::vector<double>>& us) {
      std::vector<double> out;
      for (const auto& rep : us) out.push_back(*std::max_element(rep.begin(), rep.end()));
      return out;
    };
    auto summarize = [&](const std::string& name, const std::vector<std::vector<double>>& us,
                         const std::vector<double>& ref, double ref_aggregate, EngineGroup* group,
                         const std::vector<bool>& ok) {
      for (int i = 0; i < G; ++i) {
        std::vector<double> mine;
        for (const auto& rep : us) mine.push_back(rep[static_cast<std::size_t>(i)]);
        Row r;
        r.gpus = G;
        r.backend = name;
        r.gpu = std::to_string(gpus[static_cast<std::size_t>(i)].ordinal);
        r.us = percentiles(mine);
        r.gbps = bytes / (r.us.p50 * 1e3);
        r.ref_gbps = ref[static_cast<std::size_t>(i)];
        r.verified = ok[static_cast<std::size_t>(i)];
        if (group) {
          const EngineStats st = (*group)[static_cast<std::size_t>(i)].stats();
          r.threads = st.gather_threads;
          r.cpus = probe::format_cpulist(st.cpus);
        }
        rows.push_back(r);
      }
      Row a;  // the aggregate: all G GPUs' bytes over the slowest GPU's time, per repetition
      a.gpus = G;
      a.backend = name;
      a.gpu = "all";
      a.us = percentiles(slowest(us));
      a.gbps = static_cast<double>(G) * bytes / (a.us.p50 * 1e3);
      a.ref_gbps = ref_aggregate < 0 ? a.gbps : ref_aggregate;
      a.verified = std::all_of(ok.begin(), ok.begin() + G, [](bool b) { return b; });
      if (G == 1) one_gpu_aggregate[name] = a.gbps;
      if (one_gpu_aggregate.count(name)) a.efficiency = a.gbps / (G * one_gpu_aggregate[name]);
      rows.push_back(a);
      std::fprintf(stderr, "[%5.1fs] G=%d %-16s aggregate %8.2f GB/s%s%s\n", since_us(start) * 1e-6, G, name.c_str(),
                   a.gbps, a.efficiency >= 0 ? (" (" + std::to_string(static_cast<int>(100 * a.efficiency + 0.5)) + "% of G x 1 GPU)").c_str() : "",
                   a.verified ? "" : " VERIFY FAILED");
    };
    // All G contiguous DMAs at once: the aggregate line rate of this G.
    {
      const auto us = timed(first, [&](std::size_t i, Engine&) {
        Gpu& g = gpus[i];
        g.dev.copy_h2d(g.dst, g.ref_src, bytes, g.stream);
        g.dev.stream_sync(g.stream);
      });
      const double ref_aggregate = static_cast<double>(G) * bytes / (percentiles(slowest(us)).p50 * 1e3);
      summarize("contiguous", us, alone, -1, nullptr, std::vector<bool>(G, true));
      for (Backend b : backends) {
        EngineGroup& group = *groups[b];
        const auto t = timed(group, [&](std::size_t i, Engine& e) {
          Gpu& g = gpus[i];
          const Transfer t = e.copy_to_device(g.blocks, g.stream);
          g.dev.stream_sync(g.stream);
          t.wait();  // done with the stream; throws the transfer's error, if any
        });
        // Verify every GPU's bytes, outside the timed region.
        std::vector<bool> ok(G, true);
        group.run([&](std::size_t i, Engine& e) {
          if (static_cast<int>(i) >= G) return;
          Gpu& g = gpus[i];
          g.dev.memset_async(g.dst, 0, bytes, g.stream);
          g.refill(n, size);
          e.copy_to_device(g.blocks, g.stream).wait();
          std::vector<std::byte> back(bytes);
          g.dev.copy_d2h(back.data(), g.dst, bytes, g.stream);
          g.dev.stream_sync(g.stream);
          for (std::size_t k = 0; k < n && ok[i]; ++k)
            ok[i] = std::memcmp(back.data() + k * size, g.blocks[k].src, size) == 0;
        });
        for (bool v : ok) failures += v ? 0 : 1;
        summarize(to_string(b), t, alone, ref_aggregate, &group, ok);
      }
    }
  }

  std::printf("\n%-4s %-16s %-5s %9s %9s %9s %9s %7s %6s %-12s %s\n", "G", "backend", "gpu", "p50_us", "GB/s",
              "ref_GB/s", "ratio", "scaling", "thr", "cpus", "verified");
  for (const Row& r : rows) {
    char eff[16] = "-";
    if (r.efficiency >= 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * r.efficiency);
    std::printf("%-4d %-16s %-5s %9.1f %9.2f %9.2f %8.1f%% %7s %6d %-12s %s\n", r.gpus, r.backend.c_str(), r.gpu.c_str(),
                r.us.p50, r.gbps, r.ref_gbps, r.ref_gbps > 0 ? 100 * r.gbps / r.ref_gbps : 0, eff, r.threads,
                r.cpus.empty() ? "-" : r.cpus.c_str(), r.verified ? "yes" : "NO");
  }

  const std::string label = host_only ? "host-only" : "gpu";
  auto csv_cpus = [](std::string s) {
    std::replace(s.begin(), s.end(), ',', ' ');
    return s;
  };
  if (flags.has("csv")) {
    std::ofstream f(flags.get("csv"));
    f << "mode,sources,backend,gpus,gpu,blocks,block_size,p50_us,p90_us,p50_gbps,ref_gbps,scaling_efficiency,threads,cpus,"
         "verified\n";
    for (const Row& r : rows)
      f << label << ',' << (warm ? "warm" : "cold") << ',' << r.backend << ',' << r.gpus << ',' << r.gpu << ',' << n
        << ',' << size << ',' << r.us.p50 << ',' << r.us.p90 << ',' << r.gbps << ',' << r.ref_gbps << ','
        << (r.efficiency >= 0 ? std::to_string(r.efficiency) : "") << ',' << r.threads << ',' << csv_cpus(r.cpus) << ','
        << (r.verified ? 1 : 0) << '\n';
  }
  if (flags.has("json")) {
    std::ofstream f(flags.get("json"));
    f << "{\"mode\":\"" << label << "\",\"sources\":\"" << (warm ? "warm" : "cold") << "\",\"blocks\":" << n
      << ",\"block_size\":" << size << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << (i ? "," : "") << "{\"gpus\":" << r.gpus << ",\"backend\":\"" << r.backend << "\",\"gpu\":\"" << r.gpu
        << "\",\"p50_us\":" << r.us.p50 << ",\"p90_us\":" << r.us.p90 << ",\"p50_gbps\":" << r.gbps
        << ",\"ref_gbps\":" << r.ref_gbps << ",\"scaling_efficiency\":"
        << (r.efficiency >= 0 ? std::to_string(r.efficiency) : "null") << ",\"threads\":" << r.threads
        << ",\"cpus\":\"" << r.cpus << "\",\"verified\":" << (r.verified ? "true" : "false") << "}";
    }
    f << "]}\n";
  }

  first.run([&](std::size_t i, Engine&) {
    Gpu& g = gpus[i];
    g.dev.free_device(g.dst);
    g.dev.unregister_host(g.ref_src);
    free(g.ref_src);
    g.dev.unregister_host(g.pool->data);
    g.dev.destroy_stream(g.stream);
  });
  groups.clear();
  if (failures != 0) {
    std::fprintf(stderr, "%d GPU measurement(s) failed verification\n", failures);
    return 2;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gfd_multi_gpu_benchmark: %s\n", e.what());
  return 1;
}
