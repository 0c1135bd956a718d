#include "planner.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#include <unordered_set>
#include <cstdio>
#include <string>

#include "gfd/error.hpp"

namespace gfd::detail {
namespace {

constexpr std::uint64_t kAlign = 16;
// CUDA registers and allocates host memory in whole pages and keeps device allocations in their
// own address ranges, so a 4 KB page the driver does not know holds no CUDA memory at all.
constexpr std::uintptr_t kGranule = 4096;

std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

[[noreturn]] void bad_block(std::size_t i, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "block " + std::to_string(i) + ": " + what, i);
}

// Classifies pointers with as few device queries as possible: blocks of one transfer mostly
// live in a few large allocations (the KV pool, the device cache), so remember each range the
// driver reports, and remember pages the driver does not know (pageable memory). Lives for one
// plan only, so memory freed and reused between transfers is never misclassified; pageable
// memory is remembered across plans, in whole 2 MiB regions, by the engine's PageableCache.
class RangeCache {
 public:
  RangeCache(const PointerClassifier& classify, PageableCache* shared)
      : classify_(classify), shared_(shared), now_ms_(shared != nullptr ? shared->now_ms() : 0) {}

  // The returned pointer stays valid for the cache's life (a whole region's, until the next
  // lookup with `whole_region`). With `whole_region`, pageable memory
  // is reported as its whole 2 MiB region (a range, so the blocks after it in that region need
  // no lookup) and may be answered from the shared cache; without, the driver is asked about
  // this very page (where pinned memory matters).
  const PointerInfo* lookup(const void* p, bool whole_region) {
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

 private:
  // One slot, rewritten by each answer: only host-side lookups ask for whole regions, and the
  // planner holds one host-side answer at a time (a deque entry per block cost ~10 ns).
  const PointerInfo* region(std::uintptr_t a) {
    const std::uintptr_t begin = a & ~(PageableCache::kGranule - 1);
    region_ = {PointerKind::kPageableHost, -1, begin, begin + PageableCache::kGranule};
    return &region_;
  }
  static constexpr PointerInfo kPageable{};
  const PointerClassifier& classify_;
  PageableCache* shared_;
  std::uint32_t now_ms_;
  std::deque<PointerInfo> ranges_;  // deque: pointers into it stay valid as it grows
  std::deque<PointerInfo> others_;
  PointerInfo region_;
  std::unordered_set<std::uintptr_t> pageable_;
};

struct Segment {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t bytes;
  bool pinned_src;
};

// Validates blocks [begin, end) of `blocks` into `pinned` (sized for all of them). Blocks of one
// transfer mostly come from one host pool and go to one device cache: each block is tested
// against the ranges of the previous one (dr: the device side's allocation, sr: the host
// side's; kept across calls) before the cache is asked.
void validate_range(std::span<const BlockCopy> blocks, std::size_t begin, std::size_t end,
                    const PlanConfig& cfg, RangeCache& cache, std::vector<std::uint8_t>& pinned,
                    const PointerInfo*& dr, const PointerInfo*& sr) {
  const bool to_host = cfg.direction == Direction::kToHost;
  const std::size_t direct_min = cfg.direct_min_bytes != 0 ? cfg.direct_min_bytes : SIZE_MAX;
  const char* dev_name = to_host ? "source" : "destination";
  const char* host_name = to_host ? "destination" : "source";
  const auto device_side = [to_host](const BlockCopy& b) { return to_host ? b.src : static_cast<const void*>(b.dst); };
  const auto host_side = [to_host](const BlockCopy& b) { return to_host ? static_cast<const void*>(b.dst) : b.src; };
  // Every check of one block, with the messages; updates the ranges.
  auto check = [&](std::size_t i) {
    const BlockCopy& b = blocks[i];
    const void* dp = device_side(b);
    const void* hp = host_side(b);
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
    // A pageable region (from the shared cache) does not say whether a block large enough for
    // the direct path is pinned: ask about that block itself.
    const bool big = b.bytes >= direct_min;
    if (sr == nullptr || s < sr->begin || s >= sr->end || (big && sr->kind == PointerKind::kPageableHost)) {
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
                       "; " + cfg.pinned_reason + " needs pinned host memory (cudaHostAlloc or "
                       "cudaHostRegister)");
  };
  const std::size_t n = end;
  std::size_t i = begin;
  while (i < n) {
    if (dr != nullptr && sr != nullptr && dr->end != 0 && sr->end != 0) {
      // The common case without calls or branches per condition: the block lies wholly in the
      // current device range (so neither pointer is null and nothing overflows) and starts in
      // the current host range. Anything else leaves this loop for the detailed checks above.
      const std::uintptr_t db = dr->begin, de = dr->end, sb = sr->begin, se = sr->end;
      const bool pinned_range = sr->kind == PointerKind::kPinnedHost;
      const bool need_pinned = cfg.require_pinned_host;
      for (; i < n; ++i) {
        const auto s = reinterpret_cast<std::uintptr_t>(host_side(blocks[i]));
        const auto d = reinterpret_cast<std::uintptr_t>(device_side(blocks[i]));
        const std::size_t len = blocks[i].bytes;
        const bool in_src = s >= sb && s < se;
        const bool whole_src = len <= se - s;
        const bool ok = (d >= db) & (d < de) & (len - 1 < de - d) & in_src & (s != 0) &
                        (whole_src | (len <= UINTPTR_MAX - s)) & ((!need_pinned) | (pinned_range & whole_src)) &
                        (pinned_range | (len < direct_min));
        if (!ok) break;
        pinned[i] = static_cast<std::uint8_t>(pinned_range & whole_src);
      }
      if (i == n) break;
    }
    check(i);
    ++i;
  }
}

// Sorts (key, index) pairs by key: LSD radix sort on the keys' offsets from the smallest, in
// 11-bit digits. A few passes over the array instead of n log n comparisons: this runs for
// every transfer with scattered destinations (a paged KV cache), before any data moves.
void radix_sort(std::vector<std::pair<std::uintptr_t, std::uint32_t>>& v,
                std::vector<std::pair<std::uintptr_t, std::uint32_t>>& tmp,
                std::vector<std::uint32_t>& count) {
  if (v.size() < 2) return;
  if (v.size() < 256) {  // a few passes over 2048 buckets cost more than sorting a few keys
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
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

// Packs staged segments into chunks, splitting segments wherever a chunk or piece fills up.
class Packer {
 public:
  // `bytes_hint`: about how many bytes will be packed (the taper below needs no more).
  Packer(const PlanConfig& cfg, Plan& plan, std::uint64_t bytes_hint)
      : cfg_(cfg), plan_(plan), left_(bytes_hint) {}

  void add(const Segment& seg) {
    std::uint64_t done = 0;
    while (done < seg.bytes) {
      if (!open_) open_chunk();
      const std::uint64_t n_ops = plan_.ops.size() - chunk_.op_begin;
      // Room for this op's payload while leaving space for n_ops + 1 scatter entries.
      const std::uint64_t entries = (n_ops + 1) * sizeof(ScatterEntry);
      std::uint64_t room = 0;
      if (cap_ > entries) room = align_down(cap_ - entries, kAlign);
      room = room > chunk_.data_bytes ? room - chunk_.data_bytes : 0;
      if (room == 0) {
        close_chunk();
        continue;
      }
      std::uint64_t take = std::min<std::uint64_t>(seg.bytes - done, room);
      take = std::min<std::uint64_t>(take, cfg_.piece_bytes - piece_fill_);
      plan_.ops.push_back({seg.src + done, seg.dst + done, chunk_.data_bytes, take});
      left_ -= std::min(left_, take);
      chunk_.data_bytes += take;
      piece_fill_ += take;
      done += take;
      if (piece_fill_ >= cfg_.piece_bytes) close_piece();
    }
  }

  void finish() {
    if (open_) close_chunk();
  }

 private:
  void open_chunk() {
    const std::size_t k = plan_.chunks.size();
    cap_ = cfg_.slot_bytes;
    if (k < 16) cap_ = std::min<std::uint64_t>(cap_, std::uint64_t{cfg_.first_chunk_bytes} << k);
    // Device to host, the gather threads place each chunk after its DMA, so the transfer ends
    // with the placement of its last chunk: halve the chunks towards the end, down to half a
    // slot (each chunk costs driver calls on the submission path, so no further), so that
    // less is left to place once the last DMA is done.
    if (cfg_.direction == Direction::kToHost)
      cap_ = std::min<std::uint64_t>(
          cap_, std::max<std::uint64_t>(std::max<std::uint64_t>(cfg_.first_chunk_bytes, cfg_.slot_bytes / 2),
                                        align_up((left_ + 1) / 2, kAlign)));
    chunk_ = {};
    chunk_.op_begin = static_cast<std::uint32_t>(plan_.ops.size());
    chunk_.piece_begin = static_cast<std::uint32_t>(plan_.pieces.size());
    piece_begin_ = chunk_.op_begin;
    piece_fill_ = 0;
    open_ = true;
  }
  void close_piece() {
    const auto end = static_cast<std::uint32_t>(plan_.ops.size());
    if (end > piece_begin_) plan_.pieces.push_back({piece_begin_, end});
    piece_begin_ = end;
    piece_fill_ = 0;
  }
  void close_chunk() {
    close_piece();
    chunk_.op_end = static_cast<std::uint32_t>(plan_.ops.size());
    chunk_.piece_end = static_cast<std::uint32_t>(plan_.pieces.size());
    chunk_.contiguous_device = true;
    const bool to_host = cfg_.direction == Direction::kToHost;
    for (std::uint32_t i = chunk_.op_begin + 1; i < chunk_.op_end && chunk_.contiguous_device; ++i) {
      const GatherOp& a = plan_.ops[i - 1];
      const GatherOp& b = plan_.ops[i];
      chunk_.contiguous_device = to_host ? a.src + a.bytes == b.src : a.dst + a.bytes == b.dst;
    }
    chunk_.scatter_offset = align_up(chunk_.data_bytes, kAlign);
    plan_.chunks.push_back(chunk_);
    open_ = false;
  }

  const PlanConfig& cfg_;
  Plan& plan_;
  PlannedChunk chunk_{};
  std::uint64_t left_;
  std::uint64_t cap_ = 0;
  std::uint32_t piece_begin_ = 0;
  std::uint64_t piece_fill_ = 0;
  bool open_ = false;
};

}  // namespace

PageableCache::PageableCache(std::uint32_t ttl_ms)
    : ttl_ms_(std::min<std::uint32_t>(ttl_ms, 1u << (kStampBits - 1))),  // stamps compare modulo 2^24
      table_(std::make_unique<std::atomic<std::uint64_t>[]>(kEntries)) {
  clear();
}

std::uint32_t PageableCache::now_ms() const {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now().time_since_epoch());
  return static_cast<std::uint32_t>(ms.count()) & ((1u << kStampBits) - 1);
}

std::size_t PageableCache::index(std::uintptr_t granule) const {
  return static_cast<std::size_t>((granule * 0x9E3779B97F4A7C15ull) >> (64 - kIndexBits));
}

// An entry is the region's number above kStampBits and the time it was learned below; 0 is empty
// (region 0, the first 2 MiB of the address space, is never stored).
bool PageableCache::contains(std::uintptr_t address, std::uint32_t now) const {
  const std::uintptr_t g = address >> kGranuleShift;
  const std::uint64_t e = table_[index(g)].load(std::memory_order_relaxed);
  if (g == 0 || (e >> kStampBits) != g) return false;
  const auto stamp = static_cast<std::uint32_t>(e) & ((1u << kStampBits) - 1);
  return ((now - stamp) & ((1u << kStampBits) - 1)) < ttl_ms_;
}

void PageableCache::insert(std::uintptr_t address, std::uint32_t now) {
  const std::uintptr_t g = address >> kGranuleShift;
  if (g == 0 || ttl_ms_ == 0) return;
  table_[index(g)].store((std::uint64_t{g} << kStampBits) | now, std::memory_order_relaxed);
}

void PageableCache::clear() {
  for (std::size_t i = 0; i < kEntries; ++i) table_[i].store(0, std::memory_order_relaxed);
}

std::string describe(const PointerInfo& info) {
  switch (info.kind) {
    case PointerKind::kPageableHost: return "pageable host memory";
    case PointerKind::kPinnedHost: return "pinned host memory";
    case PointerKind::kDevice: return "device memory of GPU " + std::to_string(info.device);
    case PointerKind::kOtherDevice: return "device memory of GPU " + std::to_string(info.device);
    case PointerKind::kManaged: return "managed memory";
  }
  return "unknown memory";
}

void validate_plan_config(const PlanConfig& c) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); };
  if (c.slot_bytes < 4096) bad("slot_bytes must be at least 4096 (got " + std::to_string(c.slot_bytes) + ")");
  if (c.piece_bytes < 256) bad("piece_bytes must be at least 256 (got " + std::to_string(c.piece_bytes) + ")");
  if (c.first_chunk_bytes < 4096)
    bad("first_chunk_bytes must be at least 4096 (got " + std::to_string(c.first_chunk_bytes) + ")");
  if (c.device < 0) bad("device must be >= 0 (got " + std::to_string(c.device) + ")");
}

struct PlanBuilder::State {
  State(std::span<const BlockCopy> b, const PlanConfig& c, const PointerClassifier& classify,
        Plan& p, PageableCache* pageable, std::uint64_t block_bytes)
      : blocks(b), cfg(c), plan(p), cache(classify, pageable), packer(cfg, plan, block_bytes) {}
  std::span<const BlockCopy> blocks;
  PlanConfig cfg;
  Plan& plan;
  RangeCache cache;
  Packer packer;
  const PointerInfo* dr = nullptr;
  const PointerInfo* sr = nullptr;
  Segment cur{};
  std::size_t validated = 0;  // blocks validated
  std::size_t placed = 0;     // blocks coalesced into `cur` or placed before it

  void place(const Segment& seg) {
    plan.total_bytes += seg.bytes;
    if (cfg.direct_min_bytes != 0 && seg.pinned_src && seg.bytes >= cfg.direct_min_bytes)
      plan.direct.push_back({seg.src, seg.dst, seg.bytes});
    else
      packer.add(seg);
  }
  // Coalesces runs of blocks that are adjacent at both ends into one segment as they go by.
  void coalesce(std::size_t end) {
    const std::vector<std::uint8_t>& pinned = plan.scratch.pinned;
    for (std::size_t i = placed; i < end; ++i) {
      const auto* src = static_cast<const std::byte*>(blocks[i].src);
      auto* dst = static_cast<std::byte*>(blocks[i].dst);
      if (i != 0 && cur.src + cur.bytes == src && cur.dst + cur.bytes == dst) {
        cur.bytes += blocks[i].bytes;
        cur.pinned_src = cur.pinned_src && pinned[i] != 0;
        continue;
      }
      if (i != 0) place(cur);
      cur = {src, dst, blocks[i].bytes, pinned[i] != 0};
    }
    placed = end;
  }
};

PlanBounds plan_bounds(std::size_t blocks, std::uint64_t bytes, const PlanConfig& cfg) {
  // A chunk other than the last closes only when full: its data plus one scatter entry per op
  // (and one more), aligned down to 16, reach its capacity, which is at least cmin. An op ends
  // where its block run ends (at most one per block) or where a piece closes; a piece closes
  // when full or with its chunk. Summing over the chunks bounds their number.
  const std::uint64_t cmin = std::min<std::uint64_t>(cfg.first_chunk_bytes, cfg.slot_bytes);
  const std::uint64_t entry = sizeof(ScatterEntry);
  const std::uint64_t full_pieces = bytes / cfg.piece_bytes;
  PlanBounds b;
  b.chunks = (bytes + entry * (blocks + full_pieces) + cmin) / (cmin - 2 * entry - 16 - 15) + 1;
  b.pieces = full_pieces + b.chunks;
  b.ops = blocks + b.pieces;
  return b;
}

PlanBuilder::PlanBuilder(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
                         const PointerClassifier& classify, Plan& plan, PageableCache* pageable,
                         bool stable) {
  plan.ops.clear();
  plan.chunks.clear();
  plan.pieces.clear();
  plan.direct.clear();
  plan.total_bytes = 0;
  plan.block_count = blocks.size();
  plan.all_pinned_host = true;
  if (blocks.size() > UINT32_MAX / 2)
    throw Error(ErrorCode::kInvalidArgument,
                "blocks: " + std::to_string(blocks.size()) + " blocks is more than one transfer takes");
  std::uint64_t block_bytes = 0;  // saturating: bad sizes are reported by validation
  for (const BlockCopy& b : blocks) block_bytes = b.bytes > UINT64_MAX - block_bytes ? UINT64_MAX : block_bytes + b.bytes;
  plan.scratch.pinned.resize(blocks.size());
  if (cfg.mode == PlanConfig::Mode::kStaged) {
    if (stable && block_bytes <= (std::uint64_t{1} << 44)) {
      const PlanBounds b = plan_bounds(blocks.size(), block_bytes, cfg);
      plan.ops.reserve(b.ops);
      plan.pieces.reserve(b.pieces);
      plan.chunks.reserve(b.chunks);
      stable_ = true;
    } else {
      plan.ops.reserve(blocks.size() + blocks.size() / 8 + 64);
      plan.pieces.reserve(blocks.size() / 4 + 64);
    }
  }
  s_ = std::make_unique<State>(blocks, cfg, classify, plan, pageable, block_bytes);
}

PlanBuilder::~PlanBuilder() = default;

std::size_t PlanBuilder::size() const { return s_->blocks.size(); }
std::size_t PlanBuilder::validated() const { return s_->validated; }
std::size_t PlanBuilder::packed() const { return s_->placed; }

void PlanBuilder::advance(std::size_t end) {
  State& st = *s_;
  end = std::min(end, st.blocks.size());
  if (end > st.validated) {
    validate_range(st.blocks, st.validated, end, st.cfg, st.cache, st.plan.scratch.pinned, st.dr, st.sr);
    st.validated = end;
  }
  // Ranges are checked for overlaps by check(); a staged plan packs as it goes.
  if (st.cfg.mode == PlanConfig::Mode::kStaged && end > st.placed) st.coalesce(end);
}

void PlanBuilder::check() {
  if (checked_) return;
  State& st = *s_;
  Plan& plan = st.plan;
  if (st.validated < st.blocks.size()) {
    validate_range(st.blocks, st.validated, st.blocks.size(), st.cfg, st.cache, plan.scratch.pinned, st.dr, st.sr);
    st.validated = st.blocks.size();
  }
  if (!st.blocks.empty() && st.cfg.check_overlaps) check_overlaps(st.blocks, plan.scratch);
  for (std::uint8_t p : plan.scratch.pinned) plan.all_pinned_host = plan.all_pinned_host && p != 0;
  checked_ = true;
}

void PlanBuilder::finish() {
  State& st = *s_;
  Plan& plan = st.plan;
  check();
  if (st.blocks.empty()) return;
  if (st.cfg.mode == PlanConfig::Mode::kPassThrough) {
    plan.direct.reserve(st.blocks.size());
    for (const BlockCopy& b : st.blocks) {
      plan.direct.push_back({static_cast<const std::byte*>(b.src), static_cast<std::byte*>(b.dst), b.bytes});
      plan.total_bytes += b.bytes;
    }
    return;
  }
  advance(st.blocks.size());
  st.place(st.cur);
  st.packer.finish();
}

void make_plan(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
               const PointerClassifier& classify, Plan& plan, PageableCache* pageable) {
  PlanBuilder builder(blocks, cfg, classify, plan, pageable, false);
  builder.finish();
}

}  // namespace gfd::detail
