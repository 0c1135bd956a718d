// The planner's driver: plan config checks, PlanBuilder (validate, coalesce, pack) and make_plan.
#include "planning/planner.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "gfd/error.hpp"
#include "planning/planner_internal.hpp"

namespace gfd::detail {

using plan_internal::check_overlaps;
using plan_internal::Packer;
using plan_internal::RangeCache;
using plan_internal::Segment;
using plan_internal::validate_range;
using plan_internal::validate_run;

void validate_plan_config(const PlanConfig& c) {
  auto bad = [](const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); };
  if (c.slot_bytes < 4096)
    bad("slot_bytes must be at least 4096 (got " + std::to_string(c.slot_bytes) + ")");
  if (c.piece_bytes < 256)
    bad("piece_bytes must be at least 256 (got " + std::to_string(c.piece_bytes) + ")");
  if (c.first_chunk_bytes < 4096)
    bad("first_chunk_bytes must be at least 4096 (got " + std::to_string(c.first_chunk_bytes) +
        ")");
  if (c.device < 0) bad("device must be >= 0 (got " + std::to_string(c.device) + ")");
}

namespace {
// Whether a constant-stride run of `rows` blocks of `width` bytes whose sources and destinations
// advance by `sp` and `dp` may go as one 2D copy (find_runs and plan_one_run): enough rows and
// bytes (strided_min_rows, strided_min_bytes), both pitches at least a block and within CUDA's
// 2^31 - 1, not contiguous on both sides (that is one plain copy, coalesced). The pitches are
// checked before the bytes are multiplied, so the product cannot overflow.
bool takes_2d(std::uint64_t rows, std::uint64_t width, std::int64_t sp, std::int64_t dp,
              const PlanConfig& cfg) {
  const auto w = static_cast<std::int64_t>(width);
  constexpr auto kMaxPitch = static_cast<std::int64_t>(kMax2dPitch);
  if (rows < cfg.strided_min_rows || sp < w || dp < w || sp > kMaxPitch || dp > kMaxPitch ||
      (sp == w && dp == w))
    return false;
  return rows * width >= cfg.strided_min_bytes;
}

// From this many blocks a list is first checked for destinations that cannot all be disjoint:
// one pass with no memory, where the planner would otherwise allocate and validate in proportion
// to the list before the overlap check rejects it (a list of 10^8 blocks to one place). Shorter
// lists skip the pass: their overlap check comes soon enough.
constexpr std::size_t kCrowdedCheckBlocks = std::size_t{1} << 16;

// Throws (through the overlap check, which names the blocks) where the destinations' bytes are
// more than the address range they lie in: then some must overlap. Blocks a validation would
// refuse (null, empty, running past the address space) leave the list to it.
void reject_crowded(std::span<const BlockCopy> blocks, Plan::Scratch& scratch) {
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  std::uint64_t bytes = 0;
  for (const BlockCopy& b : blocks) {
    const auto d = reinterpret_cast<std::uintptr_t>(b.dst);
    if (d == 0 || b.bytes == 0 || b.bytes > UINTPTR_MAX - d) return;
    lo = std::min(lo, d);
    hi = std::max(hi, d + b.bytes);
    bytes = b.bytes > UINT64_MAX - bytes ? UINT64_MAX : bytes + b.bytes;
  }
  if (bytes > hi - lo) check_overlaps(blocks, scratch);
}
}  // namespace

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

  void place(const Segment& seg) {
    plan.total_bytes += seg.bytes;
    if (seg.pinned_src && seg.bytes >= direct_min) {
      plan.direct.push_back({seg.src, seg.dst, seg.bytes});
      return;
    }
    packer.add(seg);
  }

  // Constant-stride runs: the copy engine moves one 2D copy of many rows at the link rate, where
  // it pays a per-copy cost for every block of a batch and the staged path crosses host memory
  // three times. find_runs lists, before anything is placed, every stretch of at least
  // strided_min_rows blocks (strided_min_bytes in all) of one size whose sources and
  // destinations each advance by one pitch
  // (positive, no smaller than a block, within CUDA's 2^31 - 1, not both contiguous: those are
  // coalesced). One tight pass, two subtractions and a well-predicted compare per block, so a
  // random list costs next to nothing (bench/micro/micro_planner, runs_on / runs_off).
  std::vector<std::pair<std::size_t, std::size_t>>& runs = plan.scratch.runs;
  // Per listed run: it lies in one device allocation and one pinned host range (validate_run,
  // or PlanTrust::one_allocation), so it may go as one 2D copy; otherwise block by block.
  std::vector<std::uint8_t>& run_ok = plan.scratch.run_ok;
  std::size_t next_run = 0;
  bool has_cur = false;
  void find_runs() {
    runs.clear();
    run_ok.clear();
    const std::size_t n = blocks.size(), min = cfg.strided_min_rows;
    if (cfg.mode != PlanConfig::Mode::kStaged || min < 2 || n < min) return;
    auto addr = [](const void* p) {
      return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
    };
    std::size_t start = 0;
    std::int64_t sp = 0, dp = 0;
    bool paired = false;  // blocks start and start + 1 have one size: (sp, dp) is their pitch
    auto close = [&](std::size_t end) {
      // In a random list nearly every pair of blocks is a candidate too small for the bytes
      // rule: one multiply and a well-predicted compare settle it, before takes_2d's pitch
      // tests, whose outcome on random pitches the CPU cannot predict. (The product cannot wrap
      // where takes_2d could pass: its pitch bound keeps the width under 2^31, rows too.)
      if (!paired || (end - start) * blocks[start].bytes < cfg.strided_min_bytes ||
          !takes_2d(end - start, blocks[start].bytes, sp, dp, cfg))
        return false;
      runs.emplace_back(start, end);
      run_ok.push_back(cfg.trust != nullptr && cfg.trust->one_allocation);
      return true;
    };
    for (std::size_t i = 1; i < n; ++i) {
      const std::int64_t s = addr(blocks[i].src) - addr(blocks[i - 1].src);
      const std::int64_t d = addr(blocks[i].dst) - addr(blocks[i - 1].dst);
      const bool same = blocks[i].bytes == blocks[i - 1].bytes;
      if (paired && same && s == sp && d == dp) continue;
      // The run ends before block i; the next candidate is blocks i - 1 and i (i alone where
      // i - 1 went into the run just listed, or the sizes differ).
      const bool listed = close(i);
      start = listed || !same ? i : i - 1;
      paired = !listed && same;
      sp = s;
      dp = d;
    }
    close(n);
  }
  // Listed run r, [b, e), all of it validated: one 2D copy, or (rows in several allocations, or
  // a host side not all pinned) its blocks one by one as usual.
  void place_run(std::size_t r, std::size_t b, std::size_t e) {
    const std::vector<std::uint8_t>& pinned = plan.scratch.pinned;
    if (run_ok[r] == 0 || std::memchr(pinned.data() + b, 0, e - b) != nullptr) {
      for (std::size_t k = b; k < e; ++k)
        place({static_cast<const std::byte*>(blocks[k].src), static_cast<std::byte*>(blocks[k].dst),
               blocks[k].bytes, pinned[k] != 0});
      return;
    }
    const auto* s0 = static_cast<const std::byte*>(blocks[b].src);
    auto* d0 = static_cast<std::byte*>(blocks[b].dst);
    const auto sp =
        static_cast<std::uint64_t>(static_cast<const std::byte*>(blocks[b + 1].src) - s0);
    const auto dp = static_cast<std::uint64_t>(static_cast<std::byte*>(blocks[b + 1].dst) - d0);
    plan.strided.push_back({s0, d0, blocks[b].bytes, sp, dp, e - b});
    plan.total_bytes += blocks[b].bytes * (e - b);
  }
  // Validates blocks [validated, end): a listed run by its ends where it lies in one device
  // allocation and one pinned host range (validate_run), the rest block by block.
  std::size_t next_checked_run = 0;
  void validate_to(std::size_t end) {
    while (validated < end) {
      while (next_checked_run < runs.size() && runs[next_checked_run].second <= validated)
        ++next_checked_run;
      std::size_t stop = end;
      if (next_checked_run < runs.size() && runs[next_checked_run].first < end) {
        const auto [rb, re] = runs[next_checked_run];
        if (rb <= validated) {
          // advance() validates listed runs whole; a run entered part way is checked block by
          // block.
          const std::size_t e = std::min(re, end);
          if (rb == validated && e == re)
            run_ok[next_checked_run] =
                validate_run(blocks, rb, re, cfg, cache, plan.scratch.pinned, valid);
          else
            validate_range(blocks, validated, e, cfg, cache, plan.scratch.pinned, valid);
          validated = e;
          continue;
        }
        stop = rb;
      }
      validate_range(blocks, validated, stop, cfg, cache, plan.scratch.pinned, valid);
      validated = stop;
    }
  }
  // The end advance() must reach so that no listed run is cut: a run that starts before `end`
  // is placed whole.
  std::size_t run_end(std::size_t end) const {
    for (std::size_t r = next_run; r < runs.size() && runs[r].first < end; ++r)
      end = std::max(end, runs[r].second);
    return end;
  }

  // Coalesces runs of blocks that are adjacent at both ends into one segment as they go by.
  void coalesce(std::size_t end) {
    const std::vector<std::uint8_t>& pinned = plan.scratch.pinned;
    for (std::size_t i = placed; i < end; ++i) {
      if (next_run < runs.size() && i == runs[next_run].first) {
        if (has_cur) place(cur);
        has_cur = false;
        place_run(next_run, runs[next_run].first, runs[next_run].second);
        i = runs[next_run].second - 1;
        ++next_run;
        continue;
      }
      const auto* src = static_cast<const std::byte*>(blocks[i].src);
      auto* dst = static_cast<std::byte*>(blocks[i].dst);
      if (has_cur && cur.src + cur.bytes == src && cur.dst + cur.bytes == dst) {
        cur.bytes += blocks[i].bytes;
        cur.pinned_src = cur.pinned_src && pinned[i] != 0;
        continue;
      }
      if (has_cur) place(cur);
      cur = {src, dst, blocks[i].bytes, pinned[i] != 0};
      has_cur = true;
    }
    placed = end;
  }
};

PlanBuilder::PlanBuilder(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
                         const PointerClassifier& classify, Plan& plan, PageableCache* pageable,
                         bool stable, std::optional<std::uint64_t> known_bytes) {
  plan.reset(blocks.size());
  if (blocks.size() > UINT32_MAX / 2)
    throw Error(ErrorCode::kInvalidArgument, "blocks: " + std::to_string(blocks.size()) +
                                                 " blocks is more than one transfer takes");
  if (cfg.check_overlaps && cfg.trust == nullptr && blocks.size() >= kCrowdedCheckBlocks)
    reject_crowded(blocks, plan.scratch);
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
  s_->find_runs();
  if (cfg.trust != nullptr) {
    // Checked already (a CacheSet's transfer): only the pinned-memory requirement is left.
    const PlanTrust& t = *cfg.trust;
    if (cfg.require_pinned_host && !t.all_pinned)
      for (std::size_t i = 0; i < blocks.size(); ++i)
        if (t.pinned[i] == 0)
          throw Error(ErrorCode::kInvalidArgument,
                      "block " + std::to_string(i) + ": its host memory is pageable; " +
                          cfg.pinned_reason + " needs pinned host memory",
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
  end = std::min(st.run_end(end), st.blocks.size());
  if (end > st.validated) st.validate_to(end);
  // Ranges are checked for overlaps by check(); a staged plan packs as it goes.
  if (st.cfg.mode == PlanConfig::Mode::kStaged && end > st.placed) st.coalesce(end);
}

void PlanBuilder::check() {
  if (checked_) return;
  State& st = *s_;
  Plan& plan = st.plan;
  if (st.validated < st.blocks.size()) st.validate_to(st.blocks.size());
  if (st.cfg.trust != nullptr) {
    plan.all_pinned_host = st.cfg.trust->all_pinned;
    checked_ = true;
    return;
  }
  // Ascending, disjoint destinations (seen while validating) need no overlap check.
  if (!st.blocks.empty() && st.cfg.check_overlaps && !st.valid.disjoint)
    check_overlaps(st.blocks, plan.scratch);
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
      plan.direct.push_back(
          {static_cast<const std::byte*>(b.src), static_cast<std::byte*>(b.dst), b.bytes});
      plan.total_bytes += b.bytes;
    }
    return;
  }
  advance(st.blocks.size());
  if (st.has_cur) st.place(st.cur);
  st.packer.finish();
}

std::uint64_t total_bytes(std::span<const BlockCopy> blocks) {
  std::uint64_t bytes = 0;
  for (const BlockCopy& b : blocks)
    bytes = b.bytes > UINT64_MAX - bytes ? UINT64_MAX : bytes + b.bytes;
  return bytes;
}

bool may_be_strided(std::span<const BlockCopy> blocks, const PlanConfig& cfg) {
  const std::size_t n = blocks.size();
  if (cfg.mode != PlanConfig::Mode::kStaged || cfg.strided_min_rows < 2 ||
      n < cfg.strided_min_rows || n < 2)
    return false;
  auto addr = [](const void* p) {
    return static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(p));
  };
  const BlockCopy &a = blocks[0], &b = blocks[1], &y = blocks[n - 2], &z = blocks[n - 1];
  const auto w = static_cast<std::int64_t>(a.bytes);
  const std::int64_t sp = addr(b.src) - addr(a.src), dp = addr(b.dst) - addr(a.dst);
  return w > 0 && b.bytes == a.bytes && y.bytes == a.bytes && z.bytes == a.bytes && sp >= w &&
         dp >= w && addr(z.src) - addr(y.src) == sp && addr(z.dst) - addr(y.dst) == dp;
}

bool plan_one_run(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
                  const PointerClassifier& classify, Plan& plan, PageableCache* pageable) {
  if (!may_be_strided(blocks, cfg)) return false;
  const std::size_t n = blocks.size();
  const std::uint64_t w = blocks[0].bytes;
  auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const std::uintptr_t s0 = addr(blocks[0].src), d0 = addr(blocks[0].dst);
  const std::uint64_t sp = addr(blocks[1].src) - s0,
                      dp = addr(blocks[1].dst) - d0;  // >= w (may_be_strided)
  if (!takes_2d(n, w, static_cast<std::int64_t>(sp), static_cast<std::int64_t>(dp), cfg))
    return false;
  const PlanTrust* trust = cfg.trust;
  if (trust != nullptr && (!trust->one_allocation ||
                           (!trust->all_pinned && std::memchr(trust->pinned, 0, n) != nullptr)))
    return false;
  // One pass: every block at its place along the run (the bytes are summed by it: n * w).
  for (std::size_t i = 2; i < n; ++i)
    if (blocks[i].bytes != w || addr(blocks[i].src) != s0 + i * sp ||
        addr(blocks[i].dst) != d0 + i * dp)
      return false;
  plan.reset(n);
  if (trust == nullptr) {
    // Checked by its ends (validate_run): the first block in full, the last in the same device
    // allocation and pinned host range. Otherwise every block is checked (a bad one throws, named)
    // and the list is planned the usual way.
    RangeCache cache(classify, pageable);
    plan_internal::Validation v;
    plan.scratch.pinned.resize(n);
    if (!validate_run(blocks, 0, n, cfg, cache, plan.scratch.pinned, v)) return false;
  }
  plan.strided.push_back(
      {reinterpret_cast<const std::byte*>(s0), reinterpret_cast<std::byte*>(d0), w, sp, dp, n});
  plan.total_bytes = n * w;
  plan.all_pinned_host = true;
  return true;
}

void make_plan(std::span<const BlockCopy> blocks, const PlanConfig& cfg,
               const PointerClassifier& classify, Plan& plan, PageableCache* pageable,
               std::optional<std::uint64_t> bytes) {
  if (plan_one_run(blocks, cfg, classify, plan, pageable)) return;
  PlanBuilder builder(blocks, cfg, classify, plan, pageable, false, bytes);
  builder.finish();
}

}  // namespace gfd::detail
