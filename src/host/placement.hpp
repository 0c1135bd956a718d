// Where an engine's staging memory and gather threads go: the GPU's NUMA node and local CPUs
// (sysfs), or the node the options name, and this GPU's share of CPUs that other GPUs' engines
// would use too.
#pragma once

#include <vector>

#include "device/device.hpp"
#include "gfd/options.hpp"

namespace gfd::detail {

struct Placement {
  int numa_node = -1;     // node to bind staging memory and threads to (-1: none)
  std::vector<int> cpus;  // CPUs for the gather threads (never empty)
  int cpu_sharing = 1;    // GPUs whose engines split these CPUs (1: none)
};

// `options` must have passed EngineOptions::validate().
Placement place_engine(const EngineOptions& options, Device& device);

}  // namespace gfd::detail
