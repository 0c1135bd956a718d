// copy2d_cost: what one constant-stride run costs the copy engine as 2D copies, with nothing
// around them (is a gap between the engine's constant-stride transfers, 2048 x 4 KB at a pitch
// of 2 blocks, and the contiguous DMA the 2D copy's or the engine's?). Needs a GPU.
//
// For each --rows count, rows of --width bytes at a host pitch of --pitch widths (pinned,
// cudaHostAlloc) to contiguous device memory (and back with --direction d2h), timed from the
// first enqueue to the synchronisation, P50 of --iters after 5 warm-up repetitions:
//   contiguous  one cudaMemcpyAsync of rows x width bytes (the benchmarks' line rate)
//   2d/K        the rows as K cudaMemcpy2DAsync of rows/K each, on K streams (K = 1: the caller's
//               stream; K > 1 joined back to it by events)
// Each repetition starts at another row (cold: a fresh start in a host area of --host bytes).
//
// Then vLLM 0.33's shape: --layers per-layer caches in ONE device allocation (layer l
// of block g at l x layer pitch + g x width, the LBHNC layout its offloading connector asks
// for), a job of --blocks random blocks, each a host row of every layer's page side by side
// (gfd's block layout, rows at random in the host area), each --widths size:
//   contiguous  one cudaMemcpyAsync of the job's bytes
//   batch       one cudaMemcpyBatchAsync of a descriptor per (block, layer) (vLLM's path)
//   2d/K        a cudaMemcpy2DAsync per block (layers rows at the layer pitch), over K streams
//   3dbatch     one cudaMemcpy3DBatchAsync of an op per block (the same 2D shapes)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "micro_cuda.hpp"

namespace {

using gfd::micro::check;

const std::map<std::string, std::string> kFlags = {
    {"rows", "=LIST         row counts (default 2048,16384)"},
    {"width", "=S           bytes per row (default 4K)"},
    {"pitch", "=K           host pitch in widths (default 2)"},
    {"splits", "=LIST       stream counts the rows are split over (default 1,2,4)"},
    {"direction", "=D       h2d or d2h (default h2d)"},
    {"host", "=S            pinned host area the rows start in at random (default 1G)"},
    {"iters", "=N           timed repetitions (default 30)"},
    {"layers", "=N          per-layer caches of the vLLM shape (default 64; 0: skip it)"},
    {"blocks", "=N          blocks per job of the vLLM shape (default 64)"},
    {"widths", "=LIST       page bytes of the vLLM shape (default 8K,32K)"},
    {"dev-blocks", "=N      blocks per layer cache on the device (default 2048)"},
    {"help", "              this text"},
};

// vLLM 0.33's shape: see the top. True when the last repetition of every variant moved the bytes.
bool vllm_shape(const gfd::bench::Flags& flags, std::byte* host, std::size_t host_bytes,
                bool to_host, std::size_t layers, const std::vector<cudaStream_t>& streams,
                const std::vector<cudaEvent_t>& events, int iters) {
  const auto nblocks = static_cast<std::size_t>(flags.get_int("blocks", 64));
  const auto dev_blocks = static_cast<std::size_t>(flags.get_int("dev-blocks", 2048));
  const std::vector<std::size_t> widths = flags.get_sizes("widths", {8 << 10, 32 << 10});
  if (nblocks == 0 || dev_blocks < nblocks)
    throw std::invalid_argument("--blocks > 0, --dev-blocks >= --blocks");
  std::size_t max_w = 0;
  for (std::size_t w : widths) max_w = std::max(max_w, w);
  if (max_w * layers * nblocks > host_bytes)
    throw std::invalid_argument("the vLLM shape needs a larger --host");
  std::byte* dev = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&dev), layers * dev_blocks * max_w),
        "cudaMalloc layer caches");
  std::byte* ref = nullptr;  // the contiguous DMA's device side
  check(cudaMalloc(reinterpret_cast<void**>(&ref), layers * nblocks * max_w), "cudaMalloc");
  std::mt19937_64 rng(11);
  const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  cudaStream_t caller = streams[0];
  bool ok = true;
  std::printf(
      "\nvLLM 0.33 shape: %zu layer caches in one allocation (%zu blocks each), %zu blocks per "
      "job, %s\n",
      layers, dev_blocks, nblocks, to_host ? "device to host" : "host to device");
  std::printf("(layer pitch %s at the largest page)\n",
              gfd::bench::format_size(dev_blocks * max_w).c_str());
  std::printf("%7s %-11s %9s %8s %8s\n", "page", "variant", "us", "GB/s", "ratio");
  for (std::size_t w : widths) {
    const std::size_t row = layers * w, pitch = dev_blocks * w, host_rows = host_bytes / row;
    std::vector<std::size_t> g(dev_blocks), h(host_rows);
    std::vector<void*> dsts(nblocks * layers);
    std::vector<const void*> srcs(nblocks * layers);
    std::vector<std::size_t> sizes(nblocks * layers, w);
    std::vector<cudaMemcpy3DBatchOp> ops(nblocks);
    std::vector<cudaMemcpyAttributes> attrs(1);
    attrs[0].srcAccessOrder =
        to_host ? cudaMemcpySrcAccessOrderStream : cudaMemcpySrcAccessOrderAny;
    std::vector<std::size_t> attr_idx(1, 0);
    std::iota(g.begin(), g.end(), 0);
    std::iota(h.begin(), h.end(), 0);
    auto once = [&](const std::string& v, std::size_t k) {
      std::shuffle(g.begin(), g.end(), rng);
      std::shuffle(h.begin(), h.end(), rng);
      for (std::size_t b = 0; b < nblocks; ++b)
        for (std::size_t l = 0; l < layers; ++l) {
          std::byte* d = dev + l * pitch + g[b] * w;
          std::byte* hp = host + h[b] * row + l * w;
          dsts[b * layers + l] = to_host ? static_cast<void*>(hp) : d;
          srcs[b * layers + l] = to_host ? static_cast<const void*>(d) : hp;
        }
      const auto t0 = std::chrono::steady_clock::now();
      if (v == "contiguous") {
        std::byte* hp = host + h[0] * row;
        if (h[0] + nblocks > host_rows) hp = host;
        check(to_host ? cudaMemcpyAsync(hp, ref, nblocks * row, kind, caller)
                      : cudaMemcpyAsync(ref, hp, nblocks * row, kind, caller),
              "cudaMemcpyAsync");
      } else if (v == "batch") {
        check(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(),
                                   attrs.data(), attr_idx.data(), 1, caller),
              "cudaMemcpyBatchAsync");
      } else if (v == "2d") {
        if (k > 1) check(cudaEventRecord(events[0], caller), "cudaEventRecord");
        for (std::size_t p = 1; p < k; ++p)
          check(cudaStreamWaitEvent(streams[p], events[0], 0), "cudaStreamWaitEvent");
        for (std::size_t b = 0; b < nblocks; ++b) {
          const std::size_t dp = to_host ? w : pitch, sp = to_host ? pitch : w;
          check(cudaMemcpy2DAsync(dsts[b * layers], dp, srcs[b * layers], sp, w, layers, kind,
                                  streams[b % k]),
                "cudaMemcpy2DAsync");
        }
        for (std::size_t p = 1; p < k; ++p) {
          check(cudaEventRecord(events[p], streams[p]), "cudaEventRecord");
          check(cudaStreamWaitEvent(caller, events[p], 0), "cudaStreamWaitEvent");
        }
      } else {  // 3dbatch
        for (std::size_t b = 0; b < nblocks; ++b) {
          cudaMemcpy3DBatchOp& op = ops[b];
          op = cudaMemcpy3DBatchOp{};
          op.src.type = cudaMemcpyOperandTypePointer;
          op.src.op.ptr.ptr = const_cast<void*>(srcs[b * layers]);
          op.src.op.ptr.rowLength = to_host ? pitch : w;
          op.dst.type = cudaMemcpyOperandTypePointer;
          op.dst.op.ptr.ptr = dsts[b * layers];
          op.dst.op.ptr.rowLength = to_host ? w : pitch;
          op.extent = make_cudaExtent(w, layers, 1);
          op.srcAccessOrder =
              to_host ? cudaMemcpySrcAccessOrderStream : cudaMemcpySrcAccessOrderAny;
        }
        check(cudaMemcpy3DBatchAsync(ops.size(), ops.data(), 0, caller), "cudaMemcpy3DBatchAsync");
      }
      check(cudaStreamSynchronize(caller), "cudaStreamSynchronize");
      return gfd::bench::since_us(t0);
    };
    // Whether the last repetition moved every page to its place.
    auto verify = [&]() {
      std::vector<std::byte> a(w), b(w);
      for (std::size_t i = 0; i < dsts.size(); i += 7) {
        check(cudaMemcpy(a.data(), srcs[i], w, cudaMemcpyDefault), "cudaMemcpy");
        check(cudaMemcpy(b.data(), dsts[i], w, cudaMemcpyDefault), "cudaMemcpy");
        if (std::memcmp(a.data(), b.data(), w) != 0) return false;
      }
      return true;
    };
    const double bytes = static_cast<double>(nblocks * row);
    double ref_us = 0;
    const std::vector<std::pair<std::string, std::size_t>> variants = {
        {"contiguous", 1}, {"batch", 1}, {"2d", 1}, {"2d", 2}, {"3dbatch", 1}};
    for (const auto& [v, k] : variants) {
      const std::string name = v == "2d" ? "2d/" + std::to_string(k) : v;
      std::vector<double> us;
      try {
        for (int i = 0; i < 5 + iters; ++i) {
          const double t = once(v, k);
          if (i >= 5) us.push_back(t);
        }
      } catch (const std::exception& e) {  // a pitch the call refuses, say: the next variant
        std::printf("%7s %-11s refused: %s\n", gfd::bench::format_size(w).c_str(), name.c_str(),
                    e.what());
        (void)cudaGetLastError();
        check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        continue;
      }
      const double t = gfd::bench::percentiles(us).p50;
      if (v == "contiguous") ref_us = t;
      const bool good = v == "contiguous" || verify();
      ok = ok && good;
      std::printf("%7s %-11s %9.1f %8.2f %7.1f%%%s\n", gfd::bench::format_size(w).c_str(),
                  name.c_str(), t, bytes / (t * 1e3), 100.0 * ref_us / t,
                  good ? "" : "  WRONG BYTES");
    }
  }
  check(cudaFree(dev), "cudaFree");
  check(cudaFree(ref), "cudaFree");
  return ok;
}

int run_main(int argc, char** argv) {
  gfd::bench::Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("copy2d_cost", flags, kFlags)) return 0;
  const std::vector<std::size_t> rows_list = flags.get_sizes("rows", {2048, 16384});
  const std::size_t width = gfd::bench::parse_size(flags.get("width", "4K"));
  const std::size_t pitch = width * static_cast<std::size_t>(flags.get_int("pitch", 2));
  const std::vector<std::size_t> splits = flags.get_sizes("splits", {1, 2, 4});
  const bool to_host = flags.get("direction", "h2d") == "d2h";
  const std::size_t host_bytes = gfd::bench::parse_size(flags.get("host", "1G"));
  const int iters = static_cast<int>(flags.get_int("iters", 30));
  std::size_t max_rows = 0;
  for (std::size_t r : rows_list) max_rows = std::max(max_rows, r);
  if (width == 0 || pitch < width || iters < 1 || max_rows * pitch > host_bytes)
    throw std::invalid_argument("--width > 0, --pitch >= 1, --iters >= 1, rows x pitch <= --host");
  for (std::size_t k : splits)
    if (k == 0 || k > 8) throw std::invalid_argument("--splits: each between 1 and 8");

  check(cudaSetDevice(0), "cudaSetDevice");
  std::byte* host = nullptr;
  std::byte* dev = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&host), host_bytes, cudaHostAllocDefault),
        "cudaHostAlloc");
  gfd::bench::fill_random(host, host_bytes);
  check(cudaMalloc(reinterpret_cast<void**>(&dev), max_rows * width), "cudaMalloc");
  std::vector<cudaStream_t> streams(8);
  for (cudaStream_t& s : streams)
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<cudaEvent_t> events(9);
  for (cudaEvent_t& e : events)
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  std::mt19937_64 rng(7);

  // One repetition; k == 0: the contiguous DMA.
  auto once = [&](std::size_t rows, std::size_t k) {
    const std::size_t start =
        std::uniform_int_distribution<std::size_t>(0, (host_bytes - rows * pitch) / width)(rng);
    std::byte* h = host + start * width;
    const auto t0 = std::chrono::steady_clock::now();
    cudaStream_t caller = streams[0];
    if (k == 0) {
      if (to_host)
        check(cudaMemcpyAsync(h, dev, rows * width, cudaMemcpyDeviceToHost, caller),
              "cudaMemcpyAsync");
      else
        check(cudaMemcpyAsync(dev, h, rows * width, cudaMemcpyHostToDevice, caller),
              "cudaMemcpyAsync");
    } else {
      if (k > 1) check(cudaEventRecord(events[0], caller), "cudaEventRecord");
      for (std::size_t p = 0; p < k; ++p) {
        const std::size_t r0 = rows * p / k, r1 = rows * (p + 1) / k;
        cudaStream_t s = streams[p];
        if (p > 0) check(cudaStreamWaitEvent(s, events[0], 0), "cudaStreamWaitEvent");
        if (to_host)
          check(cudaMemcpy2DAsync(h + r0 * pitch, pitch, dev + r0 * width, width, width, r1 - r0,
                                  cudaMemcpyDeviceToHost, s),
                "cudaMemcpy2DAsync");
        else
          check(cudaMemcpy2DAsync(dev + r0 * width, width, h + r0 * pitch, pitch, width, r1 - r0,
                                  cudaMemcpyHostToDevice, s),
                "cudaMemcpy2DAsync");
      }
      for (std::size_t p = 1; p < k; ++p) {
        check(cudaEventRecord(events[p], streams[p]), "cudaEventRecord");
        check(cudaStreamWaitEvent(caller, events[p], 0), "cudaStreamWaitEvent");
      }
    }
    check(cudaStreamSynchronize(caller), "cudaStreamSynchronize");
    return gfd::bench::since_us(t0);
  };
  auto p50 = [&](std::size_t rows, std::size_t k) {
    std::vector<double> us;
    for (int i = 0; i < 5 + iters; ++i) {
      const double t = once(rows, k);
      if (i >= 5) us.push_back(t);
    }
    return gfd::bench::percentiles(us).p50;
  };

  std::printf("copy2d_cost: %s rows at a host pitch of %zu B, %s, P50 of %d, call to sync\n",
              gfd::bench::format_size(width).c_str(), pitch,
              to_host ? "device to host" : "host to device", iters);
  std::printf("%7s %-11s %9s %8s %8s\n", "rows", "variant", "us", "GB/s", "ratio");
  for (std::size_t rows : rows_list) {
    const double ref = p50(rows, 0);
    const double bytes = static_cast<double>(rows * width);
    std::printf("%7zu %-11s %9.1f %8.2f %7.1f%%\n", rows, "contiguous", ref, bytes / (ref * 1e3),
                100.0);
    for (std::size_t k : splits) {
      const double t = p50(rows, k);
      const std::string name = "2d/" + std::to_string(k);
      std::printf("%7zu %-11s %9.1f %8.2f %7.1f%%\n", rows, name.c_str(), t, bytes / (t * 1e3),
                  100.0 * ref / t);
    }
  }
  // The data: the last 2D copy of the first row count, checked row by row.
  const std::size_t rows = rows_list.front();
  std::vector<std::byte> back(rows * width);
  if (to_host) {
    check(cudaMemcpy2D(host, pitch, dev, width, width, rows, cudaMemcpyDeviceToHost),
          "cudaMemcpy2D");
    check(cudaMemcpy(back.data(), dev, rows * width, cudaMemcpyDeviceToHost), "cudaMemcpy");
  } else {
    check(cudaMemcpy2D(dev, width, host, pitch, width, rows, cudaMemcpyHostToDevice),
          "cudaMemcpy2D");
    check(cudaMemcpy(back.data(), dev, rows * width, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  bool ok = true;
  for (std::size_t r = 0; r < rows && ok; ++r)
    ok = std::memcmp(back.data() + r * width, host + r * pitch, width) == 0;
  std::printf("verified %s (strided rows)\n", ok ? "yes" : "NO");
  const auto layers = static_cast<std::size_t>(flags.get_int("layers", 64));
  if (layers > 0)
    ok = vllm_shape(flags, host, host_bytes, to_host, layers, streams, events, iters) && ok;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("copy2d_cost", [&] { return run_main(argc, argv); });
}
