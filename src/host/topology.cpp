#include "host/topology.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gfd/error.hpp"

namespace gfd::detail {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  if (in) std::getline(in, s);
  return s;
}

std::string trim(const std::string& s) {
  std::size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

}  // namespace

std::vector<int> parse_cpulist(const std::string& text) {
  std::vector<int> cpus;
  const std::string t = trim(text);
  if (t.empty()) return cpus;
  std::stringstream ss(t);
  std::string part;
  auto bad = [&] { throw Error(ErrorCode::kInvalidArgument, "malformed CPU list '" + text + "'"); };
  auto num = [&](const std::string& s) {
    if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), ::isdigit)) bad();
    return std::stoi(s);
  };
  while (std::getline(ss, part, ',')) {
    part = trim(part);
    const auto dash = part.find('-');
    if (dash == std::string::npos) {
      cpus.push_back(num(part));
    } else {
      const int lo = num(part.substr(0, dash)), hi = num(part.substr(dash + 1));
      if (hi < lo) bad();
      for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    }
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) cpus.push_back(0);
  return cpus;
}

GpuLocality read_gpu_locality(const std::string& pci_bus_id, const std::string& sysfs_root) {
  GpuLocality loc;
  const std::vector<int> allowed = allowed_cpus();
  std::string id = pci_bus_id;
  std::transform(id.begin(), id.end(), id.begin(), ::tolower);
  std::vector<int> local;
  if (!id.empty()) {
    const std::string dir = sysfs_root + "/bus/pci/devices/" + id + "/";
    const std::string node = trim(read_line(dir + "numa_node"));
    const std::string list = read_line(dir + "local_cpulist");
    loc.from_sysfs = !node.empty() || !list.empty();
    if (!node.empty()) {
      try {
        loc.numa_node = std::stoi(node);
      } catch (...) {
        loc.numa_node = -1;
      }
    }
    if (loc.numa_node >= 0 && !list.empty()) {
      try {
        local = parse_cpulist(list);
      } catch (const Error&) {
        local.clear();
      }
    }
  }
  if (loc.numa_node < 0) loc.numa_node = -1;
  // No locality reported (numa_node -1, as on single-socket VMs): every allowed CPU is local.
  for (int c : local)
    if (std::binary_search(allowed.begin(), allowed.end(), c)) loc.cpus.push_back(c);
  if (loc.cpus.empty()) loc.cpus = allowed;
  return loc;
}

std::vector<int> split_cpus(const std::vector<int>& cpus, int rank, int count) {
  if (cpus.empty() || count <= 1) return cpus;
  const auto n = static_cast<std::size_t>(cpus.size());
  const auto k = static_cast<std::size_t>(count), r = static_cast<std::size_t>(rank) % k;
  if (n < k) return {cpus[r % n]};
  return std::vector<int>(cpus.begin() + static_cast<std::ptrdiff_t>(n * r / k),
                          cpus.begin() + static_cast<std::ptrdiff_t>(n * (r + 1) / k));
}

std::vector<std::string> host_gpu_bus_ids(const std::string& sysfs_root) {
  std::vector<std::string> out;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::path(sysfs_root) / "bus" / "pci" / "devices";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string d = entry.path().string() + "/";
    const std::string vendor = trim(read_line(d + "vendor"));
    const std::string cls = trim(read_line(d + "class"));
    // 0x030200: 3D controller (data-centre GPUs), 0x030000: VGA-compatible controller.
    if (vendor == "0x10de" && (cls.rfind("0x0302", 0) == 0 || cls.rfind("0x0300", 0) == 0)) {
      std::string id = entry.path().filename().string();
      std::transform(id.begin(), id.end(), id.begin(), ::tolower);
      out.push_back(id);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

CpuShare share_cpus(const std::string& pci_bus_id, const GpuLocality& loc,
                    const std::vector<std::string>& all_bus_ids, const std::string& sysfs_root) {
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), ::tolower);
    return s;
  };
  const std::string me = lower(pci_bus_id);
  std::vector<std::string> group;
  std::vector<std::string> candidates = all_bus_ids;
  if (!me.empty())
    for (const std::string& id : host_gpu_bus_ids(sysfs_root)) candidates.push_back(id);
  for (const std::string& id : candidates) {
    const std::string other = lower(id);
    if (other == me || read_gpu_locality(other, sysfs_root).numa_node == loc.numa_node)
      group.push_back(other);
  }
  std::sort(group.begin(), group.end());
  group.erase(std::unique(group.begin(), group.end()), group.end());
  const auto it = std::find(group.begin(), group.end(), me);
  if (me.empty() || it == group.end() || group.size() < 2) return {loc.cpus, 1};
  const int count = static_cast<int>(group.size());
  return {split_cpus(loc.cpus, static_cast<int>(it - group.begin()), count), count};
}

bool pin_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return true;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus)
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

std::string format_cpulist(const std::vector<int>& cpus) {
  std::string out;
  for (std::size_t i = 0; i < cpus.size();) {
    std::size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) out += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace gfd::detail
