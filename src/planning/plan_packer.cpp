// The planner's packer: staged segments into chunks and gather pieces, and plan_bounds.
#include <algorithm>

#include "planning/planner_internal.hpp"

namespace gfd::detail::plan_internal {

void Packer::add(const Segment& seg) {
  std::uint64_t done = 0;
  while (done < seg.bytes) {
    if (!open_) open_chunk();
    const std::uint64_t n_ops = plan_.ops.size() - chunk_.op_begin;
    // Room for this op's payload while leaving space for n_ops + 1 scatter entries.
    const std::uint64_t entries = (n_ops + 1) * sizeof(ScatterEntry);
    std::uint64_t room = 0;
    if (cap_ > entries) room = align_down(cap_ - entries, kAlign);
    room = std::min(room, data_cap_);
    room = room > chunk_.data_bytes ? room - chunk_.data_bytes : 0;
    if (room == 0) {
      close_chunk();
      continue;
    }
    std::uint64_t take = std::min<std::uint64_t>(seg.bytes - done, room);
    take = std::min<std::uint64_t>(take, piece_cap_ - piece_fill_);
    plan_.ops.push_back({seg.src + done, seg.dst + done, chunk_.data_bytes, take});
    pinned_ = pinned_ && seg.pinned_src;
    left_ -= std::min(left_, take);
    chunk_.data_bytes += take;
    piece_fill_ += take;
    done += take;
    if (piece_fill_ >= piece_cap_) close_piece();
  }
}

void Packer::finish() {
  if (open_) close_chunk();
}

ChunkCaps chunk_caps(const PlanConfig& cfg, std::size_t k, std::uint64_t left) {
  ChunkCaps c;
  c.cap = c.data_cap = cfg.chunk_bytes();
  // The first chunks grow from first_chunk_bytes of data; their scatter entries come on top (up
  // to one per 384 bytes of data), so that a transfer of exactly first_chunk_bytes is one chunk
  // and one DMA, not a full chunk and a sliver.
  if (k < 16) {
    const std::uint64_t ramp = std::uint64_t{cfg.first_chunk_bytes} << k;
    c.cap = std::min<std::uint64_t>(c.cap, ramp + ramp / kEntryAllowance);
    c.data_cap = std::min<std::uint64_t>(c.data_cap, ramp);
  }
  // Device to host, the gather threads place each chunk after its DMA, so the transfer ends
  // with the placement of its last chunk: halve the chunks towards the end, down to half a
  // slot (each chunk costs driver calls on the submission path, so no further), so that
  // less is left to place once the last DMA is done.
  if (cfg.direction == Direction::kToHost) {
    c.cap = std::min<std::uint64_t>(
        c.cap, std::max<std::uint64_t>(
                   std::max<std::uint64_t>(cfg.first_chunk_bytes, cfg.chunk_bytes() / 2),
                   align_up((left + 1) / 2, kAlign)));
    c.data_cap = std::min(c.data_cap, c.cap);
  }
  // The chunk that takes the rest of the transfer (a small transfer's only one) is cut into
  // pieces small enough that every gather thread gets one (a 32nd of its data, kMinPiece at
  // least): its DMA waits for its last piece, and this is a small transfer's whole latency.
  // Earlier chunks keep piece_bytes pieces: each piece starts its prefetch afresh. (Not rounded
  // down: plan_bounds counts on at most kPiecesPerChunk full pieces per chunk; `left` never
  // underestimates what is left.)
  const std::uint64_t least = std::min<std::uint64_t>(kMinPiece, cfg.piece_bytes);
  c.piece_cap = left <= c.data_cap ? std::clamp<std::uint64_t>(c.data_cap / kPiecesPerChunk, least,
                                                               cfg.piece_bytes)
                                   : cfg.piece_bytes;
  return c;
}

void Packer::open_chunk() {
  const ChunkCaps caps = chunk_caps(cfg_, plan_.chunks.size(), left_);
  cap_ = caps.cap;
  data_cap_ = caps.data_cap;
  piece_cap_ = caps.piece_cap;
  chunk_ = {};
  chunk_.op_begin = static_cast<std::uint32_t>(plan_.ops.size());
  chunk_.piece_begin = static_cast<std::uint32_t>(plan_.pieces.size());
  piece_begin_ = chunk_.op_begin;
  piece_fill_ = 0;
  open_ = true;
  pinned_ = true;
}

void Packer::close_piece() {
  const auto end = static_cast<std::uint32_t>(plan_.ops.size());
  if (end > piece_begin_) plan_.pieces.push_back({piece_begin_, end});
  piece_begin_ = end;
  piece_fill_ = 0;
}

void Packer::close_chunk() {
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
  // Where the host side lies in few contiguous pinned runs (every layer's page of a block side by
  // side in a host cache laid out block-major, say), the copy engine moves each run between host
  // memory and the chunk's device staging area in place: no CPU copy. Each run is one DMA, so
  // only runs as long as the direct path's blocks; the first and last may be cut short by the
  // chunk's edges.
  chunk_.host_runs = 0;
  chunk_.host_direct = false;
  if (!chunk_.contiguous_device && chunk_.op_end > chunk_.op_begin) {
    // Every run but the first and the last at least min_run long (those the chunk's edges may
    // cut), and one at least.
    const std::uint64_t min_run = cfg_.direct_min();
    std::uint32_t runs = 1;
    std::uint64_t run = plan_.ops[chunk_.op_begin].bytes, longest = 0;
    bool inner_long = true;
    for (std::uint32_t i = chunk_.op_begin + 1; i < chunk_.op_end; ++i) {
      const GatherOp &a = plan_.ops[i - 1], &b = plan_.ops[i];
      if ((to_host ? a.dst + a.bytes == b.dst : a.src + a.bytes == b.src)) {
        run += b.bytes;
        continue;
      }
      if (runs > 1) inner_long = inner_long && run >= min_run;
      longest = std::max(longest, run);
      ++runs;
      run = b.bytes;
    }
    longest = std::max(longest, run);
    chunk_.host_runs = runs;
    chunk_.host_direct = pinned_ && min_run != SIZE_MAX && inner_long && longest >= min_run;
  }
  chunk_.scatter_offset = align_up(chunk_.data_bytes, kAlign);
  plan_.chunks.push_back(chunk_);
  open_ = false;
}

}  // namespace gfd::detail::plan_internal

namespace gfd::detail {

PlanBounds plan_bounds(std::size_t blocks, std::uint64_t bytes, const PlanConfig& cfg) {
  using plan_internal::kPiecesPerChunk;
  // A chunk other than the last closes only when full: its data plus one scatter entry per op
  // (and one more), aligned down to 16, reach its capacity, which is at least cmin. An op ends
  // where its block run ends (at most one per block) or where a piece closes; a piece closes
  // when full or with its chunk. Summing over the chunks bounds their number.
  const std::uint64_t cmin = std::min<std::uint64_t>(cfg.first_chunk_bytes, cfg.chunk_bytes());
  const std::uint64_t entry = sizeof(ScatterEntry);
  const std::uint64_t full_pieces = bytes / cfg.piece_bytes;
  PlanBounds b;
  b.chunks = (bytes + entry * (blocks + full_pieces) + cmin) / (cmin - 2 * entry - 16 - 15) + 1;
  // A chunk whose pieces are smaller than piece_bytes has at most kPiecesPerChunk full ones (its
  // piece size is a 32nd of its data capacity, or kMinPiece where that is larger, which leaves
  // fewer) and one partial; any other chunk has full piece_bytes pieces and one partial. Only
  // the 16 ramp chunks can be that small, unless half a slot is (the device-to-host taper).
  const std::uint64_t small = cfg.chunk_bytes() / 2 < kPiecesPerChunk * cfg.piece_bytes
                                  ? b.chunks
                                  : std::min<std::uint64_t>(b.chunks, 16);
  b.pieces = full_pieces + b.chunks + small * kPiecesPerChunk;
  b.ops = blocks + b.pieces;
  return b;
}

}  // namespace gfd::detail
