// Unit tests of the transfer planner (make_plan, validate_plan_config). The planner never
// dereferences block pointers, so every test works on fake addresses classified by a fake
// PointerClassifier: one GPU-0 range, one GPU-1 range, one pinned host range and pageable
// memory everywhere else.
#include "planning/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gfd/gfd.hpp"

namespace {

using gfd::BlockCopy;
using gfd::detail::Plan;
using gfd::detail::PlanConfig;
using gfd::detail::PointerInfo;
using gfd::detail::PointerKind;

constexpr std::uintptr_t kGiB = std::uintptr_t{1} << 30;
constexpr std::uintptr_t kMiB = std::uintptr_t{1} << 20;
constexpr std::uintptr_t kKiB = std::uintptr_t{1} << 10;

// The fake address space. All ranges are 2 MB aligned, as real CUDA allocations are.
constexpr std::uintptr_t kDevBase = 0x7000'0000'0000;  // device memory of GPU 0
constexpr std::uintptr_t kDevSize = kGiB;
constexpr std::uintptr_t kOtherBase = 0x7100'0000'0000;  // device memory of GPU 1
constexpr std::uintptr_t kOtherSize = kGiB;
constexpr std::uintptr_t kPinnedBase = 0x5000'0000'0000;  // pinned host memory
constexpr std::uintptr_t kPinnedSize = kGiB;
constexpr std::uintptr_t kPageBase = 0x3000'0000'0000;  // pageable host memory (unknown)

bool in_range(std::uintptr_t a, std::uintptr_t base, std::uintptr_t size) {
  return a >= base && a - base < size;
}

PointerInfo fake_classify(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  PointerInfo info;
  if (in_range(a, kDevBase, kDevSize)) {
    info.kind = PointerKind::kDevice;
    info.device = 0;
    info.begin = kDevBase;
    info.end = kDevBase + kDevSize;
  } else if (in_range(a, kOtherBase, kOtherSize)) {
    info.kind = PointerKind::kOtherDevice;
    info.device = 1;
    info.begin = kOtherBase;
    info.end = kOtherBase + kOtherSize;
  } else if (in_range(a, kPinnedBase, kPinnedSize)) {
    info.kind = PointerKind::kPinnedHost;
    info.device = -1;
    info.begin = kPinnedBase;
    info.end = kPinnedBase + kPinnedSize;
  }  // else: pageable host memory, begin = end = 0
  return info;
}

const gfd::detail::PointerClassifier& classifier() {
  static const gfd::detail::PointerClassifier c = fake_classify;
  return c;
}

const void* src_at(std::uintptr_t a) { return reinterpret_cast<const void*>(a); }
void* dst_at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }
std::uintptr_t addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

BlockCopy block(std::uintptr_t src, std::uintptr_t dst, std::size_t bytes) {
  return BlockCopy{src_at(src), dst_at(dst), bytes};
}

Plan plan_of(const std::vector<BlockCopy>& blocks, const PlanConfig& cfg) {
  return gfd::detail::make_plan(blocks, cfg, classifier());
}

// A small configuration so that tests need few bytes to fill chunks and pieces.
PlanConfig small_config() {
  PlanConfig cfg;
  cfg.slot_bytes = 64 * kKiB;
  cfg.first_chunk_bytes = 16 * kKiB;
  cfg.piece_bytes = 4 * kKiB;
  cfg.direct_min_bytes = 1 * kMiB;
  cfg.direct_min_bytes_to_host = cfg.direct_min_bytes;
  return cfg;
}

// Capacity of chunk k: min(chunk, ramp + ramp / 16) with ramp = first << k (the ramp is the
// chunk's data; its scatter entries may take up to a 16th more); `chunk` is the slot, or device
// to host chunk_bytes_to_host where that is smaller.
std::uint64_t chunk_cap(const PlanConfig& cfg, std::size_t k) {
  const std::uint64_t first = cfg.first_chunk_bytes, cap = cfg.chunk_bytes();
  if (k >= 16 || (first << k) >= cap) return cap;
  return std::min<std::uint64_t>(cap, (first << k) + (first << k) / 16);
}

// Data capacity of chunk k: min(chunk, first << k).
std::uint64_t chunk_data_cap(const PlanConfig& cfg, std::size_t k) {
  const std::uint64_t first = cfg.first_chunk_bytes, cap = cfg.chunk_bytes();
  return k >= 16 || (first << k) >= cap ? cap : first << k;
}

// Structural invariants of every plan: chunks and pieces tile the op list in order, chunk
// capacity, piece payloads, slot offsets, scatter offsets and contiguous_device.
void check_structure(const Plan& plan, const PlanConfig& cfg) {
  std::uint32_t next_op = 0, next_piece = 0;
  for (std::size_t k = 0; k < plan.chunks.size(); ++k) {
    SCOPED_TRACE("chunk " + std::to_string(k));
    const auto& c = plan.chunks[k];
    ASSERT_EQ(c.op_begin, next_op);
    ASSERT_LT(c.op_begin, c.op_end);
    ASSERT_LE(c.op_end, plan.ops.size());
    ASSERT_EQ(c.piece_begin, next_piece);
    ASSERT_LT(c.piece_begin, c.piece_end);
    ASSERT_LE(c.piece_end, plan.pieces.size());
    next_op = c.op_end;
    next_piece = c.piece_end;

    // Ops are packed back to back from the start of the slot.
    std::uint64_t off = 0;
    bool contiguous = true;
    for (std::uint32_t i = c.op_begin; i < c.op_end; ++i) {
      const auto& op = plan.ops[i];
      ASSERT_GT(op.bytes, 0u) << "op " << i;
      ASSERT_EQ(op.slot_offset, off) << "op " << i;
      off += op.bytes;
      if (i > c.op_begin) {
        const auto& prev = plan.ops[i - 1];
        contiguous = contiguous && prev.dst + prev.bytes == op.dst;
      }
    }
    ASSERT_EQ(c.data_bytes, off);
    ASSERT_EQ(c.contiguous_device, contiguous);
    ASSERT_EQ(c.scatter_offset % 16, 0u);
    ASSERT_GE(c.scatter_offset, c.data_bytes);
    ASSERT_LT(c.scatter_offset, c.data_bytes + 16);

    // Capacity: chunk_cap; the first chunk's data is at most first_chunk_bytes.
    ASSERT_LE(c.dma_bytes(), cfg.slot_bytes);
    ASSERT_LE(c.dma_bytes(), chunk_cap(cfg, k));
    ASSERT_LE(c.data_bytes, chunk_data_cap(cfg, k));
    if (!c.contiguous_device) {
      ASSERT_EQ(c.dma_bytes(),
                c.scatter_offset + (c.op_end - c.op_begin) * sizeof(gfd::detail::ScatterEntry));
    } else {
      ASSERT_EQ(c.dma_bytes(), c.data_bytes);
    }

    // Pieces tile the chunk's ops exactly; each carries at most piece_bytes.
    std::uint32_t next = c.op_begin;
    for (std::uint32_t p = c.piece_begin; p < c.piece_end; ++p) {
      const auto& piece = plan.pieces[p];
      ASSERT_EQ(piece.op_begin, next) << "piece " << p;
      ASSERT_LT(piece.op_begin, piece.op_end) << "piece " << p;
      std::uint64_t payload = 0;
      for (std::uint32_t i = piece.op_begin; i < piece.op_end; ++i) payload += plan.ops[i].bytes;
      ASSERT_LE(payload, cfg.piece_bytes) << "piece " << p;
      next = piece.op_end;
    }
    ASSERT_EQ(next, c.op_end);
  }
  ASSERT_EQ(next_op, plan.ops.size());
  ASSERT_EQ(next_piece, plan.pieces.size());

  // Direct copies are at least direct_min_bytes.
  for (const auto& d : plan.direct) {
    ASSERT_NE(cfg.direct_min_bytes, 0u);
    ASSERT_GE(d.bytes, cfg.direct_min_bytes);
  }
}

// Every byte of every block appears exactly once across plan.ops and plan.direct, with the
// source byte that belongs to its destination byte. Requires disjoint block destinations.
void check_coverage(const std::vector<BlockCopy>& blocks, const Plan& plan) {
  struct Part {
    std::uintptr_t src, dst;
    std::uint64_t bytes;
  };
  std::vector<Part> parts;
  for (const auto& op : plan.ops) parts.push_back({addr(op.src), addr(op.dst), op.bytes});
  for (const auto& d : plan.direct) parts.push_back({addr(d.src), addr(d.dst), d.bytes});
  std::sort(parts.begin(), parts.end(), [](const Part& a, const Part& b) { return a.dst < b.dst; });

  std::uint64_t part_total = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    ASSERT_GT(parts[i].bytes, 0u);
    part_total += parts[i].bytes;
    if (i > 0) ASSERT_LE(parts[i - 1].dst + parts[i - 1].bytes, parts[i].dst) << "parts overlap";
  }
  std::uint64_t block_total = 0;
  for (const auto& b : blocks) block_total += b.bytes;
  ASSERT_EQ(part_total, block_total);
  ASSERT_EQ(plan.total_bytes, block_total);
  ASSERT_EQ(plan.block_count, blocks.size());

  std::vector<std::size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return addr(blocks[a].dst) < addr(blocks[b].dst);
  });
  std::size_t j = 0;
  for (std::size_t i : order) {
    SCOPED_TRACE("block " + std::to_string(i));
    const std::uintptr_t b_src = addr(blocks[i].src), b_dst = addr(blocks[i].dst);
    const std::uintptr_t b_end = b_dst + blocks[i].bytes;
    std::uintptr_t cur = b_dst;
    while (cur < b_end) {
      while (j < parts.size() && parts[j].dst + parts[j].bytes <= cur) ++j;
      ASSERT_LT(j, parts.size()) << "byte " << (cur - b_dst) << " is not covered";
      const Part& p = parts[j];
      ASSERT_LE(p.dst, cur) << "byte " << (cur - b_dst) << " is not covered";
      // Both mappings are linear with slope 1, so agreeing at one byte means agreeing on all.
      ASSERT_EQ(p.src + (cur - p.dst), b_src + (cur - b_dst))
          << "byte " << (cur - b_dst) << " comes from the wrong source";
      cur = std::min<std::uintptr_t>(p.dst + p.bytes, b_end);
    }
  }
}

void check_plan(const std::vector<BlockCopy>& blocks, const Plan& plan, const PlanConfig& cfg) {
  ASSERT_NO_FATAL_FAILURE(check_structure(plan, cfg));
  ASSERT_NO_FATAL_FAILURE(check_coverage(blocks, plan));
}

// Expects make_plan to reject `blocks` for block `index`.
void expect_block_error(const std::vector<BlockCopy>& blocks, const PlanConfig& cfg,
                        std::size_t index, const std::string& detail = "") {
  try {
    (void)plan_of(blocks, cfg);
    ADD_FAILURE() << "make_plan accepted the blocks; expected an error for block " << index;
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
    EXPECT_EQ(e.block(), index);
    const std::string want = "block " + std::to_string(index) + ":";
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, want, e.what());
    if (!detail.empty()) EXPECT_PRED_FORMAT2(::testing::IsSubstring, detail, e.what());
  }
}

// Three valid pageable -> device blocks; tests put a bad block among them.
std::vector<BlockCopy> valid_blocks() {
  return {block(kPageBase, kDevBase, 4096), block(kPageBase + 0x10000, kDevBase + 0x10000, 4096),
          block(kPageBase + 0x20000, kDevBase + 0x20000, 4096)};
}

// ---------------------------------------------------------------------------------------------
// Empty and basic plans

TEST(PlannerTest, EmptyBlockListGivesEmptyPlan) {
  int calls = 0;
  const gfd::detail::PointerClassifier counting = [&](const void* p) {
    ++calls;
    return fake_classify(p);
  };
  const std::vector<BlockCopy> none;
  const Plan plan = gfd::detail::make_plan(none, small_config(), counting);
  EXPECT_TRUE(plan.ops.empty());
  EXPECT_TRUE(plan.chunks.empty());
  EXPECT_TRUE(plan.pieces.empty());
  EXPECT_TRUE(plan.direct.empty());
  EXPECT_EQ(plan.total_bytes, 0u);
  EXPECT_EQ(plan.block_count, 0u);
  EXPECT_EQ(calls, 0);
}

TEST(PlannerTest, SingleSmallBlockIsOneOpInOneChunk) {
  const PlanConfig cfg = small_config();
  const std::vector<BlockCopy> blocks = {block(kPageBase + 8, kDevBase + 256, 1000)};
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.ops.size(), 1u);
  ASSERT_EQ(plan.chunks.size(), 1u);
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_TRUE(plan.direct.empty());
  EXPECT_EQ(addr(plan.ops[0].src), kPageBase + 8);
  EXPECT_EQ(addr(plan.ops[0].dst), kDevBase + 256);
  EXPECT_EQ(plan.ops[0].slot_offset, 0u);
  EXPECT_EQ(plan.ops[0].bytes, 1000u);
  EXPECT_TRUE(plan.chunks[0].contiguous_device);
  EXPECT_EQ(plan.chunks[0].data_bytes, 1000u);
  EXPECT_EQ(plan.chunks[0].dma_bytes(), 1000u);
  EXPECT_EQ(plan.total_bytes, 1000u);
  EXPECT_EQ(plan.block_count, 1u);
}

TEST(PlannerTest, ClassifierResultsAreReusedForOneAllocation) {
  // Many blocks in the same two allocations: the planner remembers the ranges instead of
  // asking the classifier for every pointer.
  int calls = 0;
  const gfd::detail::PointerClassifier counting = [&](const void* p) {
    ++calls;
    return fake_classify(p);
  };
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 100; ++i)
    blocks.push_back(block(kPinnedBase + i * 8192, kDevBase + i * 8192, 4096));
  const PlanConfig cfg = small_config();
  const Plan plan = gfd::detail::make_plan(blocks, cfg, counting);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_LE(calls, 2);
}

// ---------------------------------------------------------------------------------------------
// Coalescing

TEST(PlannerTest, CoalescesBlocksContiguousOnBothSides) {
  PlanConfig cfg = small_config();
  cfg.piece_bytes = 64 * kKiB;
  // A first chunk large enough that its pieces (a 32nd of it) hold the whole 8 KB run.
  cfg.slot_bytes = 1 * kMiB;
  cfg.first_chunk_bytes = 256 * kKiB;
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.push_back(block(kPageBase + i * 2048, kDevBase + 0x1000 + i * 2048, 2048));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.ops.size(), 1u);
  EXPECT_EQ(addr(plan.ops[0].src), kPageBase);
  EXPECT_EQ(addr(plan.ops[0].dst), kDevBase + 0x1000);
  EXPECT_EQ(plan.ops[0].bytes, 4u * 2048);
}

TEST(PlannerTest, DoesNotCoalesceWhenOnlySourcesAreContiguous) {
  PlanConfig cfg = small_config();
  cfg.piece_bytes = 64 * kKiB;
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.push_back(block(kPageBase + i * 2048, kDevBase + i * 4096, 2048));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.ops.size(), 4u);
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_FALSE(plan.chunks[0].contiguous_device);
}

TEST(PlannerTest, DoesNotCoalesceWhenOnlyDestinationsAreContiguous) {
  PlanConfig cfg = small_config();
  cfg.piece_bytes = 64 * kKiB;
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 4; ++i)
    blocks.push_back(block(kPageBase + i * 4096, kDevBase + i * 2048, 2048));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.ops.size(), 4u);
  ASSERT_EQ(plan.chunks.size(), 1u);
  // Separate ops, but their destinations follow each other: one DMA lands the chunk.
  EXPECT_TRUE(plan.chunks[0].contiguous_device);
  EXPECT_EQ(plan.chunks[0].dma_bytes(), 4u * 2048);
}

TEST(PlannerTest, CoalescesOnlyNeighboursInListOrder) {
  // Contiguous on both sides, but listed in reverse: the planner does not reorder blocks.
  PlanConfig cfg = small_config();
  cfg.piece_bytes = 64 * kKiB;
  std::vector<BlockCopy> blocks;
  for (int i = 3; i >= 0; --i)
    blocks.push_back(block(kPageBase + i * 1024, kDevBase + i * 1024, 1024));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_EQ(plan.ops.size(), 4u);
}

TEST(PlannerTest, CoalescedRunIsSplitAtPieceBoundaries) {
  const PlanConfig cfg = small_config();  // 4 KB pieces
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 8; ++i)
    blocks.push_back(block(kPageBase + i * 1024, kDevBase + i * 1024, 1024));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  // 8 KB coalesced into one segment, cut into two 4 KB ops, one per piece.
  ASSERT_EQ(plan.ops.size(), 2u);
  EXPECT_EQ(plan.ops[0].bytes, 4096u);
  EXPECT_EQ(plan.ops[1].bytes, 4096u);
  EXPECT_EQ(plan.pieces.size(), 2u);
}

// ---------------------------------------------------------------------------------------------
// Chunks, pieces, scatter layout

TEST(PlannerTest, ContiguousDestinationsGiveContiguousChunks) {
  const PlanConfig cfg = small_config();
  std::vector<BlockCopy> blocks;
  // Sources scattered, destinations back to back.
  for (int i = 0; i < 64; ++i)
    blocks.push_back(block(kPageBase + i * 8192, kDevBase + i * 3000, 3000));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_GT(plan.chunks.size(), 1u);
  for (const auto& c : plan.chunks) {
    EXPECT_TRUE(c.contiguous_device);
    EXPECT_EQ(c.dma_bytes(), c.data_bytes);
  }
}

TEST(PlannerTest, ShuffledPagedLayoutNeedsScatter) {
  const PlanConfig cfg = small_config();
  constexpr int kPages = 64;
  std::vector<BlockCopy> blocks;
  // Destination page (i * 7) mod 64: no two consecutive blocks land next to each other.
  for (int i = 0; i < kPages; ++i)
    blocks.push_back(block(kPageBase + i * 4096, kDevBase + ((i * 7) % kPages) * 4096, 4096));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_GT(plan.chunks.size(), 1u);
  for (const auto& c : plan.chunks) {
    if (c.op_end - c.op_begin < 2) continue;
    EXPECT_FALSE(c.contiguous_device);
    EXPECT_GT(c.dma_bytes(), c.data_bytes);
  }
}

TEST(PlannerTest, ScatterOffsetIsAlignedAfterUnalignedData) {
  PlanConfig cfg = small_config();
  cfg.piece_bytes = 64 * kKiB;
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 3; ++i)
    blocks.push_back(block(kPageBase + i * 4096, kDevBase + (2 - i) * 4096, 1000));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.chunks.size(), 1u);
  const auto& c = plan.chunks[0];
  EXPECT_FALSE(c.contiguous_device);
  EXPECT_EQ(c.data_bytes, 3000u);
  EXPECT_EQ(c.scatter_offset, 3008u);
  EXPECT_EQ(c.dma_bytes(), 3008u + 3 * sizeof(gfd::detail::ScatterEntry));
}

TEST(PlannerTest, ChunkCapacityDoublesFromFirstChunkUpToSlot) {
  PlanConfig cfg;
  cfg.slot_bytes = 64 * kKiB;
  cfg.first_chunk_bytes = 4 * kKiB;
  cfg.piece_bytes = 1 * kKiB;
  cfg.direct_min_bytes = 0;
  cfg.direct_min_bytes_to_host = cfg.direct_min_bytes;
  std::vector<BlockCopy> blocks;
  // Scattered 512-byte blocks: every chunk needs scatter entries.
  for (int i = 0; i < 2000; ++i)
    blocks.push_back(block(kPageBase + i * 1024, kDevBase + (1999 - i) * 1024, 512));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_GE(plan.chunks.size(), 6u);
  // The first chunks fill their growing capacity (4K, 8K, 16K, 32K, then 64K).
  for (std::size_t k = 0; k + 1 < plan.chunks.size(); ++k) {
    const auto& c = plan.chunks[k];
    EXPECT_GT(c.dma_bytes() + 512 + sizeof(gfd::detail::ScatterEntry) + 16, chunk_cap(cfg, k))
        << "chunk " << k << " is not full";
  }
}

TEST(PlannerTest, LargeBlockIsSplitOverManyChunks) {
  PlanConfig cfg = small_config();  // 64 KB slots, 16 KB first chunk, 4 KB pieces
  const std::size_t bytes = 8 * kMiB + 123;
  const std::vector<BlockCopy> blocks = {block(kPageBase + 5, kDevBase + 16, bytes)};
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_TRUE(plan.direct.empty());
  EXPECT_GE(plan.chunks.size(), bytes / cfg.slot_bytes);
  for (std::size_t k = 0; k < plan.chunks.size(); ++k) {
    const auto& c = plan.chunks[k];
    EXPECT_TRUE(c.contiguous_device) << "chunk " << k;
    // Every chunk but the last is filled: its data reach the ramp, or data and entries its
    // capacity.
    if (k + 1 < plan.chunks.size() && c.data_bytes != chunk_data_cap(cfg, k))
      EXPECT_GT(c.data_bytes + (c.op_end - c.op_begin + 1) * sizeof(gfd::detail::ScatterEntry) + 16,
                chunk_cap(cfg, k))
          << "chunk " << k;
  }
  // The whole block is gathered in order.
  std::uint64_t done = 0;
  for (const auto& op : plan.ops) {
    ASSERT_EQ(addr(op.src), kPageBase + 5 + done);
    ASSERT_EQ(addr(op.dst), kDevBase + 16 + done);
    done += op.bytes;
  }
  EXPECT_EQ(done, bytes);
}

// A transfer of first_chunk_bytes of scattered 4 KB blocks is one chunk (one DMA), its scatter
// entries beside the data, and its pieces are small enough to spread over every gather thread;
// the chunks of a larger transfer keep piece_bytes pieces.
TEST(PlannerTest, FirstChunkHoldsItsBytesInSmallPieces) {
  const PlanConfig cfg;  // 2 MB slots, 256 KB first chunk, 32 KB pieces
  constexpr int kBlocks = 64;
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < kBlocks; ++i)
    blocks.push_back(block(kPageBase + i * 8192, kDevBase + ((i * 7) % kBlocks) * 4096, 4096));
  Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_FALSE(plan.chunks[0].contiguous_device);
  EXPECT_EQ(plan.chunks[0].data_bytes, cfg.first_chunk_bytes);
  EXPECT_EQ(plan.pieces.size(), 32u);  // 8 KB each: 256 KB / 32

  // 16 x 4 KB: the same piece size, 8 pieces.
  blocks.resize(16);
  for (int i = 0; i < 16; ++i) blocks[i] = block(kPageBase + i * 8192, kDevBase + i * 4096, 4096);
  plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.chunks.size(), 1u);
  EXPECT_EQ(plan.pieces.size(), 8u);

  // 16 MB: the 256 KB, 512 KB and 1 MB chunks are cut into 32 KB pieces (8, 16 and 32).
  blocks.clear();
  for (int i = 0; i < 4096; ++i)
    blocks.push_back(block(kPageBase + i * 8192, kDevBase + i * 4096, 4096));
  plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_GE(plan.chunks.size(), 5u);
  for (std::size_t k = 0; k < 3; ++k)
    EXPECT_EQ(plan.chunks[k].piece_end - plan.chunks[k].piece_begin, 8u << k) << "chunk " << k;
}

TEST(PlannerTest, DefaultConfigPlansMixedTransfer) {
  const PlanConfig cfg;  // library defaults
  std::vector<BlockCopy> blocks;
  std::uintptr_t d = kDevBase;
  for (int i = 0; i < 300; ++i) {
    const std::size_t bytes = 16 * kKiB + i * 37;
    blocks.push_back(block(kPageBase + i * 64 * kKiB, d, bytes));
    d += bytes + (i % 3 == 0 ? 0 : 256);
  }
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
}

// ---------------------------------------------------------------------------------------------
// Direct path

TEST(PlannerTest, LargePinnedBlockGoesDirect) {
  const PlanConfig cfg = small_config();  // direct_min 1 MB
  const std::vector<BlockCopy> blocks = {block(kPageBase, kDevBase, 4096),
                                         block(kPinnedBase + 64, kDevBase + 8192, 2 * kMiB)};
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.direct.size(), 1u);
  EXPECT_EQ(addr(plan.direct[0].src), kPinnedBase + 64);
  EXPECT_EQ(addr(plan.direct[0].dst), kDevBase + 8192);
  EXPECT_EQ(plan.direct[0].bytes, 2 * kMiB);
  ASSERT_EQ(plan.ops.size(), 1u);
  EXPECT_EQ(plan.ops[0].bytes, 4096u);
}

TEST(PlannerTest, DirectThresholdIsInclusive) {
  const PlanConfig cfg = small_config();
  const std::vector<BlockCopy> at = {block(kPinnedBase, kDevBase, cfg.direct_min_bytes)};
  const Plan plan_at = plan_of(at, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(at, plan_at, cfg));
  EXPECT_EQ(plan_at.direct.size(), 1u);
  EXPECT_TRUE(plan_at.ops.empty());
  EXPECT_TRUE(plan_at.chunks.empty());

  const std::vector<BlockCopy> below = {block(kPinnedBase, kDevBase, cfg.direct_min_bytes - 1)};
  const Plan plan_below = plan_of(below, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(below, plan_below, cfg));
  EXPECT_TRUE(plan_below.direct.empty());
  EXPECT_FALSE(plan_below.ops.empty());
}

TEST(PlannerTest, CoalescedPinnedRunGoesDirect) {
  const PlanConfig cfg = small_config();
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 16; ++i)
    blocks.push_back(block(kPinnedBase + i * 128 * kKiB, kDevBase + i * 128 * kKiB, 128 * kKiB));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  ASSERT_EQ(plan.direct.size(), 1u);
  EXPECT_EQ(plan.direct[0].bytes, 2 * kMiB);
  EXPECT_TRUE(plan.ops.empty());
}

TEST(PlannerTest, SmallScatteredPinnedBlocksAreStaged) {
  const PlanConfig cfg = small_config();
  std::vector<BlockCopy> blocks;
  for (int i = 0; i < 16; ++i)
    blocks.push_back(block(kPinnedBase + i * 256 * kKiB, kDevBase + i * 128 * kKiB, 128 * kKiB));
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_TRUE(plan.direct.empty());
}

TEST(PlannerTest, PageableSourcesNeverGoDirect) {
  const PlanConfig cfg = small_config();
  const std::vector<BlockCopy> blocks = {block(kPageBase, kDevBase, 4 * kMiB)};
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_TRUE(plan.direct.empty());
  EXPECT_GT(plan.chunks.size(), 1u);
}

TEST(PlannerTest, ZeroDirectMinDisablesDirectPath) {
  PlanConfig cfg = small_config();
  cfg.direct_min_bytes = 0;
  cfg.direct_min_bytes_to_host = cfg.direct_min_bytes;
  const std::vector<BlockCopy> blocks = {block(kPinnedBase, kDevBase, 4 * kMiB),
                                         block(kPinnedBase + 8 * kMiB, kDevBase + 8 * kMiB, 1)};
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_TRUE(plan.direct.empty());
}

TEST(PlannerTest, RunWithOnePageableBlockIsStaged) {
  // Contiguous on both sides with a pageable block in the middle: one segment, not all pinned.
  const PlanConfig cfg = small_config();
  const std::uintptr_t pinned_end = kPinnedBase + kPinnedSize;
  const std::vector<BlockCopy> blocks = {
      block(pinned_end - kMiB, kDevBase, kMiB),
      block(pinned_end, kDevBase + kMiB, kMiB),  // just past the pinned range: pageable
  };
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_TRUE(plan.direct.empty());
}

TEST(PlannerTest, PinnedSourceRunningPastItsAllocationIsStaged) {
  const PlanConfig cfg = small_config();
  const std::uintptr_t pinned_end = kPinnedBase + kPinnedSize;
  const std::vector<BlockCopy> blocks = {block(pinned_end - kMiB, kDevBase, 2 * kMiB)};
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_TRUE(plan.direct.empty());
}

// ---------------------------------------------------------------------------------------------
// Validation

// A CacheSet's transfer planned from its ids (plan_from_ids, make_ops): equal blocks that
// neither coalesce (arrays at twice the block size) nor go direct, both directions, sizes that
// do and do not divide a chunk, down to a transfer of one block. The plan keeps every structural
// invariant and covers every byte; its ops are the listed blocks in CacheSetState::build's order
// (pair by pair, or row by row); it has as many chunks as make_plan of that list, or one more where
// make_plan splits a block across two.
TEST(PlannerTest, PlanFromIdsCutsChunksByArithmetic) {
  using gfd::detail::Direction;
  using gfd::detail::IdOps;
  for (const Direction dir : {Direction::kToDevice, Direction::kToHost})
    for (const std::uint64_t bytes :
         {std::uint64_t{1024}, std::uint64_t{3000}, std::uint64_t{4096}})
      for (const std::size_t rows : {std::size_t{1}, std::size_t{37}, std::size_t{300}})
        for (const bool row_major : {false, true}) {
          SCOPED_TRACE((dir == Direction::kToDevice ? "to device, " : "to host, ") +
                       std::to_string(bytes) + " bytes, " + std::to_string(rows) + " rows" +
                       (row_major ? ", row-major" : ""));
          PlanConfig cfg = small_config();
          cfg.direction = dir;
          ASSERT_TRUE(gfd::detail::fits_from_ids(bytes, cfg));
          constexpr std::size_t kPairs = 5;
          std::mt19937_64 rng(bytes + rows);
          std::vector<std::uint64_t> src_ids(rows), dst_ids(rows);
          std::iota(src_ids.begin(), src_ids.end(), 0);
          std::iota(dst_ids.begin(), dst_ids.end(), 0);
          std::shuffle(src_ids.begin(), src_ids.end(), rng);
          std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
          Plan plan;
          plan.reset(kPairs * rows);
          IdOps& ids = plan.id_ops;
          ids.rows = rows;
          ids.block_bytes = bytes;
          ids.row_major = row_major;
          for (std::size_t i = 0; i < rows; ++i) {
            ids.ids.push_back(src_ids[i]);
            ids.ids.push_back(dst_ids[i]);
          }
          const std::uint64_t stride = 2 * bytes, span = 512 * stride;
          std::vector<BlockCopy> list;
          for (std::size_t p = 0; p < kPairs; ++p) {
            const std::uintptr_t host = kPinnedBase + p * span, dev = kDevBase + p * span;
            const std::uintptr_t from = dir == Direction::kToDevice ? host : dev;
            const std::uintptr_t to = dir == Direction::kToDevice ? dev : host;
            ids.pairs.push_back({static_cast<const std::byte*>(src_at(from)),
                                 static_cast<std::byte*>(dst_at(to)), stride, stride});
          }
          // CacheSetState::build's order: pair by pair, or (row_major) row by row.
          for (std::size_t a = 0; a < (row_major ? rows : kPairs); ++a)
            for (std::size_t z = 0; z < (row_major ? kPairs : rows); ++z) {
              const std::size_t p = row_major ? z : a, i = row_major ? a : z;
              list.push_back(block(addr(ids.pairs[p].from) + src_ids[i] * stride,
                                   addr(ids.pairs[p].to) + dst_ids[i] * stride, bytes));
            }
          gfd::detail::plan_from_ids(plan, cfg);
          EXPECT_TRUE(plan.from_ids);
          gfd::detail::make_all_ops(plan);
          ASSERT_NO_FATAL_FAILURE(check_plan(list, plan, cfg));
          ASSERT_EQ(plan.ops.size(), list.size());
          for (std::size_t k = 0; k < list.size(); ++k) {
            ASSERT_EQ(plan.ops[k].src, list[k].src) << "op " << k;
            ASSERT_EQ(plan.ops[k].dst, list[k].dst) << "op " << k;
          }
          const Plan listed = plan_of(list, cfg);
          EXPECT_GE(plan.chunks.size(), listed.chunks.size());
          EXPECT_LE(plan.chunks.size(), listed.chunks.size() + 1 + listed.chunks.size() / 4);
        }
}

// Blocks larger than a piece: one block per piece (plan_from_ids never splits a block), every
// byte covered.
TEST(PlannerTest, PlanFromIdsPutsABlockLargerThanAPieceInAPieceOfItsOwn) {
  PlanConfig cfg = small_config();  // 4 KB pieces
  constexpr std::uint64_t kBytes = 12288;
  Plan plan;
  plan.reset(20);
  plan.id_ops.rows = 20;
  plan.id_ops.block_bytes = kBytes;
  std::vector<BlockCopy> list;
  plan.id_ops.pairs.push_back({static_cast<const std::byte*>(src_at(kPinnedBase)),
                               static_cast<std::byte*>(dst_at(kDevBase)), 2 * kBytes, 3 * kBytes});
  for (std::uint64_t i = 0; i < 20; ++i) {
    plan.id_ops.ids.push_back(19 - i);
    plan.id_ops.ids.push_back(i);
    list.push_back(block(kPinnedBase + (19 - i) * 2 * kBytes, kDevBase + i * 3 * kBytes, kBytes));
  }
  gfd::detail::plan_from_ids(plan, cfg);
  gfd::detail::make_all_ops(plan);
  ASSERT_NO_FATAL_FAILURE(check_coverage(list, plan));
  ASSERT_EQ(plan.pieces.size(), 20u);
  for (const auto& pc : plan.pieces) EXPECT_EQ(pc.op_end - pc.op_begin, 1u);
  for (const auto& c : plan.chunks) EXPECT_LE(c.dma_bytes(), cfg.slot_bytes);
}

TEST(PlannerValidationTest, NullSource) {
  auto blocks = valid_blocks();
  blocks[1].src = nullptr;
  expect_block_error(blocks, small_config(), 1, "null");
}

TEST(PlannerValidationTest, NullDestination) {
  auto blocks = valid_blocks();
  blocks[2].dst = nullptr;
  expect_block_error(blocks, small_config(), 2, "null");
}

TEST(PlannerValidationTest, ZeroSize) {
  auto blocks = valid_blocks();
  blocks[0].bytes = 0;
  expect_block_error(blocks, small_config(), 0, "zero");
}

TEST(PlannerValidationTest, SourceOverflowsAddressSpace) {
  auto blocks = valid_blocks();
  blocks[1].src = src_at(UINTPTR_MAX - 15);
  blocks[1].bytes = 32;
  expect_block_error(blocks, small_config(), 1, "overflow");
}

TEST(PlannerValidationTest, DestinationOverflowsAddressSpace) {
  auto blocks = valid_blocks();
  blocks[2].dst = dst_at(UINTPTR_MAX - 15);
  blocks[2].bytes = 16 + 1;
  expect_block_error(blocks, small_config(), 2, "overflow");
}

TEST(PlannerValidationTest, DestinationInPageableHostMemory) {
  auto blocks = valid_blocks();
  blocks[1].dst = dst_at(kPageBase + 0x100000);
  expect_block_error(blocks, small_config(), 1, "pageable host memory");
}

TEST(PlannerValidationTest, DestinationInPinnedHostMemory) {
  auto blocks = valid_blocks();
  blocks[1].dst = dst_at(kPinnedBase + 0x100000);
  expect_block_error(blocks, small_config(), 1, "pinned host memory");
}

TEST(PlannerValidationTest, DestinationOnAnotherGpu) {
  auto blocks = valid_blocks();
  blocks[2].dst = dst_at(kOtherBase + 0x1000);
  expect_block_error(blocks, small_config(), 2, "GPU 1");
}

TEST(PlannerValidationTest, DestinationOnGpuOtherThanConfigured) {
  // The classifier reports GPU 0 memory as kDevice of device 0; the plan is for GPU 1.
  PlanConfig cfg = small_config();
  cfg.device = 1;
  expect_block_error(valid_blocks(), cfg, 0, "GPU 0");
}

TEST(PlannerValidationTest, DestinationRunsPastItsAllocation) {
  auto blocks = valid_blocks();
  blocks[1].dst = dst_at(kDevBase + kDevSize - 100);
  blocks[1].bytes = 101;
  expect_block_error(blocks, small_config(), 1, "past the end");

  // Ending exactly at the end of the allocation is fine.
  blocks[1].bytes = 100;
  const PlanConfig cfg = small_config();
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
}

TEST(PlannerValidationTest, SourceInDeviceMemory) {
  auto blocks = valid_blocks();
  blocks[1].src = src_at(kDevBase + 0x40000);
  expect_block_error(blocks, small_config(), 1, "host source");
}

TEST(PlannerValidationTest, SourceInAnotherGpusMemory) {
  auto blocks = valid_blocks();
  blocks[2].src = src_at(kOtherBase + 0x40000);
  expect_block_error(blocks, small_config(), 2, "host source");
}

TEST(PlannerValidationTest, FirstBadBlockIsReported) {
  auto blocks = valid_blocks();
  blocks[1].bytes = 0;
  blocks[2].src = nullptr;
  expect_block_error(blocks, small_config(), 1);
}

TEST(PlannerValidationTest, OverlappingDestinationsInAscendingOrder) {
  const std::vector<BlockCopy> blocks = {
      block(kPageBase, kDevBase, 4096),
      block(kPageBase + 0x10000, kDevBase + 0x10000, 4096),
      block(kPageBase + 0x20000, kDevBase + 0x10000 + 4095, 4096),  // overlaps block 1 by 1 byte
      block(kPageBase + 0x30000, kDevBase + 0x30000, 4096),
  };
  expect_block_error(blocks, small_config(), 2, "overlaps block 1");
}

TEST(PlannerValidationTest, OverlappingDestinationsInShuffledOrder) {
  {
    // Block 2 lies below block 0 in memory and overlaps it.
    const std::vector<BlockCopy> blocks = {
        block(kPageBase, kDevBase + 0x20000, 4096),
        block(kPageBase + 0x10000, kDevBase, 4096),
        block(kPageBase + 0x20000, kDevBase + 0x20000 - 10, 100),
        block(kPageBase + 0x30000, kDevBase + 0x40000, 4096),
    };
    expect_block_error(blocks, small_config(), 2, "overlaps block 0");
  }
  {
    // Block 3 lies above block 1 in memory; block 1 runs into it.
    const std::vector<BlockCopy> blocks = {
        block(kPageBase, kDevBase + 0x80000, 4096),
        block(kPageBase + 0x10000, kDevBase + 0x40000, 8192),
        block(kPageBase + 0x20000, kDevBase, 4096),
        block(kPageBase + 0x30000, kDevBase + 0x41000, 4096),
    };
    expect_block_error(blocks, small_config(), 3, "overlaps block 1");
  }
}

TEST(PlannerValidationTest, IdenticalDestinationsOverlap) {
  const std::vector<BlockCopy> blocks = {
      block(kPageBase + 0x10000, kDevBase + 0x5000, 64),
      block(kPageBase, kDevBase, 64),
      block(kPageBase + 0x20000, kDevBase + 0x5000, 64),
  };
  expect_block_error(blocks, small_config(), 2, "overlaps block 0");
}

// A long list whose destinations cannot all be disjoint (their bytes more than the range they
// lie in) is rejected before any block is validated or planned: no pointer is classified, and
// the overlap check names the blocks. A long list of disjoint destinations is planned as usual.
TEST(PlannerValidationTest, LongListOfCrowdedDestinationsIsRejectedBeforePlanning) {
  constexpr std::size_t kN = std::size_t{1} << 17;
  int calls = 0;
  const gfd::detail::PointerClassifier counting = [&](const void* p) {
    ++calls;
    return fake_classify(p);
  };
  std::vector<BlockCopy> same(kN, block(kPageBase, kDevBase, 4096));  // every block to one place
  for (std::size_t i = 0; i < kN; ++i) same[i].src = src_at(kPageBase + i * 4096);
  std::vector<BlockCopy> shuffled = same;  // and onto a few pages, in random order
  std::mt19937_64 rng(7);
  for (BlockCopy& b : shuffled) b.dst = dst_at(kDevBase + (rng() % 64) * 4096);
  for (const auto* list : {&same, &shuffled}) {
    calls = 0;
    try {
      (void)gfd::detail::make_plan(*list, small_config(), counting);
      ADD_FAILURE() << "make_plan accepted destinations that overlap";
    } catch (const gfd::Error& e) {
      EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, "destination range overlaps block", e.what());
      EXPECT_NE(e.block(), gfd::kNoBlock);
    }
    EXPECT_EQ(calls, 0) << "pointers were classified before the overlap was found";
  }
  std::vector<BlockCopy> disjoint = same;
  for (std::size_t i = 0; i < kN; ++i)
    disjoint[i].dst = dst_at(kDevBase + ((i * 7919) % kN) * 4096);
  EXPECT_NO_THROW((void)gfd::detail::make_plan(disjoint, small_config(), counting));
}

// Scattered destinations of a paged KV cache (equal power-of-two blocks on one grid, checked
// with a hash set of grid slots) and the same lists off the grid or with other sizes (checked by
// sorting): a shared destination is found wherever it is, naming the later block, and a list
// without one passes.
TEST(PlannerValidationTest, ScatteredPagesOverlapFoundOnAndOffTheGrid) {
  constexpr std::size_t kN = 2048;
  std::vector<std::size_t> page(kN);
  std::iota(page.begin(), page.end(), std::size_t{0});
  std::shuffle(page.begin(), page.end(), std::mt19937_64(5));
  for (const std::size_t size : {std::size_t{4096}, std::size_t{3072}}) {
    SCOPED_TRACE("block size " + std::to_string(size));
    std::vector<BlockCopy> blocks;
    for (std::size_t i = 0; i < kN; ++i)
      blocks.push_back(block(kPageBase + i * 2 * size, kDevBase + page[i] * size, size));
    EXPECT_NO_THROW((void)plan_of(blocks, small_config()));
    std::vector<BlockCopy> dup = blocks;
    dup[1500].dst = dup[700].dst;  // the same page twice
    expect_block_error(dup, small_config(), 1500, "overlaps block 700");
    std::vector<BlockCopy> off = blocks;
    off[1800].dst = dst_at(addr(off[300].dst) + 512);  // off the grid, into block 300's page
    expect_block_error(off, small_config(), 1800, "overlaps block 300");
  }
}

TEST(PlannerValidationTest, TouchingDestinationsDoNotOverlap) {
  const PlanConfig cfg = small_config();
  const std::vector<BlockCopy> blocks = {
      block(kPageBase + 0x10000, kDevBase + 4096, 4096),
      block(kPageBase, kDevBase, 4096),
      block(kPageBase + 0x20000, kDevBase + 8192, 4096),
  };
  const Plan plan = plan_of(blocks, cfg);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
}

TEST(PlannerValidationTest, OverlapCheckCanBeDisabled) {
  PlanConfig cfg = small_config();
  cfg.check_overlaps = false;
  const std::vector<BlockCopy> blocks = {
      block(kPageBase, kDevBase + 0x20000, 4096),
      block(kPageBase + 0x10000, kDevBase, 4096),
      block(kPageBase + 0x20000, kDevBase + 0x20000 - 10, 100),
  };
  Plan plan;
  ASSERT_NO_THROW(plan = plan_of(blocks, cfg));
  ASSERT_NO_FATAL_FAILURE(check_structure(plan, cfg));
  EXPECT_EQ(plan.total_bytes, 4096u + 4096u + 100u);
  EXPECT_EQ(plan.block_count, 3u);
}

TEST(PlannerValidationTest, InvalidBlockIsReportedEvenWithOverlapCheckOff) {
  PlanConfig cfg = small_config();
  cfg.check_overlaps = false;
  auto blocks = valid_blocks();
  blocks[2].dst = dst_at(kPinnedBase);
  expect_block_error(blocks, cfg, 2);
}

TEST(PlannerConfigTest, DefaultsAreValid) {
  EXPECT_NO_THROW(gfd::detail::validate_plan_config(PlanConfig{}));
  EXPECT_NO_THROW(gfd::detail::validate_plan_config(small_config()));
}

TEST(PlannerConfigTest, MinimumSizesAreValid) {
  PlanConfig cfg;
  cfg.slot_bytes = 4096;
  cfg.first_chunk_bytes = 4096;
  cfg.piece_bytes = 256;
  EXPECT_NO_THROW(gfd::detail::validate_plan_config(cfg));
}

TEST(PlannerConfigTest, RejectsTinySizes) {
  auto expect_rejected = [](const PlanConfig& cfg, const std::string& field) {
    try {
      gfd::detail::validate_plan_config(cfg);
      ADD_FAILURE() << "accepted a config with a tiny " << field;
    } catch (const gfd::Error& e) {
      EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.block(), gfd::kNoBlock);
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, field, e.what());
    }
  };
  PlanConfig cfg;
  cfg.slot_bytes = 4095;
  expect_rejected(cfg, "slot_bytes");
  cfg = PlanConfig{};
  cfg.slot_bytes = 0;
  expect_rejected(cfg, "slot_bytes");
  cfg = PlanConfig{};
  cfg.piece_bytes = 255;
  expect_rejected(cfg, "piece_bytes");
  cfg = PlanConfig{};
  cfg.first_chunk_bytes = 4095;
  expect_rejected(cfg, "first_chunk_bytes");
  cfg = PlanConfig{};
  cfg.device = -1;
  expect_rejected(cfg, "device");
}

// ---------------------------------------------------------------------------------------------
// Pointer classification cache

// Without the engine's PageableCache the planner remembers pageable memory page by page, and
// assumes nothing about 2 MB regions: an allocation right next to pageable memory in the same
// region is still recognised (the emulated device's memory once lay in heap regions).
TEST(PlannerRangeCacheTest, DeviceAllocationSharingGranuleWithPageableSourceIsAccepted) {
  constexpr std::uintptr_t kHeap = 0x6000'0000'0000;  // one 2 MB granule of "heap"
  constexpr std::uintptr_t kAllocA = kHeap + 0x1000, kAllocB = kHeap + 0x10000;
  constexpr std::uintptr_t kAllocBytes = 0x1000;
  const gfd::detail::PointerClassifier heap_classify = [](const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    PointerInfo info;
    for (std::uintptr_t base : {kAllocA, kAllocB}) {
      if (in_range(a, base, kAllocBytes)) {
        info.kind = PointerKind::kDevice;
        info.device = 0;
        info.begin = base;
        info.end = base + kAllocBytes;
      }
    }
    return info;
  };
  const std::vector<BlockCopy> blocks = {block(kHeap + 0x40000, kAllocA, 256),
                                         block(kHeap + 0x40100, kAllocB, 256)};
  const PlanConfig cfg = small_config();
  Plan plan;
  ASSERT_NO_THROW(plan = gfd::detail::make_plan(blocks, cfg, heap_classify));
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
}

// Likewise for a pinned (registered) source next to pageable memory: the large pinned block
// takes the direct path.
TEST(PlannerRangeCacheTest, PinnedSourceSharingGranuleWithPageableSourceGoesDirect) {
  constexpr std::uintptr_t kHeap = 0x6000'0000'0000;
  constexpr std::uintptr_t kRegistered = kHeap + 0x10000;  // registered 1 MB + 64 KB
  constexpr std::uintptr_t kRegisteredBytes = kMiB + 0x10000;
  const gfd::detail::PointerClassifier heap_classify = [](const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    if (in_range(a, kRegistered, kRegisteredBytes))
      return PointerInfo{PointerKind::kPinnedHost, -1, kRegistered, kRegistered + kRegisteredBytes};
    return fake_classify(p);
  };
  const std::vector<BlockCopy> blocks = {block(kHeap, kDevBase, 256),
                                         block(kRegistered, kDevBase + 0x10000, kMiB)};
  const PlanConfig cfg = small_config();  // direct_min 1 MB
  const Plan plan = gfd::detail::make_plan(blocks, cfg, heap_classify);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_EQ(plan.direct.size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Randomized property test

struct ExpectedSegment {
  std::uintptr_t src, dst;
  std::uint64_t bytes;
  bool pinned;
};

// Independent model of coalescing and the direct-path choice.
std::vector<ExpectedSegment> model_segments(const std::vector<BlockCopy>& blocks) {
  std::vector<ExpectedSegment> segs;
  for (const auto& b : blocks) {
    const std::uintptr_t s = addr(b.src), d = addr(b.dst);
    const bool pinned =
        in_range(s, kPinnedBase, kPinnedSize) && s + b.bytes <= kPinnedBase + kPinnedSize;
    if (!segs.empty() && segs.back().src + segs.back().bytes == s &&
        segs.back().dst + segs.back().bytes == d) {
      segs.back().bytes += b.bytes;
      segs.back().pinned = segs.back().pinned && pinned;
    } else {
      segs.push_back({s, d, b.bytes, pinned});
    }
  }
  return segs;
}

void check_against_model(const std::vector<BlockCopy>& blocks, const Plan& plan,
                         const PlanConfig& cfg) {
  std::vector<ExpectedSegment> direct, staged;
  for (const auto& s : model_segments(blocks)) {
    if (s.pinned && s.bytes >= cfg.direct_min())
      direct.push_back(s);
    else
      staged.push_back(s);
  }
  ASSERT_EQ(plan.direct.size(), direct.size());
  for (std::size_t i = 0; i < direct.size(); ++i) {
    ASSERT_EQ(addr(plan.direct[i].src), direct[i].src) << "direct " << i;
    ASSERT_EQ(addr(plan.direct[i].dst), direct[i].dst) << "direct " << i;
    ASSERT_EQ(plan.direct[i].bytes, direct[i].bytes) << "direct " << i;
  }
  // The ops, in order, are the staged segments cut into consecutive parts.
  std::size_t k = 0;
  for (std::size_t i = 0; i < staged.size(); ++i) {
    std::uint64_t done = 0;
    while (done < staged[i].bytes) {
      ASSERT_LT(k, plan.ops.size()) << "staged segment " << i;
      const auto& op = plan.ops[k];
      ASSERT_EQ(addr(op.src), staged[i].src + done) << "op " << k;
      ASSERT_EQ(addr(op.dst), staged[i].dst + done) << "op " << k;
      ASSERT_LE(op.bytes, staged[i].bytes - done) << "op " << k;
      done += op.bytes;
      ++k;
    }
  }
  ASSERT_EQ(k, plan.ops.size());
}

struct RandomTransfer {
  std::vector<BlockCopy> blocks;
  PlanConfig cfg;
};

RandomTransfer random_transfer(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uniform = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  RandomTransfer t;
  const std::size_t slots[] = {4096, 16 * kKiB, 64 * kKiB, 256 * kKiB, 2 * kMiB};
  t.cfg.slot_bytes = slots[uniform(0, 4)];
  // A power-of-two fraction of the slot, or any size (pieces of a 32nd of it are then odd sizes).
  t.cfg.first_chunk_bytes = uniform(0, 1) == 0
                                ? std::max<std::size_t>(4096, t.cfg.slot_bytes >> uniform(0, 4))
                                : uniform(4096, std::max<std::size_t>(4096, t.cfg.slot_bytes));
  const std::size_t pieces[] = {256, 1000, 4096, 64 * kKiB, 1 * kMiB};
  t.cfg.piece_bytes = pieces[uniform(0, 4)];
  const std::size_t directs[] = {0, 64 * kKiB, 256 * kKiB, 1 * kMiB};
  t.cfg.direct_min_bytes = directs[uniform(0, 3)];
  t.cfg.direct_min_bytes_to_host = t.cfg.direct_min_bytes;

  // Source placement: 0 all pageable, 1 all pinned, 2 mixed runs.
  const int src_mode = static_cast<int>(uniform(0, 2));
  const std::size_t n = uniform(200, 400);
  std::uintptr_t page_cur = kPageBase + uniform(0, 4095);
  std::uintptr_t pin_cur = kPinnedBase + uniform(0, 4095);
  std::uintptr_t dst_cur = kDevBase + uniform(0, 4095);
  bool pinned = src_mode == 1;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t bytes = uniform(1, 300000);
    // 0: contiguous with the previous block on both sides; 1: source gap only; 2: destination
    // gap only; 3: both.
    const int join = static_cast<int>(uniform(0, 3));
    const bool src_gap = join == 1 || join == 3, dst_gap = join == 2 || join == 3;
    if (src_mode == 2 && src_gap && uniform(0, 3) == 0) pinned = !pinned;
    std::uintptr_t& src_cur = pinned ? pin_cur : page_cur;
    if (src_gap) src_cur += uniform(1, 8192);
    if (dst_gap) dst_cur += uniform(1, 8192);
    t.blocks.push_back(block(src_cur, dst_cur, bytes));
    src_cur += bytes;
    dst_cur += bytes;
  }
  // Order: 0 as laid out; 1 a few swaps; 2 fully shuffled.
  const int order_mode = static_cast<int>(uniform(0, 2));
  if (order_mode == 1) {
    for (int s = 0; s < 10; ++s) {
      const std::size_t i = uniform(0, n - 1), j = uniform(0, n - 1);
      std::swap(t.blocks[i], t.blocks[j]);
    }
  } else if (order_mode == 2) {
    std::shuffle(t.blocks.begin(), t.blocks.end(), rng);
  }
  return t;
}

TEST(PlannerPropertyTest, RandomTransfersKeepInvariants) {
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const RandomTransfer t = random_transfer(seed);
    ASSERT_NO_THROW(gfd::detail::validate_plan_config(t.cfg));
    Plan plan;
    ASSERT_NO_THROW(plan = plan_of(t.blocks, t.cfg));
    ASSERT_NO_FATAL_FAILURE(check_plan(t.blocks, plan, t.cfg));
    ASSERT_NO_FATAL_FAILURE(check_against_model(t.blocks, plan, t.cfg));
  }
}

TEST(PlannerPropertyTest, RandomOverlapIsReportedWithHigherIndex) {
  for (std::uint64_t seed = 100; seed < 120; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomTransfer t = random_transfer(seed);
    std::mt19937_64 rng(seed);
    const std::size_t n = t.blocks.size();
    const std::size_t a = std::uniform_int_distribution<std::size_t>(0, n - 2)(rng);
    const std::size_t b = std::uniform_int_distribution<std::size_t>(a + 1, n - 1)(rng);
    // Move block b onto the last byte of block a: (a, b) is then the only overlapping pair.
    const std::uintptr_t a_last = addr(t.blocks[a].dst) + t.blocks[a].bytes - 1;
    t.blocks[b].dst = dst_at(a_last);
    t.blocks[b].bytes = 1;
    try {
      (void)plan_of(t.blocks, t.cfg);
      ADD_FAILURE() << "overlap of blocks " << a << " and " << b << " not detected";
    } catch (const gfd::Error& e) {
      EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.block(), b);
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, "block " + std::to_string(b) + ":", e.what());
    }
  }
}

}  // namespace

// ---- device to host ---------------------------------------------------------------------------
namespace {

PlanConfig to_host_config() {
  PlanConfig cfg = small_config();
  cfg.direction = gfd::detail::Direction::kToHost;
  return cfg;
}

TEST(PlannerToHostTest, DeviceSourcesToHostDestinationsArePacked) {
  // Device sources in order (one DMA per chunk), host destinations scattered.
  std::vector<BlockCopy> blocks;
  for (std::size_t i = 0; i < 8; ++i)
    blocks.push_back(block(kDevBase + i * 4 * kKiB, kPageBase + (7 - i) * 8 * kKiB, 4 * kKiB));
  const Plan plan = plan_of(blocks, to_host_config());
  EXPECT_EQ(plan.total_bytes, 32 * kKiB);
  ASSERT_FALSE(plan.chunks.empty());
  for (const auto& c : plan.chunks)
    EXPECT_TRUE(c.contiguous_device) << "device side is consecutive";
  EXPECT_FALSE(plan.all_pinned_host);
  // Each op keeps its device source and host destination.
  for (const auto& op : plan.ops) {
    EXPECT_GE(addr(op.src), kDevBase);
    EXPECT_LT(addr(op.dst), kPageBase + kGiB);
  }
}

TEST(PlannerToHostTest, ScatteredDeviceSourcesAreNotContiguous) {
  std::vector<BlockCopy> blocks;
  for (std::size_t i = 0; i < 8; ++i)
    blocks.push_back(block(kDevBase + (7 - i) * 8 * kKiB, kPinnedBase + i * 4 * kKiB, 4 * kKiB));
  const Plan plan = plan_of(blocks, to_host_config());
  ASSERT_FALSE(plan.chunks.empty());
  EXPECT_FALSE(plan.chunks[0].contiguous_device);
  EXPECT_TRUE(plan.all_pinned_host);
}

// chunk_bytes_to_host caps device-to-host chunks below the slot (one ring of large slots for
// both directions), listed and planned from ids; host to device still fills whole slots.
TEST(PlannerToHostTest, ChunkBytesToHostCapsOnlyDeviceToHostChunks) {
  using gfd::detail::Direction;
  using gfd::detail::IdOps;
  for (const Direction dir : {Direction::kToDevice, Direction::kToHost}) {
    SCOPED_TRACE(dir == Direction::kToDevice ? "to device" : "to host");
    PlanConfig cfg = small_config();  // 64 KB slots, 16 KB first chunk
    cfg.chunk_bytes_to_host = 32 * kKiB;
    cfg.direction = dir;
    const std::uint64_t cap = dir == Direction::kToHost ? 32 * kKiB : 64 * kKiB;
    EXPECT_EQ(cfg.chunk_bytes(), cap);
    // 400 scattered 1 KB blocks, listed.
    std::vector<BlockCopy> blocks;
    for (std::uint64_t i = 0; i < 400; ++i) {
      const std::uintptr_t host = kPinnedBase + i * 2 * kKiB, dev = kDevBase + (399 - i) * 2 * kKiB;
      blocks.push_back(dir == Direction::kToDevice ? block(host, dev, kKiB)
                                                   : block(dev, host, kKiB));
    }
    const Plan listed = plan_of(blocks, cfg);
    ASSERT_NO_FATAL_FAILURE(check_plan(blocks, listed, cfg));
    std::uint64_t largest = 0;
    for (const auto& c : listed.chunks) largest = std::max<std::uint64_t>(largest, c.dma_bytes());
    EXPECT_LE(largest, cap);
    EXPECT_GT(largest, cap / 2) << "the chunks grow to the cap";
    // The same blocks planned from ids: one pair, ids 0..399 one way and 399..0 the other.
    Plan plan;
    plan.reset(400);
    IdOps& ids = plan.id_ops;
    ids.rows = 400;
    ids.block_bytes = kKiB;
    for (std::uint64_t i = 0; i < 400; ++i) {
      ids.ids.push_back(dir == Direction::kToDevice ? i : 399 - i);
      ids.ids.push_back(dir == Direction::kToDevice ? 399 - i : i);
    }
    const std::uintptr_t from = dir == Direction::kToDevice ? kPinnedBase : kDevBase;
    const std::uintptr_t to = dir == Direction::kToDevice ? kDevBase : kPinnedBase;
    ids.pairs.push_back({static_cast<const std::byte*>(src_at(from)),
                         static_cast<std::byte*>(dst_at(to)), 2 * kKiB, 2 * kKiB});
    gfd::detail::plan_from_ids(plan, cfg);
    gfd::detail::make_all_ops(plan);
    ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
    for (const auto& c : plan.chunks) EXPECT_LE(c.dma_bytes(), cap);
  }
}

// Device to host, the last chunk is placed after the last DMA: chunks grow from the first
// chunk's size, then halve towards the end, so the last one is no larger than half a slot.
TEST(PlannerToHostTest, ChunksTaperTowardsTheEnd) {
  PlanConfig cfg;  // the engine's defaults: 2 MB slots, 256 KB first chunk
  std::vector<BlockCopy> blocks;
  for (std::uintptr_t i = 0; i < 2048; ++i)
    blocks.push_back(block(kDevBase + i * 4096, kPageBase + i * 8192, 4096));  // 8 MB
  cfg.direction = gfd::detail::Direction::kToHost;
  const Plan down = plan_of(blocks, cfg);
  std::uint64_t sum = 0;
  for (const auto& c : down.chunks) sum += c.data_bytes;
  EXPECT_EQ(sum, 8 * kMiB);
  ASSERT_GE(down.chunks.size(), 4u);
  EXPECT_LE(down.chunks.back().data_bytes, cfg.slot_bytes / 2);
  std::size_t peak = 0;
  for (std::size_t k = 1; k < down.chunks.size(); ++k)
    if (down.chunks[k].data_bytes > down.chunks[peak].data_bytes) peak = k;
  EXPECT_GT(peak, 0u);
  EXPECT_LT(peak, down.chunks.size() - 2);
  for (std::size_t k = 1; k <= peak; ++k)
    EXPECT_GE(down.chunks[k].data_bytes, down.chunks[k - 1].data_bytes) << "chunk " << k;
  for (std::size_t k = peak + 1; k < down.chunks.size(); ++k)
    EXPECT_LE(down.chunks[k].data_bytes, down.chunks[k - 1].data_bytes) << "chunk " << k;
  // Host to device keeps full slots to the end (the DMA is last there, and it is the slower).
  cfg.direction = gfd::detail::Direction::kToDevice;
  std::vector<BlockCopy> up;
  for (std::uintptr_t i = 0; i < 2048; ++i)
    up.push_back(block(kPageBase + i * 8192, kDevBase + i * 4096, 4096));
  const Plan plan_up = plan_of(up, cfg);
  EXPECT_LT(plan_up.chunks.size(), down.chunks.size());
  EXPECT_GT(plan_up.chunks[plan_up.chunks.size() - 2].data_bytes, cfg.slot_bytes / 2);
}

TEST(PlannerToHostTest, SidesAreNamedInErrors) {
  const PlanConfig cfg = to_host_config();
  auto reject = [&](BlockCopy b, const std::string& needle) {
    std::vector<BlockCopy> blocks = {block(kDevBase, kPageBase, 4096), b};
    try {
      (void)plan_of(blocks, cfg);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const gfd::Error& e) {
      EXPECT_EQ(e.block(), 1u);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  reject(block(kPageBase + 8192, kPageBase + 65536, 4096), "source");  // host source
  reject(block(kDevBase + 8192, kDevBase + 65536, 4096), "needs a host destination");
  reject(block(kOtherBase, kPageBase + 65536, 4096), "device memory of GPU 1");
  reject(block(kDevBase + 8192, kPageBase + 100, 4096), "overlaps block 0");
  PlanConfig pinned = cfg;
  pinned.require_pinned_host = true;
  pinned.pinned_reason = "the test";
  std::vector<BlockCopy> blocks = {block(kDevBase, kPageBase, 4096)};
  EXPECT_THROW((void)plan_of(blocks, pinned), gfd::Error);
}

// ---------------------------------------------------------------------------------------------
// Pageable regions remembered across plans (PageableCache)

using gfd::detail::PageableCache;

TEST(PageableCacheTest, RemembersA2MiBRegionUntilItExpires) {
  PageableCache cache(100);
  const std::uintptr_t a = kPageBase + 3 * PageableCache::kGranule + 12345;
  cache.insert(a, 1000);
  EXPECT_TRUE(cache.contains(a, 1000));
  EXPECT_TRUE(cache.contains(a - 12345, 1099)) << "the region's first byte";
  EXPECT_TRUE(cache.contains(a - 12345 + PageableCache::kGranule - 1, 1050)) << "its last byte";
  EXPECT_FALSE(cache.contains(a + PageableCache::kGranule, 1000)) << "the next region";
  EXPECT_FALSE(cache.contains(a - 12345 - 1, 1000)) << "the region before";
  EXPECT_FALSE(cache.contains(a, 1100)) << "expired after 100 ms";
  cache.insert(a, 1100);
  EXPECT_TRUE(cache.contains(a, 1150)) << "learned again";
  cache.clear();
  EXPECT_FALSE(cache.contains(a, 1150));
}

TEST(PageableCacheTest, TheClockMayWrap) {
  PageableCache cache(100);
  constexpr std::uint32_t kWrap = 1u << 24;  // the stamps are 24 bits of milliseconds
  cache.insert(kPageBase, kWrap - 10);
  EXPECT_TRUE(cache.contains(kPageBase, 20));
  EXPECT_FALSE(cache.contains(kPageBase, 95));
}

TEST(PageableCacheTest, ZeroTtlRemembersNothing) {
  PageableCache cache(0);
  cache.insert(kPageBase, 5);
  EXPECT_FALSE(cache.contains(kPageBase, 5));
}

// A classifier that counts its queries and can be told that memory was registered since.
struct CountingClassifier {
  int calls = 0;
  std::uintptr_t registered_base = 0, registered_bytes = 0;
  gfd::detail::PointerClassifier fn() {
    return [this](const void* p) {
      ++calls;
      const auto a = reinterpret_cast<std::uintptr_t>(p);
      if (registered_bytes != 0 && in_range(a, registered_base, registered_bytes))
        return PointerInfo{PointerKind::kPinnedHost, -1, registered_base,
                           registered_base + registered_bytes};
      return fake_classify(p);
    };
  }
};

// 512 pageable 4 KB blocks spread over 8 regions of 2 MiB: the first plan asks about each region
// once (and the device range once); a second plan asks about the device range alone.
TEST(PageableCacheTest, PlansAskTheDriverOncePerPageableRegion) {
  std::vector<BlockCopy> blocks;
  for (std::uintptr_t i = 0; i < 512; ++i)
    blocks.push_back(block(kPageBase + (i % 8) * PageableCache::kGranule + (i / 8) * 8192,
                           kDevBase + i * 4096, 4096));
  PageableCache cache(60000);
  CountingClassifier c;
  const auto fn = c.fn();
  const PlanConfig cfg = small_config();
  Plan plan = gfd::detail::make_plan(blocks, cfg, fn, &cache);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_FALSE(plan.all_pinned_host);
  EXPECT_EQ(c.calls, 1 + 8);
  c.calls = 0;
  plan = gfd::detail::make_plan(blocks, cfg, fn, &cache);
  ASSERT_NO_FATAL_FAILURE(check_plan(blocks, plan, cfg));
  EXPECT_EQ(c.calls, 1);
  // Without the cache: one query per page.
  c.calls = 0;
  plan = gfd::detail::make_plan(blocks, cfg, fn);
  EXPECT_EQ(c.calls, 1 + 512);
}

// Where pinned memory matters the driver is asked afresh, even inside a region remembered as
// pageable: memory registered since then is found.
TEST(PageableCacheTest, PinnedMemoryRegisteredSinceIsFoundWhereItMatters) {
  PageableCache cache(60000);
  CountingClassifier c;
  const auto fn = c.fn();
  const PlanConfig cfg = small_config();  // direct_min 1 MB
  const std::uintptr_t region = kPageBase + 16 * PageableCache::kGranule;
  const std::vector<BlockCopy> small = {block(region, kDevBase, 4096)};
  (void)gfd::detail::make_plan(small, cfg, fn, &cache);
  ASSERT_TRUE(cache.contains(region + 8192, cache.now_ms()));
  c.registered_base = region + 8192;  // registered after the first transfer saw it pageable
  c.registered_bytes = 2 * kMiB;
  // A block large enough for the direct path takes it.
  const std::vector<BlockCopy> big = {block(region + 8192, kDevBase, kMiB)};
  Plan plan = gfd::detail::make_plan(big, cfg, fn, &cache);
  EXPECT_EQ(plan.direct.size(), 1u);
  EXPECT_TRUE(plan.all_pinned_host);
  // A backend that needs pinned memory accepts it.
  PlanConfig pinned = cfg;
  pinned.require_pinned_host = true;
  pinned.pinned_reason = "the test";
  const std::vector<BlockCopy> small_registered = {block(region + 8192, kDevBase, 4096)};
  EXPECT_NO_THROW(plan = gfd::detail::make_plan(small_registered, pinned, fn, &cache));
  // Small blocks elsewhere go through staging without a query, pinned or not (either is correct).
  c.calls = 0;
  plan = gfd::detail::make_plan(small, cfg, fn, &cache);
  EXPECT_EQ(c.calls, 1);  // the device range alone
  EXPECT_TRUE(plan.direct.empty());
}

// A device pointer on the host side is still rejected with the cache in use, and so is a host
// pointer on the device side.
TEST(PageableCacheTest, WrongSidesAreStillRejected) {
  PageableCache cache(60000);
  const PlanConfig cfg = small_config();
  const std::vector<BlockCopy> ok = {block(kPageBase, kDevBase, 4096)};
  (void)gfd::detail::make_plan(ok, cfg, classifier(), &cache);
  const std::vector<BlockCopy> dev_source = {block(kPageBase + 4096, kDevBase, 4096),
                                             block(kDevBase + kMiB, kDevBase + 8192, 4096)};
  EXPECT_THROW((void)gfd::detail::make_plan(dev_source, cfg, classifier(), &cache), gfd::Error);
  const std::vector<BlockCopy> host_dest = {block(kPageBase + 4096, kPageBase + 65536, 4096)};
  EXPECT_THROW((void)gfd::detail::make_plan(host_dest, cfg, classifier(), &cache), gfd::Error);
}

// ---------------------------------------------------------------------------------------------
// Planning a stretch at a time (PlanBuilder)

bool same_plan(const Plan& a, const Plan& b) {
  if (a.ops.size() != b.ops.size() || a.chunks.size() != b.chunks.size() ||
      a.pieces.size() != b.pieces.size() || a.direct.size() != b.direct.size() ||
      a.total_bytes != b.total_bytes || a.all_pinned_host != b.all_pinned_host)
    return false;
  for (std::size_t i = 0; i < a.ops.size(); ++i)
    if (a.ops[i].src != b.ops[i].src || a.ops[i].dst != b.ops[i].dst ||
        a.ops[i].slot_offset != b.ops[i].slot_offset || a.ops[i].bytes != b.ops[i].bytes)
      return false;
  for (std::size_t i = 0; i < a.chunks.size(); ++i)
    if (a.chunks[i].op_begin != b.chunks[i].op_begin || a.chunks[i].op_end != b.chunks[i].op_end ||
        a.chunks[i].piece_end != b.chunks[i].piece_end ||
        a.chunks[i].data_bytes != b.chunks[i].data_bytes ||
        a.chunks[i].contiguous_device != b.chunks[i].contiguous_device)
      return false;
  for (std::size_t i = 0; i < a.direct.size(); ++i)
    if (a.direct[i].src != b.direct[i].src || a.direct[i].bytes != b.direct[i].bytes) return false;
  return true;
}

// Planned in random stretches, with storage reserved up front: the same plan as in one go, no
// chunk changes once closed, and no vector is ever reallocated (other threads read closed
// chunks while planning goes on). Blocks of 1-300000 bytes, and of 1-16 bytes (the most ops
// and scatter entries per chunk), in both directions.
TEST(PlanBuilderTest, StretchesGiveTheSamePlanInStableStorage) {
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RandomTransfer t = random_transfer(seed);
    std::mt19937_64 rng(seed * 7);
    if (seed % 3 == 0)
      for (auto& b : t.blocks) b.bytes = 1 + rng() % 16;
    if (seed % 2 == 0) {  // device to host: swap the sides
      t.cfg.direction = gfd::detail::Direction::kToHost;
      for (auto& b : t.blocks) {
        const void* host = b.src;
        b.src = b.dst;
        b.dst = const_cast<void*>(host);
      }
    }
    Plan whole;
    try {
      whole = plan_of(t.blocks, t.cfg);
    } catch (const gfd::Error&) {
      continue;  // swapped sides may overlap on the host: nothing to compare
    }
    Plan plan;
    gfd::detail::PlanBuilder builder(t.blocks, t.cfg, classifier(), plan, nullptr, true);
    ASSERT_TRUE(builder.stable());
    const auto* ops = plan.ops.data();
    const auto* pieces = plan.pieces.data();
    const auto* chunks = plan.chunks.data();
    std::vector<gfd::detail::PlannedChunk> closed;
    const bool check_early = seed % 4 == 1;  // validate everything after the first stretch
    while (builder.packed() < builder.size()) {
      builder.advance(builder.packed() + 1 + rng() % 97);
      if (check_early) builder.check();
      for (std::size_t k = 0; k < closed.size(); ++k)
        ASSERT_EQ(plan.chunks[k].data_bytes, closed[k].data_bytes) << "chunk " << k << " changed";
      for (std::size_t k = closed.size(); k < plan.chunks.size(); ++k)
        closed.push_back(plan.chunks[k]);
    }
    builder.finish();
    EXPECT_EQ(plan.ops.data(), ops) << "ops reallocated";
    EXPECT_EQ(plan.pieces.data(), pieces) << "pieces reallocated";
    EXPECT_EQ(plan.chunks.data(), chunks) << "chunks reallocated";
    EXPECT_TRUE(same_plan(plan, whole));
    const gfd::detail::PlanBounds b =
        gfd::detail::plan_bounds(t.blocks.size(), plan.total_bytes, t.cfg);
    EXPECT_LE(plan.ops.size(), b.ops);
    EXPECT_LE(plan.pieces.size(), b.pieces);
    EXPECT_LE(plan.chunks.size(), b.chunks);
    ++compared;
  }
  EXPECT_GE(compared, 50);
}

// A bad block after some chunks were planned is reported by the advance that reaches it, naming
// it; the chunks planned before it are there (the engine discards them).
TEST(PlanBuilderTest, ABadBlockIsReportedWhenReached) {
  std::vector<BlockCopy> blocks;
  for (std::uintptr_t i = 0; i < 1000; ++i)
    blocks.push_back(block(kPinnedBase + i * 8192, kDevBase + i * 4096, 4096));
  blocks[700].dst = dst_at(kPinnedBase);  // a host destination
  const PlanConfig cfg = small_config();
  Plan plan;
  gfd::detail::PlanBuilder builder(blocks, cfg, classifier(), plan, nullptr, true);
  builder.advance(600);
  EXPECT_GT(plan.chunks.size(), 10u);
  try {
    builder.advance(800);
    ADD_FAILURE() << "accepted";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.block(), 700u);
  }
}

}  // namespace

// ---- constant-stride runs as 2D copies ---------------------------------------------------------
namespace {

PlanConfig strided_config(std::size_t min_rows = 64) {
  PlanConfig cfg = small_config();
  cfg.strided_min_rows = min_rows;
  return cfg;
}

// `n` blocks of `bytes`: block i from src + i * sp to dst + i * dp.
std::vector<BlockCopy> run_of(std::uintptr_t src, std::int64_t sp, std::uintptr_t dst,
                              std::int64_t dp, std::size_t n, std::size_t bytes) {
  std::vector<BlockCopy> v;
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(block(src + static_cast<std::int64_t>(i) * sp,
                      dst + static_cast<std::int64_t>(i) * dp, bytes));
  return v;
}

std::uint64_t staged_bytes(const Plan& p) {
  std::uint64_t b = 0;
  for (const auto& op : p.ops) b += op.bytes;
  for (const auto& d : p.direct) b += d.bytes;
  return b;
}

}  // namespace

TEST(StridedRunTest, TheSeedsLayoutIsOne2DCopy) {
  // 2048 blocks of 4 KB at a pitch of 2 blocks in pinned memory, to one contiguous device range.
  const auto blocks = run_of(kPinnedBase, 8192, kDevBase, 4096, 2048, 4096);
  const Plan p = plan_of(blocks, strided_config());
  ASSERT_EQ(p.strided.size(), 1u);
  const auto& s = p.strided[0];
  EXPECT_EQ(addr(s.src), kPinnedBase);
  EXPECT_EQ(addr(s.dst), kDevBase);
  EXPECT_EQ(s.width, 4096u);
  EXPECT_EQ(s.spitch, 8192u);
  EXPECT_EQ(s.dpitch, 4096u);
  EXPECT_EQ(s.rows, 2048u);
  EXPECT_TRUE(p.ops.empty());
  EXPECT_TRUE(p.chunks.empty());
  EXPECT_EQ(p.total_bytes, 2048u * 4096);
}

TEST(StridedRunTest, OneOddBlockBreaksTheRunInTwo) {
  auto blocks = run_of(kPinnedBase, 8192, kDevBase + 64 * kMiB, 3 * 4096, 201, 4096);
  blocks[100] = block(kPinnedBase + 500 * kMiB, kDevBase, 4096);  // elsewhere on both sides
  const Plan p = plan_of(blocks, strided_config(64));
  ASSERT_EQ(p.strided.size(), 2u);
  EXPECT_EQ(p.strided[0].rows, 100u);
  EXPECT_EQ(p.strided[1].rows, 100u);
  EXPECT_EQ(addr(p.strided[1].src), kPinnedBase + 101 * 8192);
  EXPECT_EQ(p.strided[1].dpitch, 3u * 4096);
  EXPECT_EQ(staged_bytes(p), 4096u);  // the odd block, staged
  EXPECT_EQ(p.total_bytes, 201u * 4096);
}

TEST(StridedRunTest, ShortRunsNegativePitchesAndPageableMemoryAreStaged) {
  const PlanConfig cfg = strided_config(128);
  const auto short_run = run_of(kPinnedBase, 8192, kDevBase, 4096, 127, 4096);
  const Plan a = plan_of(short_run, cfg);
  EXPECT_TRUE(a.strided.empty());
  EXPECT_EQ(staged_bytes(a), 127u * 4096);
  const auto backwards =
      run_of(kPinnedBase + 64 * kMiB, -8192, kDevBase + 64 * kMiB, -4096, 512, 4096);
  const Plan b = plan_of(backwards, cfg);
  EXPECT_TRUE(b.strided.empty());
  EXPECT_EQ(staged_bytes(b), 512u * 4096);
  const auto pageable = run_of(kPageBase, 8192, kDevBase, 4096, 512, 4096);
  const Plan c = plan_of(pageable, cfg);
  EXPECT_TRUE(c.strided.empty());
  EXPECT_EQ(staged_bytes(c), 512u * 4096);
  PlanConfig off = cfg;
  off.strided_min_rows = 0;
  EXPECT_TRUE(plan_of(run_of(kPinnedBase, 8192, kDevBase, 4096, 512, 4096), off).strided.empty());
}

TEST(StridedRunTest, MixedListsKeepEveryByteAndTheirOrder) {
  // Random blocks, then a run, then random blocks, then a run of another size.
  std::mt19937_64 rng(3);
  std::vector<BlockCopy> blocks;
  std::uintptr_t dst = kDevBase;
  auto random_block = [&] {
    blocks.push_back(block(kPinnedBase + (rng() % 100000) * 8192, dst, 4096));
    dst += 4096;
  };
  for (int i = 0; i < 50; ++i) random_block();
  for (const auto& b : run_of(kPinnedBase + 900 * kMiB, 16384, dst, 4096, 300, 4096))
    blocks.push_back(b);
  dst += 300 * 4096;
  for (int i = 0; i < 50; ++i) random_block();
  for (const auto& b : run_of(kPinnedBase + 800 * kMiB, 65536, dst, 2 * 8192, 200, 8192))
    blocks.push_back(b);
  const Plan p = plan_of(blocks, strided_config(64));
  ASSERT_EQ(p.strided.size(), 2u);
  EXPECT_EQ(p.strided[0].rows, 300u);
  EXPECT_EQ(p.strided[1].rows, 200u);
  EXPECT_EQ(p.strided[1].width, 8192u);
  std::uint64_t in_2d = 0;
  for (const auto& s : p.strided) in_2d += s.width * s.rows;
  EXPECT_EQ(staged_bytes(p) + in_2d, p.total_bytes);
  EXPECT_EQ(p.total_bytes, 100u * 4096 + 300u * 4096 + 200u * 8192);
  check_structure(p, strided_config(64));
}

TEST(StridedRunTest, DeviceToHostRunsToo) {
  // Device blocks in order into host slots at a pitch of 4 blocks.
  PlanConfig cfg = strided_config(64);
  cfg.direction = gfd::detail::Direction::kToHost;
  const auto blocks = run_of(kDevBase, 4096, kPinnedBase, 4 * 4096, 256, 4096);
  const Plan p = plan_of(blocks, cfg);
  ASSERT_EQ(p.strided.size(), 1u);
  EXPECT_EQ(p.strided[0].spitch, 4096u);
  EXPECT_EQ(p.strided[0].dpitch, 4u * 4096);
  EXPECT_EQ(p.strided[0].rows, 256u);
}

TEST(StridedRunTest, OverlappingDestinationsAreStillRejected) {
  // A destination pitch smaller than a block: rows would overlap. The check sees it first.
  const auto blocks = run_of(kPinnedBase, 8192, kDevBase, 2048, 256, 4096);
  EXPECT_THROW(plan_of(blocks, strided_config(64)), gfd::Error);
}

// The engine's rule: at least 2 rows and 512 KiB. One block id of 64 layers whose caches share
// one allocation at a constant layer stride (vLLM 0.33), host rows of every layer's page side
// by side: each id is one run when its pages hold 512 KiB (64 x 8 KB), none at 64 x 4 KB.
TEST(StridedRunTest, RunsOfFewLargeRowsByTheirBytes) {
  PlanConfig cfg = strided_config(2);
  cfg.strided_min_bytes = 512 * kKiB;
  auto job = [](std::size_t page, std::size_t ids) {
    std::vector<BlockCopy> v;
    const std::uintptr_t layer = 2 * kMiB;  // 64 layer caches of 2 MB in one device allocation
    for (std::size_t i = 0; i < ids; ++i) {
      const std::uintptr_t host_row = kPinnedBase + (37 * i % 101) * 64 * page;
      const std::uintptr_t dev_block = (53 * i % 97) * page;
      for (std::uintptr_t l = 0; l < 64; ++l)
        v.push_back(block(host_row + l * page, kDevBase + l * layer + dev_block, page));
    }
    return v;
  };
  const Plan eight = plan_of(job(8192, 16), cfg);
  ASSERT_EQ(eight.strided.size(), 16u);
  for (const auto& s : eight.strided) {
    EXPECT_EQ(s.rows, 64u);
    EXPECT_EQ(s.width, 8192u);
    EXPECT_EQ(s.spitch, 8192u);
    EXPECT_EQ(s.dpitch, 2 * kMiB);
  }
  EXPECT_TRUE(eight.chunks.empty());
  EXPECT_EQ(eight.total_bytes, 16u * 64 * 8192);
  const Plan four = plan_of(job(4096, 16), cfg);
  EXPECT_TRUE(four.strided.empty()) << "64 x 4 KB = 256 KiB per run";
  EXPECT_EQ(staged_bytes(four), 16u * 64 * 4096);
}

// A run is validated by its ends where both lie in one device allocation and one pinned range;
// otherwise block by block, so a bad block inside or at the end of a run is still named.
TEST(StridedRunTest, RunsAreCheckedByTheirEndsAndBadBlocksStillNamed) {
  const PlanConfig cfg = strided_config(64);
  // Runs past the end of the device allocation: block 300 is the first outside it.
  const auto past = run_of(kPinnedBase, 8192, kDevBase + kDevSize - 300 * 4096, 4096, 400, 4096);
  try {
    plan_of(past, cfg);
    ADD_FAILURE() << "accepted";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.block(), 300u) << e.what();
  }
  // The host side leaves pinned memory half way (into memory the driver does not know, which is
  // pageable): checked block by block, so nothing goes as a 2D copy over pageable rows and
  // every byte is staged.
  const Plan p =
      plan_of(run_of(kPinnedBase + kPinnedSize - 100 * 8192, 8192, kDevBase, 4096, 200, 4096), cfg);
  EXPECT_TRUE(p.strided.empty());
  EXPECT_EQ(staged_bytes(p), 200u * 4096);
  EXPECT_FALSE(p.all_pinned_host);
  // A null destination in the middle breaks the run (its pitch differs) and is named.
  auto holed = run_of(kPinnedBase, 8192, kDevBase, 4096, 400, 4096);
  holed[250].dst = nullptr;
  try {
    plan_of(holed, cfg);
    ADD_FAILURE() << "accepted";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.block(), 250u) << e.what();
  }
  // A good run: one 2D copy, every block marked pinned.
  const Plan good = plan_of(run_of(kPinnedBase, 8192, kDevBase, 4096, 400, 4096), cfg);
  ASSERT_EQ(good.strided.size(), 1u);
  EXPECT_EQ(good.strided[0].rows, 400u);
  EXPECT_TRUE(good.all_pinned_host);
}

// A 2D copy must stay within one allocation: a run whose rows cross from one device allocation
// into the next (separate tensors that happen to lie at a constant pitch) is staged block by block.
TEST(StridedRunTest, ARunOverTwoAllocationsIsStaged) {
  const std::uintptr_t split = kDevBase + kDevSize / 2;  // two allocations of GPU 0, back to back
  const gfd::detail::PointerClassifier two = [split](const void* p) {
    PointerInfo info = fake_classify(p);
    if (info.kind == PointerKind::kDevice && info.device == 0) {
      const bool low = reinterpret_cast<std::uintptr_t>(p) < split;
      info.begin = low ? kDevBase : split;
      info.end = low ? split : kDevBase + kDevSize;
    }
    return info;
  };
  const auto blocks = run_of(kPinnedBase, 8192, split - 100 * 4096, 4096, 200, 4096);
  const Plan p = gfd::detail::make_plan(blocks, strided_config(64), two);
  EXPECT_TRUE(p.strided.empty());
  EXPECT_EQ(staged_bytes(p), 200u * 4096);
  // Within one of them: one 2D copy.
  const Plan q = gfd::detail::make_plan(run_of(kPinnedBase, 8192, split, 4096, 200, 4096),
                                        strided_config(64), two);
  ASSERT_EQ(q.strided.size(), 1u);
  EXPECT_EQ(q.strided[0].rows, 200u);
}

// A list that is one run end to end is planned in one pass (plan_one_run, which make_plan tries
// first) into the same plan the builder makes; anything else is left to the builder.
TEST(StridedRunTest, AWholeListRunIsPlannedInOnePassAsTheBuilderWould) {
  using gfd::detail::plan_one_run;
  const PlanConfig cfg = strided_config(64);
  const auto seed = run_of(kPinnedBase, 8192, kDevBase, 4096, 2048, 4096);
  Plan fast;
  ASSERT_TRUE(plan_one_run(seed, cfg, classifier(), fast, nullptr));
  Plan built;
  {
    gfd::detail::PlanBuilder b(seed, cfg, classifier(), built, nullptr, false);
    b.finish();
  }
  ASSERT_EQ(fast.strided.size(), 1u);
  ASSERT_EQ(built.strided.size(), 1u);
  const auto &f = fast.strided[0], &g = built.strided[0];
  EXPECT_EQ(f.src, g.src);
  EXPECT_EQ(f.dst, g.dst);
  EXPECT_EQ(f.width, g.width);
  EXPECT_EQ(f.spitch, g.spitch);
  EXPECT_EQ(f.dpitch, g.dpitch);
  EXPECT_EQ(f.rows, g.rows);
  EXPECT_EQ(fast.total_bytes, built.total_bytes);
  EXPECT_EQ(fast.block_count, 2048u);
  EXPECT_TRUE(fast.ops.empty() && fast.chunks.empty() && fast.direct.empty());
  EXPECT_TRUE(fast.all_pinned_host);
  // Device to host too.
  PlanConfig back = cfg;
  back.direction = gfd::detail::Direction::kToHost;
  Plan out;
  EXPECT_TRUE(plan_one_run(run_of(kDevBase, 4096, kPinnedBase, 8192, 2048, 4096), back,
                           classifier(), out, nullptr));
  // Not one run: one odd block, one other size, too few rows, both sides contiguous (one DMA),
  // pageable host memory, runs off.
  Plan no;
  auto odd = seed;
  odd[1000] = block(kPinnedBase + 500 * kMiB, kDevBase + 1000 * 4096, 4096);
  EXPECT_FALSE(plan_one_run(odd, cfg, classifier(), no, nullptr));
  auto sized = seed;
  sized[7].bytes = 2048;
  EXPECT_FALSE(plan_one_run(sized, cfg, classifier(), no, nullptr));
  EXPECT_FALSE(plan_one_run(run_of(kPinnedBase, 8192, kDevBase, 4096, 63, 4096), cfg, classifier(),
                            no, nullptr));
  EXPECT_FALSE(plan_one_run(run_of(kPinnedBase, 4096, kDevBase, 4096, 512, 4096), cfg, classifier(),
                            no, nullptr));
  EXPECT_FALSE(plan_one_run(run_of(kPageBase, 8192, kDevBase, 4096, 512, 4096), cfg, classifier(),
                            no, nullptr));
  PlanConfig off = cfg;
  off.strided_min_rows = 0;
  EXPECT_FALSE(plan_one_run(seed, off, classifier(), no, nullptr));
  // A bad last block is named, as the builder names it.
  const auto past = run_of(kPinnedBase, 8192, kDevBase + kDevSize - 300 * 4096, 4096, 400, 4096);
  try {
    (void)plan_one_run(past, cfg, classifier(), no, nullptr);
    ADD_FAILURE() << "accepted";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.block(), 300u) << e.what();
  }
  // Trusted blocks (a CacheSet's): only where each side's arrays share one allocation.
  std::vector<std::uint8_t> pinned(seed.size(), 1);
  gfd::detail::PlanTrust trust{pinned.data(), true, false};
  PlanConfig trusted = cfg;
  trusted.trust = &trust;
  EXPECT_FALSE(plan_one_run(seed, trusted, classifier(), no, nullptr));
  trust.one_allocation = true;
  EXPECT_TRUE(plan_one_run(seed, trusted, classifier(), no, nullptr));
  pinned[5] = 0;
  trust.all_pinned = false;
  EXPECT_FALSE(plan_one_run(seed, trusted, classifier(), no, nullptr)) << "a pageable row";
}

// ---- staged chunks read in place from host memory (host_direct) --------------------------------
namespace {

// `rows` rows of `per_row` blocks of `bytes`: row r's blocks side by side in host memory at
// host + r * row_pitch (a block-major host cache: one id's page of every layer together), each
// block to its own scattered device place.
std::vector<BlockCopy> rows_of(std::uintptr_t host, std::size_t rows, std::size_t per_row,
                               std::size_t bytes, std::size_t row_pitch) {
  std::vector<BlockCopy> v;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t k = 0; k < per_row; ++k)
      v.push_back(block(host + r * row_pitch + k * bytes,
                        kDevBase + (7 * (r * per_row + k) % 1000) * 2 * bytes, bytes));
  return v;
}

PlanConfig host_direct_config() {
  PlanConfig cfg = small_config();
  cfg.direct_min_bytes = 16 * kKiB;  // runs of 16 KB on average are read in place
  return cfg;
}

}  // namespace

TEST(HostDirectTest, LongHostRunsAreReadInPlace) {
  // 8 rows of 8 x 2 KB (16 KB runs), rows apart: every chunk has runs of 16 KB at least.
  const auto blocks = rows_of(kPinnedBase, 8, 8, 2048, 1 << 20);
  const Plan p = plan_of(blocks, host_direct_config());
  ASSERT_FALSE(p.chunks.empty());
  EXPECT_TRUE(p.direct.empty());
  std::uint64_t bytes = 0;
  for (const auto& c : p.chunks) {
    EXPECT_TRUE(c.host_direct) << "chunk of " << c.data_bytes << " bytes, " << c.host_runs
                               << " runs";
    EXPECT_FALSE(c.contiguous_device);
    // The runs counted are those of the ops' host addresses.
    std::uint32_t runs = 1;
    for (std::uint32_t i = c.op_begin + 1; i < c.op_end; ++i)
      runs += p.ops[i - 1].src + p.ops[i - 1].bytes != p.ops[i].src ? 1 : 0;
    EXPECT_EQ(c.host_runs, runs);
    bytes += c.data_bytes;
  }
  EXPECT_EQ(bytes, 8u * 8 * 2048);
}

TEST(HostDirectTest, ShortRunsAndPageableMemoryAreGathered) {
  // Runs of 2 x 2 KB = 4 KB: too short.
  for (const auto& c :
       plan_of(rows_of(kPinnedBase, 32, 2, 2048, 1 << 20), host_direct_config()).chunks)
    EXPECT_FALSE(c.host_direct) << c.host_runs << " runs, " << c.data_bytes << " bytes";
  // Pageable sources: the copy engine cannot read them in place.
  for (const auto& c :
       plan_of(rows_of(kPageBase, 8, 8, 2048, 1 << 20), host_direct_config()).chunks)
    EXPECT_FALSE(c.host_direct);
}

TEST(HostDirectTest, DeviceToHostLooksAtTheDestinations) {
  // The same rows the other way: the host destinations lie in 16 KB runs.
  PlanConfig to_host = host_direct_config();
  to_host.direction = gfd::detail::Direction::kToHost;
  to_host.direct_min_bytes_to_host = 16 * kKiB;
  std::vector<BlockCopy> back;
  for (const auto& b : rows_of(kPinnedBase, 8, 8, 2048, 1 << 20))
    back.push_back(block(reinterpret_cast<std::uintptr_t>(b.dst),
                         reinterpret_cast<std::uintptr_t>(b.src), b.bytes));
  const Plan p = plan_of(back, to_host);
  ASSERT_FALSE(p.chunks.empty());
  // Device to host the chunks taper towards the end: one may be a sliver of a run, shorter than
  // 16 KB; every other chunk moves in place.
  std::size_t slivers = 0;
  for (const auto& c : p.chunks) {
    if (!c.host_direct) ++slivers;
    EXPECT_TRUE(c.host_direct || (c.host_runs == 1 && c.data_bytes < 16 * kKiB))
        << c.host_runs << " runs, " << c.data_bytes << " bytes";
  }
  EXPECT_LE(slivers, 1u);
  // Its threshold is direct_min_bytes_to_host's.
  to_host.direct_min_bytes_to_host = 64 * kKiB;
  for (const auto& c : plan_of(back, to_host).chunks) EXPECT_FALSE(c.host_direct);
}
