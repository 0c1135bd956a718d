// stream_gate: whether a stream may wait on the GPU for copies another thread enqueues later,
// which handing a call's enqueues to a thread of its own (and returning before they are made)
// would need while the caller's stream must stay ordered after them. Needs a GPU.
//
// Stream S waits (cuStreamWaitValue64) for a flag in pinned memory, with a copy queued behind the
// wait; --delay ms later another thread enqueues a copy on stream L and then the flag's write on
// L (the copy done: S may go on). Reported: when each was enqueued and when S finished. A
// watchdog writes the flag from the CPU once S has waited --watchdog ms, so that a wait the GPU
// would never end is reported as such and the program still exits. Cases:
//   plain  as above
//   free   a third thread calls cudaFree while S waits, before the copy on L is enqueued: how
//          long cudaFree held its thread, and whether the enqueue on L waited for it
// Run it as it is and with CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue for every stream), to
// see whether the work enqueued on L after S's wait sits behind that wait where they share a queue
// (docs/performance.md has an H100's answer: it did not; the free case blocked in every setting).
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "bench_common.hpp"
#include "micro_cuda.hpp"
#include "micro_driver.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using gfd::micro::check;
using gfd::micro::drv;

const std::map<std::string, std::string> kFlags = {
    {"cases", "=LIST       plain, free (default both)"},
    {"delay", "=MS         how long after S's wait the other thread enqueues (default 50)"},
    {"watchdog", "=MS      when the CPU releases a wait still blocked (default 3000)"},
    {"bytes", "=S          bytes of each copy (default 16M)"},
    {"help", "              this text"},
};

struct Buffers {
  std::size_t bytes;
  void *dev_a = nullptr, *dev_b = nullptr, *victim = nullptr, *host = nullptr;
  std::uint64_t* flag = nullptr;
  CUdeviceptr dflag = 0;
  explicit Buffers(std::size_t n) : bytes(n) {
    check(cudaMalloc(&dev_a, n), "cudaMalloc");
    check(cudaMalloc(&dev_b, n), "cudaMalloc");
    check(cudaHostAlloc(&host, n, cudaHostAllocDefault), "cudaHostAlloc");
    check(cudaHostAlloc(reinterpret_cast<void**>(&flag), 64, cudaHostAllocMapped),
          "cudaHostAlloc(flag)");
    drv(cuMemHostGetDevicePointer(&dflag, flag, 0), "cuMemHostGetDevicePointer");
  }
  ~Buffers() {
    (void)cudaFree(dev_a);
    (void)cudaFree(dev_b);
    (void)cudaFreeHost(host);
    (void)cudaFreeHost(flag);
  }
};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void run_case(const std::string& name, Buffers& b, int delay_ms, int watchdog_ms) {
  cudaStream_t s = nullptr, l = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&l, cudaStreamNonBlocking), "cudaStreamCreate");
  if (name == "free") check(cudaMalloc(&b.victim, 1 << 20), "cudaMalloc(victim)");
  *reinterpret_cast<volatile std::uint64_t*>(b.flag) = 0;
  const auto t0 = Clock::now();
  drv(cuStreamWaitValue64(reinterpret_cast<CUstream>(s), b.dflag, 1, CU_STREAM_WAIT_VALUE_GEQ),
      "cuStreamWaitValue64");
  check(cudaMemcpyAsync(b.dev_b, b.dev_a, b.bytes, cudaMemcpyDeviceToDevice, s), "copy on S");
  std::atomic<double> freed_at{-1}, free_began{-1};
  std::thread freer;
  if (name == "free")
    freer = std::thread([&] {
      check(cudaSetDevice(0), "cudaSetDevice");
      free_began = ms_since(t0);
      check(cudaFree(b.victim), "cudaFree");
      freed_at = ms_since(t0);
    });
  std::atomic<double> copy_at{-1}, write_at{-1};
  std::thread issuer([&] {
    check(cudaSetDevice(0), "cudaSetDevice");
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    check(cudaMemcpyAsync(b.dev_a, b.host, b.bytes, cudaMemcpyHostToDevice, l), "copy on L");
    copy_at = ms_since(t0);
    drv(cuStreamWriteValue64(reinterpret_cast<CUstream>(l), b.dflag, 1, 0), "cuStreamWriteValue64");
    write_at = ms_since(t0);
  });
  // The watchdog makes no CUDA call: it works while the driver is held by another thread too.
  std::atomic<bool> done{false}, watchdog{false};
  std::thread dog([&] {
    while (!done.load() && ms_since(t0) < watchdog_ms)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (!done.load()) {
      watchdog = true;
      *reinterpret_cast<volatile std::uint64_t*>(b.flag) = 2;  // the CPU releases the wait
    }
  });
  check(cudaStreamSynchronize(s), "cudaStreamSynchronize(S)");
  done = true;
  const double s_done = ms_since(t0);
  dog.join();
  issuer.join();
  if (freer.joinable()) freer.join();
  check(cudaStreamSynchronize(l), "cudaStreamSynchronize(L)");
  std::printf(
      "%-6s copy on L enqueued at %.1f ms, the flag's write at %.1f ms; S finished at %.1f "
      "ms, %s",
      name.c_str(), copy_at.load(), write_at.load(), s_done,
      watchdog ? "released by the CPU's watchdog: the wait would not have ended"
               : "released by the write on L");
  if (name == "free")
    std::printf("; cudaFree called at %.1f ms returned at %.1f ms", free_began.load(),
                freed_at.load());
  std::printf("\n");
  check(cudaStreamDestroy(s), "cudaStreamDestroy");
  check(cudaStreamDestroy(l), "cudaStreamDestroy");
}

int run_main(int argc, char** argv) {
  gfd::bench::Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("stream_gate", flags, kFlags)) return 0;
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  const char* conn = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  std::printf("stream_gate: CUDA_DEVICE_MAX_CONNECTIONS=%s\n",
              conn != nullptr ? conn : "(unset: 8)");
  Buffers b(gfd::bench::parse_size(flags.get("bytes", "16M")));
  const int delay = static_cast<int>(flags.get_int("delay", 50));
  const int watchdog = static_cast<int>(flags.get_int("watchdog", 3000));
  for (const std::string& c : flags.get_list("cases", "plain,free")) {
    if (c != "plain" && c != "free") throw std::invalid_argument("--cases: '" + c + "'");
    run_case(c, b, delay, watchdog);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("stream_gate", [&] { return run_main(argc, argv); });
}
