// dma_cost: what one staged chunk costs the copy engine beyond its bytes, with nothing gathered
// (in the engine's traces on an H200, DMAs of 256-582 KB took about 7 us more each than the line
// rate gives, so smaller chunks lose, and the last chunk's DMA after the gather is long).
// Needs a GPU.
//
// --total bytes of warm pinned memory (cudaHostAlloc) go to contiguous device memory as chunks of
// each --chunks size, round robin over each --streams count of non-blocking streams, with each
// variant's per-chunk sequence:
//   plain    cudaMemcpyAsync
//   events   timing event, cudaMemcpyAsync, timing event (the engine's slot events until now)
//   events_nt  the same with events made with cudaEventDisableTiming
//   done_nt  cudaMemcpyAsync, then one event without timing (what a slot needs to be reused)
//   wait     cuStreamWaitValue64 on a host flag already set, cudaMemcpyAsync
//   engine   wait, events, and the engine's joins: each lane first waits on a start event of the
//            caller's stream, and at the end every lane's event joins one lane, whose done event
//            the caller's stream waits on
//   engine_nt  the same with done_nt's one event per chunk
// Two timings, P50 of --iters after 5 warm-up repetitions:
//   call   from the first enqueue to the caller's stream's synchronisation (driver calls included)
//   gpu    every stream first waits on one host gate flag; everything is enqueued; the time runs
//          from the gate's store to the synchronisation, so it holds the GPU's side only (and
//          one wake-up from a flag, also measured alone: see "release")
// Each row also gives the cost per chunk beyond one DMA of --total bytes timed the same way:
// (time - one DMA) / (chunks - 1). The last line times a 4 KB DMA released by a host flag the GPU
// has been waiting on, against a 4 KB DMA from the call.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "micro_cuda.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using gfd::micro::check;

const std::map<std::string, std::string> kFlags = {
    {"total", "=S           bytes moved per repetition (default 8M)"},
    {"chunks", "=LIST       chunk sizes (default 256K,512K,1M,2M)"},
    {"streams", "=LIST      stream counts (default 1,2)"},
    {"variants",
     "=LIST     comma list of plain, events, events_nt, done_nt, wait, engine, engine_nt\n"
     "                      (default all)"},
    {"iters", "=N           timed repetitions (default 30)"},
    {"help", "              this text"},
};

using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);

WaitValue64 load_wait_value() {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  check(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &p, 12000, cudaEnableDefault, &q),
        "cudaGetDriverEntryPointByVersion");
  if (q != cudaDriverEntryPointSuccess || p == nullptr)
    throw std::runtime_error("cuStreamWaitValue64 is missing");
  return reinterpret_cast<WaitValue64>(p);
}

struct Rig {
  WaitValue64 wait_value = nullptr;
  std::byte* src = nullptr;
  std::byte* dst = nullptr;
  std::uint64_t* flags = nullptr;  // [0] the gate, [1] always set
  cudaStream_t caller = nullptr;
  std::vector<cudaStream_t> lanes;
  std::vector<cudaEvent_t> timing;   // two per chunk
  std::vector<cudaEvent_t> untimed;  // two per chunk, cudaEventDisableTiming
  std::vector<cudaEvent_t> joins;    // start, done, one per lane
  std::uint64_t gate_value = 0;

  void wait(std::uint64_t* flag, std::uint64_t value, cudaStream_t s) const {
    const CUresult r =
        wait_value(reinterpret_cast<CUstream>(s), reinterpret_cast<CUdeviceptr>(flag), value,
                   CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS)
      throw std::runtime_error("cuStreamWaitValue64 failed: " + std::to_string(r));
  }
  void open_gate() {
    std::atomic_ref<std::uint64_t>(flags[0]).store(gate_value, std::memory_order_release);
  }

  // One repetition: microseconds, timed as `gated` says.
  double run(const std::string& v, std::size_t total, std::size_t chunk, std::size_t k,
             bool gated) {
    const bool waits = v == "wait" || v == "engine" || v == "engine_nt";
    const bool joined = v == "engine" || v == "engine_nt";
    const bool start_event = v == "events" || v == "events_nt" || v == "engine";
    const bool done_event = start_event || v == "done_nt" || v == "engine_nt";
    const std::size_t n = (total + chunk - 1) / chunk;
    if (timing.size() < 2 * n) {
      const std::size_t have = timing.size();
      timing.resize(2 * n);
      untimed.resize(2 * n);
      for (std::size_t i = have; i < timing.size(); ++i) {
        check(cudaEventCreate(&timing[i]), "cudaEventCreate");
        check(cudaEventCreateWithFlags(&untimed[i], cudaEventDisableTiming), "cudaEventCreate");
      }
    }
    const std::vector<cudaEvent_t>& ev = v == "events" || v == "engine" ? timing : untimed;
    ++gate_value;
    auto t0 = Clock::now();
    std::uint32_t started = 0;
    if (gated) {
      if (joined)
        wait(&flags[0], gate_value, caller);
      else
        for (std::size_t l = 0; l < k; ++l) wait(&flags[0], gate_value, lanes[l]);
    }
    if (joined) check(cudaEventRecord(joins[0], caller), "cudaEventRecord start");
    for (std::size_t c = 0; c < n; ++c) {
      const std::size_t l = c % k;
      cudaStream_t s = lanes[l];
      if (joined && (started & (1u << l)) == 0) {
        check(cudaStreamWaitEvent(s, joins[0], 0), "cudaStreamWaitEvent start");
        started |= 1u << l;
      }
      if (waits) wait(&flags[1], 1, s);
      if (start_event) check(cudaEventRecord(ev[2 * c], s), "cudaEventRecord");
      const std::size_t off = c * chunk, bytes = std::min(chunk, total - off);
      check(cudaMemcpyAsync(dst + off, src + off, bytes, cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync");
      if (done_event) check(cudaEventRecord(ev[2 * c + 1], s), "cudaEventRecord");
    }
    if (joined) {
      for (std::size_t l = 1; l < k && l < n; ++l) {
        check(cudaEventRecord(joins[2 + l], lanes[l]), "cudaEventRecord lane");
        check(cudaStreamWaitEvent(lanes[0], joins[2 + l], 0), "cudaStreamWaitEvent lane");
      }
      check(cudaEventRecord(joins[1], lanes[0]), "cudaEventRecord done");
      check(cudaStreamWaitEvent(caller, joins[1], 0), "cudaStreamWaitEvent done");
    }
    if (gated) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // the GPU is waiting by now
      t0 = Clock::now();
      open_gate();
    }
    if (joined)
      check(cudaStreamSynchronize(caller), "cudaStreamSynchronize");
    else
      for (std::size_t l = 0; l < k; ++l)
        check(cudaStreamSynchronize(lanes[l]), "cudaStreamSynchronize");
    return gfd::bench::since_us(t0);
  }

  double p50(const std::string& v, std::size_t total, std::size_t chunk, std::size_t k, bool gated,
             int iters) {
    std::vector<double> us;
    for (int i = 0; i < 5 + iters; ++i) {
      const double t = run(v, total, chunk, k, gated);
      if (i >= 5) us.push_back(t);
    }
    return gfd::bench::percentiles(us).p50;
  }
};

int run_main(int argc, char** argv) {
  gfd::bench::Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("dma_cost", flags, kFlags)) return 0;
  const std::size_t total = gfd::bench::parse_size(flags.get("total", "8M"));
  const int iters = static_cast<int>(flags.get_int("iters", 30));
  const std::vector<std::size_t> chunks =
      flags.get_sizes("chunks", {256 << 10, 512 << 10, 1 << 20, 2 << 20});
  const std::vector<std::size_t> streams = flags.get_sizes("streams", {1, 2});
  std::vector<std::string> variants;
  for (const std::string& v :
       flags.get_list("variants", "plain,events,events_nt,done_nt,wait,engine,engine_nt"))
    if (!v.empty()) variants.push_back(v);
  if (total == 0 || iters < 1) throw std::invalid_argument("--total > 0, --iters >= 1");
  for (std::size_t c : chunks)
    if (c == 0 || c > total) throw std::invalid_argument("--chunks: each between 1 and --total");
  for (std::size_t k : streams)
    if (k == 0 || k > 8) throw std::invalid_argument("--streams: each between 1 and 8");
  for (const std::string& v : variants)
    if (v != "plain" && v != "events" && v != "events_nt" && v != "done_nt" && v != "wait" &&
        v != "engine" && v != "engine_nt")
      throw std::invalid_argument("--variants: unknown variant " + v);

  check(cudaSetDevice(0), "cudaSetDevice");
  Rig rig;
  rig.wait_value = load_wait_value();
  check(cudaHostAlloc(reinterpret_cast<void**>(&rig.src), total, cudaHostAllocDefault),
        "cudaHostAlloc");
  gfd::bench::fill_random(rig.src, total);
  check(cudaMalloc(reinterpret_cast<void**>(&rig.dst), total), "cudaMalloc");
  check(cudaHostAlloc(reinterpret_cast<void**>(&rig.flags), 2 * sizeof(std::uint64_t),
                      cudaHostAllocDefault),
        "cudaHostAlloc flags");
  rig.flags[0] = 0;
  rig.flags[1] = 1;
  check(cudaStreamCreateWithFlags(&rig.caller, cudaStreamNonBlocking), "cudaStreamCreate");
  rig.lanes.resize(8);
  for (cudaStream_t& s : rig.lanes)
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  rig.joins.resize(10);
  for (cudaEvent_t& e : rig.joins)
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");

  const double one_call = rig.p50("plain", total, total, 1, false, iters);
  const double one_gpu = rig.p50("plain", total, total, 1, true, iters);
  std::printf(
      "dma_cost: %s warm pinned to device; one DMA: call %.1f us (%.2f GB/s), gpu %.1f us (%.2f "
      "GB/s)\n",
      gfd::bench::format_size(total).c_str(), one_call, total / (one_call * 1e3), one_gpu,
      total / (one_gpu * 1e3));
  std::printf("%-9s %6s %7s %6s | %9s %7s %9s | %9s %7s %9s\n", "variant", "chunk", "streams",
              "chunks", "call us", "GB/s", "us/chunk", "gpu us", "GB/s", "us/chunk");
  for (std::size_t chunk : chunks)
    for (std::size_t k : streams)
      for (const std::string& v : variants) {
        const std::size_t n = (total + chunk - 1) / chunk;
        const double c = rig.p50(v, total, chunk, k, false, iters);
        const double g = rig.p50(v, total, chunk, k, true, iters);
        const double denom = n > 1 ? static_cast<double>(n - 1) : 1.0;
        std::printf("%-9s %6s %7zu %6zu | %9.1f %7.2f %9.2f | %9.1f %7.2f %9.2f\n", v.c_str(),
                    gfd::bench::format_size(chunk).c_str(), k, n, c, total / (c * 1e3),
                    (c - one_call) / denom, g, total / (g * 1e3), (g - one_gpu) / denom);
      }
  // A DMA released by a flag the GPU already waits on, against one from the call.
  const std::size_t small = std::min<std::size_t>(4096, total);
  const double small_call = rig.p50("plain", small, small, 1, false, iters);
  const double small_gpu = rig.p50("plain", small, small, 1, true, iters);
  std::printf(
      "release: 4 KB DMA from the call %.1f us; from a host flag's store (GPU waiting) %.1f us\n",
      small_call, small_gpu);

  std::vector<std::byte> back(total);
  check(cudaMemcpy(back.data(), rig.dst, total, cudaMemcpyDeviceToHost), "cudaMemcpy");
  const bool ok = std::memcmp(back.data(), rig.src, total) == 0;
  std::printf("verified %s\n", ok ? "yes" : "NO");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("dma_cost", [&] { return run_main(argc, argv); });
}
