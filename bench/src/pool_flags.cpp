#include "pool_flags.hpp"

#include <algorithm>
#include <iostream>
#include <map>
#include <stdexcept>

#include "bench_common.hpp"

namespace gfd::bench::pool {
namespace {

const std::map<std::string, std::string> kFlags = {
    {"blocks", "=N[,N...]    block counts (default sweep 16..16384 at 4K)"},
    {"block-sizes", "=S[,S...] block sizes, e.g. 512,4K,64K (default sweep 512..256K at N=2048)"},
    {"backends", "=B[,B...]  gather, batch_async, per_block, zero_copy_kernel (default all)"},
    {"iters", "=N           timed repetitions per configuration (default 30, at least 20)"},
    {"warmup", "=N          untimed repetitions first (default 5)"},
    {"warm", "              reuse the same source blocks every repetition (default: cold)"},
    {"dst", "=MODE          contiguous | scattered | both (default contiguous)"},
    {"device", "=N          CUDA device (default 0)"},
    {"pool-bytes",
     "=S      source pool size (default max(8 x L3, 32 x largest transfer), at most RAM/2;\n"
     "                   host-only: also at most RAM/8 and 1G)"},
    {"csv", "=FILE          write results as CSV"},
    {"json", "=FILE         write results as JSON"},
    {"quick", "             a short grid: 2048 x 4K only"},
    {"batch", "=K           submit K transfers back to back per repetition, one sync (default 1)"},
    {"under-load",
     "[=M[,M...]] also measure each backend (2048 x 4K, or the first grid point) while compute\n"
     "                   fills every SM; modes: high (one long kernel, transfers on a "
     "highest-priority\n"
     "                   stream), equal (one long kernel, transfers on a stream of its priority, "
     "as a\n"
     "                   runtime's current stream), short (short kernels back to back, equal "
     "priority);\n"
     "                   all three when no mode is given"},
    {"pool",
     "=P[,P...]     source pool: cuda (cudaHostAlloc, default), gfd (gfd::HostPool: huge pages, "
     "the\n"
     "                   GPU's NUMA node, registered), mmap (mmap + cudaHostRegister), both (= "
     "cuda,gfd);\n"
     "                   several: the whole grid once per pool"},
    {"trace",
     "             print the timeline of the median transfer (gather pipeline, zero-copy kernel)"},
    {"host-load-probe",
     "   only measure the contiguous DMA while 0 to 15 threads copy host memory"},
    {"direction",
     "=D       h2d (host to device, default) or d2h (device to host); --dst then names the\n"
     "                   device side's layout"},
    {"pageable",
     "          host blocks in pageable memory (not registered); zero_copy_kernel skipped"},
    {"layout",
     "=L          paged (default: a paged KV cache's 2L cache pairs, scattered both sides, gfd\n"
     "                   against the CUDA peers; --layout paged --help lists its flags), pool "
     "(this\n"
     "                   text: random blocks of one pool into one device buffer, every backend) "
     "or\n"
     "                   strided (the same, each transfer's blocks in a row at a pitch of --pitch\n"
     "                   blocks from a random start: constant-stride runs)"},
    {"pitch", "=K           blocks between the starts of two source blocks (default 2)"},
    {"help", "              this text"},
};

std::vector<LoadMode> load_modes_flag(const Flags& flags) {
  const std::string v = flags.get("under-load");
  if (v == "1" || v == "all") return {std::begin(kLoadModes), std::end(kLoadModes)};
  std::vector<LoadMode> out;
  for (const std::string& name : flags.get_list("under-load")) {
    const LoadMode* hit = nullptr;
    for (const LoadMode& m : kLoadModes)
      if (name == m.name) hit = &m;
    if (hit == nullptr)
      throw std::invalid_argument("--under-load=" + v + ": '" + name +
                                  "' is not a mode (high, equal, short, or a comma list of them; "
                                  "--under-load alone runs all three)");
    bool seen = false;
    for (const LoadMode& m : out) seen = seen || m.name == hit->name;
    if (!seen) out.push_back(*hit);
  }
  return out;
}

// The default cases, --quick's, or the product of --blocks and --block-sizes.
std::vector<Case> cases_flag(const Flags& flags) {
  if (flags.has("quick")) return {kQuickCase};
  if (!flags.has("blocks") && !flags.has("block-sizes"))
    return {std::begin(kDefaultCases), std::end(kDefaultCases)};
  std::vector<Case> out;
  for (std::size_t n : flags.get_sizes("blocks", {2048}))
    for (std::size_t s : flags.get_sizes("block-sizes", {4096})) out.push_back({n, s});
  return out;
}

// --pool: cudaHostAlloc by default, as runtimes allocate their pinned KV pool today; with
// --pageable (no pinned pool at all), the unregistered mmap the benchmark has always used.
std::vector<PoolKind> pools_flag(const Flags& flags, bool pageable) {
  std::vector<PoolKind> pools{pageable ? PoolKind::kMmap : PoolKind::kCuda};
  if (flags.has("pool")) pools = pool_kinds_flag(flags.get("pool"));
  if (pageable && std::find(pools.begin(), pools.end(), PoolKind::kCuda) != pools.end())
    throw std::invalid_argument(
        "--pool=cuda with --pageable: cudaHostAlloc memory is always pinned; "
        "use --pool=mmap or --pool=gfd (unregistered) with --pageable");
  return pools;
}

void read_modes(const Flags& flags, PoolOptions& o) {
  const std::string direction = flags.get("direction", "h2d");
  if (direction != "h2d" && direction != "d2h")
    throw std::invalid_argument("--direction must be h2d or d2h");
  o.to_host = direction == "d2h";
  o.dst = flags.get("dst", "contiguous");
  if (o.dst != "contiguous" && o.dst != "scattered" && o.dst != "both")
    throw std::invalid_argument("--dst must be contiguous, scattered or both");
  o.pageable = flags.has("pageable");
  o.pools = pools_flag(flags, o.pageable);
  o.under_load = flags.has("under-load");
  if (o.under_load) o.load_modes = load_modes_flag(flags);
}

}  // namespace

std::optional<PoolOptions> parse_pool_flags(int argc, char** argv, const std::string& layout) {
  Flags flags(argc, argv, kFlags);
  if (flags.has("help")) {
    std::cout << "gfd_benchmark --layout pool: scattered host-to-GPU block copies of one pool, "
                 "every backend\n"
                 "against the contiguous DMA (the default layout is paged: gfd_benchmark --help)\n"
              << Flags::usage(kFlags);
    return std::nullopt;
  }
  PoolOptions o;
  o.iters = static_cast<int>(std::max<long long>(20, flags.get_int("iters", 30)));
  o.warmup = static_cast<int>(std::max<long long>(1, flags.get_int("warmup", 5)));
  o.warm = flags.has("warm");
  o.trace = flags.has("trace");
  o.strided = layout == "strided";
  o.pitch = static_cast<std::size_t>(std::max<long long>(1, flags.get_int("pitch", 2)));
  o.batch = static_cast<std::size_t>(std::max<long long>(1, flags.get_int("batch", 1)));
  o.device = static_cast<int>(flags.get_int("device", 0));
  read_modes(flags, o);
  o.backends = backends_flag(flags);
  o.cases = cases_flag(flags);
  o.cases_from_flags = flags.has("blocks") || flags.has("block-sizes");
  if (flags.has("pool-bytes")) o.pool_bytes = parse_size(flags.get("pool-bytes"));
  o.host_load_probe = flags.has("host-load-probe");
  o.csv = flags.get("csv");
  o.json = flags.get("json");
  return o;
}

}  // namespace gfd::bench::pool
