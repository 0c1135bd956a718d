#include "paged_report.hpp"

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace gfd::bench::paged {

void print_table(const std::vector<Row>& rows, const std::string& label) {
  if (label.rfind("host-only", 0) == 0)
    std::printf(
        "\nhost-only figures (emulated device: its 'DMA' is a host memcpy; nothing here crosses "
        "PCIe or says how fast a GPU is):");
  std::printf("\n%-3s %-5s %6s %-14s %-6s %9s %9s %7s %7s %10s %7s %8s %-8s\n", "dir", "size",
              "blocks", "method", "load", "p50_GB/s", "p90_GB/s", "ratio", "r_p90", "submit_us",
              "kept", "slowdown", "verified");
  for (const Row& r : rows) {
    char kept[16] = "-", slow[16] = "-";
    if (r.kept >= 0) std::snprintf(kept, sizeof kept, "%.1f%%", 100 * r.kept);
    if (r.slowdown > -1) std::snprintf(slow, sizeof slow, "%+.1f%%", 100 * r.slowdown);
    const double ratio = r.ref_gbps > 0 ? r.p50_gbps() / r.ref_gbps : 0;
    const double ratio90 = r.ref_gbps > 0 ? r.p90_gbps() / r.ref_gbps : 0;
    std::printf("%-3s %-5s %6zu %-14s %-6s %9.2f %9.2f %6.1f%% %6.1f%% %10.1f %7s %8s %-8s\n",
                r.direction.c_str(), format_size(r.size).c_str(), r.n, r.method.c_str(),
                r.load.c_str(), r.p50_gbps(), r.p90_gbps(), 100 * ratio, 100 * ratio90, r.submit_us,
                kept, slow,
                r.verified < 0 ? "-"
                : r.verified   ? "yes"
                               : "NO");
  }
  std::printf(
      "(%s; ratio = P50 GB/s / P50 of the contiguous DMA of the same bytes, r_p90 the same "
      "of P90; submit_us = P50 of the time the submitting call blocked its caller)\n",
      label.c_str());
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& label,
               bool warm, int layers, std::size_t tensors) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("--csv: cannot write " + path);
  f << "mode,layout,sources,direction,load,layers,caches,blocks,block_size,transfer_bytes,method,"
       "reps,p50_us,p90_us,p50_gbps,p90_gbps,ref_gbps,ratio_p50,ratio_p90,submit_p50_us,rate_kept,"
       "load_slowdown,verified,host_blocks,gpu_blocks\n";
  auto opt = [](double v, bool ok) { return ok ? std::to_string(v) : std::string(); };
  for (const Row& r : rows)
    f << label << ",paged," << (warm ? "warm" : "cold") << ',' << r.direction << ',' << r.load
      << ',' << layers << ',' << tensors << ',' << r.n << ',' << r.size << ',' << r.bytes << ','
      << r.method << ',' << r.reps << ',' << r.us.p50 << ',' << r.us.p90 << ',' << r.p50_gbps()
      << ',' << r.p90_gbps() << ',' << r.ref_gbps << ',' << r.p50_gbps() / r.ref_gbps << ','
      << r.p90_gbps() / r.ref_gbps << ',' << r.submit_us << ',' << opt(r.kept, r.kept >= 0) << ','
      << opt(r.slowdown, r.slowdown > -1) << ','
      << (r.verified < 0 ? ""
          : r.verified   ? "1"
                         : "0")
      << ',' << r.host_blocks << ',' << r.gpu_blocks << '\n';
}

}  // namespace gfd::bench::paged
