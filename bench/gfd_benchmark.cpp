// gfd_benchmark: scattered host blocks -> GPU, gfd's engine against the contiguous pinned DMA
// of the same bytes measured in the same run. Cold sources by default (fresh random blocks of a
// pool several times the L3 each repetition); --warm reuses the same blocks.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "device.hpp"
#include "emulated_device.hpp"
#include "engine_core.hpp"
#include "topology.hpp"
#include "gfd/gfd.hpp"

namespace {

using namespace gfd;
using namespace gfd::bench;
using Clock = std::chrono::steady_clock;

const std::map<std::string, std::string> kFlags = {
    {"blocks", "=N[,N...]   block counts (default sweep 16..16384 at 4K)"},
    {"block-sizes", "=S[,S...] block sizes, e.g. 512,4K,64K (default sweep 512..256K at N=2048)"},
    {"iters", "=N          timed repetitions per configuration (default 30, at least 20)"},
    {"warmup", "=N         untimed repetitions first (default 5)"},
    {"warm", "             reuse the same source blocks every repetition (default: cold)"},
    {"dst", "=MODE         contiguous | scattered | both (default both)"},
    {"device", "=N         CUDA device (default 0)"},
    {"pool-bytes", "=S     source pool size (default max(8 x L3, 32 x largest transfer))"},
    {"csv", "=FILE         write results as CSV"},
    {"json", "=FILE        write results as JSON"},
    {"quick", "            a short grid: 2048 x 4K only"},
    {"batch", "=K          submit K transfers back to back per repetition, one sync (default 1)"},
    {"help", "             this text"},
};

struct Row {
  std::size_t n, size;
  std::string dst, method;
  Percentiles us;
  double gbps = 0, ratio = 0, ref_gbps = 0, cpu_s_per_gb = 0, submit_us = 0;
  int threads = 0;
  bool verified = false;
};

struct Ctx {
  std::shared_ptr<detail::Device> dev;
  detail::StreamHandle stream = nullptr;
  bool host_only = false;
  int iters = 30, warmup = 5;
  bool warm = false;
};

double gbps(std::size_t bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0; }

// Times `fn` (which must return only when the data is on the device): warm-up, then iters.
template <class Prepare, class Run>
std::vector<double> time_it(const Ctx& c, Prepare&& prepare, Run&& run) {
  std::vector<double> us;
  for (int i = 0; i < c.warmup + c.iters; ++i) {
    prepare(i);
    const auto t0 = Clock::now();
    run();
    const double t = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (i >= c.warmup) us.push_back(t);
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) try {
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_benchmark: scattered host-to-GPU block copies, gfd vs the contiguous DMA\n"
              << Flags::usage(kFlags);
    return 0;
  }
  Ctx c;
  c.iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 30)));
  c.warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 5)));
  c.warm = flags.has("warm");
  const std::size_t batch = static_cast<std::size_t>(std::max<long long>(1, flags.get_int("batch", 1)));
  const int device = static_cast<int>(flags.get_int("device", 0));
  const std::string dst_mode = flags.get("dst", "both");
  if (dst_mode != "contiguous" && dst_mode != "scattered" && dst_mode != "both")
    throw std::invalid_argument("--dst must be contiguous, scattered or both");

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
  std::size_t max_bytes = 0;
  for (auto [n, s] : grid) max_bytes = std::max(max_bytes, n * s);

  if (detail::cuda_device_count() == 0) {
    c.host_only = true;
    std::printf("No CUDA GPU is visible here: measuring the host side only (gather threads into the\n"
                "real staging ring; the emulated device's 'DMA' is a host memcpy). These figures are\n"
                "labelled host-only and say nothing about PCIe.\n");
    c.dev = std::make_shared<detail::EmulatedDevice>(0);
  } else {
    c.dev = detail::make_cuda_device(device);
  }
  detail::Device& d = *c.dev;
  d.make_current();
  c.stream = d.create_stream();

  EngineOptions eo = EngineOptions::from_env();
  eo.device = d.ordinal();
  Engine engine = detail::EngineCore::make_engine(eo, c.dev);
  const EngineStats st0 = engine.stats();

  const long phys = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGE_SIZE);
  std::size_t pool_bytes = flags.has("pool-bytes")
                               ? parse_size(flags.get("pool-bytes"))
                               : std::max(8 * l3_bytes(), 32 * max_bytes);
  if (c.host_only) pool_bytes = std::min(pool_bytes, static_cast<std::size_t>(phys / 4));
  pool_bytes = std::min(pool_bytes, static_cast<std::size_t>(phys / 2));
  std::printf("device: %s | engine: %d gather threads on CPUs %s, NUMA node %d, ring %s in %s slots, "
              "hugepages %s, %d copy streams\n",
              c.host_only ? "emulated (host-only)" : ("CUDA " + std::to_string(d.ordinal())).c_str(),
              st0.gather_threads, detail::format_cpulist(st0.cpus).c_str(), st0.numa_node,
              format_size(st0.staging_bytes).c_str(), format_size(st0.slot_bytes).c_str(),
              to_string(st0.hugepages), eo.copy_streams);
  std::printf("sources: %s, pool %s (L3 %s), 2x block stride | %d timed reps after %d warm-up\n",
              c.warm ? "warm (same blocks every rep)" : "cold (fresh random blocks every rep)",
              format_size(pool_bytes).c_str(), format_size(l3_bytes()).c_str(), c.iters, c.warmup);

  Pool pool(pool_bytes);
  d.register_host(pool.data, pool.bytes);  // pinned, as a serving runtime's KV pool is
  std::vector<std::byte> ref_init(max_bytes);
  std::byte* ref_src = nullptr;
  {
    // Contiguous pinned source for the reference DMA.
    void* p = nullptr;
    if (posix_memalign(&p, 1 << 21, max_bytes) != 0) throw std::bad_alloc();
    ref_src = static_cast<std::byte*>(p);
    std::memcpy(ref_src, pool.data, max_bytes);
    d.register_host(ref_src, max_bytes);
  }
  auto* dst = static_cast<std::byte*>(d.alloc_device(2 * max_bytes));

  std::vector<Row> rows;
  std::vector<std::string> dst_modes;
  if (dst_mode != "scattered") dst_modes.push_back("contiguous");
  if (dst_mode != "contiguous") dst_modes.push_back("scattered");
  const std::size_t total = grid.size() * dst_modes.size();
  std::size_t done = 0;
  int failures = 0;

  for (auto [n, size] : grid) {
    const std::size_t bytes = n * size;
    // Reference: one contiguous pinned DMA of the same bytes, timed the same way.
    const auto ref_us = percentiles(time_it(c, [](int) {}, [&] {
      d.copy_h2d(dst, ref_src, bytes, c.stream);
      d.stream_sync(c.stream);
    }));
    const double ref_gbps = gbps(bytes, ref_us.p50);
    for (const std::string& mode : dst_modes) {
      ++done;
      std::fprintf(stderr, "[%zu/%zu] %zu x %s, %s destinations ...\n", done, total, n,
                   format_size(size).c_str(), mode.c_str());
      SourcePicker picker(pool.bytes, size, 0xC0FFEE + n * 31 + size);
      std::mt19937_64 rng(n ^ size);
      std::vector<std::size_t> dst_pages(2 * n);
      std::iota(dst_pages.begin(), dst_pages.end(), 0);
      std::vector<std::vector<BlockCopy>> sets(batch, std::vector<BlockCopy>(n));
      auto build = [&](bool fresh) {
        if (!fresh) return;
        for (auto& blocks : sets) {
          const auto src = picker.pick(n);
          if (mode == "scattered") std::shuffle(dst_pages.begin(), dst_pages.end(), rng);
          for (std::size_t i = 0; i < n; ++i)
            blocks[i] = {pool.data + src[i], dst + (mode == "scattered" ? dst_pages[i] : i) * size, size};
        }
      };
      build(true);
      const std::vector<BlockCopy>& blocks = sets.back();
      std::vector<double> submit_us;
      const double cpu0 = process_cpu_seconds();
      auto us = time_it(c, [&](int i) { build(!c.warm || i == 0); }, [&] {
        const auto t0 = Clock::now();
        for (const auto& set : sets) engine.copy_to_device(set, static_cast<cudaStream_t>(c.stream));
        submit_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / batch);
        d.stream_sync(c.stream);  // the stream waits for the transfers: the data is on the GPU
      });
      for (double& u : us) u /= static_cast<double>(batch);
      const double cpu = process_cpu_seconds() - cpu0;
      // Verify every byte of the last repetition, outside the timed region.
      Row r{n, size, mode, "gather", percentiles(us)};
      r.submit_us = percentiles(std::vector<double>(submit_us.begin() + c.warmup, submit_us.end())).p50;
      bool ok = true;
      {
        std::vector<std::byte> back(2 * bytes);
        d.copy_d2h(back.data(), dst, 2 * bytes, c.stream);
        d.stream_sync(c.stream);
        for (std::size_t i = 0; i < n && ok; ++i)
          ok = std::memcmp(back.data() + (static_cast<std::byte*>(blocks[i].dst) - dst), blocks[i].src, size) == 0;
      }
      if (!ok) {
        ++failures;
        std::fprintf(stderr, "VERIFY FAILED: %zu x %zu (%s destinations): data on the GPU differs\n", n, size,
                     mode.c_str());
      }
      r.verified = ok;
      r.gbps = gbps(bytes, r.us.p50);
      r.ref_gbps = ref_gbps;
      r.ratio = ref_gbps > 0 ? r.gbps / ref_gbps : 0;
      r.threads = engine.stats().gather_threads;
      r.cpu_s_per_gb = cpu / (static_cast<double>(bytes) * batch * (c.warmup + c.iters) * 1e-9);
      rows.push_back(r);
    }
  }

  if (batch > 1) std::printf("\n(%zu transfers back to back per repetition; times are per transfer)", batch);
  std::printf("\n%-7s %-6s %-10s %-8s %9s %9s %9s %9s %7s %8s %9s %s\n", "blocks", "size", "dst", "method",
              "p50_us", "p90_us", "GB/s", "ref_GB/s", "ratio", "cpu_s/GB", "submit_us", "verified");
  for (const Row& r : rows)
    std::printf("%-7zu %-6s %-10s %-8s %9.1f %9.1f %9.2f %9.2f %6.1f%% %8.3f %9.1f %s\n", r.n,
                format_size(r.size).c_str(), r.dst.c_str(), r.method.c_str(), r.us.p50, r.us.p90, r.gbps,
                r.ref_gbps, 100 * r.ratio, r.cpu_s_per_gb, r.submit_us, r.verified ? "yes" : "NO");
  const EngineStats st = engine.stats();
  std::printf("engine: %llu transfers, %llu chunks (%llu scattered), gather %.3f s CPU, DMA %.3f s, "
              "planning %.3f s, submit waited %.3f s%s\n",
              (unsigned long long)st.transfers, (unsigned long long)st.chunks,
              (unsigned long long)st.scattered_chunks, st.gather_seconds, st.dma_seconds,
              st.plan_seconds, st.submit_wait_seconds, c.host_only ? " [host-only]" : "");

  const std::string label = c.host_only ? "host-only" : "gpu";
  if (flags.has("csv")) {
    std::ofstream f(flags.get("csv"));
    f << "mode,sources,blocks,block_size,dst,method,p50_us,p90_us,gbps,ref_gbps,ratio,cpu_s_per_gb,threads,verified\n";
    for (const Row& r : rows)
      f << label << ',' << (c.warm ? "warm" : "cold") << ',' << r.n << ',' << r.size << ',' << r.dst << ','
        << r.method << ',' << r.us.p50 << ',' << r.us.p90 << ',' << r.gbps << ',' << r.ref_gbps << ','
        << r.ratio << ',' << r.cpu_s_per_gb << ',' << r.threads << ',' << (r.verified ? 1 : 0) << '\n';
  }
  if (flags.has("json")) {
    std::ofstream f(flags.get("json"));
    f << "{\"mode\":\"" << label << "\",\"sources\":\"" << (c.warm ? "warm" : "cold") << "\",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      f << (i ? "," : "") << "{\"blocks\":" << r.n << ",\"block_size\":" << r.size << ",\"dst\":\"" << r.dst
        << "\",\"method\":\"" << r.method << "\",\"p50_us\":" << r.us.p50 << ",\"p90_us\":" << r.us.p90
        << ",\"gbps\":" << r.gbps << ",\"ref_gbps\":" << r.ref_gbps << ",\"ratio\":" << r.ratio
        << ",\"cpu_s_per_gb\":" << r.cpu_s_per_gb << ",\"threads\":" << r.threads
        << ",\"verified\":" << (r.verified ? "true" : "false") << "}";
    }
    f << "]}\n";
  }

  d.free_device(dst);
  d.unregister_host(ref_src);
  free(ref_src);
  d.unregister_host(pool.data);
  d.destroy_stream(c.stream);
  if (failures != 0) {
    std::fprintf(stderr, "%d configuration(s) failed verification\n", failures);
    return 2;
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "gfd_benchmark: %s\n", e.what());
  return 1;
}
