// Where a GPU sits: its NUMA node and the CPUs local to it, read from sysfs by PCI bus id.
#pragma once

#include <string>
#include <vector>

namespace gfd::detail {

struct GpuLocality {
  int numa_node = -1;       // -1: the system reports no locality
  std::vector<int> cpus;    // CPUs local to the GPU that this process may run on (never empty)
  bool from_sysfs = false;  // false when sysfs had nothing for the bus id
};

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}. Throws gfd::Error on malformed input.
std::vector<int> parse_cpulist(const std::string& text);

// Reads <sysfs_root>/bus/pci/devices/<bus_id>/{numa_node,local_cpulist}. A missing file or
// numa_node -1 means "no locality": all CPUs this process may use.
GpuLocality read_gpu_locality(const std::string& pci_bus_id,
                              const std::string& sysfs_root = "/sys");

// PCI bus ids (lower case) of every NVIDIA GPU sysfs lists under <sysfs_root>/bus/pci/devices
// (vendor 0x10de, class 3D or VGA controller), whatever CUDA_VISIBLE_DEVICES lets this process
// see: the other processes of a host each run their own GPU's engine.
std::vector<std::string> host_gpu_bus_ids(const std::string& sysfs_root = "/sys");

// The part of a GPU's local CPUs its engine takes when every GPU runs an engine: GPUs with the
// same locality (the same NUMA node, or all GPUs that report none) among `all_bus_ids` (those
// this process sees) and every GPU of the host that sysfs lists (host_gpu_bus_ids) split those
// CPUs into equal consecutive parts in PCI bus id order, so that engines, in one process or in
// one process per GPU, never share a CPU. More GPUs than CPUs: each GPU gets one CPU, round
// robin.
struct CpuShare {
  std::vector<int> cpus;  // this GPU's part (never empty)
  int sharing = 1;        // GPUs splitting the same CPUs (1: the GPU has them to itself)
};
CpuShare share_cpus(const std::string& pci_bus_id, const GpuLocality& loc,
                    const std::vector<std::string>& all_bus_ids,
                    const std::string& sysfs_root = "/sys");
// The pure split: part `rank` of `count` equal consecutive parts of `cpus`.
std::vector<int> split_cpus(const std::vector<int>& cpus, int rank, int count);

// CPUs this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

// Pins the calling thread to `cpus` (no-op when empty). Returns false if the OS refused.
bool pin_current_thread(const std::vector<int>& cpus);

// "0-3,8" style text for logs and stats.
std::string format_cpulist(const std::vector<int>& cpus);

}  // namespace gfd::detail
