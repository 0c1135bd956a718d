// The output of gfd_benchmark --layout pool: the table and the small-request latencies on
// stdout, and the CSV and JSON files that bench/measure.sh, bench/summarize.py and
// bench/plot_results.py read.
#pragma once

#include <string>
#include <vector>

#include "pool_bench.hpp"

namespace gfd::bench::pool {

// How a run was made, for the file outputs' columns.
struct RunLabel {
  std::string mode;  // gpu or host-only, with -pageable
  const char* direction;
  const char* sources;  // cold or warm
  const char* layout;   // pool or strided
  std::size_t pitch;
};

void print_rows(const std::vector<Row>& rows, bool to_host, bool host_only);
void print_latency(const std::vector<Row>& rows, bool host_only);
// Scripts read the columns by name; new columns go at the end.
void write_csv(const std::string& path, const std::vector<Row>& rows, const RunLabel& run);
void write_json(const std::string& path, const std::vector<Row>& rows, const RunLabel& run);

}  // namespace gfd::bench::pool
