// The output of gfd_benchmark --layout paged: the table on stdout and the CSV that
// bench/measure.sh, bench/summarize.py and bench/plot_results.py read.
#pragma once

#include <string>
#include <vector>

#include "paged_types.hpp"

namespace gfd::bench::paged {

void print_table(const std::vector<Row>& rows, const std::string& label);

// Scripts read the columns by name; new columns go at the end.
void write_csv(const std::string& path, const std::vector<Row>& rows, const std::string& label,
               bool warm, int layers, std::size_t tensors);

}  // namespace gfd::bench::paged
