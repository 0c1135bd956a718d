// gfd_benchmark --trace: the engine's timeline of the median timed transfer of one
// configuration, printed as submission stages, piece durations and one line per chunk
// (published, first and last piece, issued, DMA done, threads, slowest piece), so that a reader
// sees where the time went: planning, the pipeline's fill, a straggling piece, the copy engine.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "testkit/testkit.hpp"

namespace gfd::bench {

// `ev`: the trace of a run of timed repetitions (testkit::take_trace), one transfer each; `us`:
// their call-to-sync times in the same order. Prints "trace: unusable" when the two do not
// match (a --batch run, say).
void print_trace(const std::vector<testkit::TraceEvent>& ev, const std::vector<double>& us,
                 std::size_t n, std::size_t size, const std::string& mode,
                 const std::string& backend);

}  // namespace gfd::bench
