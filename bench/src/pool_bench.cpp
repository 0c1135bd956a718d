#include "pool_bench.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "trace_report.hpp"

namespace gfd::bench::pool {

using Clock = std::chrono::steady_clock;

Percentiles PoolBench::reference(std::size_t bytes) {
  std::vector<double> us;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = Clock::now();
    if (to_host)
      dev.copy_d2h(ref_src, dst, bytes, stream);
    else
      dev.copy_h2d(dst, ref_src, bytes, stream);
    dev.stream_sync(stream);
    if (i >= warmup) us.push_back(since_us(t0));
  }
  return percentiles(us);
}

PoolBench::Blocks PoolBench::make_blocks(std::size_t n, std::size_t size, std::size_t sets,
                                         std::uint64_t seed) {
  Blocks b{SourcePicker(pool->bytes(), size, seed + n * 31 + size, pitch, strided),
           std::mt19937_64(n ^ size), std::vector<std::size_t>(2 * n),
           std::vector<std::vector<BlockCopy>>(sets, std::vector<BlockCopy>(n))};
  std::iota(b.dst_pages.begin(), b.dst_pages.end(), 0);
  return b;
}

void PoolBench::refill(Blocks& b, std::size_t size, bool scattered) {
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

Transfer PoolBench::submit(Engine& engine, const std::vector<BlockCopy>& blocks) {
  return to_host ? engine.copy_to_host(blocks, stream) : engine.copy_to_device(blocks, stream);
}

bool PoolBench::verify(Engine& engine, Blocks& b, std::size_t size, bool scattered) {
  const std::size_t span = 2 * b.sets[0].size() * size;
  if (to_host)
    dev.copy_h2d(dst, ref_src, std::min(span, max_bytes), stream);
  else
    dev.memset_async(dst, 0, span, stream);
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

void PoolBench::time_transfers(BackendEngine& be, Blocks& b, std::size_t size, bool scattered,
                               std::vector<double>& us, std::vector<double>& submit_us,
                               double& cpu_s) {
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
  cpu_s = process_cpu_seconds() - cpu0;
}

Row PoolBench::measure(BackendEngine& be, std::size_t n, std::size_t size, const std::string& mode,
                       double ref_gbps) {
  const bool scattered = mode == "scattered";
  Blocks b = make_blocks(n, size, batch);
  refill(b, size, scattered);
  std::vector<double> us, submit_us;
  double cpu = 0;
  time_transfers(be, b, size, scattered, us, submit_us, cpu);
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
    if (batch == 1)
      print_trace(ev, us, n, size, mode, r.backend);
    else
      std::printf("trace: not with --batch (it needs one transfer per timed repetition)\n");
  }
  r.verified = verify(be.engine, b, size, scattered);
  if (!r.verified) {
    ++failures;
    std::fprintf(stderr,
                 "VERIFY FAILED: %s, %zu x %zu (%s destinations): data on the GPU differs\n",
                 r.backend.c_str(), n, size, mode.c_str());
  }
  return r;
}

double PoolBench::stage_only_gbps(std::size_t n, std::size_t size, bool& verified) {
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
    std::fprintf(stderr, "VERIFY FAILED: %s-only, %zu x %zu: staged bytes differ\n",
                 to_host ? "place" : "gather", n, size);
  }
  return gbps(n * size, percentiles(us).p50);
}

}  // namespace gfd::bench::pool
