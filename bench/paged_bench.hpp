// gfd_benchmark --layout paged: the caches of a paged-KV serving runtime (vLLM's shape), L layers
// x K and V = 2L device caches, each its own allocation, and 2L pinned host caches; a transfer
// moves the same N block ids of every cache pair. gfd (caches registered once, copy_blocks with
// ids only) against cudaMemcpyBatchAsync, per-block cudaMemcpyAsync and UVA copy kernels, each
// as a ratio to the contiguous DMA of the same bytes measured in the same run.
#pragma once

#include <string>

namespace gfd::bench {

// The value of --layout in argv: "pool" when absent. Throws std::invalid_argument for anything
// but pool or paged.
std::string layout_flag(int argc, char** argv);

// Runs the paged-layout benchmark with argv's flags; returns the exit status for main (2 when a
// measurement failed verification or a method's call failed; the others still run). Throws on
// bad flags or a failed CUDA call outside the methods.
int run_paged_benchmark(int argc, char** argv);

}  // namespace gfd::bench
