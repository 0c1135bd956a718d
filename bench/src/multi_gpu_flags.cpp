#include "multi_gpu_flags.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>

namespace gfd::bench::multi_gpu {
namespace {

const std::map<std::string, std::string> kFlags = {
    {"gpus",
     "=N[,N...]     devices to use (default: every visible GPU; --one-gpu: one, default 0)"},
    {"counts", "=G[,G...]   GPU counts to run (default 1, 2, 4, ... up to all, and all)"},
    {"blocks", "=N          blocks per GPU per repetition (default 2048)"},
    {"block-size", "=S      block size (default 4K)"},
    {"backends",
     "=B[,B...] gather, batch_async, per_block, zero_copy_kernel (default all;\n"
     "                   --one-gpu: gather, batch_async, per_block)"},
    {"iters", "=N           timed repetitions (default 30, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 5)"},
    {"warm", "              reuse the same source blocks every repetition (default: cold)"},
    {"pool-bytes",
     "=S      source pool per GPU (default max(8 x L3 / GPUs, 32 x transfer); --one-gpu:\n"
     "                   shared by the callers, default max(8 x L3, 8 x engines x transfer))"},
    {"one-gpu",
     "          engines on ONE GPU instead, each with its own caller thread, CPUs and\n"
     "                   stream, submitting at the same moment: each call's time and the caller's\n"
     "                   CPU time per transfer, and the time until every transfer is done, as the\n"
     "                   engines are added (GFD_CPUS is replaced by each engine's share)"},
    {"engines", "=N[,N...]  engine counts of --one-gpu (default 1,2,4,8; 1 is always run)"},
    {"emulated", "         the host-emulated device even where a GPU is visible (host-only)"},
    {"csv", "=FILE          write results as CSV"},
    {"json", "=FILE         write results as JSON (not with --one-gpu)"},
    {"help", "              this text"},
};

// A list of integers from 0 (device ordinals and counts; not sizes, which exclude 0).
std::vector<int> ints(const Flags& flags, const char* name) {
  std::vector<int> out;
  if (!flags.has(name)) return out;
  for (const std::string& part : flags.get_list(name)) {
    std::size_t pos = 0;
    int v = -1;
    try {
      v = std::stoi(part, &pos);
    } catch (...) {
    }
    if (v < 0 || pos != part.size())
      throw std::invalid_argument("--" + std::string(name) + "=" + flags.get(name) + ": '" + part +
                                  "' is not a whole number from 0");
    out.push_back(v);
  }
  return out;
}

std::string csv_cpus(std::string s) {
  std::replace(s.begin(), s.end(), ',', ' ');
  return s;
}

// --one-gpu / --engines: the counts (1 always first, each once, ascending) and the flags of the
// GPU-count mode it does not take.
void one_gpu_flags(const Flags& flags, MultiGpuOptions& o) {
  o.one_gpu = flags.has("one-gpu") || flags.has("engines");
  if (!o.one_gpu) return;
  if (flags.has("counts"))
    throw std::invalid_argument("--counts: GPU counts; --one-gpu takes --engines");
  if (flags.has("json")) throw std::invalid_argument("--json: not with --one-gpu (use --csv)");
  if (o.gpus.size() > 1) throw std::invalid_argument("--gpus: --one-gpu uses one GPU");
  std::vector<int> n = flags.has("engines") ? ints(flags, "engines") : std::vector<int>{1, 2, 4, 8};
  for (int e : n)
    if (e < 1 || e > 64)
      throw std::invalid_argument("--engines: " + std::to_string(e) + " is outside 1..64");
  n.push_back(1);  // the ratios are to one engine's figures
  std::sort(n.begin(), n.end());
  n.erase(std::unique(n.begin(), n.end()), n.end());
  o.engines = n;
  if (!flags.has("backends"))
    o.backends = {Backend::kGather, Backend::kBatchAsync, Backend::kPerBlock};
}

}  // namespace

std::optional<MultiGpuOptions> parse_multi_gpu_flags(int argc, char** argv) {
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_multi_gpu_benchmark: one thread per GPU, every backend, G = 1 ... all GPUs;\n"
                 "with --one-gpu: 1, 2, 4, 8 engines and caller threads on one GPU\n"
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
  o.emulated = flags.has("emulated");
  one_gpu_flags(flags, o);
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
