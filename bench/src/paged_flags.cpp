#include "paged_flags.hpp"

#include <algorithm>
#include <iostream>
#include <map>
#include <stdexcept>

namespace gfd::bench::paged {
namespace {

const std::map<std::string, std::string> kFlags = {
    {"layout", "=L          paged (this one, the default) or pool (the source-pool benchmark)"},
    {"layers", "=N          layers L: 2L caches (K and V) on each side (default 32; --quick 8)"},
    {"blocks", "=N[,N...]   blocks per transfer (default sweep 16,64,256,1024,4096 at 4K)"},
    {"block-sizes", "=S[,S...] bytes of one block of one cache (default sweep 2K..2M at N=64)"},
    {"host-cache-bytes", "=S  pinned host caches, all 2L together (default 4G; host-only 256M)"},
    {"device-cache-bytes",
     "=S cap on device memory: caches + reference (default 40G, at most\n"
     "                   70% of the free memory; host-only 1G)"},
    {"max-transfer",
     "=S    cap on the bytes of one transfer, N x 2L x block (default 1G;\n"
     "                   host-only 64M): larger grid points get fewer blocks"},
    {"direction", "=D       h2d (loads), d2h (stores) or both (default both)"},
    {"methods",
     "=M[,M...]  gfd, gfd_zero_copy, batch, per_block, uva2, uva12 (default all; the\n"
     "                   contiguous DMA is always measured); gfd's stages alone, named\n"
     "                   only: gather_only (its gather threads' copies into a buffer the\n"
     "                   ring's size, placing to the host for d2h; no GPU work) and\n"
     "                   place_only (its placing kernel from device staging, packing for\n"
     "                   d2h, on a highest-priority stream as its lanes; a GPU only); both\n"
     "                   only at sizes gfd stages (below direct_min_bytes)"},
    {"iters", "=N           timed repetitions per configuration (default 20, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 3)"},
    {"warm", "              reuse the same block ids every repetition (default: fresh ids)"},
    {"device", "=N          CUDA device (default 0)"},
    {"csv", "=FILE          write results as CSV"},
    {"quick", "             one configuration: 4K x 64 blocks x 8 layers"},
    {"trace",
     "             print the engine's timeline of gfd's median transfer per configuration"},
    {"under-load",
     "[=decode]  also measure while bf16 matmuls run back to back on a stream of\n"
     "                   the transfers' priority (GPU only)"},
    {"help", "              this text"},
};

std::vector<Method> methods_flag(const Flags& flags) {
  std::vector<Method> out;
  if (!flags.has("methods")) {
    for (const MethodName& m : kMethods)
      if (m.method != Method::kDma && !is_stage(m.method)) out.push_back(m.method);
    return out;
  }
  for (const std::string& name : flags.get_list("methods")) {
    const MethodName* hit = nullptr;
    for (const MethodName& m : kMethods)
      if (m.method != Method::kDma && name == m.name) hit = &m;
    if (hit == nullptr)
      throw std::invalid_argument("--methods: '" + name +
                                  "' is not a method (gfd, gfd_zero_copy, "
                                  "batch, per_block, uva2, uva12, gather_only, place_only)");
    if (std::find(out.begin(), out.end(), hit->method) == out.end()) out.push_back(hit->method);
  }
  return out;
}

// h2d first: stores overwrite the host caches' pattern.
std::vector<bool> directions_flag(const Flags& flags) {
  const std::string direction = flags.get("direction", "both");
  if (direction != "h2d" && direction != "d2h" && direction != "both")
    throw std::invalid_argument("--direction must be h2d, d2h or both");
  std::vector<bool> out;
  if (direction != "d2h") out.push_back(false);
  if (direction != "h2d") out.push_back(true);
  return out;
}

// The default cases, --quick's, or the product of --blocks and --block-sizes.
std::vector<Case> cases_flag(const Flags& flags) {
  std::vector<Case> out;
  if (flags.has("quick")) {
    out = {kQuickCase};
  } else if (!flags.has("blocks") && !flags.has("block-sizes")) {
    out.assign(std::begin(kDefaultCases), std::end(kDefaultCases));
  } else {
    for (std::size_t s : flags.get_sizes("block-sizes", {4096}))
      for (std::size_t n : flags.get_sizes("blocks", {64})) out.push_back({s, n, true});
  }
  for (const Case& c : out)
    if (c.block_size % 8 != 0)
      throw std::invalid_argument("block size " + std::to_string(c.block_size) +
                                  ": not a multiple of 8");
  return out;
}

std::optional<std::size_t> size_flag(const Flags& flags, const char* name) {
  if (!flags.has(name)) return std::nullopt;
  return parse_size(flags.get(name));
}

}  // namespace

std::optional<PagedOptions> parse_paged_flags(int argc, char** argv) {
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_benchmark --layout paged: a paged KV cache's transfers (2L cache pairs, the "
                 "same block ids in each), gfd against the CUDA peers and the contiguous DMA\n"
              << Flags::usage(kFlags);
    return std::nullopt;
  }
  PagedOptions o;
  o.iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 20)));
  o.warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 3)));
  o.warm = flags.has("warm");
  o.trace = flags.has("trace");
  o.layers = static_cast<int>(flags.get_int("layers", flags.has("quick") ? 8 : 32));
  if (o.layers < 1) throw std::invalid_argument("--layers must be at least 1");
  o.tensors = 2 * static_cast<std::size_t>(o.layers);
  o.to_host = directions_flag(flags);
  o.methods = methods_flag(flags);
  o.under_load = flags.has("under-load");
  if (o.under_load && flags.get("under-load") != "1" && flags.get("under-load") != "decode")
    throw std::invalid_argument("--under-load=" + flags.get("under-load") + ": the mode is decode");
  o.device = static_cast<int>(flags.get_int("device", 0));
  o.cases = cases_flag(flags);
  o.host_cache_bytes = size_flag(flags, "host-cache-bytes");
  o.device_cache_bytes = size_flag(flags, "device-cache-bytes");
  o.max_transfer = size_flag(flags, "max-transfer");
  o.csv = flags.get("csv");
  return o;
}

}  // namespace gfd::bench::paged
