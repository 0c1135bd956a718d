#include "one_gpu_report.hpp"

#include <cstdio>
#include <fstream>
#include <map>

namespace gfd::bench::multi_gpu {
namespace {

double ratio(double v, double one) { return one > 0 ? v / one : -1; }

std::string ratio_text(double r) {
  if (r < 0) return "-";
  char s[16];
  std::snprintf(s, sizeof s, "%.2fx", r);
  return s;
}

std::string csv_ratio(double r) { return r < 0 ? "" : std::to_string(r); }

}  // namespace

void fill_ratios(std::vector<OneGpuRow>& rows, std::size_t bytes) {
  std::map<std::string, const OneGpuRow*> one;
  for (const OneGpuRow& r : rows)
    if (r.engines == 1) one[r.backend] = &r;
  double ref = 0;
  if (one.count("contiguous") && one["contiguous"]->e2e_us.p50 > 0)
    ref = bytes / (one["contiguous"]->e2e_us.p50 * 1e3);
  // Copied first: the row of one engine is itself in `rows`.
  std::map<std::string, OneGpuRow> base;
  for (const auto& [name, r] : one) base[name] = *r;
  for (OneGpuRow& r : rows) {
    r.ref_gbps = ref;
    if (!base.count(r.backend)) continue;
    const OneGpuRow& b = base[r.backend];
    r.call_ratio = ratio(r.call_us.p50, b.call_us.p50);
    r.cpu_ratio = ratio(r.cpu_us.p50, b.cpu_us.p50);
    r.e2e_ratio = ratio(r.e2e_us.p50, b.e2e_us.p50);
  }
}

void print_one_gpu_rows(const std::vector<OneGpuRow>& rows) {
  std::printf("\n%-3s %-16s %9s %9s %7s %9s %7s %9s %7s %8s %4s %-14s %s\n", "N", "backend",
              "call_p50", "call_p90", "x1", "cpu_p50", "x1", "e2e_p50", "x1", "GB/s", "thr",
              "caller_cpus", "verified");
  for (const OneGpuRow& r : rows)
    std::printf("%-3d %-16s %9.1f %9.1f %7s %9.1f %7s %9.1f %7s %8.2f %4d %-14s %s\n", r.engines,
                r.backend.c_str(), r.call_us.p50, r.call_us.p90, ratio_text(r.call_ratio).c_str(),
                r.cpu_us.p50, ratio_text(r.cpu_ratio).c_str(), r.e2e_us.p50,
                ratio_text(r.e2e_ratio).c_str(), r.gbps, r.threads, r.caller_cpus.c_str(),
                r.verified < 0 ? "-"
                : r.verified   ? "yes"
                               : "NO");
  std::printf(
      "times in us; call: each caller held in the submit call, P50/P90 over callers and "
      "repetitions; cpu: the caller's CPU time in that call; e2e: per repetition, from the common "
      "start until every caller's transfer is done; x1: over the same backend with N = 1\n");
}

void print_one_gpu_summary(const std::vector<OneGpuRow>& rows) {
  std::map<std::string, const OneGpuRow*> most;  // the row of the most engines per backend
  std::vector<std::string> order;
  for (const OneGpuRow& r : rows) {
    if (!most.count(r.backend)) order.push_back(r.backend);
    if (!most.count(r.backend) || r.engines > most[r.backend]->engines) most[r.backend] = &r;
  }
  for (const std::string& name : order) {
    const OneGpuRow& r = *most[name];
    if (r.engines == 1) continue;
    std::printf("%-16s %d engines over 1: call %s, caller's CPU %s, end to end %s\n", name.c_str(),
                r.engines, ratio_text(r.call_ratio).c_str(), ratio_text(r.cpu_ratio).c_str(),
                ratio_text(r.e2e_ratio).c_str());
  }
  if (!rows.empty() && rows.front().ref_gbps > 0)
    std::printf("contiguous DMA of one caller's bytes alone: %.2f GB/s\n", rows.front().ref_gbps);
}

void write_one_gpu_csv(const std::string& path, const std::vector<OneGpuRow>& rows,
                       const std::string& label, const MultiGpuOptions& o) {
  std::ofstream f(path);
  f << "mode,sources,engines,backend,blocks,block_size,call_p50_us,call_p90_us,call_ratio,"
       "cpu_p50_us,cpu_p90_us,cpu_ratio,e2e_p50_us,e2e_p90_us,e2e_ratio,p50_gbps,ref_gbps,"
       "threads,caller_cpus,gather_cpus,verified\n";
  for (const OneGpuRow& r : rows)
    f << label << ',' << (o.warm ? "warm" : "cold") << ',' << r.engines << ',' << r.backend << ','
      << o.blocks << ',' << o.block_size << ',' << r.call_us.p50 << ',' << r.call_us.p90 << ','
      << csv_ratio(r.call_ratio) << ',' << r.cpu_us.p50 << ',' << r.cpu_us.p90 << ','
      << csv_ratio(r.cpu_ratio) << ',' << r.e2e_us.p50 << ',' << r.e2e_us.p90 << ','
      << csv_ratio(r.e2e_ratio) << ',' << r.gbps << ',' << r.ref_gbps << ',' << r.threads << ','
      << r.caller_cpus << ',' << r.gather_cpus << ','
      << (r.verified < 0 ? "" : std::to_string(r.verified)) << '\n';
}

}  // namespace gfd::bench::multi_gpu
