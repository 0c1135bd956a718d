#include "pool_report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <utility>

namespace gfd::bench::pool {
namespace {

std::string slowdown(const Row& r) {
  return r.slowdown >= -0.5 ? std::to_string(r.slowdown) : std::string();
}
// Optional numbers: empty in the CSV, null in the JSON.
std::string opt(double v, bool json) {
  return v >= 0 ? std::to_string(v) : std::string(json ? "null" : "");
}

}  // namespace

void print_rows(const std::vector<Row>& rows, bool to_host, bool host_only) {
  if (host_only)
    std::printf(
        "\nhost-only figures (emulated device: its 'DMA' is a host memcpy; nothing here crosses "
        "PCIe or says how fast a GPU is):");
  // Scripts read these columns by position: new columns go at the end.
  std::printf(
      "\n%-6s %-5s %-10s %-16s %-8s %9s %9s %9s %9s %9s %7s %7s %8s %8s %-8s %-5s %16s %7s %7s\n",
      "blocks", "size", "dst", "backend", "load", "p50_us", "p90_us", "p50_GB/s", "p90_GB/s",
      "ref_GB/s", "ratio", "thr", "cpu_s/GB", "slowdown", "verified", "pool",
      to_host ? "place_only_GB/s" : "gather_only_GB/s", "eff", "kept");
  for (const Row& r : rows) {
    char slow[16] = "-", stage[24] = "-", eff[16] = "-", kept[16] = "-";
    if (r.slowdown >= -0.5) std::snprintf(slow, sizeof slow, "%+.1f%%", 100 * r.slowdown);
    if (r.stage_gbps > 0) std::snprintf(stage, sizeof stage, "%.2f", r.stage_gbps);
    if (r.eff() >= 0) std::snprintf(eff, sizeof eff, "%.1f%%", 100 * r.eff());
    if (r.kept >= 0) std::snprintf(kept, sizeof kept, "%.1f%%", 100 * r.kept);
    std::printf(
        "%-6zu %-5s %-10s %-16s %-8s %9.1f %9.1f %9.2f %9.2f %9.2f %6.1f%% %7d %8.3f %8s %-8s %-5s "
        "%16s %7s %7s\n",
        r.n, format_size(r.size).c_str(), r.dst.c_str(), r.backend.c_str(), r.load.c_str(),
        r.us.p50, r.us.p90, r.p50_gbps(), r.p90_gbps(), r.ref_gbps,
        r.ref_gbps > 0 ? 100 * r.p50_gbps() / r.ref_gbps : 0, r.threads, r.cpu_s_per_gb, slow,
        r.verified ? "yes" : "NO", r.pool.c_str(), stage, eff, kept);
  }
}

void print_latency(const std::vector<Row>& rows, bool host_only) {
  bool any = false;
  for (const Row& r : rows) any = any || (r.size == 4096 && r.n <= 256 && r.load == "none");
  if (!any) return;
  std::printf("\nsmall-request latency (4 KB blocks, call to stream sync returning), us%s:\n",
              host_only ? ", host-only (emulated device, no PCIe)" : "");
  std::printf("%-16s %-10s %-5s %12s %12s %12s\n", "backend", "dst", "pool", "16 p50/p90",
              "64 p50/p90", "256 p50/p90");
  std::vector<std::string> pools;  // in the order they ran
  for (const Row& r : rows)
    if (std::find(pools.begin(), pools.end(), r.pool) == pools.end()) pools.push_back(r.pool);
  for (const std::string& pool : pools) {
    std::set<std::pair<std::string, std::string>> keys;
    for (const Row& r : rows)
      if (r.load == "none" && r.pool == pool) keys.insert({r.backend, r.dst});
    for (const auto& [backend, dst] : keys) {
      std::printf("%-16s %-10s %-5s", backend.c_str(), dst.c_str(), pool.c_str());
      for (std::size_t n : {16, 64, 256}) {
        const Row* hit = nullptr;
        for (const Row& r : rows)
          if (r.backend == backend && r.dst == dst && r.pool == pool && r.n == n &&
              r.size == 4096 && r.load == "none")
            hit = &r;
        if (hit)
          std::printf(" %5.1f/%-6.1f", hit->us.p50, hit->us.p90);
        else
          std::printf(" %12s", "-");
      }
      std::printf("\n");
    }
  }
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const RunLabel& run) {
  std::ofstream f(path);
  f << "mode,sources,direction,load,blocks,block_size,dst,backend,p50_us,p90_us,p50_gbps,p90_gbps,"
       "ref_gbps,"
       "ratio_p50,ratio_p90,cpu_s_per_gb,threads,compute_slowdown,verified,pool,gather_only_gbps,"
       "eff,"
       "rate_kept,layout,pitch\n";
  for (const Row& r : rows)
    f << run.mode << ',' << run.sources << ',' << run.direction << ',' << r.load << ',' << r.n
      << ',' << r.size << ',' << r.dst << ',' << r.backend << ',' << r.us.p50 << ',' << r.us.p90
      << ',' << r.p50_gbps() << ',' << r.p90_gbps() << ',' << r.ref_gbps << ','
      << r.p50_gbps() / r.ref_gbps << ',' << r.p90_gbps() / r.ref_gbps << ',' << r.cpu_s_per_gb
      << ',' << r.threads << ',' << slowdown(r) << ',' << (r.verified ? 1 : 0) << ',' << r.pool
      << ',' << opt(r.stage_gbps, false) << ',' << opt(r.eff(), false) << ',' << opt(r.kept, false)
      << ',' << run.layout << ',' << run.pitch << '\n';
}

void write_json(const std::string& path, const std::vector<Row>& rows, const RunLabel& run) {
  std::ofstream f(path);
  f << "{\"mode\":\"" << run.mode << "\",\"sources\":\"" << run.sources << "\",\"direction\":\""
    << run.direction << "\",\"rows\":[";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << (i ? "," : "") << "{\"blocks\":" << r.n << ",\"block_size\":" << r.size << ",\"dst\":\""
      << r.dst << "\",\"backend\":\"" << r.backend << "\",\"load\":\"" << r.load
      << "\",\"p50_us\":" << r.us.p50 << ",\"p90_us\":" << r.us.p90
      << ",\"p50_gbps\":" << r.p50_gbps() << ",\"p90_gbps\":" << r.p90_gbps()
      << ",\"ref_gbps\":" << r.ref_gbps << ",\"cpu_s_per_gb\":" << r.cpu_s_per_gb
      << ",\"threads\":" << r.threads
      << ",\"compute_slowdown\":" << (r.slowdown >= -0.5 ? std::to_string(r.slowdown) : "null")
      << ",\"verified\":" << (r.verified ? "true" : "false") << ",\"pool\":\"" << r.pool
      << "\",\"gather_only_gbps\":" << opt(r.stage_gbps, true) << ",\"eff\":" << opt(r.eff(), true)
      << ",\"rate_kept\":" << opt(r.kept, true) << ",\"layout\":\"" << run.layout
      << "\",\"pitch\":" << run.pitch << "}";
  }
  f << "]}\n";
}

}  // namespace gfd::bench::pool
