// gfd_multi_gpu_benchmark: its flags, read in one place into MultiGpuOptions, and its rows.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "gfd/gfd.hpp"

namespace gfd::bench::multi_gpu {

struct MultiGpuOptions {
  std::vector<int> gpus;     // --gpus; empty: every visible GPU (--one-gpu: GPU 0)
  std::vector<int> counts;   // --counts; empty: 1, 2, 4, ... up to all, and all
  bool one_gpu = false;      // --one-gpu or --engines: engines (caller threads) on one GPU
  std::vector<int> engines;  // --engines, ascending, 1 first (--one-gpu: 1, 2, 4, 8)
  bool emulated = false;     // --emulated: the host-emulated device even where a GPU is visible
  std::size_t blocks = 2048, block_size = 4096;
  std::vector<Backend> backends;
  int iters = 30, warmup = 5;
  bool warm = false;
  std::optional<std::size_t> pool_bytes;
  std::string csv, json;
};

// Reads argv's flags. Returns nullopt after printing the usage for --help; throws
// std::invalid_argument naming the flag for a bad value.
std::optional<MultiGpuOptions> parse_multi_gpu_flags(int argc, char** argv);

struct Row {
  int gpus = 0;
  std::string backend, gpu;  // gpu: ordinal or "all"
  Percentiles us;
  double gbps = 0, ref_gbps = 0, efficiency = -1;
  int threads = 0;
  std::string cpus;
  bool verified = true;
};

// The table on stdout, and the CSV and JSON files bench/plot_results.py reads.
void print_rows(const std::vector<Row>& rows);
void write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& label,
               const MultiGpuOptions& o);
void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& label,
                const MultiGpuOptions& o);

}  // namespace gfd::bench::multi_gpu
