#include "multi_gpu_flags.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

namespace gfd::bench::multi_gpu {
namespace {

const std::map<std::string, std::string> kFlags = {
    {"gpus", "=N[,N...]     devices to use (default: every visible GPU)"},
    {"counts", "=G[,G...]   GPU counts to run (default 1, 2, 4, ... up to all, and all)"},
    {"blocks", "=N          blocks per GPU per repetition (default 2048)"},
    {"block-size", "=S      block size (default 4K)"},
    {"backends", "=B[,B...] gather, batch_async, per_block, zero_copy_kernel (default all)"},
    {"iters", "=N           timed repetitions (default 30, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 5)"},
    {"warm", "              reuse the same source blocks every repetition (default: cold)"},
    {"pool-bytes", "=S      source pool per GPU (default max(8 x L3 / GPUs, 32 x transfer))"},
    {"csv", "=FILE          write results as CSV"},
    {"json", "=FILE         write results as JSON"},
    {"help", "              this text"},
};

std::vector<int> ints(const Flags& flags, const char* name) {
  std::vector<int> out;
  for (std::size_t v : flags.get_sizes(name, {})) out.push_back(static_cast<int>(v));
  return out;
}

std::string csv_cpus(std::string s) {
  std::replace(s.begin(), s.end(), ',', ' ');
  return s;
}

}  // namespace

std::optional<MultiGpuOptions> parse_multi_gpu_flags(int argc, char** argv) {
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_multi_gpu_benchmark: one thread per GPU, every backend, G = 1 ... all GPUs\n"
              << Flags::usage(kFlags);
    return std::nullopt;
  }
  MultiGpuOptions o;
  o.iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 30)));
  o.warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 5)));
  o.warm = flags.has("warm");
  o.blocks = flags.get_sizes("blocks", {2048})[0];
  o.block_size = flags.get_sizes("block-size", {4096})[0];
  o.backends = backends_flag(flags);
  o.gpus = ints(flags, "gpus");
  o.counts = ints(flags, "counts");
  if (flags.has("pool-bytes")) o.pool_bytes = parse_size(flags.get("pool-bytes"));
  o.csv = flags.get("csv");
  o.json = flags.get("json");
  return o;
}

void print_rows(const std::vector<Row>& rows) {
  std::printf("\n%-4s %-16s %-5s %9s %9s %9s %9s %7s %6s %-12s %s\n", "G", "backend", "gpu",
              "p50_us", "GB/s", "ref_GB/s", "ratio", "scaling", "thr", "cpus", "verified");
  for (const Row& r : rows) {
    char eff[16] = "-";
    if (r.efficiency >= 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * r.efficiency);
    std::printf("%-4d %-16s %-5s %9.1f %9.2f %9.2f %8.1f%% %7s %6d %-12s %s\n", r.gpus,
                r.backend.c_str(), r.gpu.c_str(), r.us.p50, r.gbps, r.ref_gbps,
                r.ref_gbps > 0 ? 100 * r.gbps / r.ref_gbps : 0, eff, r.threads,
                r.cpus.empty() ? "-" : r.cpus.c_str(), r.verified ? "yes" : "NO");
  }
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& label,
               const MultiGpuOptions& o) {
  std::ofstream f(path);
  f << "mode,sources,backend,gpus,gpu,blocks,block_size,p50_us,p90_us,p50_gbps,ref_gbps,scaling_"
       "efficiency,threads,"
       "cpus,verified\n";
  for (const Row& r : rows)
    f << label << ',' << (o.warm ? "warm" : "cold") << ',' << r.backend << ',' << r.gpus << ','
      << r.gpu << ',' << o.blocks << ',' << o.block_size << ',' << r.us.p50 << ',' << r.us.p90
      << ',' << r.gbps << ',' << r.ref_gbps << ','
      << (r.efficiency >= 0 ? std::to_string(r.efficiency) : "") << ',' << r.threads << ','
      << csv_cpus(r.cpus) << ',' << (r.verified ? 1 : 0) << '\n';
}

void write_json(const std::string& path, const std::vector<Row>& rows, const std::string& label,
                const MultiGpuOptions& o) {
  std::ofstream f(path);
  f << "{\"mode\":\"" << label << "\",\"sources\":\"" << (o.warm ? "warm" : "cold")
    << "\",\"blocks\":" << o.blocks << ",\"block_size\":" << o.block_size << ",\"rows\":[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << (i ? "," : "") << "{\"gpus\":" << r.gpus << ",\"backend\":\"" << r.backend
      << "\",\"gpu\":\"" << r.gpu << "\",\"p50_us\":" << r.us.p50 << ",\"p90_us\":" << r.us.p90
      << ",\"p50_gbps\":" << r.gbps << ",\"ref_gbps\":" << r.ref_gbps
      << ",\"scaling_efficiency\":" << (r.efficiency >= 0 ? std::to_string(r.efficiency) : "null")
      << ",\"threads\":" << r.threads << ",\"cpus\":\"" << r.cpus
      << "\",\"verified\":" << (r.verified ? "true" : "false") << "}";
  }
  f << "]}\n";
}

}  // namespace gfd::bench::multi_gpu
