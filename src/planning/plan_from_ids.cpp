// Plans made from a CacheSet's ids (IdOps): chunks and pieces cut by arithmetic, ops made where
// they are used, so that the submitter's work does not grow with the blocks: listed and planned
// block by block, the list, the planner and the packer were most of the call.
#include <algorithm>

#include "planning/planner.hpp"
#include "planning/planner_internal.hpp"

namespace gfd::detail {

using plan_internal::align_down;
using plan_internal::align_up;
using plan_internal::chunk_caps;
using plan_internal::ChunkCaps;
using plan_internal::kAlign;

namespace {
constexpr std::uint64_t kEntry = sizeof(ScatterEntry);

// The most whole blocks of `b` bytes a chunk of these capacities holds with their entries, by the
// packer's rule: m blocks fit where m * b is within the data capacity and within the capacity
// less m entries, aligned down to 16.
std::uint64_t blocks_in(const ChunkCaps& c, std::uint64_t b) {
  std::uint64_t m = std::min(c.data_cap / b, c.cap / (b + kEntry));
  while (m > 0 && (c.cap < m * kEntry || m * b > align_down(c.cap - m * kEntry, kAlign))) --m;
  return m;
}
}  // namespace

bool fits_from_ids(std::uint64_t block_bytes, const PlanConfig& config) {
  if (block_bytes == 0) return false;
  // The smallest chunk is the first (k = 0) with the least left: one block.
  const ChunkCaps c = chunk_caps(config, 0, block_bytes);
  return blocks_in(c, block_bytes) >= 1;
}

void plan_from_ids(Plan& plan, const PlanConfig& cfg) {
  const IdOps& ids = plan.id_ops;
  const std::uint64_t b = ids.block_bytes;
  const std::uint64_t n = ids.rows * ids.pairs.size();
  plan.from_ids = true;
  plan.ops_made = false;
  plan.block_count = n;
  plan.total_bytes = n * b;
  plan.ops.resize(n);
  plan.chunks.clear();
  plan.pieces.clear();
  std::uint64_t left = n * b, op = 0;
  while (op < n) {
    const ChunkCaps caps = chunk_caps(cfg, plan.chunks.size(), left);
    const std::uint64_t m = std::min(std::max<std::uint64_t>(blocks_in(caps, b), 1), n - op);
    const std::uint64_t per_piece = std::max<std::uint64_t>(caps.piece_cap / b, 1);
    PlannedChunk c{};
    c.op_begin = static_cast<std::uint32_t>(op);
    c.op_end = static_cast<std::uint32_t>(op + m);
    c.piece_begin = static_cast<std::uint32_t>(plan.pieces.size());
    for (std::uint64_t k = op; k < op + m; k += per_piece)
      plan.pieces.push_back({static_cast<std::uint32_t>(k),
                             static_cast<std::uint32_t>(std::min(k + per_piece, op + m))});
    c.piece_end = static_cast<std::uint32_t>(plan.pieces.size());
    c.data_bytes = m * b;
    // A chunk of one block is one DMA straight to (or from) its place, as make_plan's: its op is
    // made now, since the copy lanes read it as they enqueue the DMA. Any other is scattered.
    c.contiguous_device = m == 1;
    c.host_direct = false;
    c.host_runs = 0;
    c.scatter_offset = align_up(c.data_bytes, kAlign);
    plan.chunks.push_back(c);
    if (m == 1) make_ops(plan, c.op_begin, c.op_end, c.op_begin);
    left -= m * b;
    op += m;
  }
}

void make_ops(const Plan& plan, std::uint32_t begin, std::uint32_t end, std::uint32_t chunk_begin) {
  const IdOps& ids = plan.id_ops;
  const std::uint64_t b = ids.block_bytes;
  // Written through const: see the declaration.
  GatherOp* out = const_cast<GatherOp*>(plan.ops.data());
  // Op k is (pair p, row i); the inner index of the list's order wraps at `inner`.
  const std::size_t inner = ids.row_major ? ids.pairs.size() : ids.rows;
  std::size_t outer_at = begin / inner, inner_at = begin % inner;
  for (std::uint32_t k = begin; k < end; ++k) {
    const std::size_t p = ids.row_major ? inner_at : outer_at,
                      i = ids.row_major ? outer_at : inner_at;
    const IdOps::Pair& q = ids.pairs[p];
    out[k] = {q.from + ids.ids[2 * i] * q.from_stride, q.to + ids.ids[2 * i + 1] * q.to_stride,
              (k - chunk_begin) * b, b};
    if (++inner_at == inner) {
      inner_at = 0;
      ++outer_at;
    }
  }
}

void make_all_ops(Plan& plan) {
  for (const PlannedChunk& c : plan.chunks) make_ops(plan, c.op_begin, c.op_end, c.op_begin);
  plan.ops_made = true;
}

}  // namespace gfd::detail
