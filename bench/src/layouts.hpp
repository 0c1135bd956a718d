// The layouts gfd_benchmark measures, each a program of its own behind one main.
//  - paged (the default, paged_bench.cpp): the caches of a paged-KV serving runtime (vLLM's
//    shape), L layers x K and V = 2L device caches, each its own allocation, and 2L pinned host
//    caches; a transfer moves the same N block ids of every cache pair. gfd (caches registered
//    once, copy_blocks with ids only) against cudaMemcpyBatchAsync, per-block cudaMemcpyAsync
//    and UVA copy kernels.
//  - pool and strided (pool_main.cpp): blocks of one source pool to one device buffer, every
//    backend of gfd; strided takes each transfer's blocks in a row at a constant pitch.
// Each method is given as a ratio to the contiguous DMA of the same bytes measured in the same run.
#pragma once

#include <string>

namespace gfd::bench {

// Each runs its layout with argv's flags and returns the exit status for main (2 when a
// measurement failed verification or a method's call failed; the others still run). They throw
// on bad flags or a failed CUDA call outside the methods.
int run_paged_benchmark(int argc, char** argv);
int run_pool_benchmark(int argc, char** argv, const std::string& layout);

}  // namespace gfd::bench
