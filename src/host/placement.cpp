#include "host/placement.hpp"

#include <numa.h>

#include <string>

#include "common/env.hpp"
#include "gfd/error.hpp"
#include "host/topology.hpp"

namespace gfd::detail {

Placement place_engine(const EngineOptions& o, Device& device) {
  Placement pl;
  // Locality: the GPU's node and CPUs (sysfs), or the node the caller asked for.
  const GpuLocality loc = read_gpu_locality(device.pci_bus_id());
  pl.numa_node = o.numa_node == -1 ? loc.numa_node : o.numa_node;
  if (o.numa_node == -2) pl.numa_node = -1;
  pl.cpus = loc.cpus;
  if (o.numa_node >= 0) {
    bitmask* mask = numa_allocate_cpumask();
    std::vector<int> node_cpus;
    if (numa_node_to_cpus(o.numa_node, mask) == 0) {
      for (int c : allowed_cpus())
        if (numa_bitmask_isbitset(mask, static_cast<unsigned>(c))) node_cpus.push_back(c);
    }
    numa_free_cpumask(mask);
    if (!node_cpus.empty()) pl.cpus = node_cpus;
  }
  if (!o.cpus.empty()) {
    // The operator's list (validated by EngineOptions::validate): no split, no node's CPUs.
    pl.cpus = parse_cpulist(o.cpus);
    log_info("GPU " + std::to_string(device.ordinal()) + ": its engine takes CPUs " +
             format_cpulist(pl.cpus) + " (EngineOptions::cpus / GFD_CPUS)");
    return pl;
  }
  if (o.numa_node == -1 && !o.use_all_local_cpus) {
    // One engine per GPU: GPUs that share these CPUs get equal, disjoint parts of them.
    const CpuShare share = share_cpus(device.pci_bus_id(), loc, device.all_bus_ids());
    pl.cpu_sharing = share.sharing;
    if (share.sharing > 1) {
      pl.cpus = share.cpus;
      log_info(
          "GPU " + std::to_string(device.ordinal()) + " shares its " +
          std::to_string(loc.cpus.size()) + " local CPUs with " +
          std::to_string(share.sharing - 1) +
          " other GPU(s) of this host (visible to this process or not): its engine takes CPUs " +
          format_cpulist(pl.cpus) +
          " (set use_all_local_cpus or GFD_USE_ALL_LOCAL_CPUS=1 to use all, or cpus / GFD_CPUS to "
          "choose)");
    }
  }
  return pl;
}

}  // namespace gfd::detail
