// batch_cost: what cudaMemcpyBatchAsync costs its caller a copy, in the shape of a runtime's
// per-layer loads (SGLang HiCache's: a call per layer and K/V part, each page its own copy, all
// queued on one stream), and whether the attributes change it. Needs a GPU.
//
// For each --pages size, --calls calls of --per random pages each (pinned host memory from
// cudaHostAlloc to device memory, or back with --direction d2h; every page a distinct slot on
// both sides), on one non-blocking stream, variants:
//   per_copy_hints  one cudaMemcpyAttributes per copy with location hints (gfd's call)
//   one_hints       one attribute entry for every copy, with location hints
//   per_copy_plain  one attribute per copy, no location hints
//   one_plain       one attribute entry, no location hints
//   one_any_order   one attribute entry, hints, sources read in any order
//   memcpy          a cudaMemcpyAsync per copy
// Timings, P50 of --iters after 3 warm-up repetitions: "caller", from the first call to the
// return of the last (the time the calling thread is held), with the first call alone beside it;
// "gpu", from an event before the first call to one after the last. The last repetition's pages
// are compared (every 97th).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "micro_cuda.hpp"

namespace {

using gfd::micro::check;

const std::map<std::string, std::string> kFlags = {
    {"pages", "=LIST        page bytes (default 128K,72K,8K)"},
    {"calls", "=N           calls per batch (default 64: K and V of 32 layers)"},
    {"per", "=N             copies per call (default 64)"},
    {"direction", "=D       h2d or d2h (default h2d)"},
    {"iters", "=N           timed repetitions (default 10)"},
    {"help", "              this text"},
};

const char* const kVariants[] = {"per_copy_hints", "one_hints",     "per_copy_plain",
                                 "one_plain",      "one_any_order", "memcpy"};

bool measure(std::size_t page, std::size_t calls, std::size_t per, bool to_host, int iters) {
  const std::size_t n = calls * per;
  std::byte* host = nullptr;
  std::byte* dev = nullptr;
  check(cudaHostAlloc(&host, n * page, 0), "cudaHostAlloc");
  check(cudaMalloc(&dev, n * page), "cudaMalloc");
  std::mt19937 rng(1);
  std::vector<unsigned char> fill(n * page);
  for (auto& b : fill) b = static_cast<unsigned char>(rng());
  std::memcpy(host, fill.data(), fill.size());
  check(cudaMemcpy(dev, host, n * page, cudaMemcpyHostToDevice), "cudaMemcpy");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");

  std::vector<std::size_t> h(n), d(n);
  std::iota(h.begin(), h.end(), 0);
  std::iota(d.begin(), d.end(), 0);
  std::vector<void*> dsts(n);
  std::vector<const void*> srcs(n);
  std::vector<std::size_t> sizes(per, page);  // the calls take non-const arrays
  const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;

  cudaMemcpyAttributes hints{};
  hints.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  hints.srcLocHint.type = to_host ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
  hints.dstLocHint.type = to_host ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  cudaMemcpyAttributes plain{};
  plain.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  cudaMemcpyAttributes any_order = hints;
  any_order.srcAccessOrder = cudaMemcpySrcAccessOrderAny;
  std::vector<cudaMemcpyAttributes> hints_each(per, hints), plain_each(per, plain);
  std::vector<std::size_t> idx(per);
  std::iota(idx.begin(), idx.end(), 0);
  std::size_t zero = 0;

  bool ok = true;
  for (std::size_t v = 0; v < std::size(kVariants); ++v) {
    std::vector<double> caller, first, gpu;
    for (int it = 0; it < 3 + iters; ++it) {
      std::shuffle(h.begin(), h.end(), rng);
      std::shuffle(d.begin(), d.end(), rng);
      for (std::size_t i = 0; i < n; ++i) {
        std::byte* hp = host + h[i] * page;
        std::byte* dp = dev + d[i] * page;
        dsts[i] = to_host ? static_cast<void*>(hp) : dp;
        srcs[i] = to_host ? static_cast<const void*>(dp) : hp;
      }
      check(cudaEventRecord(e0, s), "cudaEventRecord");
      const auto t0 = std::chrono::steady_clock::now();
      double first_us = 0;
      for (std::size_t c = 0; c < calls; ++c) {
        void** dd = dsts.data() + c * per;
        const void** ss = srcs.data() + c * per;
        std::size_t* sz = sizes.data();
        switch (v) {
          case 0:
            check(cudaMemcpyBatchAsync(dd, ss, sz, per, hints_each.data(), idx.data(), per, s),
                  "batch");
            break;
          case 1:
            check(cudaMemcpyBatchAsync(dd, ss, sz, per, &hints, &zero, 1, s), "batch");
            break;
          case 2:
            check(cudaMemcpyBatchAsync(dd, ss, sz, per, plain_each.data(), idx.data(), per, s),
                  "batch");
            break;
          case 3:
            check(cudaMemcpyBatchAsync(dd, ss, sz, per, &plain, &zero, 1, s), "batch");
            break;
          case 4:
            check(cudaMemcpyBatchAsync(dd, ss, sz, per, &any_order, &zero, 1, s), "batch");
            break;
          default:
            for (std::size_t i = 0; i < per; ++i)
              check(cudaMemcpyAsync(dd[i], ss[i], page, kind, s), "cudaMemcpyAsync");
        }
        if (c == 0) first_us = gfd::bench::since_us(t0);
      }
      const double held = gfd::bench::since_us(t0);
      check(cudaEventRecord(e1, s), "cudaEventRecord");
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (it >= 3) {
        caller.push_back(held);
        first.push_back(first_us);
        gpu.push_back(ms * 1e3);
      }
    }
    std::vector<std::byte> a(page), b(page);
    bool good = true;
    for (std::size_t i = 0; i < n && good; i += 97) {
      check(cudaMemcpy(a.data(), srcs[i], page, cudaMemcpyDefault), "cudaMemcpy");
      check(cudaMemcpy(b.data(), dsts[i], page, cudaMemcpyDefault), "cudaMemcpy");
      good = std::memcmp(a.data(), b.data(), page) == 0;
    }
    ok = ok && good;
    const double c50 = gfd::bench::percentiles(caller).p50, g50 = gfd::bench::percentiles(gpu).p50;
    std::printf(
        "%6s %s %5zu copies %-15s caller %8.1f us (%.2f us a copy) first call %6.1f us  gpu %8.1f "
        "us "
        "%5.1f GB/s%s\n",
        gfd::bench::format_size(page).c_str(), to_host ? "d2h" : "h2d", n, kVariants[v], c50,
        c50 / n, gfd::bench::percentiles(first).p50, g50,
        static_cast<double>(n * page) / (g50 * 1e3), good ? "" : "  WRONG BYTES");
  }
  check(cudaEventDestroy(e0), "cudaEventDestroy");
  check(cudaEventDestroy(e1), "cudaEventDestroy");
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  check(cudaFree(dev), "cudaFree");
  check(cudaFreeHost(host), "cudaFreeHost");
  return ok;
}

int run_main(int argc, char** argv) {
  gfd::bench::Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("batch_cost", flags, kFlags)) return 0;
  const auto calls = static_cast<std::size_t>(flags.get_int("calls", 64));
  const auto per = static_cast<std::size_t>(flags.get_int("per", 64));
  const int iters = static_cast<int>(flags.get_int("iters", 10));
  const bool to_host = flags.get("direction", "h2d") == "d2h";
  if (calls == 0 || per == 0 || iters < 1)
    throw std::invalid_argument("--calls, --per and --iters: at least 1");
  check(cudaSetDevice(0), "cudaSetDevice");
  bool ok = true;
  for (std::size_t page : flags.get_sizes("pages", {128 << 10, 72 << 10, 8 << 10}))
    ok = measure(page, calls, per, to_host, iters) && ok;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("batch_cost", [&] { return run_main(argc, argv); });
}
