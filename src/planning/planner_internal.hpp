// Private to the planner: the pieces planner.cpp, plan_validate.cpp, plan_packer.cpp and
// plan_from_ids.cpp share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_set>
#include <vector>

#include "planning/planner.hpp"

namespace gfd::detail::plan_internal {

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
  const PointerInfo* lookup(const void* p, bool whole_region);

 private:
  // One slot, rewritten by each answer: only host-side lookups ask for whole regions, and the
  // planner holds one host-side answer at a time (a deque entry per block cost ~10 ns).
  const PointerInfo* region(std::uintptr_t a);
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

// What validation carries from one stretch of blocks to the next.
struct Validation {
  // The ranges of the previous block (dr: the device side's allocation, sr: the host side's):
  // blocks of one transfer mostly come from one host pool and go to one device cache, so each
  // block is tested against them before the cache is asked.
  const PointerInfo* dr = nullptr;
  const PointerInfo* sr = nullptr;
  // Learnt in the same pass, so that no further pass over the list is needed in the common case:
  // every destination so far starts at or after the end of the one before (ascending and
  // disjoint: the overlap check has nothing to do), where the last one ends, and whether every
  // host side so far lies wholly in pinned memory.
  bool disjoint = true;
  std::uintptr_t last_end = 0;
  bool all_pinned = true;
};

// Validates blocks [begin, end) of `blocks` into `pinned` (sized for all of them).
void validate_range(std::span<const BlockCopy> blocks, std::size_t begin, std::size_t end,
                    const PlanConfig& cfg, RangeCache& cache, std::vector<std::uint8_t>& pinned,
                    Validation& v);

// Validates the constant-stride run [begin, end) of `blocks` (find_runs: one block size, both
// sides advancing by a pitch no smaller than a block): the first block is checked in full;
// where the last one then lies in the same device allocation and the same pinned host range,
// so does every block between (addresses only grow along the run), and the run is valid in
// O(1) and true is returned. Otherwise every block is checked, as validate_range does, and false
// is returned: the run spans several allocations (or pageable memory), no 2D copy may take it.
bool validate_run(std::span<const BlockCopy> blocks, std::size_t begin, std::size_t end,
                  const PlanConfig& cfg, RangeCache& cache, std::vector<std::uint8_t>& pinned,
                  Validation& v);

// Throws gfd::Error naming the later of two blocks whose destination ranges overlap.
void check_overlaps(std::span<const BlockCopy> blocks, Plan::Scratch& scratch);

inline constexpr std::uint64_t kAlign = 16;
// A ramp chunk's room for scatter entries beyond its nominal data: 1/16 of it, one 24-byte
// entry per 384 bytes.
inline constexpr std::uint64_t kEntryAllowance = 16;
// Pieces per chunk at least (about one per gather thread and more), down to kMinPiece.
inline constexpr std::uint64_t kPiecesPerChunk = 32;
inline constexpr std::uint64_t kMinPiece = 4096;
inline std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
inline std::uint64_t align_down(std::uint64_t v, std::uint64_t a) { return v / a * a; }

// Chunk k's capacities, with `left` bytes (at least) still to pack: in all (data, scatter
// entries, alignment), of which data, and its pieces' payload. The packer and plan_from_ids
// cut chunks by them.
struct ChunkCaps {
  std::uint64_t cap = 0, data_cap = 0, piece_cap = 0;
};
ChunkCaps chunk_caps(const PlanConfig& cfg, std::size_t k, std::uint64_t left);

// Packs staged segments into chunks, splitting segments wherever a chunk or piece fills up.
class Packer {
 public:
  // `bytes_hint`: about how many bytes will be packed (open_chunk's taper needs no more).
  Packer(const PlanConfig& cfg, Plan& plan, std::uint64_t bytes_hint)
      : cfg_(cfg), plan_(plan), left_(bytes_hint) {}

  void add(const Segment& seg);
  void finish();

 private:
  void open_chunk();
  void close_piece();
  void close_chunk();

  const PlanConfig& cfg_;
  Plan& plan_;
  PlannedChunk chunk_{};
  std::uint64_t left_;
  std::uint64_t cap_ = 0;        // the open chunk's capacity (data, scatter entries, alignment)
  std::uint64_t data_cap_ = 0;   // of which data at most
  std::uint64_t piece_cap_ = 0;  // its pieces' payload
  std::uint32_t piece_begin_ = 0;
  std::uint64_t piece_fill_ = 0;
  bool open_ = false;
  bool pinned_ = true;  // every op of the open chunk has a pinned host side
};

}  // namespace gfd::detail::plan_internal
