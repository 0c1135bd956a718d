// gfd_benchmark --layout pool (and strided): scattered host blocks of one source pool to one
// device buffer (or back), through every backend, each against the contiguous pinned DMA of the
// same bytes measured in the same run. Cold sources by default (fresh random blocks of a pool
// several times the L3 each repetition); --warm reuses the same blocks. Every byte is verified
// once per configuration and backend, outside the timed region.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"
#include "pool_flags.hpp"
#include "source_pool.hpp"
#include "stage_only.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench::pool {

struct Row {
  std::size_t n = 0, size = 0;
  std::string dst, backend, load = "none", pool;
  Percentiles us;
  double ref_gbps = 0, cpu_s_per_gb = 0, submit_us = 0, slowdown = -1;
  double stage_gbps = -1;  // gather-only (place-only to the host) rate of the same run; -1: none
  double kept = -1;  // under load: P50 GB/s under load / the same backend's idle P50; -1: none
  int threads = 0;
  bool verified = false;
  double p50_gbps() const { return us.p50 > 0 ? n * size / (us.p50 * 1e3) : 0; }
  double p90_gbps() const { return us.p90 > 0 ? n * size / (us.p90 * 1e3) : 0; }  // slower tail
  // The pipeline against the slower of its two halves measured alone: -1 without a gather-only
  // rate.
  double eff() const {
    const double bound = std::min(stage_gbps, ref_gbps);
    return stage_gbps > 0 && bound > 0 ? p50_gbps() / bound : -1;
  }
};

inline double gbps(std::size_t bytes, double us) { return us > 0 ? bytes / (us * 1e3) : 0; }

struct BackendEngine {
  Backend backend;
  Engine engine;
};

class PoolBench {
 public:
  testkit::Device dev;
  cudaStream_t stream = nullptr;
  bool host_only = false, warm = false, trace = false, to_host = false;
  // --layout strided: each transfer's blocks in a row at a pitch of `pitch` blocks (constant-
  // stride runs); otherwise random blocks at that pitch.
  bool strided = false;
  std::size_t pitch = 2;
  int iters = 30, warmup = 5;
  std::size_t batch = 1;
  std::unique_ptr<SourcePool> pool;
  std::unique_ptr<HostPool> stage_buffer;  // declared first: outlives the threads that write it
  std::unique_ptr<StageOnly> stage;  // the gather-only / place-only threads (with a gather engine)
  std::byte* ref_src = nullptr;
  std::byte* dst = nullptr;
  std::size_t max_bytes = 0;
  int failures = 0;
  std::string pool_name;  // the kind of `pool`, for the rows

  // One contiguous pinned cudaMemcpyAsync of `bytes`, timed like the backends (call to sync).
  Percentiles reference(std::size_t bytes);

  // Block lists of one configuration: fresh random sources each call unless warm.
  struct Blocks {
    SourcePicker picker;
    std::mt19937_64 rng;
    std::vector<std::size_t> dst_pages;
    std::vector<std::vector<BlockCopy>> sets;
  };
  Blocks make_blocks(std::size_t n, std::size_t size, std::size_t sets,
                     std::uint64_t seed = 0xC0FFEE);
  void refill(Blocks& b, std::size_t size, bool scattered);

  // One transfer in the configured direction; device-to-host handles are waited on by callers.
  Transfer submit(Engine& engine, const std::vector<BlockCopy>& blocks);

  // Moves one fresh set and compares every byte: to the device, against the host blocks with the
  // device area cleared first; to the host, against the device area (given fresh bytes first).
  bool verify(Engine& engine, Blocks& b, std::size_t size, bool scattered);

  // Times one backend on one configuration.
  Row measure(BackendEngine& be, std::size_t n, std::size_t size, const std::string& mode,
              double ref_gbps);

  // The gather-only (host to device) or place-only (device to host) rate of one configuration:
  // the stage-only threads copy the same kind of block lists (fresh blocks each repetition unless
  // warm, from the same pool with the same picker, another seed so that they are not the blocks
  // the pipeline just read) between the pool and the staging-sized buffer, timed call to
  // all-done, P50 over the same repetitions. Checks the bytes of the last repetition.
  double stage_only_gbps(std::size_t n, std::size_t size, bool& verified);

  // The pipeline timeline of the median timed transfer: where the time goes. --trace covers the
  // backends whose engine records a timeline: the gather pipeline's stages, and the zero-copy
  // kernel's planning and launch.
  bool traced(Backend b) const {
    return trace && (b == Backend::kGather || b == Backend::kZeroCopyKernel);
  }

 private:
  // The timed repetitions of measure(): per-transfer call-to-done and submit times.
  void time_transfers(BackendEngine& be, Blocks& b, std::size_t size, bool scattered,
                      std::vector<double>& us, std::vector<double>& submit_us, double& cpu_s);
};

// Each backend while compute keeps every SM busy, in each of `modes` (sm_load.cpp).
std::vector<Row> under_load(PoolBench& bench, std::vector<BackendEngine>& engines, std::size_t n,
                            std::size_t size, double ref_gbps, const std::vector<LoadMode>& modes,
                            const std::function<double(BackendEngine&)>& idle_gbps);

// How much of the host's memory bandwidth the copy engine keeps while CPU threads copy memory
// as the gather threads do (host_load_probe.cpp).
void host_load_probe(PoolBench& b, std::size_t bytes);

}  // namespace gfd::bench::pool
