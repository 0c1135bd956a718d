// The planner's driver: plan config checks, PlanBuilder (validate, coalesce, pack) and make_plan.
#include "planning/planner.hpp"

#include <algorithm>
#include <string>

#include "gfd/error.hpp"
#include "planning/planner_internal.hpp"

namespace gfd::detail {

using plan_internal::check_overlaps;
using plan_internal::Packer;
using plan_internal::RangeCache;
using plan_internal::Segment;
using plan_internal::validate_range;

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
  plan_internal::Validation valid;
  Segment cur{};
  std::size_t validated = 0;  // blocks validated
  std::size_t placed = 0;     // blocks coalesced into `cur` or placed before it
  const std::size_t direct_min = cfg.direct_min();

  void place_one(const Segment& seg) {
    plan.total_bytes += seg.bytes;
    if (seg.pinned_src && seg.bytes >= direct_min)
      plan.direct.push_back({seg.src, seg.dst, seg.bytes});
    else
      packer.add(seg);
  }

  // Constant-stride runs: the copy engine moves one 2D copy of many rows at the link rate, where
  // it pays a per-copy cost for every block of a batch and the staged path crosses host memory
  // three times. A run is followed as segments go by (two subtractions and compares per
  // segment, so a random list costs next to nothing): `run_rows` segments from `run_first` on,
  // each `run_sp` / `run_dp` after the one before. A run too short for a 2D copy is placed
  // segment by segment, as it would have been.
  Segment run_first{};
  std::size_t run_rows = 0;
  std::int64_t run_sp = 0, run_dp = 0;
  void flush_run() {
    if (run_rows >= cfg.strided_min_rows && run_rows >= 2) {
      plan.strided.push_back({run_first.src, const_cast<std::byte*>(run_first.dst), run_first.bytes,
                              static_cast<std::uint64_t>(run_sp), static_cast<std::uint64_t>(run_dp), run_rows});
      plan.total_bytes += run_first.bytes * run_rows;
    } else {
      for (std::size_t r = 0; r < run_rows; ++r)
        place_one({run_first.src + static_cast<std::int64_t>(r) * run_sp,
                   run_first.dst + static_cast<std::int64_t>(r) * run_dp, run_first.bytes, run_first.pinned_src});
    }
    run_rows = 0;
  }
  void place(const Segment& seg) {
    if (cfg.strided_min_rows == 0 || !seg.pinned_src) {
      if (run_rows != 0) flush_run();
      place_one(seg);
      return;
    }
    if (run_rows != 0 && seg.bytes == run_first.bytes) {
      const Segment last{run_first.src + static_cast<std::int64_t>(run_rows - 1) * run_sp,
                         run_first.dst + static_cast<std::int64_t>(run_rows - 1) * run_dp, 0, true};
      const std::int64_t sp = seg.src - last.src, dp = seg.dst - last.dst;
      if (run_rows == 1) {
        // Pitches positive and no smaller than a row (rows may not overlap), within what a 2D
        // copy takes (CUDA's pitch limit is 2^31 - 1 on current GPUs).
        const auto w = static_cast<std::int64_t>(seg.bytes);
        constexpr std::int64_t kMaxPitch = (std::int64_t{1} << 31) - 1;
        if (sp >= w && dp >= w && sp <= kMaxPitch && dp <= kMaxPitch) {
          run_sp = sp;
          run_dp = dp;
          ++run_rows;
          return;
        }
      } else if (sp == run_sp && dp == run_dp) {
        ++run_rows;
        return;
      }
    }
    if (run_rows != 0) flush_run();
    run_first = seg;
    run_rows = 1;
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


PlanBuilder::PlanBuilder(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
                         const PointerClassifier& classify, Plan& plan, PageableCache* pageable,
                         bool stable, std::optional<std::uint64_t> known_bytes) {
  plan.ops.clear();
  plan.chunks.clear();
  plan.pieces.clear();
  plan.direct.clear();
  plan.strided.clear();
  plan.total_bytes = 0;
  plan.block_count = blocks.size();
  plan.all_pinned_host = true;
  if (blocks.size() > UINT32_MAX / 2)
    throw Error(ErrorCode::kInvalidArgument,
                "blocks: " + std::to_string(blocks.size()) + " blocks is more than one transfer takes");
  // Only packing needs the sum (a pass-through plan adds the sizes up as it lists the blocks).
  const bool staged = cfg.mode == PlanConfig::Mode::kStaged;
  const std::uint64_t block_bytes = known_bytes ? *known_bytes : staged ? total_bytes(blocks) : 0;
  plan.scratch.pinned.resize(blocks.size());
  if (staged) {
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
  if (cfg.trust != nullptr) {
    // Checked already (a CacheSet's transfer): only the pinned-memory requirement is left.
    const PlanTrust& t = *cfg.trust;
    if (cfg.require_pinned_host && !t.all_pinned)
      for (std::size_t i = 0; i < blocks.size(); ++i)
        if (t.pinned[i] == 0)
          throw Error(ErrorCode::kInvalidArgument,
                      "block " + std::to_string(i) + ": its host memory is pageable; " + cfg.pinned_reason +
                          " needs pinned host memory",
                      i);
    std::copy(t.pinned, t.pinned + blocks.size(), plan.scratch.pinned.begin());
    s_->validated = blocks.size();
  }
}

PlanBuilder::~PlanBuilder() = default;

std::size_t PlanBuilder::size() const { return s_->blocks.size(); }
std::size_t PlanBuilder::validated() const { return s_->validated; }
std::size_t PlanBuilder::packed() const { return s_->placed; }

void PlanBuilder::advance(std::size_t end) {
  State& st = *s_;
  end = std::min(end, st.blocks.size());
  if (end > st.validated) {
    validate_range(st.blocks, st.validated, end, st.cfg, st.cache, st.plan.scratch.pinned, st.valid);
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
    validate_range(st.blocks, st.validated, st.blocks.size(), st.cfg, st.cache, plan.scratch.pinned, st.valid);
    st.validated = st.blocks.size();
  }
  if (st.cfg.trust != nullptr) {
    plan.all_pinned_host = st.cfg.trust->all_pinned;
    checked_ = true;
    return;
  }
  // Ascending, disjoint destinations (seen while validating) need no overlap check.
  if (!st.blocks.empty() && st.cfg.check_overlaps && !st.valid.disjoint) check_overlaps(st.blocks, plan.scratch);
  plan.all_pinned_host = st.valid.all_pinned;
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
  if (st.run_rows != 0) st.flush_run();
  st.packer.finish();
}

std::uint64_t total_bytes(std::span<const BlockCopy> blocks) {
  std::uint64_t bytes = 0;
  for (const BlockCopy& b : blocks) bytes = b.bytes > UINT64_MAX - bytes ? UINT64_MAX : bytes + b.bytes;
  return bytes;
}

void make_plan(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
               const PointerClassifier& classify, Plan& plan, PageableCache* pageable,
               std::optional<std::uint64_t> bytes) {
  PlanBuilder builder(blocks, cfg, classify, plan, pageable, false, bytes);
  builder.finish();
}

}  // namespace gfd::detail
