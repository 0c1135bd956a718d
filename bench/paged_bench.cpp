#include "paged_bench.hpp"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"
#include "peer_kernels.cuh"
#include "testkit/testkit.hpp"
#include "trace_report.hpp"

namespace gfd::bench {
namespace {

using Clock = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(call) + ": " + cudaGetErrorString(e) + " (" + file + ":" +
                             std::to_string(line) + ")");
}

void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(call) + ": " + cublasGetStatusString(s) + " (" + file +
                             ":" + std::to_string(line) + ")");
}

#define GFD_BENCH_CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)
#define GFD_BENCH_CUBLAS(call) cublas_check((call), #call, __FILE__, __LINE__)

const std::map<std::string, std::string> kFlags = {
    {"layout", "=L          paged (this one, the default) or pool (the source-pool benchmark)"},
    {"layers", "=N          layers L: 2L caches (K and V) on each side (default 32; --quick 8)"},
    {"blocks", "=N[,N...]   blocks per transfer (default sweep 16,64,256,1024,4096 at 4K)"},
    {"block-sizes", "=S[,S...] bytes of one block of one cache (default sweep 2K..2M at N=64)"},
    {"host-cache-bytes", "=S  pinned host caches, all 2L together (default 4G; host-only 256M)"},
    {"device-cache-bytes",
     "=S cap on device memory: caches + reference (default 40G, at most\n"
     "                   70% of the free memory; host-only 1G)"},
    {"max-transfer",
     "=S    cap on the bytes of one transfer, N x 2L x block (default 1G;\n"
     "                   host-only 64M): larger grid points get fewer blocks"},
    {"direction", "=D       h2d (loads), d2h (stores) or both (default both)"},
    {"methods",
     "=M[,M...]  gfd, gfd_zero_copy, batch, per_block, uva2, uva12 (default all; the\n"
     "                   contiguous DMA is always measured)"},
    {"iters", "=N           timed repetitions per configuration (default 20, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 3)"},
    {"warm", "              reuse the same block ids every repetition (default: fresh ids)"},
    {"device", "=N          CUDA device (default 0)"},
    {"csv", "=FILE          write results as CSV"},
    {"quick", "             one configuration: 4K x 64 blocks x 8 layers"},
    {"trace", "             print the engine's timeline of gfd's median transfer per configuration"},
    {"under-load",
     "[=decode]  also measure while bf16 matmuls run back to back on a stream of\n"
     "                   the transfers' priority (GPU only)"},
    {"help", "              this text"},
};

enum class Method { kDma, kGfd, kGfdZeroCopy, kBatch, kPerBlock, kUva2, kUva12 };
constexpr Method kMethods[] = {Method::kGfd,      Method::kGfdZeroCopy, Method::kBatch,
                               Method::kPerBlock, Method::kUva2,        Method::kUva12};

const char* method_name(Method m) {
  switch (m) {
    case Method::kDma:
      return "dma_contiguous";
    case Method::kGfd:
      return "gfd";
    case Method::kGfdZeroCopy:
      return "gfd_zero_copy";
    case Method::kBatch:
      return "batch";
    case Method::kPerBlock:
      return "per_block";
    case Method::kUva2:
      return "uva2";
    case Method::kUva12:
      return "uva12";
  }
  return "?";
}

std::vector<Method> methods_flag(const Flags& flags) {
  if (!flags.has("methods")) return {std::begin(kMethods), std::end(kMethods)};
  std::vector<Method> out;
  for (const std::string& name : flags.get_list("methods")) {
    const Method* hit = nullptr;
    for (const Method& m : kMethods)
      if (name == method_name(m)) hit = &m;
    if (hit == nullptr)
      throw std::invalid_argument("--methods: '" + name +
                                  "' is not a method (gfd, gfd_zero_copy, "
                                  "batch, per_block, uva2, uva12)");
    if (std::find(out.begin(), out.end(), *hit) == out.end()) out.push_back(*hit);
  }
  return out;
}

// Tags of the fill patterns: a host cache and a device cache never hold the same bytes, so a
// copy that moved the wrong side (or nothing) cannot pass.
std::uint64_t host_tag(std::size_t tensor) { return tensor; }
std::uint64_t device_tag(std::size_t tensor) { return 0x10000 + tensor; }

// Runs fn(i) for every i in [0, n) on up to 16 threads.
template <class F>
void parallel_for(std::size_t n, F fn) {
  const std::size_t threads =
      std::min<std::size_t>(n, std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> ts;
  for (std::size_t t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  for (auto& t : ts) t.join();
}

// One grid point: blocks of `size` bytes, `n` per transfer (after the caps), and how many
// blocks each host and each device cache holds at that size.
struct Config {
  std::size_t size = 0, n = 0, requested = 0, host_blocks = 0, gpu_blocks = 0;
};

struct Row {
  std::string direction, method, load = "none";
  std::size_t size = 0, n = 0, bytes = 0, host_blocks = 0, gpu_blocks = 0, reps = 0;
  Percentiles us;
  double submit_us = 0, ref_gbps = 0;
  double kept = -1;      // under load: P50 GB/s / the same method's idle P50; -1: none
  double slowdown = -1;  // under load: mean matmul time during the transfers / alone - 1
  int verified = -1;     // 1 yes, 0 failed, -1 not checked (the contiguous DMA)
  double p50_gbps() const { return us.p50 > 0 ? bytes / (us.p50 * 1e3) : 0; }
  double p90_gbps() const { return us.p90 > 0 ? bytes / (us.p90 * 1e3) : 0; }  // the slow tail
};

// The 2L cache pairs and the contiguous reference buffers, allocated once for the whole run at
// the largest size any grid point needs; each point views them as arrays of its block size.
// On the GPU: each host cache its own cudaHostAlloc and each device cache its own cudaMalloc,
// as a runtime allocates one tensor per layer and side. Host-only: the emulated device's memory
// and mmaps registered with it (pinned as far as the engine is concerned).
class Caches {
 public:
  Caches(testkit::Device& dev, std::size_t tensors, std::size_t host_bytes, std::size_t device_bytes,
         std::size_t ref_bytes)
      : host_bytes(host_bytes), device_bytes(device_bytes), ref_bytes(ref_bytes), dev_(dev) {
    try {
      for (std::size_t t = 0; t < tensors; ++t) {
        host.push_back(alloc_host(host_bytes));
        device.push_back(static_cast<std::byte*>(alloc_device(device_bytes)));
      }
      ref_host = alloc_host(ref_bytes);
      ref_device = static_cast<std::byte*>(alloc_device(ref_bytes));
    } catch (...) {
      release();
      throw;
    }
  }
  ~Caches() { release(); }
  Caches(const Caches&) = delete;
  Caches& operator=(const Caches&) = delete;

  std::vector<std::byte*> host, device;
  std::size_t host_bytes, device_bytes;  // of one cache
  std::byte* ref_host = nullptr;
  std::byte* ref_device = nullptr;
  std::size_t ref_bytes;

 private:
  std::byte* alloc_host(std::size_t bytes) {
    if (!dev_.emulated()) {
      void* p = nullptr;
      // Default flags, as PyTorch's pinned allocator (and so vLLM's host caches) calls it.
      GFD_BENCH_CUDA(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
      host_owned_.push_back({p, bytes});
      return static_cast<std::byte*>(p);
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of " + format_size(bytes) + " failed");
    host_owned_.push_back({p, bytes});
    dev_.register_host(p, bytes);
    return static_cast<std::byte*>(p);
  }
  void* alloc_device(std::size_t bytes) {
    void* p = nullptr;
    if (dev_.emulated()) {
      p = dev_.alloc_device(bytes);
    } else {
      GFD_BENCH_CUDA(cudaMalloc(&p, bytes));
    }
    device_owned_.push_back(p);
    return p;
  }
  void release() noexcept {
    for (auto [p, bytes] : host_owned_) {
      if (!dev_.emulated()) {
        (void)cudaFreeHost(p);
        continue;
      }
      try {
        dev_.unregister_host(p);
      } catch (...) {
      }
      munmap(p, bytes);
    }
    for (void* p : device_owned_) {
      if (!dev_.emulated()) {
        (void)cudaFree(p);
        continue;
      }
      try {
        dev_.free_device(p);
      } catch (...) {
      }
    }
    host_owned_.clear();
    device_owned_.clear();
  }

  testkit::Device& dev_;
  std::vector<std::pair<void*, std::size_t>> host_owned_;
  std::vector<void*> device_owned_;
};

// Block ids of one repetition: a swap-in moves host block host[i] to device block device[i] of
// every pair, a swap-out device block device[i] to host block host[i].
struct Ids {
  std::vector<std::int64_t> host, device;
};

// The ids of successive repetitions: n distinct host ids and n distinct device ids, fresh every
// call (cold) or the first draw every call (warm). Seeded by the grid point alone, so that every
// method of a point moves the same blocks in the same order.
class IdStream {
 public:
  IdStream(const Config& c, bool warm)
      : rng_(0xC0FFEE ^ (c.size * 1315423911u) ^ (c.n << 20)),
        n_(c.n),
        warm_(warm),
        host_seen_(c.host_blocks, 0),
        device_seen_(c.gpu_blocks, 0) {}
  const Ids& next() {
    if (warm_ && drawn_) return ids_;
    ++stamp_;
    draw(ids_.host, host_seen_);
    draw(ids_.device, device_seen_);
    drawn_ = true;
    return ids_;
  }

 private:
  void draw(std::vector<std::int64_t>& out, std::vector<std::uint32_t>& seen) {
    std::uniform_int_distribution<std::int64_t> pick(0, static_cast<std::int64_t>(seen.size()) - 1);
    out.clear();
    while (out.size() < n_) {
      const std::int64_t id = pick(rng_);
      if (seen[id] == stamp_) continue;
      seen[id] = stamp_;
      out.push_back(id);
    }
  }
  std::mt19937_64 rng_;
  std::size_t n_;
  bool warm_, drawn_ = false;
  std::vector<std::uint32_t> host_seen_, device_seen_;  // the stamp of the draw that took an id
  std::uint32_t stamp_ = 0;
  Ids ids_;
};

// One method's calls for one repetition: `prepare` (untimed) builds what the call needs from the
// ids, `submit` is the call a runtime's thread makes (its return ends the submit time), `finish`
// waits until every byte is in place.
struct Ops {
  std::function<void(const Ids&)> prepare;
  std::function<void()> submit;
  std::function<void()> finish;
};

// --under-load=decode: 4096^3 bf16 matmuls (cuBLAS, ~0.2 ms each on an H200) back to back on a
// stream of its own, enqueued by a thread of its own in batches bracketed by CUDA events, so
// that the mean matmul time of the batches that ran wholly inside a window can be read off.
class DecodeLoad {
 public:
  static constexpr int kDim = 4096;
  static constexpr int kPerBatch = 10;  // ~2 ms batches
  static constexpr int kRing = 4;       // batches queued ahead at most

  DecodeLoad(int device, int priority) : device_(device) {
    GFD_BENCH_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
    // Blocking sync: the load's thread sleeps on its events instead of taking a CPU core from
    // the gather threads.
    GFD_BENCH_CUDA(cudaEventCreateWithFlags(&origin_, cudaEventBlockingSync));
    for (int i = 0; i < kRing; ++i) {
      GFD_BENCH_CUDA(cudaEventCreateWithFlags(&begin_[i], cudaEventBlockingSync));
      GFD_BENCH_CUDA(cudaEventCreateWithFlags(&end_[i], cudaEventBlockingSync));
    }
    const std::size_t elems = std::size_t{kDim} * kDim;
    // Random bf16 operands in [-1, 1): tensor-core power (and so clocks) depends on the data.
    std::vector<std::uint16_t> host(elems);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (auto& h : host) {
      const float f = u(rng);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &f, 4);
      h = static_cast<std::uint16_t>(bits >> 16);
    }
    for (void** m : {&a_, &b_, &c_}) {
      GFD_BENCH_CUDA(cudaMalloc(m, elems * 2));
      GFD_BENCH_CUDA(cudaMemcpy(*m, host.data(), elems * 2, cudaMemcpyHostToDevice));
    }
    GFD_BENCH_CUBLAS(cublasCreate(&handle_));
    GFD_BENCH_CUBLAS(cublasSetStream(handle_, stream_));
    // A first matmul now: it loads cuBLAS's kernels (a lazy module load synchronises the
    // context, which must not happen while an engine's stream waits on a host flag).
    gemm();
    GFD_BENCH_CUDA(cudaStreamSynchronize(stream_));
  }
  ~DecodeLoad() {
    stop_thread();
    if (handle_ != nullptr) (void)cublasDestroy(handle_);
    for (void* m : {a_, b_, c_}) (void)cudaFree(m);
    (void)cudaEventDestroy(origin_);
    for (int i = 0; i < kRing; ++i) {
      (void)cudaEventDestroy(begin_[i]);
      (void)cudaEventDestroy(end_[i]);
    }
    (void)cudaStreamDestroy(stream_);
  }
  DecodeLoad(const DecodeLoad&) = delete;
  DecodeLoad& operator=(const DecodeLoad&) = delete;

  // Starts enqueuing matmuls back to back.
  void start() {
    batches_.clear();
    error_ = nullptr;
    stop_ = false;
    GFD_BENCH_CUDA(cudaEventRecord(origin_, stream_));
    thread_ = std::thread([this] { loop(); });
  }

  // Stops the load; the mean milliseconds of one matmul over the batches that ran wholly between
  // the events `from` and `to` (recorded on any stream of the device), or -1 for none.
  double stop(cudaEvent_t from, cudaEvent_t to) {
    stop_thread();
    if (error_) std::rethrow_exception(error_);
    GFD_BENCH_CUDA(cudaEventSynchronize(from));
    GFD_BENCH_CUDA(cudaEventSynchronize(to));
    const double t0 = elapsed(origin_, from), t1 = elapsed(origin_, to);
    double sum = 0;
    std::size_t count = 0;
    for (auto [a, z] : batches_)
      if (a >= t0 && z <= t1) sum += z - a, ++count;
    return count ? sum / (count * kPerBatch) : -1;
  }

  // Stops the load without reading it (on an error).
  void halt() noexcept { stop_thread(); }

  // The mean matmul time with nothing else running, over `window_ms` (events on `marker`).
  double alone(cudaStream_t marker, cudaEvent_t from, cudaEvent_t to, double window_ms) {
    start();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the first batch
    GFD_BENCH_CUDA(cudaEventRecord(from, marker));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(window_ms));
    GFD_BENCH_CUDA(cudaEventRecord(to, marker));
    return stop(from, to);
  }

 private:
  void gemm() {
    const float alpha = 1.f, beta = 0.f;
    GFD_BENCH_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, kDim, kDim, kDim, &alpha, a_,
                                  CUDA_R_16BF, kDim, b_, CUDA_R_16BF, kDim, &beta, c_, CUDA_R_16BF,
                                  kDim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  static double elapsed(cudaEvent_t a, cudaEvent_t z) {
    float ms = 0;
    GFD_BENCH_CUDA(cudaEventElapsedTime(&ms, a, z));
    return ms;
  }
  void collect(int slot) {
    GFD_BENCH_CUDA(cudaEventSynchronize(end_[slot]));
    batches_.push_back({elapsed(origin_, begin_[slot]), elapsed(origin_, end_[slot])});
  }
  void loop() noexcept {
    std::size_t k = 0;
    try {
      GFD_BENCH_CUDA(cudaSetDevice(device_));
      for (; !stop_.load(std::memory_order_relaxed); ++k) {
        const int slot = static_cast<int>(k % kRing);
        if (k >= kRing) collect(slot);  // its batch of kRing rounds ago is done: reuse its events
        GFD_BENCH_CUDA(cudaEventRecord(begin_[slot], stream_));
        for (int i = 0; i < kPerBatch; ++i) gemm();
        GFD_BENCH_CUDA(cudaEventRecord(end_[slot], stream_));
      }
      for (std::size_t j = k > kRing ? k - kRing : 0; j < k; ++j)
        collect(static_cast<int>(j % kRing));
    } catch (...) {
      error_ = std::current_exception();
      (void)cudaStreamSynchronize(stream_);
    }
  }
  void stop_thread() noexcept {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void* a_ = nullptr;
  void* b_ = nullptr;
  void* c_ = nullptr;
  cudaEvent_t origin_ = nullptr;
  cudaEvent_t begin_[kRing] = {};
  cudaEvent_t end_[kRing] = {};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::vector<std::pair<double, double>> batches_;  // ms from origin_; read after the join
  std::exception_ptr error_;
};

class PagedBench {
 public:
  testkit::Device dev;
  bool host_only = false, warm = false;
  int iters = 20, warmup = 3, stream_priority = 0;
  std::size_t tensors = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Caches> caches;  // before the engines: they go first
  std::optional<Engine> gfd, zero_copy;
  bool trace = false;  // --trace: the engine's timeline of gfd's median transfer (idle runs)
  CacheSet gfd_set, zero_copy_set;
  std::unique_ptr<DecodeLoad> load;
  cudaEvent_t window_from = nullptr, window_to = nullptr;
  int failures = 0;

  ~PagedBench() {
    load.reset();
    gfd_set = CacheSet();
    zero_copy_set = CacheSet();
    gfd.reset();
    zero_copy.reset();
    if (!host_only) {
      (void)cudaFreeHost(scratch_host_);
      (void)cudaFree(scratch_device_);
      (void)cudaFreeHost(mismatches_host_);
      (void)cudaFree(mismatches_device_);
      if (window_from != nullptr) (void)cudaEventDestroy(window_from);
      if (window_to != nullptr) (void)cudaEventDestroy(window_to);
    }
    if (stream != nullptr) {
      if (host_only)
        dev.destroy_stream(stream);
      else
        (void)cudaStreamDestroy(stream);
    }
    caches.reset();
  }

  // The descriptor lists' pinned and device buffers, for transfers of up to `entries` copies.
  void make_scratch(std::size_t entries) {
    lists_.reserve(entries);
    if (host_only) return;
    scratch_bytes_ = entries * sizeof(PatternCheck);
    static_assert(sizeof(PatternCheck) >= sizeof(PeerCopy));
    GFD_BENCH_CUDA(cudaHostAlloc(&scratch_host_, scratch_bytes_, cudaHostAllocDefault));
    GFD_BENCH_CUDA(cudaMalloc(&scratch_device_, scratch_bytes_));
    GFD_BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&mismatches_host_), 8, 0));
    GFD_BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&mismatches_device_), 8));
    GFD_BENCH_CUDA(cudaEventCreate(&window_from));
    GFD_BENCH_CUDA(cudaEventCreate(&window_to));
  }

  // Every host cache holds its host pattern (word i of cache t: pattern_word(host_tag(t), i)).
  void fill_host_caches() {
    constexpr std::size_t kChunk = std::size_t{8} << 20;
    const std::size_t chunks = (caches->host_bytes + kChunk - 1) / kChunk;
    parallel_for(tensors * chunks, [&](std::size_t i) {
      const std::size_t t = i / chunks, lo = (i % chunks) * kChunk;
      const std::size_t hi = std::min(caches->host_bytes, lo + kChunk);
      auto* w = reinterpret_cast<std::uint64_t*>(caches->host[t]);
      for (std::size_t k = lo / 8; k < hi / 8; ++k) w[k] = pattern_word(host_tag(t), k);
    });
  }

  // Every device cache holds its device pattern (before the stores are measured).
  void fill_device_caches() {
    const std::size_t words = caches->device_bytes / 8;
    if (!host_only) {
      for (std::size_t t = 0; t < tensors; ++t)
        GFD_BENCH_CUDA(launch_fill_pattern(reinterpret_cast<std::uint64_t*>(caches->device[t]),
                                           words, 0, device_tag(t), stream));
      GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
      return;
    }
    std::vector<std::uint64_t> buf(std::size_t{1} << 17);
    for (std::size_t t = 0; t < tensors; ++t)
      for (std::size_t lo = 0; lo < words; lo += buf.size()) {
        const std::size_t n = std::min(buf.size(), words - lo);
        for (std::size_t k = 0; k < n; ++k) buf[k] = pattern_word(device_tag(t), lo + k);
        dev.copy_h2d(caches->device[t] + lo * 8, buf.data(), n * 8, stream);
        dev.stream_sync(stream);
      }
  }

  // Registers this grid point's views of the caches with the engines.
  void register_caches(const Config& c) {
    std::vector<CachePair> pairs(tensors);
    for (std::size_t t = 0; t < tensors; ++t) {
      pairs[t].host = BlockArray{caches->host[t], c.host_blocks, c.size, c.size};
      pairs[t].device = BlockArray{caches->device[t], c.gpu_blocks, c.size, c.size};
    }
    if (gfd) gfd_set = gfd->register_caches(pairs);
    if (zero_copy) zero_copy_set = zero_copy->register_caches(pairs);
  }

  Ops make_ops(Method m, const Config& c, bool to_host) {
    Ops ops;
    const std::size_t bytes = c.n * tensors * c.size;
    ops.finish = [this] { sync(); };
    switch (m) {
      case Method::kDma:
        ops.prepare = [](const Ids&) {};
        ops.submit = [this, bytes, to_host] {
          if (to_host)
            dev.copy_d2h(caches->ref_host, caches->ref_device, bytes, stream);
          else
            dev.copy_h2d(caches->ref_device, caches->ref_host, bytes, stream);
        };
        break;
      case Method::kGfd:
      case Method::kGfdZeroCopy: {
        Engine* engine = m == Method::kGfd ? &*gfd : &*zero_copy;
        const CacheSet* set = m == Method::kGfd ? &gfd_set : &zero_copy_set;
        ops.prepare = [this](const Ids& ids) { ids_ = &ids; };
        ops.submit = [this, engine, set, to_host] {
          // The runtime's call: ids only (swap-in: host ids are the sources).
          pending_ = to_host ? engine->copy_blocks(*set, Direction::kToHost, ids_->device,
                                                   ids_->host, stream)
                             : engine->copy_blocks(*set, Direction::kToDevice, ids_->host,
                                                   ids_->device, stream);
        };
        // To the host the handle says when the bytes are placed; to the device the stream.
        ops.finish = [this] {
          pending_.wait();
          sync();
          pending_ = Transfer();
        };
        break;
      }
      case Method::kBatch:
        ops.prepare = [this, &c, to_host](const Ids& ids) { build_lists(c, to_host, ids); };
        ops.submit = [this, to_host] {
          cudaMemcpyAttributes attr{};
          // Loads: no earlier stream work writes the host caches (vLLM's choice), so the
          // driver may read them in any order; stores must see earlier device work.
          attr.srcAccessOrder =
              to_host ? cudaMemcpySrcAccessOrderStream : cudaMemcpySrcAccessOrderAny;
          attr.srcLocHint.type = to_host ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
          attr.srcLocHint.id = to_host ? dev.ordinal() : 0;
          attr.dstLocHint.type = to_host ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
          attr.dstLocHint.id = to_host ? 0 : dev.ordinal();
          std::size_t attr_index = 0;
          GFD_BENCH_CUDA(cudaMemcpyBatchAsync(lists_.dsts.data(), lists_.srcs.data(),
                                              lists_.sizes.data(), lists_.dsts.size(), &attr,
                                              &attr_index, 1, stream));
        };
        break;
      case Method::kPerBlock:
        ops.prepare = [this, &c, to_host](const Ids& ids) { build_lists(c, to_host, ids); };
        ops.submit = [this, to_host] {
          const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
          for (std::size_t i = 0; i < lists_.dsts.size(); ++i)
            GFD_BENCH_CUDA(
                cudaMemcpyAsync(lists_.dsts[i], lists_.srcs[i], lists_.sizes[i], kind, stream));
        };
        break;
      case Method::kUva2:
      case Method::kUva12: {
        const int ctas = m == Method::kUva2 ? 2 : 12;
        // The descriptors go to device memory before the timer starts: the kernel alone is timed.
        ops.prepare = [this, &c, to_host](const Ids& ids) {
          build_lists(c, to_host, ids);
          auto* d = reinterpret_cast<PeerCopy*>(scratch_host_);
          for (std::size_t i = 0; i < lists_.dsts.size(); ++i)
            d[i] = PeerCopy{lists_.srcs[i], lists_.dsts[i], lists_.sizes[i]};
          GFD_BENCH_CUDA(cudaMemcpyAsync(scratch_device_, scratch_host_,
                                         lists_.dsts.size() * sizeof(PeerCopy),
                                         cudaMemcpyHostToDevice, stream));
          GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
        };
        ops.submit = [this, ctas] {
          GFD_BENCH_CUDA(launch_uva_copy(static_cast<const PeerCopy*>(scratch_device_),
                                         static_cast<std::uint32_t>(lists_.dsts.size()), ctas,
                                         stream));
        };
        break;
      }
    }
    return ops;
  }

  // Destinations of `ids` poisoned (zero), for the check after one more transfer.
  void poison(const Config& c, bool to_host, const Ids& ids) {
    if (to_host) {
      parallel_for(tensors, [&](std::size_t t) {
        for (std::int64_t h : ids.host) std::memset(caches->host[t] + h * c.size, 0, c.size);
      });
      return;
    }
    for (std::size_t t = 0; t < tensors; ++t)
      dev.memset_async(caches->device[t], 0, caches->device_bytes, stream);
    dev.stream_sync(stream);
  }

  // Whether every destination block of `ids` holds its source block's pattern.
  bool check(const Config& c, bool to_host, const Ids& ids) {
    const std::size_t words = c.size / 8;
    std::atomic<std::uint64_t> bad{0};
    if (to_host) {
      parallel_for(tensors, [&](std::size_t t) {
        std::uint64_t b = 0;
        for (std::size_t i = 0; i < c.n; ++i) {
          const auto* w =
              reinterpret_cast<const std::uint64_t*>(caches->host[t] + ids.host[i] * c.size);
          const std::uint64_t first = static_cast<std::uint64_t>(ids.device[i]) * words;
          for (std::size_t k = 0; k < words; ++k)
            b += w[k] != pattern_word(device_tag(t), first + k);
        }
        bad += b;
      });
      return bad == 0;
    }
    if (host_only) {
      std::vector<std::uint64_t> back(words);
      for (std::size_t t = 0; t < tensors; ++t)
        for (std::size_t i = 0; i < c.n; ++i) {
          dev.copy_d2h(back.data(), caches->device[t] + ids.device[i] * c.size, c.size, stream);
          dev.stream_sync(stream);
          const std::uint64_t first = static_cast<std::uint64_t>(ids.host[i]) * words;
          for (std::size_t k = 0; k < words; ++k)
            bad += back[k] != pattern_word(host_tag(t), first + k);
        }
      return bad == 0;
    }
    // On the GPU: a kernel compares the device blocks in place (no copy back of 2L caches).
    auto* checks = reinterpret_cast<PatternCheck*>(scratch_host_);
    std::size_t k = 0;
    for (std::size_t t = 0; t < tensors; ++t)
      for (std::size_t i = 0; i < c.n; ++i)
        checks[k++] = PatternCheck{
            reinterpret_cast<const std::uint64_t*>(caches->device[t] + ids.device[i] * c.size),
            words, static_cast<std::uint64_t>(ids.host[i]) * words, host_tag(t)};
    GFD_BENCH_CUDA(cudaMemcpyAsync(scratch_device_, scratch_host_, k * sizeof(PatternCheck),
                                   cudaMemcpyHostToDevice, stream));
    GFD_BENCH_CUDA(cudaMemsetAsync(mismatches_device_, 0, 8, stream));
    GFD_BENCH_CUDA(launch_check_pattern(static_cast<const PatternCheck*>(scratch_device_),
                                        static_cast<std::uint32_t>(k), mismatches_device_, stream));
    GFD_BENCH_CUDA(
        cudaMemcpyAsync(mismatches_host_, mismatches_device_, 8, cudaMemcpyDeviceToHost, stream));
    GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
    return *mismatches_host_ == 0;
  }

  // One method on one grid point: `warmup` untimed repetitions, then timed ones until at least
  // `iters` and `min_ms` (under load: the window the matmuls are measured over); then one more
  // transfer with fresh ids, verified. With a `load`, its matmuls run from before the first
  // warm-up repetition to the last timed one, and the row gets their slowdown against
  // `alone_ms`, their mean time alone.
  Row measure(Method m, const Config& c, bool to_host, DecodeLoad* load, double min_ms,
              double alone_ms) {
    Ops ops = make_ops(m, c, to_host);
    IdStream ids(c, warm);
    if (m != Method::kDma)
      evict_llc(static_cast<std::size_t>(warmup + iters + 1) * c.n * tensors * c.size);
    if (load) load->start();
    std::vector<double> us, submit_us;
    double loaded_ms = -1;
    try {
      for (int i = 0; i < warmup; ++i) {
        ops.prepare(ids.next());
        ops.submit();
        ops.finish();
      }
      if (load) GFD_BENCH_CUDA(cudaEventRecord(window_from, stream));
      const bool traced = trace && m == Method::kGfd && !load;
      if (traced) testkit::start_trace(*gfd, 1 << 20);
      const auto start = Clock::now();
      while (static_cast<int>(us.size()) < iters ||
             (since_us(start) < min_ms * 1e3 && us.size() < 100000)) {
        ops.prepare(ids.next());
        const auto t0 = Clock::now();
        ops.submit();
        const double sub = since_us(t0);
        ops.finish();
        us.push_back(since_us(t0));
        submit_us.push_back(sub);
      }
      if (load) {
        GFD_BENCH_CUDA(cudaEventRecord(window_to, stream));
        loaded_ms = load->stop(window_from, window_to);
      }
      if (traced) {
        std::printf("trace of gfd, %s %zu ids x %zu tensors x %zu bytes:\n", to_host ? "d2h" : "h2d", c.n, tensors,
                    c.size);
        print_trace(testkit::take_trace(*gfd), us, c.n * tensors, c.size, warm ? "warm" : "cold", "gather");
      }
    } catch (...) {
      if (load) load->halt();
      throw;
    }
    Row r;
    r.direction = to_host ? "d2h" : "h2d";
    r.method = method_name(m);
    r.load = load ? "decode" : "none";
    r.size = c.size;
    r.n = c.n;
    r.bytes = c.n * tensors * c.size;
    r.host_blocks = c.host_blocks;
    r.gpu_blocks = c.gpu_blocks;
    r.reps = us.size();
    r.us = percentiles(us);
    r.submit_us = percentiles(submit_us).p50;
    if (load && loaded_ms > 0 && alone_ms > 0) r.slowdown = loaded_ms / alone_ms - 1;
    if (m != Method::kDma) {
      const Ids& v = ids.next();
      poison(c, to_host, v);
      ops.prepare(v);
      ops.submit();
      ops.finish();
      r.verified = check(c, to_host, v) ? 1 : 0;
      if (!r.verified) {
        ++failures;
        std::fprintf(stderr, "VERIFY FAILED: %s %s, %zu x %s x %zu caches%s\n", r.direction.c_str(),
                     r.method.c_str(), c.n, format_size(c.size).c_str(), tensors,
                     load ? " (under load)" : "");
      }
    }
    return r;
  }

  // After a failed measurement: the stream's work finished and a CUDA error that does not
  // stick cleared, so that the next method starts clean.
  void drain() noexcept {
    if (host_only) {
      try {
        dev.stream_sync(stream);
      } catch (...) {
      }
      return;
    }
    (void)cudaStreamSynchronize(stream);
    (void)cudaGetLastError();
  }

 private:
  // Every method moves the same blocks in the same order: at a small grid point the blocks the
  // method before touched would still be in the last-level cache, so the cache is flushed first
  // (by writing a buffer twice its size) unless that method's own traffic already did.
  void evict_llc(std::size_t touched) {
    const std::size_t l3 = l3_bytes();
    if (touched >= 4 * l3) return;
    constexpr std::size_t kChunk = std::size_t{4} << 20;
    if (evict_.empty()) evict_.resize(std::max(2 * l3, std::size_t{64} << 20) / kChunk * kChunk);
    const int value = ++evictions_ & 0xff;
    parallel_for(evict_.size() / kChunk,
                 [&](std::size_t i) { std::memset(evict_.data() + i * kChunk, value, kChunk); });
  }

  void sync() {
    if (host_only)
      dev.stream_sync(stream);
    else
      GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
  }

  // The (src, dst, bytes) of every (tensor, block), tensor by tensor as vLLM's per-layer
  // swap_blocks orders them.
  void build_lists(const Config& c, bool to_host, const Ids& ids) {
    lists_.clear();
    for (std::size_t t = 0; t < tensors; ++t)
      for (std::size_t i = 0; i < c.n; ++i) {
        std::byte* h = caches->host[t] + ids.host[i] * c.size;
        std::byte* d = caches->device[t] + ids.device[i] * c.size;
        lists_.srcs.push_back(to_host ? d : h);
        lists_.dsts.push_back(to_host ? h : d);
        lists_.sizes.push_back(c.size);
      }
  }

  struct Lists {
    std::vector<const void*> srcs;
    std::vector<void*> dsts;
    std::vector<std::size_t> sizes;
    void clear() { srcs.clear(), dsts.clear(), sizes.clear(); }
    void reserve(std::size_t n) { srcs.reserve(n), dsts.reserve(n), sizes.reserve(n); }
  } lists_;
  const Ids* ids_ = nullptr;
  Transfer pending_;
  std::vector<std::byte> evict_;
  int evictions_ = 0;
  void* scratch_host_ = nullptr;
  void* scratch_device_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  unsigned long long* mismatches_host_ = nullptr;
  unsigned long long* mismatches_device_ = nullptr;
};

void print_table(const std::vector<Row>& rows, const std::string& label) {
  if (label.rfind("host-only", 0) == 0)
    std::printf("\nhost-only figures (emulated device: its 'DMA' is a host memcpy; nothing here crosses "
                "PCIe or says how fast a GPU is):");
  std::printf("\n%-3s %-5s %6s %-14s %-6s %9s %9s %7s %7s %10s %7s %8s %-8s\n", "dir", "size",
              "blocks", "method", "load", "p50_GB/s", "p90_GB/s", "ratio", "r_p90", "submit_us",
              "kept", "slowdown", "verified");
  for (const Row& r : rows) {
    char kept[16] = "-", slow[16] = "-";
    if (r.kept >= 0) std::snprintf(kept, sizeof kept, "%.1f%%", 100 * r.kept);
    if (r.slowdown > -1) std::snprintf(slow, sizeof slow, "%+.1f%%", 100 * r.slowdown);
    const double ratio = r.ref_gbps > 0 ? r.p50_gbps() / r.ref_gbps : 0;
    const double ratio90 = r.ref_gbps > 0 ? r.p90_gbps() / r.ref_gbps : 0;
    std::printf("%-3s %-5s %6zu %-14s %-6s %9.2f %9.2f %6.1f%% %6.1f%% %10.1f %7s %8s %-8s\n",
                r.direction.c_str(), format_size(r.size).c_str(), r.n, r.method.c_str(),
                r.load.c_str(), r.p50_gbps(), r.p90_gbps(), 100 * ratio, 100 * ratio90, r.submit_us,
                kept, slow,
                r.verified < 0 ? "-"
                : r.verified   ? "yes"
                               : "NO");
  }
  std::printf(
      "(%s; ratio = P50 GB/s / P50 of the contiguous DMA of the same bytes, r_p90 the same "
      "of P90; submit_us = P50 of the time the submitting call blocked its caller)\n",
      label.c_str());
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& label,
               bool warm, int layers, std::size_t tensors) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("--csv: cannot write " + path);
  f << "mode,layout,sources,direction,load,layers,caches,blocks,block_size,transfer_bytes,method,"
       "reps,p50_us,p90_us,p50_gbps,p90_gbps,ref_gbps,ratio_p50,ratio_p90,submit_p50_us,rate_kept,"
       "load_slowdown,verified,host_blocks,gpu_blocks\n";
  auto opt = [](double v, bool ok) { return ok ? std::to_string(v) : std::string(); };
  for (const Row& r : rows)
    f << label << ",paged," << (warm ? "warm" : "cold") << ',' << r.direction << ',' << r.load
      << ',' << layers << ',' << tensors << ',' << r.n << ',' << r.size << ',' << r.bytes << ','
      << r.method << ',' << r.reps << ',' << r.us.p50 << ',' << r.us.p90 << ',' << r.p50_gbps()
      << ',' << r.p90_gbps() << ',' << r.ref_gbps << ',' << r.p50_gbps() / r.ref_gbps << ','
      << r.p90_gbps() / r.ref_gbps << ',' << r.submit_us << ',' << opt(r.kept, r.kept >= 0) << ','
      << opt(r.slowdown, r.slowdown > -1) << ','
      << (r.verified < 0 ? ""
          : r.verified   ? "1"
                         : "0")
      << ',' << r.host_blocks << ',' << r.gpu_blocks << '\n';
}

}  // namespace

std::string layout_flag(int argc, char** argv) {
  std::string layout = "paged";  // the runtime's call is the default face of the benchmark
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--layout=", 0) == 0)
      layout = a.substr(9);
    else if (a == "--layout" && i + 1 < argc)
      layout = argv[++i];
  }
  if (layout != "pool" && layout != "paged" && layout != "strided")
    throw std::invalid_argument("--layout=" + layout + ": expected paged, pool or strided");
  return layout;
}

int run_paged_benchmark(int argc, char** argv) {
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_benchmark --layout paged: a paged KV cache's transfers (2L cache pairs, the "
                 "same block ids in each), gfd against the CUDA peers and the contiguous DMA\n"
              << Flags::usage(kFlags);
    return 0;
  }
  PagedBench b;
  b.iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 20)));
  b.warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 3)));
  b.warm = flags.has("warm");
  b.trace = flags.has("trace");
  const bool quick = flags.has("quick");
  const int layers = static_cast<int>(flags.get_int("layers", quick ? 8 : 32));
  if (layers < 1) throw std::invalid_argument("--layers must be at least 1");
  b.tensors = 2 * static_cast<std::size_t>(layers);
  const std::string direction = flags.get("direction", "both");
  if (direction != "h2d" && direction != "d2h" && direction != "both")
    throw std::invalid_argument("--direction must be h2d, d2h or both");
  std::vector<bool> to_host_dirs;  // h2d first: stores overwrite the host caches' pattern
  if (direction != "d2h") to_host_dirs.push_back(false);
  if (direction != "h2d") to_host_dirs.push_back(true);
  std::vector<Method> methods = methods_flag(flags);
  const bool under_load = flags.has("under-load");
  if (under_load && flags.get("under-load") != "1" && flags.get("under-load") != "decode")
    throw std::invalid_argument("--under-load=" + flags.get("under-load") + ": the mode is decode");

  const int ordinal = static_cast<int>(flags.get_int("device", 0));
  if (testkit::cuda_device_count() == 0) {
    b.host_only = true;
    std::printf(
        "No CUDA GPU is visible here: host-only. Only gfd runs, on the emulated device (its "
        "device caches are host memory and its 'DMA' a host memcpy); the CUDA peers are "
        "skipped and the figures say nothing about PCIe.\n");
    b.dev = testkit::Device::emulated(0);
    methods = {Method::kGfd};
    if (under_load) std::printf("--under-load needs a GPU (cuBLAS matmuls): skipped.\n");
  } else {
    b.dev = testkit::Device::cuda(ordinal);
  }
  testkit::Device& d = b.dev;
  d.make_current();

  // The grid: a block-size sweep at 64 blocks and a block-count sweep at 4K (the default), the
  // product of --blocks and --block-sizes, or --quick's one point.
  std::vector<std::pair<std::size_t, std::size_t>> points;  // (size, blocks)
  const bool default_grid = !quick && !flags.has("blocks") && !flags.has("block-sizes");
  if (quick) {
    points = {{4096, 64}};
  } else if (!default_grid) {
    for (std::size_t s : flags.get_sizes("block-sizes", {4096}))
      for (std::size_t n : flags.get_sizes("blocks", {64})) points.push_back({s, n});
  } else {
    for (std::size_t s : {2048, 4096, 8192, 16384, 32768, 65536, 262144, 2097152})
      points.push_back({s, 64});
    for (std::size_t n : {16, 256, 1024, 4096}) points.push_back({4096, n});
  }
  for (auto [s, n] : points)
    if (s % 8 != 0)
      throw std::invalid_argument("block size " + std::to_string(s) + ": not a multiple of 8");

  // Sizes: the host caches share --host-cache-bytes (far above the L3: cold sources), each a
  // whole number of 2 MiB; one transfer is at most --max-transfer and a quarter of a host cache's
  // blocks (so that fresh ids are drawn from many more than they take).
  const auto phys = static_cast<std::size_t>(sysconf(_SC_PHYS_PAGES)) *
                    static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE));
  std::size_t host_total = flags.has("host-cache-bytes")
                               ? parse_size(flags.get("host-cache-bytes"))
                               : (b.host_only ? std::size_t{256} << 20 : std::size_t{4} << 30);
  if (host_total > phys / 2) {
    std::printf("--host-cache-bytes %s is more than half the RAM: %s instead\n",
                format_size(host_total).c_str(), format_size(phys / 2).c_str());
    host_total = phys / 2;
  }
  constexpr std::size_t kMiB2 = std::size_t{2} << 20;
  std::size_t largest = 0;
  for (auto [s, n] : points) largest = std::max(largest, s);
  const std::size_t host_cache =
      std::max(host_total / b.tensors / kMiB2 * kMiB2, (largest + kMiB2 - 1) / kMiB2 * kMiB2);
  const std::size_t max_transfer =
      flags.has("max-transfer") ? parse_size(flags.get("max-transfer"))
                                : (b.host_only ? std::size_t{64} << 20 : std::size_t{1} << 30);
  // Host-only the device caches are host memory too, and the checks poison all of it.
  std::size_t device_cap = flags.has("device-cache-bytes")
                               ? parse_size(flags.get("device-cache-bytes"))
                               : (b.host_only ? std::size_t{1} << 30 : std::size_t{40} << 30);
  if (!b.host_only) {
    std::size_t free_b = 0, total_b = 0;
    GFD_BENCH_CUDA(cudaMemGetInfo(&free_b, &total_b));
    if (device_cap > free_b / 10 * 7) {
      std::printf("device memory: %s free; caches capped at 70%% of it\n",
                  format_size(free_b).c_str());
      device_cap = free_b / 10 * 7;
    }
  }

  std::vector<Config> grid;
  std::size_t ref_bytes = 0, device_cache = 0;
  for (auto [s, n] : points) {
    Config c;
    c.size = s;
    c.requested = n;
    c.host_blocks = host_cache / s;
    c.n = std::min({n, max_transfer / (b.tensors * s), c.host_blocks / 4});
    if (c.n == 0) {
      std::printf(
          "%zu x %s x %zu caches: skipped (a transfer would pass --max-transfer %s or a "
          "quarter of a host cache)\n",
          n, format_size(s).c_str(), b.tensors, format_size(max_transfer).c_str());
      continue;
    }
    if (c.n < n)
      std::printf(
          "%zu x %s x %zu caches: %zu blocks instead (at most --max-transfer %s and a quarter "
          "of a host cache's %zu blocks)\n",
          n, format_size(s).c_str(), b.tensors, c.n, format_size(max_transfer).c_str(),
          c.host_blocks);
    bool seen = false;
    for (const Config& g : grid) seen = seen || (g.size == c.size && g.n == c.n);
    if (seen) continue;  // capped onto an earlier point
    grid.push_back(c);
    ref_bytes = std::max(ref_bytes, c.n * b.tensors * s);
    device_cache = std::max(device_cache, std::max<std::size_t>(4 * c.n, 1024) * s);
  }
  if (grid.empty()) throw std::invalid_argument("no grid point fits");
  // A device cache: 4 times the blocks of a transfer and at least 1024 blocks (ids drawn from
  // many), within the cap with the reference buffer and the descriptor lists.
  std::size_t entries = 0;
  for (const Config& c : grid) entries = std::max(entries, c.n * b.tensors);
  const std::size_t fixed = ref_bytes + entries * sizeof(PatternCheck);
  if (device_cap <= fixed + b.tensors * largest)
    throw std::invalid_argument("--device-cache-bytes " + format_size(device_cap) +
                                " cannot hold " + std::to_string(b.tensors) + " device caches of " +
                                format_size(largest) + " blocks and a reference buffer of " +
                                format_size(ref_bytes));
  device_cache = std::min(device_cache, (device_cap - fixed) / b.tensors) / largest * largest;
  for (Config& c : grid) {
    c.gpu_blocks = device_cache / c.size;
    if (c.gpu_blocks < 2 * c.n) {
      std::printf("%zu x %s: %zu blocks instead (half of a device cache's %zu blocks)\n", c.n,
                  format_size(c.size).c_str(), c.gpu_blocks / 2, c.gpu_blocks);
      c.n = c.gpu_blocks / 2;
    }
  }
  std::erase_if(grid, [](const Config& c) { return c.n == 0; });
  if (grid.empty()) throw std::invalid_argument("no grid point fits the device caches");

  b.caches = std::make_unique<Caches>(d, b.tensors, host_cache, device_cache, ref_bytes);
  if (b.host_only) {
    b.stream = d.create_stream();
  } else {
    // The transfers' stream at the default priority (a runtime's current stream), which is also
    // the load's: equal priority.
    int least = 0, greatest = 0;
    GFD_BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    b.stream_priority = least;
    GFD_BENCH_CUDA(cudaStreamCreateWithPriority(&b.stream, cudaStreamNonBlocking, least));
    GFD_BENCH_CUDA(preload_peer_kernels());
  }
  b.make_scratch(entries);

  std::vector<Method> run_methods;
  for (Method m : methods) {
    if (m == Method::kGfd) {
      // The GFD_* variables apply (A/B runs of engine settings; none set: the defaults).
      b.gfd.emplace(d.make_engine(EngineOptions::from_env()));
    } else if (m == Method::kGfdZeroCopy) {
      EngineOptions o = EngineOptions::from_env();
      o.backend = Backend::kZeroCopyKernel;
      try {
        b.zero_copy.emplace(d.make_engine(o));
      } catch (const gfd::Error& e) {
        std::printf("gfd_zero_copy: the engine was refused (%s): skipped\n", e.what());
        continue;
      }
    }
    run_methods.push_back(m);
  }
  if (b.gfd) {
    const EngineStats st = b.gfd->stats();
    std::string from = "default options";  // or the GFD_* variables that changed them
    for (char** e = environ; *e != nullptr; ++e)
      if (std::strncmp(*e, "GFD_", 4) == 0) from += std::string(from == "default options" ? " but " : " ") + *e;
    std::printf(
        "engine gfd (gather, %s): %d gather threads on CPUs %s, NUMA node %d, "
        "ring %s in %s slots, hugepages %s\n",
        from.c_str(), st.gather_threads, testkit::format_cpulist(st.cpus).c_str(), st.numa_node,
        format_size(st.staging_bytes).c_str(), format_size(st.slot_bytes).c_str(),
        to_string(st.hugepages));
  }
  if (under_load && !b.host_only)
    b.load = std::make_unique<DecodeLoad>(d.ordinal(), b.stream_priority);

  const std::string label = b.host_only ? "host-only" : "gpu";
  std::printf(
      "device: %s | %d layers: %zu cache pairs | host caches %s each (%s, %s in all; L3 %s) "
      "| device caches %s each (%s in all) | reference %s pinned + %s device\n",
      b.host_only ? "emulated (host-only)" : ("CUDA " + std::to_string(d.ordinal())).c_str(),
      layers, b.tensors, format_size(host_cache).c_str(),
      b.host_only ? "mmap registered with the emulated device" : "cudaHostAlloc",
      format_size(host_cache * b.tensors).c_str(), format_size(l3_bytes()).c_str(),
      format_size(device_cache).c_str(), format_size(device_cache * b.tensors).c_str(),
      format_size(ref_bytes).c_str(), format_size(ref_bytes).c_str());
  std::printf(
      "ids: %s | %d timed reps after %d warm-up | peers' descriptor lists built before the "
      "timer (gfd builds its list from the ids inside copy_blocks)\n",
      b.warm ? "warm (the same ids every rep)" : "cold (fresh random distinct ids every rep)",
      b.iters, b.warmup);

  std::printf("filling the host caches, then measuring %zu points (one line each on stderr as it completes)%s\n",
              to_host_dirs.size() * grid.size() * (run_methods.size() + 1), b.host_only ? " [host-only]" : "");
  b.fill_host_caches();
  std::vector<Row> rows;
  const auto start = Clock::now();
  std::size_t done = 0;
  const std::size_t total = to_host_dirs.size() * grid.size() * (run_methods.size() + 1);
  bool zero_copy_d2h = true;
  auto note = [&](const Row& r, const char* extra) {
    std::fprintf(stderr,
                 "[%zu/%zu %6.1fs] %s %5zu x %-4s %-14s %-6s %9.2f GB/s (%5.1f%% of %.2f), "
                 "submit %.1f us%s%s%s\n",
                 done, total, since_us(start) * 1e-6, r.direction.c_str(), r.n,
                 format_size(r.size).c_str(), r.method.c_str(), r.load.c_str(), r.p50_gbps(),
                 r.ref_gbps > 0 ? 100 * r.p50_gbps() / r.ref_gbps : 0, r.ref_gbps, r.submit_us,
                 r.verified == 0 ? " VERIFY FAILED" : "", extra, b.host_only ? " [host-only]" : "");
  };
  // Runs one method on one point, idle (alone_ms < 0) or under the load; gfd_zero_copy is
  // skipped where its engine refuses the direction.
  auto run_one = [&](Method m, const Config& c, bool to_host, double ref_gbps, DecodeLoad* load,
                     double min_ms, double alone_ms) -> std::optional<Row> {
    if (m == Method::kGfdZeroCopy && to_host && !zero_copy_d2h) return std::nullopt;
    const char* dir = to_host ? "d2h" : "h2d";
    try {
      Row r = b.measure(m, c, to_host, load, min_ms, alone_ms);
      r.ref_gbps = m == Method::kDma ? r.p50_gbps() : ref_gbps;
      return r;
    } catch (const gfd::Error& e) {
      b.drain();
      if (m == Method::kGfdZeroCopy) {
        std::printf("gfd_zero_copy %s: %s: skipped%s\n", dir, e.what(),
                    to_host ? " (for every d2h point)" : "");
        if (to_host) zero_copy_d2h = false;
        return std::nullopt;
      }
      if (m == Method::kDma) throw;
      ++b.failures;
      std::fprintf(stderr, "FAILED: %s %s, %zu x %s: %s\n", dir, method_name(m), c.n,
                   format_size(c.size).c_str(), e.what());
      return std::nullopt;
    } catch (const std::exception& e) {
      // A peer's CUDA call refused (a batch too large, say): the rest of the grid still runs.
      if (m == Method::kDma) throw;
      b.drain();
      ++b.failures;
      std::fprintf(stderr, "FAILED: %s %s, %zu x %s: %s\n", dir, method_name(m), c.n,
                   format_size(c.size).c_str(), e.what());
      return std::nullopt;
    }
  };

  for (bool to_host : to_host_dirs) {
    if (to_host) b.fill_device_caches();         // the loads' checks poisoned them
    std::map<std::size_t, double> ref_by_point;  // grid index -> idle DMA P50 GB/s
    for (std::size_t gi = 0; gi < grid.size(); ++gi) {
      const Config& c = grid[gi];
      b.register_caches(c);
      ++done;
      Row ref = *run_one(Method::kDma, c, to_host, 0, nullptr, 0, -1);
      ref_by_point[gi] = ref.p50_gbps();
      note(ref, "");
      rows.push_back(ref);
      for (Method m : run_methods) {
        ++done;
        if (std::optional<Row> r = run_one(m, c, to_host, ref.p50_gbps(), nullptr, 0, -1)) {
          note(*r, "");
          rows.push_back(*r);
        }
      }
    }
    if (!b.load) continue;
    // Under load: the default grid's 32K x 64 and 4K x 1024, or every point of a given grid. Each
    // method (and the DMA, the floor) runs for at least 250 ms of matmuls.
    constexpr double kWindowMs = 250;
    for (std::size_t gi = 0; gi < grid.size(); ++gi) {
      const Config& c = grid[gi];
      if (default_grid && !(c.size == 32768 && c.requested == 64) &&
          !(c.size == 4096 && c.requested == 1024))
        continue;
      b.register_caches(c);
      const double alone = b.load->alone(b.stream, b.window_from, b.window_to, kWindowMs);
      std::printf(
          "under load (decode, %s): %dx%dx%d bf16 matmuls back to back, %.3f ms each "
          "alone, on a stream of the transfers' priority\n",
          to_host ? "d2h" : "h2d", DecodeLoad::kDim, DecodeLoad::kDim, DecodeLoad::kDim, alone);
      std::vector<Method> all{Method::kDma};
      all.insert(all.end(), run_methods.begin(), run_methods.end());
      double ref_loaded = 0;
      for (Method m : all) {
        std::optional<Row> r = run_one(m, c, to_host, ref_loaded, b.load.get(), kWindowMs, alone);
        if (!r) continue;
        if (m == Method::kDma) ref_loaded = r->p50_gbps();
        for (const Row& idle : rows)
          if (idle.load == "none" && idle.direction == r->direction && idle.size == r->size &&
              idle.n == r->n && idle.method == r->method && idle.p50_gbps() > 0)
            r->kept = r->p50_gbps() / idle.p50_gbps();
        // Under load the ratio is to the DMA under the same load.
        note(*r, "");
        rows.push_back(*r);
      }
    }
  }

  print_table(rows,
              label + (b.load ? "; under load, ratio is to the DMA under the same load; kept = "
                                "P50 under load / idle P50, slowdown = the matmuls' mean time "
                                "during the transfers / alone - 1"
                              : ""));
  if (flags.has("csv")) write_csv(flags.get("csv"), rows, label, b.warm, layers, b.tensors);
  if (b.failures != 0) {
    std::fprintf(stderr, "%d measurement(s) failed (verification, or an error above)\n",
                 b.failures);
    return 2;
  }
  return 0;
}

}  // namespace gfd::bench
