// gfd_multi_gpu_benchmark --one-gpu: engines and their caller threads added on one GPU.
#pragma once

#include "multi_gpu_flags.hpp"

namespace gfd::bench::multi_gpu {

// Runs the --one-gpu mode with `o`; returns the exit status (2: a transfer's bytes were wrong).
int run_one_gpu(MultiGpuOptions o);

}  // namespace gfd::bench::multi_gpu
