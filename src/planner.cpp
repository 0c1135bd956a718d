#include "planner.hpp"

#include <algorithm>
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
// plan only, so
// memory freed and reused between transfers is never misclassified.
class RangeCache {
 public:
  explicit RangeCache(const PointerClassifier& classify) : classify_(classify) {}

  PointerInfo lookup(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (last_ && a >= last_->begin && a < last_->end) return *last_;
    for (const auto& r : ranges_)
      if (a >= r.begin && a < r.end) return *(last_ = &r, last_);
    const std::uintptr_t g = a / kGranule;
    if (std::find(pageable_.begin(), pageable_.end(), g) != pageable_.end()) return {};
    PointerInfo info = classify_(p);
    if (info.begin < info.end) {
      ranges_.push_back(info);
      last_ = nullptr;  // the vector may have moved
    } else if (info.kind == PointerKind::kPageableHost && pageable_.size() < 4096) {
      pageable_.push_back(g);
    }
    return info;
  }

 private:
  const PointerClassifier& classify_;
  std::vector<PointerInfo> ranges_;
  std::vector<std::uintptr_t> pageable_;
  const PointerInfo* last_ = nullptr;
};

struct Segment {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t bytes;
  bool pinned_src;
};

void validate_blocks(std::span<const BlockCopy> blocks, const PlanConfig& cfg, RangeCache& cache,
                     std::vector<bool>& pinned) {
  pinned.assign(blocks.size(), false);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const BlockCopy& b = blocks[i];
    if (b.src == nullptr) bad_block(i, "source pointer is null");
    if (b.dst == nullptr) bad_block(i, "destination pointer is null");
    if (b.bytes == 0) bad_block(i, "size is zero");
    const auto s = reinterpret_cast<std::uintptr_t>(b.src);
    const auto d = reinterpret_cast<std::uintptr_t>(b.dst);
    if (b.bytes > UINTPTR_MAX - s)
      bad_block(i, "source " + hex(b.src) + " + " + std::to_string(b.bytes) +
                       " bytes overflows the address space");
    if (b.bytes > UINTPTR_MAX - d)
      bad_block(i, "destination " + hex(b.dst) + " + " + std::to_string(b.bytes) +
                       " bytes overflows the address space");

    const PointerInfo di = cache.lookup(b.dst);
    if (di.kind != PointerKind::kDevice || di.device != cfg.device)
      bad_block(i, "destination " + hex(b.dst) + " is not device memory of GPU " +
                       std::to_string(cfg.device) + " (it is " + describe(di) + ")");
    if (di.end != 0 && d + b.bytes > di.end)
      bad_block(i, "destination " + hex(b.dst) + " + " + std::to_string(b.bytes) +
                       " bytes runs past the end of its device allocation (" +
                       std::to_string(di.end - d) + " bytes left)");

    const PointerInfo si = cache.lookup(b.src);
    if (si.kind == PointerKind::kDevice || si.kind == PointerKind::kOtherDevice)
      bad_block(i, "source " + hex(b.src) + " is " + describe(si) +
                       "; a host-to-device transfer needs a host source");
    pinned[i] = si.kind == PointerKind::kPinnedHost && si.end != 0 && s + b.bytes <= si.end;
  }
}

void check_overlaps(std::span<const BlockCopy> blocks) {
  auto end_of = [&](std::size_t i) {
    return reinterpret_cast<std::uintptr_t>(blocks[i].dst) + blocks[i].bytes;
  };
  auto begin_of = [&](std::size_t i) { return reinterpret_cast<std::uintptr_t>(blocks[i].dst); };
  bool ascending = true;
  for (std::size_t i = 1; i < blocks.size() && ascending; ++i)
    ascending = begin_of(i) >= begin_of(i - 1);
  std::vector<std::uint32_t> order;
  if (!ascending) {
    order.resize(blocks.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::uint32_t>(i);
    std::sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
      return begin_of(a) < begin_of(b) || (begin_of(a) == begin_of(b) && a < b);
    });
  }
  auto at = [&](std::size_t k) -> std::size_t { return ascending ? k : order[k]; };
  for (std::size_t k = 1; k < blocks.size(); ++k) {
    const std::size_t prev = at(k - 1), cur = at(k);
    if (begin_of(cur) < end_of(prev)) {
      const std::size_t lo = std::min(prev, cur), hi = std::max(prev, cur);
      throw Error(ErrorCode::kInvalidArgument,
                  "block " + std::to_string(hi) + ": destination range overlaps block " +
                      std::to_string(lo) + " (" + hex(blocks[hi].dst) + " and " +
                      hex(blocks[lo].dst) + ")",
                  hi);
    }
  }
}

std::vector<Segment> coalesce(std::span<const BlockCopy> blocks, const std::vector<bool>& pinned) {
  std::vector<Segment> segs;
  segs.reserve(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto* s = static_cast<const std::byte*>(blocks[i].src);
    auto* d = static_cast<std::byte*>(blocks[i].dst);
    if (!segs.empty()) {
      Segment& l = segs.back();
      if (l.src + l.bytes == s && l.dst + l.bytes == d) {
        l.bytes += blocks[i].bytes;
        l.pinned_src = l.pinned_src && pinned[i];
        continue;
      }
    }
    segs.push_back({s, d, blocks[i].bytes, pinned[i]});
  }
  return segs;
}

// Packs staged segments into chunks, splitting segments wherever a chunk or piece fills up.
class Packer {
 public:
  Packer(const PlanConfig& cfg, Plan& plan) : cfg_(cfg), plan_(plan) {}

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
    chunk_.contiguous_dst = true;
    for (std::uint32_t i = chunk_.op_begin + 1; i < chunk_.op_end && chunk_.contiguous_dst; ++i)
      chunk_.contiguous_dst = plan_.ops[i - 1].dst + plan_.ops[i - 1].bytes == plan_.ops[i].dst;
    chunk_.scatter_offset = align_up(chunk_.data_bytes, kAlign);
    plan_.chunks.push_back(chunk_);
    open_ = false;
  }

  const PlanConfig& cfg_;
  Plan& plan_;
  PlannedChunk chunk_{};
  std::uint64_t cap_ = 0;
  std::uint32_t piece_begin_ = 0;
  std::uint64_t piece_fill_ = 0;
  bool open_ = false;
};

}  // namespace

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

Plan make_plan(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
               const PointerClassifier& classify) {
  Plan plan;
  plan.block_count = blocks.size();
  if (blocks.empty()) return plan;
  if (blocks.size() > UINT32_MAX / 2)
    throw Error(ErrorCode::kInvalidArgument,
                "blocks: " + std::to_string(blocks.size()) + " blocks is more than one transfer takes");
  RangeCache cache(classify);
  std::vector<bool> pinned;
  validate_blocks(blocks, cfg, cache, pinned);
  if (cfg.check_overlaps) check_overlaps(blocks);

  const std::vector<Segment> segs = coalesce(blocks, pinned);
  Packer packer(cfg, plan);
  for (const Segment& s : segs) {
    plan.total_bytes += s.bytes;
    if (cfg.direct_min_bytes != 0 && s.pinned_src && s.bytes >= cfg.direct_min_bytes)
      plan.direct.push_back({s.src, s.dst, s.bytes});
    else
      packer.add(s);
  }
  packer.finish();
  return plan;
}

}  // namespace gfd::detail
