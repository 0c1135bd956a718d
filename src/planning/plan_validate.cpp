// Block validation for the planner: pointer classification (RangeCache), per-block checks,
// overlaps.
#include <algorithm>
#include <cstdio>
#include <string>

#include "gfd/error.hpp"
#include "planning/planner_internal.hpp"

namespace gfd::detail {
namespace {

// CUDA registers and allocates host memory in whole pages and keeps device allocations in their
// own address ranges, so a 4 KB page the driver does not know holds no CUDA memory at all.
constexpr std::uintptr_t kGranule = 4096;

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

[[noreturn]] void bad_block(std::size_t i, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "block " + std::to_string(i) + ": " + what, i);
}

// Sorts (key, index) pairs by key: LSD radix sort on the keys' offsets from the smallest, in
// 11-bit digits. A few passes over the array instead of n log n comparisons: this runs for
// every transfer with scattered destinations (a paged KV cache), before any data moves.
void radix_sort(std::vector<std::pair<std::uintptr_t, std::uint32_t>>& v,
                std::vector<std::pair<std::uintptr_t, std::uint32_t>>& tmp,
                std::vector<std::uint32_t>& count) {
  if (v.size() < 2) return;
  if (v.size() < 256) {  // a few passes over 2048 buckets cost more than sorting a few keys
    std::stable_sort(v.begin(), v.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    return;
  }
  std::uintptr_t lo = v[0].first, hi = v[0].first;
  for (const auto& e : v) {
    lo = std::min(lo, e.first);
    hi = std::max(hi, e.first);
  }
  tmp.resize(v.size());
  constexpr unsigned kBits = 11;
  constexpr std::size_t kBuckets = std::size_t{1} << kBits;
  count.resize(kBuckets);
  for (unsigned shift = 0; shift < 64 && ((hi - lo) >> shift) != 0; shift += kBits) {
    std::fill(count.begin(), count.end(), 0);
    for (const auto& e : v) ++count[((e.first - lo) >> shift) & (kBuckets - 1)];
    std::uint32_t sum = 0;
    for (auto& c : count) {
      const std::uint32_t x = c;
      c = sum;
      sum += x;
    }
    for (const auto& e : v) tmp[count[((e.first - lo) >> shift) & (kBuckets - 1)]++] = e;
    v.swap(tmp);
  }
}

// The overlap check of a paged KV cache's scattered destinations: when every block has the same
// power-of-two size and every destination lies on one grid of that size, two destinations
// overlap exactly when they start at the same place, so a hash set of grid slots finds them in
// one pass, where sorting the addresses cost 30-37 ns per block (bench/micro/micro_planner,
// BM_Check/shuffled_dst). False when the blocks do not qualify (the caller sorts instead); a
// duplicate is reported through `report(a, b)`, which throws.
template <class Report>
bool duplicate_on_grid(std::span<const BlockCopy> blocks, Plan::Scratch& scratch, Report&& report) {
  const std::size_t n = blocks.size();
  const std::size_t size = blocks[0].bytes;
  if (n < 2 || size == 0 || (size & (size - 1)) != 0 || n > (std::size_t{1} << 30)) return false;
  std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(blocks[0].dst);
  bool same = true;
  for (const BlockCopy& b : blocks) {
    same &= b.bytes == size;
    lo = std::min(lo, reinterpret_cast<std::uintptr_t>(b.dst));
  }
  if (!same) return false;
  const std::uintptr_t mask = size - 1;
  const unsigned shift = static_cast<unsigned>(__builtin_ctzll(size));
  std::uintptr_t off = 0;
  for (const BlockCopy& b : blocks) off |= reinterpret_cast<std::uintptr_t>(b.dst) - lo;
  if ((off & mask) != 0) return false;
  unsigned bits = 6;
  while ((std::size_t{1} << bits) < 2 * n) ++bits;
  auto& slots = scratch.slots;
  auto& owner = scratch.owner;
  slots.assign(std::size_t{1} << bits, 0);  // 0: empty; else grid slot + 1
  owner.resize(slots.size());
  const std::size_t wrap = slots.size() - 1;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t key = ((reinterpret_cast<std::uintptr_t>(blocks[i].dst) - lo) >> shift) + 1;
    std::size_t h = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
    while (slots[h] != 0 && slots[h] != key) h = (h + 1) & wrap;
    if (slots[h] == key) report(owner[h], i);
    slots[h] = key;
    owner[h] = static_cast<std::uint32_t>(i);
  }
  return true;
}

}  // namespace

std::string describe(const PointerInfo& info) {
  switch (info.kind) {
    case PointerKind::kPageableHost:
      return "pageable host memory";
    case PointerKind::kPinnedHost:
      return "pinned host memory";
    case PointerKind::kDevice:
      return "device memory of GPU " + std::to_string(info.device);
    case PointerKind::kOtherDevice:
      return "device memory of GPU " + std::to_string(info.device);
    case PointerKind::kManaged:
      return "managed memory";
  }
  return "unknown memory";
}

namespace plan_internal {

const PointerInfo* RangeCache::lookup(const void* p, bool whole_region) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  for (const auto& r : ranges_)
    if (a >= r.begin && a < r.end) return &r;
  const bool shared = whole_region && shared_ != nullptr;
  if (shared && shared_->contains(a, now_ms_)) return region(a);
  const std::uintptr_t page = a / kGranule;
  if (pageable_.count(page) != 0) return shared ? region(a) : &kPageable;
  PointerInfo info = classify_(p);
  if (info.begin < info.end) {
    ranges_.push_back(info);
    return &ranges_.back();
  }
  if (info.kind == PointerKind::kPageableHost) {
    pageable_.insert(page);
    if (shared_ != nullptr) shared_->insert(a, now_ms_);
    return shared ? region(a) : &kPageable;
  }
  others_.push_back(info);
  return &others_.back();
}

const PointerInfo* RangeCache::region(std::uintptr_t a) {
  const std::uintptr_t begin = a & ~(PageableCache::kGranule - 1);
  region_ = {PointerKind::kPageableHost, -1, begin, begin + PageableCache::kGranule};
  return &region_;
}

namespace {

// The ranges the fast loop tests blocks against: the device side's allocation and the host
// side's range, each as begin and size.
struct FastRanges {
  std::uintptr_t dev_begin, dev_size, host_begin, host_size;
  bool pinned;              // the host range is pinned memory
  bool need_pinned;         // every block must lie wholly in pinned memory
  std::uint64_t max_bytes;  // outside pinned memory a block must stay below the direct path
};

// The common case, without calls or a branch per condition: blocks that lie wholly in the
// current device range (so neither pointer is null and nothing overflows) and start in the
// current host range. Returns the index of the first block that does not (it leaves for the
// detailed checks, which name what is wrong), or `n`. Specialised by direction, with each range
// as begin and size, so that fewer values compete for registers (about a fifth faster than the
// general loop: docs/performance.md, "Design decisions").
template <bool kToHost>
std::size_t validate_fast(std::span<const BlockCopy> blocks, std::size_t i, std::size_t n,
                          const FastRanges& r, std::uint8_t* pinned, Validation& v) {
  const std::uintptr_t db = r.dev_begin, dsz = r.dev_size, sb = r.host_begin, ssz = r.host_size;
  const std::uint64_t max_bytes = r.max_bytes;
  const bool pinned_range = r.pinned, need_whole = r.need_pinned;
  if (need_whole && !pinned_range) return i;
  bool disjoint = v.disjoint, all_pinned = v.all_pinned;
  std::uintptr_t last_end = v.last_end;
  for (; i < n; ++i) {
    const BlockCopy& b = blocks[i];
    const auto src = reinterpret_cast<std::uintptr_t>(b.src);
    const auto dst = reinterpret_cast<std::uintptr_t>(b.dst);
    const std::uintptr_t s = kToHost ? dst : src;  // host side
    const std::uintptr_t d = kToHost ? src : dst;  // device side
    const std::uint64_t len = b.bytes;
    const std::uintptr_t doff = d - db, soff = s - sb;  // in range when below the size (unsigned)
    const bool whole_src = len <= ssz - soff;
    const bool ok = (doff < dsz) & (len - 1 < dsz - doff) & (soff < ssz) & (s != 0) &
                    (whole_src | (len <= UINTPTR_MAX - s)) & (whole_src | !need_whole) &
                    (len <= max_bytes);
    if (!ok) break;
    const bool p = pinned_range & whole_src;
    pinned[i] = static_cast<std::uint8_t>(p);
    all_pinned &= p;
    disjoint &= dst >= last_end;
    last_end = dst + len;
  }
  v.disjoint = disjoint;
  v.all_pinned = all_pinned;
  v.last_end = last_end;
  return i;
}

}  // namespace

namespace {

// Every check of block `i` one by one, with the messages; updates the ranges in `v`.
void check_block(std::span<const BlockCopy> blocks, std::size_t i, const PlanConfig& cfg,
                 RangeCache& cache, std::vector<std::uint8_t>& pinned, Validation& v) {
  const PointerInfo*& dr = v.dr;
  const PointerInfo*& sr = v.sr;
  const bool to_host = cfg.direction == Direction::kToHost;
  const char* dev_name = to_host ? "source" : "destination";
  const char* host_name = to_host ? "destination" : "source";
  const BlockCopy& b = blocks[i];
  const void* dp = to_host ? b.src : static_cast<const void*>(b.dst);
  const void* hp = to_host ? static_cast<const void*>(b.dst) : b.src;
  const auto d = reinterpret_cast<std::uintptr_t>(dp);
  const auto s = reinterpret_cast<std::uintptr_t>(hp);
  if (b.src == nullptr) bad_block(i, "source pointer is null");
  if (b.dst == nullptr) bad_block(i, "destination pointer is null");
  if (b.bytes == 0) bad_block(i, "size is zero");
  if (b.bytes > UINTPTR_MAX - reinterpret_cast<std::uintptr_t>(b.src))
    bad_block(i, "source " + hex(b.src) + " + " + std::to_string(b.bytes) +
                     " bytes overflows the address space");
  if (b.bytes > UINTPTR_MAX - reinterpret_cast<std::uintptr_t>(b.dst))
    bad_block(i, "destination " + hex(b.dst) + " + " + std::to_string(b.bytes) +
                     " bytes overflows the address space");
  if (dr == nullptr || d < dr->begin || d + b.bytes > dr->end) {
    dr = cache.lookup(dp, false);
    if (dr->kind != PointerKind::kDevice || dr->device != cfg.device)
      bad_block(i, std::string(dev_name) + " " + hex(dp) + " is not device memory of GPU " +
                       std::to_string(cfg.device) + " (it is " + describe(*dr) + ")");
    if (dr->end != 0 && d + b.bytes > dr->end)
      bad_block(i, std::string(dev_name) + " " + hex(dp) + " + " + std::to_string(b.bytes) +
                       " bytes runs past the end of its device allocation (" +
                       std::to_string(dr->end - d) + " bytes left)");
  }
  // A pageable region (from the shared cache) does not say whether a block large enough for the
  // direct path is pinned: ask about that block itself.
  const bool big = b.bytes >= cfg.direct_min();
  if (sr == nullptr || s < sr->begin || s >= sr->end ||
      (big && sr->kind == PointerKind::kPageableHost)) {
    sr = cache.lookup(hp, !big && !cfg.require_pinned_host);
    if (sr->kind == PointerKind::kDevice || sr->kind == PointerKind::kOtherDevice)
      bad_block(i, std::string(host_name) + " " + hex(hp) + " is " + describe(*sr) + "; a " +
                       (to_host ? "device-to-host transfer needs a host destination"
                                : "host-to-device transfer needs a host source"));
  }
  pinned[i] = sr->kind == PointerKind::kPinnedHost && sr->end != 0 && s + b.bytes <= sr->end;
  if (cfg.require_pinned_host && pinned[i] == 0)
    bad_block(i, std::string(host_name) + " " + hex(hp) + " is " +
                     (sr->kind == PointerKind::kPinnedHost ? std::string("only partly pinned")
                                                           : describe(*sr)) +
                     "; " + cfg.pinned_reason +
                     " needs pinned host memory (cudaHostAlloc or cudaHostRegister)");
  const auto dst = reinterpret_cast<std::uintptr_t>(b.dst);
  v.disjoint = v.disjoint && dst >= v.last_end;
  v.last_end = dst + b.bytes;
  v.all_pinned = v.all_pinned && pinned[i] != 0;
}

}  // namespace

void validate_range(std::span<const BlockCopy> blocks, std::size_t begin, std::size_t end,
                    const PlanConfig& cfg, RangeCache& cache, std::vector<std::uint8_t>& pinned,
                    Validation& v) {
  const PointerInfo*& dr = v.dr;
  const PointerInfo*& sr = v.sr;
  const bool to_host = cfg.direction == Direction::kToHost;
  const std::size_t direct_min = cfg.direct_min();
  const std::size_t n = end;
  std::size_t i = begin;
  while (i < n) {
    if (dr != nullptr && sr != nullptr && dr->end != 0 && sr->end != 0) {
      const FastRanges r{dr->begin,
                         dr->end - dr->begin,
                         sr->begin,
                         sr->end - sr->begin,
                         sr->kind == PointerKind::kPinnedHost,
                         cfg.require_pinned_host,
                         sr->kind == PointerKind::kPinnedHost ? UINT64_MAX : direct_min - 1};
      i = to_host ? validate_fast<true>(blocks, i, n, r, pinned.data(), v)
                  : validate_fast<false>(blocks, i, n, r, pinned.data(), v);
      if (i == n) break;
    }
    check_block(blocks, i, cfg, cache, pinned, v);
    ++i;
  }
}

bool validate_run(std::span<const BlockCopy> blocks, std::size_t begin, std::size_t end,
                  const PlanConfig& cfg, RangeCache& cache, std::vector<std::uint8_t>& pinned,
                  Validation& v) {
  validate_range(blocks, begin, begin + 1, cfg, cache, pinned, v);
  const bool to_host = cfg.direction == Direction::kToHost;
  const BlockCopy& last = blocks[end - 1];
  const auto d =
      reinterpret_cast<std::uintptr_t>(to_host ? last.src : static_cast<const void*>(last.dst));
  const auto h =
      reinterpret_cast<std::uintptr_t>(to_host ? static_cast<const void*>(last.dst) : last.src);
  const std::size_t w = last.bytes;
  // The first block's ranges (v.dr, v.sr) hold it; they hold the whole run when they hold the
  // last block's end (no wrap-around: the end is at most the range's end).
  const bool in_place = pinned[begin] != 0 && v.dr != nullptr && v.sr != nullptr &&
                        v.dr->end != 0 && v.sr->end != 0 &&
                        v.sr->kind == PointerKind::kPinnedHost && d >= v.dr->begin &&
                        w <= v.dr->end - d && d <= v.dr->end && h >= v.sr->begin &&
                        h <= v.sr->end && w <= v.sr->end - h;
  if (!in_place) {
    validate_range(blocks, begin + 1, end, cfg, cache, pinned, v);
    return false;
  }
  std::fill(pinned.begin() + static_cast<std::ptrdiff_t>(begin) + 1,
            pinned.begin() + static_cast<std::ptrdiff_t>(end), std::uint8_t{1});
  // Ascending, disjoint destinations along the run (pitch >= block).
  v.last_end = reinterpret_cast<std::uintptr_t>(last.dst) + w;
  return true;
}

void check_overlaps(std::span<const BlockCopy> blocks, Plan::Scratch& scratch) {
  auto begin_of = [&](std::size_t i) { return reinterpret_cast<std::uintptr_t>(blocks[i].dst); };
  auto end_of = [&](std::size_t i) { return begin_of(i) + blocks[i].bytes; };
  auto report = [&](std::size_t a, std::size_t b) {
    const std::size_t lo = std::min(a, b), hi = std::max(a, b);
    throw Error(ErrorCode::kInvalidArgument,
                "block " + std::to_string(hi) + ": destination range overlaps block " +
                    std::to_string(lo) + " (" + hex(blocks[hi].dst) + " and " +
                    hex(blocks[lo].dst) + ")",
                hi);
  };
  bool ascending = true;
  for (std::size_t i = 1; i < blocks.size() && ascending; ++i)
    ascending = begin_of(i) >= begin_of(i - 1);
  if (ascending) {
    for (std::size_t i = 1; i < blocks.size(); ++i)
      if (begin_of(i) < end_of(i - 1)) report(i - 1, i);
    return;
  }
  if (duplicate_on_grid(blocks, scratch, report)) return;
  auto& order = scratch.order;
  order.resize(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i)
    order[i] = {begin_of(i), static_cast<std::uint32_t>(i)};
  radix_sort(order, scratch.tmp, scratch.count);  // stable: equal addresses stay in index order
  // Keep the block reaching furthest so far: a long block can overlap several later ones.
  std::size_t far = order[0].second;
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t cur = order[k].second;
    if (begin_of(cur) < end_of(far)) report(far, cur);
    if (end_of(cur) > end_of(far)) far = cur;
  }
}

}  // namespace plan_internal
}  // namespace gfd::detail
