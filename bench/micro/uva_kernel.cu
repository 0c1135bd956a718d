// uva_kernel: SM kernels that read scattered pinned host blocks through unified addressing, with
// nothing around them, as a yardstick for the zero_copy_kernel backend (on an H200 a plain
// kernel of this kind moved 89% of the line rate). Needs a GPU.
//
// N blocks of S bytes are picked cold (fresh random blocks at a 2x stride from a cudaHostAlloc
// pool of --pool-bytes, default 8 x L3, each repetition) and moved to contiguous device memory.
// Each repetition is timed from writing the block list (into pinned memory) to the stream's
// synchronisation; P50 of --iters after 5 warm-up repetitions; ratio to one contiguous pinned
// cudaMemcpyAsync of the same bytes in the same run. Every variant's last transfer is verified.
// Variants:
//   flat      one thread per 16 bytes; the list of source pointers uploaded to device memory
//             (cudaMemcpyAsync) before the kernel
//   flat_host the same kernel reading the list straight from pinned host memory
//   gfd       gfd's zero-copy kernel (src/device/kernels.cu) on gfd's entries in pinned host
//   memory,
//             as the zero_copy_kernel backend runs it (planning left out)
//   gfd_dev   gfd's zero-copy kernel on entries uploaded to device memory first
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "device/kernels.cuh"
#include "micro_cuda.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using gfd::detail::ZeroCopyEntry;
using gfd::micro::check;

const std::map<std::string, std::string> kFlags = {
    {"blocks", "=N          blocks per transfer (default 2048)"},
    {"block-size", "=S      block size, a multiple of 16 (default 4K)"},
    {"iters", "=N           timed repetitions (default 30)"},
    {"pool-bytes", "=S      source pool (default 8 x L3)"},
    {"variants", "=LIST     comma list of flat, flat_host, gfd, gfd_dev (default all)"},
    {"help", "              this text"},
};

// One thread per 16 bytes of the transfer: thread t copies 16-byte word t % words of block
// t / words (`words` = block size / 16) to the same place of the contiguous destination.
__global__ void flat_kernel(const std::uint64_t* __restrict__ src, std::uint64_t words,
                            std::uint64_t total, uint4* __restrict__ dst) {
  const std::uint64_t t = std::uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const std::uint64_t block = t / words;
  dst[t] = reinterpret_cast<const uint4*>(src[block])[t - block * words];
}

int run_main(int argc, char** argv) {
  gfd::bench::Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("uva_kernel", flags, kFlags)) return 0;
  const std::size_t n = static_cast<std::size_t>(flags.get_int("blocks", 2048));
  const std::size_t bs = gfd::bench::parse_size(flags.get("block-size", "4K"));
  const int iters = static_cast<int>(flags.get_int("iters", 30));
  if (n == 0 || bs == 0 || bs % 16 != 0 || iters < 1)
    throw std::invalid_argument("--blocks >= 1, --block-size a multiple of 16, --iters >= 1");
  std::vector<std::string> variants;
  for (const std::string& v : flags.get_list("variants", "flat,flat_host,gfd,gfd_dev"))
    if (!v.empty()) variants.push_back(v);
  const std::size_t bytes = n * bs;
  const std::size_t pool_bytes = flags.has("pool-bytes")
                                     ? gfd::bench::parse_size(flags.get("pool-bytes"))
                                     : std::max(8 * gfd::bench::l3_bytes(), 4 * bytes);
  check(cudaSetDevice(0), "cudaSetDevice");
  check(gfd::detail::preload_kernels(), "preload_kernels");
  std::byte* pool = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&pool), pool_bytes, cudaHostAllocDefault),
        "cudaHostAlloc pool");
  gfd::bench::fill_random(pool, pool_bytes);
  std::byte* ref_src = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&ref_src), bytes, cudaHostAllocDefault),
        "cudaHostAlloc reference");
  std::memset(ref_src, 1, bytes);
  std::byte* dst = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&dst), bytes), "cudaMalloc");
  const std::size_t list_bytes = n * sizeof(ZeroCopyEntry);
  void* host_list = nullptr;
  void* dev_list = nullptr;
  check(cudaHostAlloc(&host_list, list_bytes, cudaHostAllocDefault), "cudaHostAlloc list");
  check(cudaMalloc(&dev_list, list_bytes), "cudaMalloc list");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  const double ref = gfd::micro::contiguous_dma_gbps(dst, ref_src, bytes, stream, iters);
  std::printf("uva_kernel: %zu x %zu cold, pool %.1f GB; contiguous DMA %.2f GB/s\n", n, bs,
              pool_bytes * 1e-9, ref);

  gfd::bench::SourcePicker picker(pool_bytes, bs, 0xC0FFEE);
  std::vector<std::size_t> src;
  int bad_variants = 0;
  for (const std::string& v : variants) {
    const bool flat = v == "flat" || v == "flat_host";
    const bool upload = v == "flat" || v == "gfd_dev";
    if (!flat && v != "gfd" && v != "gfd_dev")
      throw std::invalid_argument("--variants: unknown variant " + v);
    std::vector<double> us;
    for (int i = 0; i < 5 + iters; ++i) {
      src = picker.pick(n);
      const auto t0 = Clock::now();
      if (flat) {
        auto* l = static_cast<std::uint64_t*>(host_list);
        for (std::size_t k = 0; k < n; ++k) l[k] = reinterpret_cast<std::uint64_t>(pool + src[k]);
      } else {
        auto* l = static_cast<ZeroCopyEntry*>(host_list);
        for (std::size_t k = 0; k < n; ++k)
          l[k] = {reinterpret_cast<std::uint64_t>(pool + src[k]),
                  reinterpret_cast<std::uint64_t>(dst + k * bs), bs};
      }
      if (upload)
        check(cudaMemcpyAsync(dev_list, host_list, flat ? n * 8 : list_bytes,
                              cudaMemcpyHostToDevice, stream),
              "cudaMemcpyAsync list");
      const void* list = upload ? dev_list : host_list;
      if (flat) {
        const std::uint64_t total = bytes / 16;
        const auto grid = static_cast<unsigned>((total + 255) / 256);
        flat_kernel<<<grid, 256, 0, stream>>>(static_cast<const std::uint64_t*>(list), bs / 16,
                                              total, reinterpret_cast<uint4*>(dst));
        check(cudaGetLastError(), "flat_kernel");
      } else {
        check(gfd::detail::launch_zero_copy(static_cast<const ZeroCopyEntry*>(list),
                                            static_cast<std::uint32_t>(n), stream),
              "launch_zero_copy");
      }
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      if (i >= 5) us.push_back(gfd::bench::since_us(t0));
    }
    std::vector<std::byte> back(bytes);
    check(cudaMemcpy(back.data(), dst, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    std::size_t bad = 0;
    for (std::size_t k = 0; k < n; ++k)
      bad += std::memcmp(back.data() + k * bs, pool + src[k], bs) != 0;
    bad_variants += bad != 0;
    const auto p = gfd::bench::percentiles(us);
    std::printf("%-10s p50 %8.1f us %7.2f GB/s ratio %5.1f%% | p90 %8.1f us | verified %s\n",
                v.c_str(), p.p50, bytes / (p.p50 * 1e3), 100.0 * bytes / (p.p50 * 1e3) / ref, p.p90,
                bad == 0 ? "yes" : "NO");
    check(cudaMemset(dst, 0, bytes), "cudaMemset");
  }
  return bad_variants == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("uva_kernel", [&] { return run_main(argc, argv); });
}
