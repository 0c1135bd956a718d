// enqueue_cost: how long the calling thread spends enqueuing a staged transfer's chunks, the
// engine's way (per chunk on one of two lanes: a flag wait, the DMA, the scatter kernel, the
// slot's done event) against one CUDA graph of the same nodes launched with one call (for 16 MB
// in 2 MB chunks the driver calls alone took 130-165 us on an H200 VM). Needs a GPU.
//
// Variants, each for every --chunks count of --chunk bytes (warm pinned memory to device memory):
//   streams   the engine's sequence: start event on the caller's stream, each lane waits on it;
//             per chunk wait_value, cudaMemcpyAsync, kernel, untimed event; the lanes join one,
//             whose event the caller's stream waits on (what CopyLanes enqueues today)
//   graph_set one graph made once per chunk count (memop wait -> memcpy -> kernel -> event record
//             node per chunk, chunk c after chunk c - 2: two lanes); per call every node's
//             parameters are set again (wait value, DMA addresses and size, kernel arguments),
//             then one cudaGraphLaunch on the caller's stream
//   graph_wait the same graph with only the wait values set per call (the rest unchanged)
//   graph_launch the launch alone
// Two timings, P50 of --iters after 5 warm-up repetitions: "host", from the first call to the
// return of the last (the time the caller is blocked), and "gpu", from the store of the flags
// every chunk waits on (set only after everything is enqueued) to the caller's synchronisation.
#include <cuda.h>
#include <cuda_runtime.h>

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
#include "micro_driver.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using gfd::micro::check;
using gfd::micro::drv;

const std::map<std::string, std::string> kFlags = {
    {"chunk", "=S           bytes per chunk (default 2M)"},
    {"chunks", "=LIST       chunk counts (default 4,8,16)"},
    {"variants",
     "=LIST     comma list of streams, graph_set, graph_wait, graph_launch (default all)"},
    {"iters", "=N           timed repetitions (default 30)"},
    {"help", "              this text"},
};

// Stands for the scatter kernel: its launch, not its work, is what is timed.
__global__ void touch_kernel(const unsigned char* staging, unsigned char* out, unsigned count) {
  if (threadIdx.x == 0 && blockIdx.x == 0 && count > 0) out[0] = staging[0];
}

constexpr unsigned kGrid = 2, kThreads = 1024;

struct Rig {
  std::size_t chunk = 0, max_chunks = 0;
  std::byte* host = nullptr;
  std::byte* dev = nullptr;
  unsigned char* sink = nullptr;
  std::uint64_t* flags = nullptr;  // one per chunk
  std::uint64_t value = 0;
  cudaStream_t caller = nullptr;
  cudaStream_t lanes[2] = {};
  std::vector<cudaEvent_t> done;  // one per chunk (the slots' done events)
  cudaEvent_t start = nullptr, lane_end = nullptr, end = nullptr;
  CUcontext ctx = nullptr;

  struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    std::vector<CUgraphNode> waits;
    std::vector<cudaGraphNode_t> copies, kernels;
    std::vector<CUstreamBatchMemOpParams> ops;  // one per chunk, kept for the node parameters
  };
  std::map<std::size_t, Graph> graphs;

  CUstreamBatchMemOpParams wait_op(std::size_t c, std::uint64_t v) const {
    CUstreamBatchMemOpParams op{};
    op.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
    op.waitValue.address = reinterpret_cast<CUdeviceptr>(&flags[c]);
    op.waitValue.value64 = v;
    op.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    return op;
  }

  // A wait node's parameters: the one operation `op`.
  CUDA_BATCH_MEM_OP_NODE_PARAMS wait_node(CUstreamBatchMemOpParams& op) const {
    CUDA_BATCH_MEM_OP_NODE_PARAMS mp{};
    mp.ctx = ctx;
    mp.count = 1;
    mp.paramArray = &op;
    return mp;
  }

  // Chunk c's kernel node parameters; they point into `a`, which must outlive their use.
  struct KernelArgs {
    const unsigned char* staging = nullptr;
    unsigned char* sink = nullptr;
    unsigned count = 1;
    void* ptrs[3] = {};
  };
  cudaKernelNodeParams kernel_node(std::size_t c, KernelArgs& a) const {
    a.staging = reinterpret_cast<const unsigned char*>(dev + c * chunk);
    a.sink = sink;
    a.ptrs[0] = &a.staging;
    a.ptrs[1] = &a.sink;
    a.ptrs[2] = &a.count;
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(touch_kernel);
    kp.gridDim = dim3(kGrid);
    kp.blockDim = dim3(kThreads);
    kp.kernelParams = a.ptrs;
    return kp;
  }

  Graph& graph(std::size_t n) {
    auto it = graphs.find(n);
    if (it != graphs.end()) return it->second;
    Graph& g = graphs[n];
    cudaGraph_t graph = nullptr;
    check(cudaGraphCreate(&graph, 0), "cudaGraphCreate");
    g.ops.resize(n);
    g.waits.resize(n);
    g.copies.resize(n);
    g.kernels.resize(n);
    std::vector<cudaGraphNode_t> ends(n);
    for (std::size_t c = 0; c < n; ++c) {
      g.ops[c] = wait_op(c, 1);
      const CUDA_BATCH_MEM_OP_NODE_PARAMS mp = wait_node(g.ops[c]);
      CUgraphNode dep = c >= 2 ? reinterpret_cast<CUgraphNode>(ends[c - 2]) : nullptr;
      drv(cuGraphAddBatchMemOpNode(&g.waits[c], reinterpret_cast<CUgraph>(graph),
                                   dep != nullptr ? &dep : nullptr, dep != nullptr ? 1 : 0, &mp),
          "cuGraphAddBatchMemOpNode");
      cudaGraphNode_t w = reinterpret_cast<cudaGraphNode_t>(g.waits[c]);
      check(cudaGraphAddMemcpyNode1D(&g.copies[c], graph, &w, 1, dev + c * chunk, host + c * chunk,
                                     chunk, cudaMemcpyHostToDevice),
            "cudaGraphAddMemcpyNode1D");
      KernelArgs args;
      const cudaKernelNodeParams kp = kernel_node(c, args);
      check(cudaGraphAddKernelNode(&g.kernels[c], graph, &g.copies[c], 1, &kp),
            "cudaGraphAddKernelNode");
      check(cudaGraphAddEventRecordNode(&ends[c], graph, &g.kernels[c], 1, done[c]),
            "cudaGraphAddEventRecordNode");
    }
    check(cudaGraphInstantiate(&g.exec, graph, 0), "cudaGraphInstantiate");
    g.graph = graph;  // kept: its nodes name the executable graph's nodes to update
    return g;
  }

  void enqueue_streams(std::size_t n) {
    check(cudaEventRecord(start, caller), "cudaEventRecord start");
    for (cudaStream_t l : lanes)
      check(cudaStreamWaitEvent(l, start, 0), "cudaStreamWaitEvent start");
    for (std::size_t c = 0; c < n; ++c) {
      cudaStream_t l = lanes[c % 2];
      drv(cuStreamWaitValue64(reinterpret_cast<CUstream>(l),
                              reinterpret_cast<CUdeviceptr>(&flags[c]), value,
                              CU_STREAM_WAIT_VALUE_GEQ),
          "cuStreamWaitValue64");
      check(cudaMemcpyAsync(dev + c * chunk, host + c * chunk, chunk, cudaMemcpyHostToDevice, l),
            "cudaMemcpyAsync");
      touch_kernel<<<kGrid, kThreads, 0, l>>>(
          reinterpret_cast<const unsigned char*>(dev + c * chunk), sink, 1);
      check(cudaGetLastError(), "touch_kernel");
      check(cudaEventRecord(done[c], l), "cudaEventRecord done");
    }
    check(cudaEventRecord(lane_end, lanes[1]), "cudaEventRecord lane");
    check(cudaStreamWaitEvent(lanes[0], lane_end, 0), "cudaStreamWaitEvent lane");
    check(cudaEventRecord(end, lanes[0]), "cudaEventRecord end");
    check(cudaStreamWaitEvent(caller, end, 0), "cudaStreamWaitEvent end");
  }

  void enqueue_graph(std::size_t n, bool set_all, bool set_waits) {
    Graph& g = graph(n);
    for (std::size_t c = 0; c < n && (set_all || set_waits); ++c) {
      g.ops[c] = wait_op(c, value);
      const CUDA_BATCH_MEM_OP_NODE_PARAMS mp = wait_node(g.ops[c]);
      drv(cuGraphExecBatchMemOpNodeSetParams(reinterpret_cast<CUgraphExec>(g.exec), g.waits[c],
                                             &mp),
          "cuGraphExecBatchMemOpNodeSetParams");
      if (!set_all) continue;
      check(cudaGraphExecMemcpyNodeSetParams1D(g.exec, g.copies[c], dev + c * chunk,
                                               host + c * chunk, chunk, cudaMemcpyHostToDevice),
            "cudaGraphExecMemcpyNodeSetParams1D");
      KernelArgs args;
      const cudaKernelNodeParams kp = kernel_node(c, args);
      check(cudaGraphExecKernelNodeSetParams(g.exec, g.kernels[c], &kp),
            "cudaGraphExecKernelNodeSetParams");
    }
    check(cudaGraphLaunch(g.exec, caller), "cudaGraphLaunch");
  }

  // One repetition: {host us, gpu us}.
  std::pair<double, double> run(const std::string& v, std::size_t n) {
    ++value;
    if (v != "streams" && v != "graph_set" && v != "graph_wait") {
      // graph_launch: the waits keep the value they were given last; make them pass at it.
      Graph& g = graph(n);
      value = g.ops[0].waitValue.value64;
    }
    const auto t0 = Clock::now();
    if (v == "streams")
      enqueue_streams(n);
    else
      enqueue_graph(n, v == "graph_set", v == "graph_wait");
    const double host_us = gfd::bench::since_us(t0);
    std::this_thread::sleep_for(
        std::chrono::microseconds(300));  // the GPU waits on the flags by now
    const auto t1 = Clock::now();
    for (std::size_t c = 0; c < n; ++c)
      std::atomic_ref<std::uint64_t>(flags[c]).store(value, std::memory_order_release);
    check(cudaStreamSynchronize(caller), "cudaStreamSynchronize");
    return {host_us, gfd::bench::since_us(t1)};
  }
};

int run_main(int argc, char** argv) {
  gfd::bench::Flags flags(argc, argv, kFlags);
  if (gfd::micro::usage_or_no_device("enqueue_cost", flags, kFlags)) return 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::size_t chunk = gfd::bench::parse_size(flags.get("chunk", "2M"));
  const std::vector<std::size_t> counts = flags.get_sizes("chunks", {4, 8, 16});
  const int iters = static_cast<int>(flags.get_int("iters", 30));
  std::vector<std::string> variants;
  for (const std::string& v :
       flags.get_list("variants", "streams,graph_set,graph_wait,graph_launch"))
    if (!v.empty()) variants.push_back(v);
  for (const std::string& v : variants)
    if (v != "streams" && v != "graph_set" && v != "graph_wait" && v != "graph_launch")
      throw std::invalid_argument("--variants: unknown variant " + v);
  if (chunk == 0 || iters < 1 || counts.empty())
    throw std::invalid_argument("--chunk > 0, --iters >= 1, --chunks");
  std::size_t most = 0;
  for (std::size_t n : counts) {
    if (n == 0 || n > 256) throw std::invalid_argument("--chunks: each between 1 and 256");
    most = std::max(most, n);
  }

  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "cudaFree(nullptr)");
  Rig rig;
  rig.chunk = chunk;
  rig.max_chunks = most;
  drv(cuCtxGetCurrent(&rig.ctx), "cuCtxGetCurrent");
  check(cudaHostAlloc(reinterpret_cast<void**>(&rig.host), chunk * most, cudaHostAllocDefault),
        "cudaHostAlloc");
  gfd::bench::fill_random(rig.host, chunk * most);
  check(cudaMalloc(reinterpret_cast<void**>(&rig.dev), chunk * most), "cudaMalloc");
  check(cudaMalloc(reinterpret_cast<void**>(&rig.sink), 64), "cudaMalloc sink");
  check(cudaHostAlloc(reinterpret_cast<void**>(&rig.flags), most * sizeof(std::uint64_t),
                      cudaHostAllocDefault),
        "cudaHostAlloc flags");
  std::memset(rig.flags, 0, most * sizeof(std::uint64_t));
  check(cudaStreamCreateWithFlags(&rig.caller, cudaStreamNonBlocking), "cudaStreamCreate");
  for (cudaStream_t& l : rig.lanes)
    check(cudaStreamCreateWithFlags(&l, cudaStreamNonBlocking), "cudaStreamCreate");
  rig.done.resize(most);
  for (cudaEvent_t& e : rig.done)
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  for (cudaEvent_t* e : {&rig.start, &rig.lane_end, &rig.end})
    check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");

  // Loaded now: with lazy module loading the first launch of a kernel may wait for the device,
  // here for lanes that wait on flags set only once everything is enqueued (a deadlock).
  touch_kernel<<<kGrid, kThreads, 0, rig.caller>>>(reinterpret_cast<const unsigned char*>(rig.dev),
                                                   rig.sink, 1);
  check(cudaStreamSynchronize(rig.caller), "touch_kernel warm-up");
  std::printf("enqueue_cost: chunks of %s, warm pinned to device, two lanes\n",
              gfd::bench::format_size(chunk).c_str());
  std::printf("%-12s %6s | %9s %9s | %9s %8s\n", "variant", "chunks", "host us", "us/chunk",
              "gpu us", "GB/s");
  for (std::size_t n : counts)
    for (const std::string& v : variants) {
      std::vector<double> host, gpu;
      for (int i = 0; i < 5 + iters; ++i) {
        const auto [h, g] = rig.run(v, n);
        if (i >= 5) {
          host.push_back(h);
          gpu.push_back(g);
        }
      }
      const double h = gfd::bench::percentiles(host).p50, g = gfd::bench::percentiles(gpu).p50;
      // A graph launch's waits pass at once (the flags hold their value already): no GPU time.
      if (v == "graph_launch")
        std::printf("%-12s %6zu | %9.1f %9.2f | %9s %8s\n", v.c_str(), n, h, h / n, "-", "-");
      else
        std::printf("%-12s %6zu | %9.1f %9.2f | %9.1f %8.2f\n", v.c_str(), n, h, h / n, g,
                    n * chunk / (g * 1e3));
    }
  std::vector<std::byte> back(chunk * most);
  check(cudaMemcpy(back.data(), rig.dev, back.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  const bool ok = std::memcmp(back.data(), rig.host, back.size()) == 0;
  std::printf("verified %s\n", ok ? "yes" : "NO");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return gfd::micro::guarded_main("enqueue_cost", [&] { return run_main(argc, argv); });
}
