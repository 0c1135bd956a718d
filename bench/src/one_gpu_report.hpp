// gfd_multi_gpu_benchmark --one-gpu: one result row per engine count and case, and the table and
// CSV made of them.
#pragma once

#include <string>
#include <vector>

#include "bench_common.hpp"
#include "multi_gpu_flags.hpp"

namespace gfd::bench::multi_gpu {

struct OneGpuRow {
  int engines = 0;
  std::string backend;  // a gfd backend, or "contiguous" (one cudaMemcpyAsync per caller)
  Percentiles call_us;  // how long each caller was held in the call, over callers and repetitions
  Percentiles cpu_us;   // the caller's CPU time in that call
  Percentiles e2e_us;   // per repetition: from the common start until every transfer is done
  // Each P50 over the same backend's P50 with one engine (-1: no such row).
  double call_ratio = -1, cpu_ratio = -1, e2e_ratio = -1;
  double gbps = 0;      // every caller's bytes over the P50 end-to-end time
  double ref_gbps = 0;  // the contiguous DMA of one caller's bytes, alone, in this run
  int threads = 0;      // gather threads of each engine
  std::string caller_cpus, gather_cpus;  // "0 2 4", "1|3|5" (one CPU list per engine)
  int verified = -1;                     // 1 yes, 0 failed, -1 not checked (contiguous)
};

// Fills every row's ratios from the row of its backend with one engine, and ref_gbps from the
// contiguous row with one engine (bytes: one caller's transfer).
void fill_ratios(std::vector<OneGpuRow>& rows, std::size_t bytes);

// The table on stdout, and the CSV (`label`: "gpu" or "host-only").
void print_one_gpu_rows(const std::vector<OneGpuRow>& rows);
// Per backend, the most engines' figures over one engine's, in a line.
void print_one_gpu_summary(const std::vector<OneGpuRow>& rows);
void write_one_gpu_csv(const std::string& path, const std::vector<OneGpuRow>& rows,
                       const std::string& label, const MultiGpuOptions& o);

}  // namespace gfd::bench::multi_gpu
