// Planning a transfer: validate every block (all-or-nothing), coalesce, choose the direct path
// for large pinned blocks, pack the rest into staging chunks and cut chunks into gather pieces.
// Pure host code with no device calls except through the pointer classifier.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "device/device.hpp"
#include "gfd/types.hpp"

namespace gfd::detail {

using Direction = gfd::Direction;

// Blocks already known to be valid: the ids of a registered CacheSet's transfer were checked
// against caches that were checked once (device memory of this GPU, no overlaps, no duplicate
// destination), so the planner asks the driver about no pointer and checks no overlap.
// `pinned[i]` says whether block i's host side is pinned memory (the direct path may take it).
struct PlanTrust {
  const std::uint8_t* pinned = nullptr;
  bool all_pinned = false;
  // Every array of each side lies in one allocation (one device allocation, one pinned host
  // range), so a constant-stride run may cross from one array to the next: a 2D copy must stay
  // within one allocation. False: no 2D copies for this list.
  bool one_allocation = false;
};

struct PlanConfig {
  Direction direction = Direction::kToDevice;
  int device = 0;                       // ordinal the device side must belong to
  std::size_t slot_bytes = 2 << 20;     // capacity of one slot (data + scatter entries)
  std::size_t chunk_bytes_to_host = 0;  // device to host, a smaller chunk capacity (0: slot_bytes)
  // Capacity of one chunk in this config's direction.
  std::size_t chunk_bytes() const {
    return direction == Direction::kToHost && chunk_bytes_to_host != 0 &&
                   chunk_bytes_to_host < slot_bytes
               ? chunk_bytes_to_host
               : slot_bytes;
  }
  std::size_t first_chunk_bytes = 256 << 10;
  std::size_t piece_bytes = 32 << 10;
  std::size_t direct_min_bytes = 1 << 20;          // host to device; 0 disables the direct path
  std::size_t direct_min_bytes_to_host = 1 << 20;  // device to host; 0 disables it
  // The direct path's threshold in this config's direction (SIZE_MAX: none).
  std::size_t direct_min() const {
    const std::size_t v =
        direction == Direction::kToHost ? direct_min_bytes_to_host : direct_min_bytes;
    return v != 0 ? v : SIZE_MAX;
  }
  bool check_overlaps = true;
  // Staged: coalesce and pack into chunks (the gather pipeline). Pass-through: validate only and
  // list every block, as given, in Plan::direct (the backends that copy block by block).
  enum class Mode : std::uint8_t { kStaged, kPassThrough } mode = Mode::kStaged;
  // Refuse pageable host memory; `pinned_reason` says who needs it (for the error message).
  bool require_pinned_host = false;
  const char* pinned_reason = "";
  // Staged plans: a run of at least strided_min_rows blocks of one size, strided_min_bytes in
  // all, whose host side is pinned and whose sources and destinations each advance by one
  // constant pitch goes as one 2D copy (Plan::strided); strided_min_rows < 2 = never.
  std::size_t strided_min_rows = 0;
  std::size_t strided_min_bytes = 0;
  // Non-null: the blocks are pre-validated (see PlanTrust); lives for the planning call.
  const PlanTrust* trust = nullptr;
};

// One gather copy: `bytes` from host `src` to `slot_offset` in the chunk's staging slot; its
// final place on the device is `dst`.
struct GatherOp {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t slot_offset;
  std::uint64_t bytes;
};

struct PlannedChunk {
  std::uint32_t op_begin, op_end;        // range in Plan::ops
  std::uint32_t piece_begin, piece_end;  // range in Plan::pieces
  std::uint64_t data_bytes;              // payload bytes at the start of the slot
  // True when the ops' device-side addresses (destinations to the device, sources to the host)
  // are consecutive: one DMA between the slot and that range moves the chunk. Otherwise the
  // scatter entries (at scatter_offset) go along and a kernel moves each op between the device
  // staging area and its device address.
  bool contiguous_device;
  // The ops' host sides are pinned and lie in contiguous runs of at least direct_min() bytes
  // (but the first and last, which the chunk's edges may cut): the copy engine moves each run
  // straight between host memory and the chunk's device staging area (host_runs DMAs) and no
  // thread copies. Host to device the scatter kernel then places the ops; device to host the
  // pack kernel first gathers them. (Never with contiguous_device.)
  bool host_direct = false;
  std::uint32_t host_runs = 0;   // contiguous runs of the ops' host side
  std::uint64_t scatter_offset;  // 16-byte aligned, after the data
  std::uint64_t entry_bytes() const { return (op_end - op_begin) * sizeof(ScatterEntry); }
  std::uint64_t dma_bytes() const {
    return contiguous_device ? data_bytes
                             : scatter_offset + (op_end - op_begin) * sizeof(ScatterEntry);
  }
};

struct PlannedPiece {
  std::uint32_t op_begin, op_end;
};

// A block sent by the copy engine straight from pinned host memory (and, in pass-through plans,
// every block as the caller gave it).
struct DirectCopy {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t bytes;
};

// A constant-stride run moved by one 2D copy: row r of `width` bytes from src + r * spitch to
// dst + r * dpitch, for r < rows (both pitches at least `width`).
struct StridedCopy {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t width, spitch, dpitch, rows;
};

// A registered CacheSet's transfer of equal blocks that all go through staging, kept as its ids:
// its ops are not listed by the submitter but made where they are used (plan_from_ids, make_ops),
// by the gather threads piece by piece host to device, by the submitter chunk by chunk device to
// host (the pack kernel reads their entries first). Op k is row k % rows of pair k / rows, or
// with row_major row k / pairs of pair k % pairs, as CacheSetState::build lists them.
struct IdOps {
  struct Pair {
    const std::byte* from;  // the source side's array (host to device: the host cache)
    std::byte* to;
    std::uint64_t from_stride, to_stride;
  };
  std::vector<Pair> pairs;
  std::vector<std::uint64_t> ids;  // checked: [source id, destination id] per row
  std::size_t rows = 0;
  std::uint64_t block_bytes = 0;
  bool row_major = false;
};

struct Plan {
  // Working memory of make_plan, kept with the plan so that a recycled plan plans again
  // without allocating (fresh pages cost a fault each: tens of microseconds per transfer).
  struct Scratch {
    std::vector<std::uint8_t> pinned;
    std::vector<std::pair<std::uintptr_t, std::uint32_t>> order, tmp;
    std::vector<std::uint32_t> count;
    std::vector<std::uint64_t> slots;  // overlap check of equal blocks on one grid: a hash set
    std::vector<std::uint32_t> owner;
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // constant-stride runs, [begin, end)
    std::vector<std::uint8_t>
        run_ok;  // per run: within one allocation on each side (may be one 2D copy)
  };
  std::vector<GatherOp> ops;
  std::vector<PlannedChunk> chunks;
  std::vector<PlannedPiece> pieces;
  std::vector<DirectCopy> direct;
  std::vector<StridedCopy> strided;
  std::uint64_t total_bytes = 0;
  std::size_t block_count = 0;
  bool all_pinned_host = true;  // every block's host side lies in pinned host memory
  // Made from ids (plan_from_ids): `ops` is sized but each op holds nothing until make_ops
  // writes it; ops_made: every op written already (a one-chunk plan, made whole at once).
  bool from_ids = false;
  bool ops_made = false;
  IdOps id_ops;
  Scratch scratch;
  // Empty, for a transfer of `blocks` blocks (the lists keep their memory).
  void reset(std::size_t blocks) {
    ops.clear();
    chunks.clear();
    pieces.clear();
    direct.clear();
    strided.clear();
    total_bytes = 0;
    block_count = blocks;
    all_pinned_host = true;
    from_ids = false;
    ops_made = false;
  }
};

// The largest pitch a 2D copy takes (cudaMemcpy2DAsync's 2^31 - 1; beyond it a 2D copy moves a
// fraction of the line rate: bench/micro/copy2d_cost).
inline constexpr std::uint64_t kMax2dPitch = (std::uint64_t{1} << 31) - 1;

using PointerClassifier = std::function<PointerInfo(const void*)>;

// Host memory the driver does not know (pageable memory), remembered across transfers in 2 MiB
// regions. The driver reports no range for such memory, so without this a pool of pageable
// blocks costs one driver query per page every transfer touches (serialised inside the driver:
// most of a millisecond for 2048 scattered 4 KB blocks).
//
// Why a whole 2 MiB region may stand for one page: the driver places device and managed memory
// in address ranges it reserves in whole 2 MiB units, so a region holding a page of pageable
// host memory holds no device memory (tests/cuda_assumptions_test checks this on the GPU). Pinned
// memory may share such a region; taking it for pageable only sends it through staging, which is
// correct for either kind. Where pinned memory matters (a backend that needs it, a block large
// enough for the direct path) the planner asks the driver afresh. Entries expire after `ttl_ms`,
// which bounds how long memory registered (cudaHostRegister) after use is still staged.
// Thread-safe and lossy: a direct-mapped table of atomic words; a collision costs a query.
class PageableCache {
 public:
  static constexpr unsigned kGranuleShift = 21;  // 2 MiB
  static constexpr std::uintptr_t kGranule = std::uintptr_t{1} << kGranuleShift;
  explicit PageableCache(std::uint32_t ttl_ms = 100);
  // Milliseconds on the cache's clock; read once per plan.
  std::uint32_t now_ms() const;
  bool contains(std::uintptr_t address, std::uint32_t now_ms) const;
  void insert(std::uintptr_t address, std::uint32_t now_ms);
  void clear();

 private:
  static constexpr unsigned kStampBits = 24;  // 4.6 hours of milliseconds, compared modulo
  static constexpr unsigned kIndexBits = 14;
  static constexpr std::size_t kEntries = std::size_t{1} << kIndexBits;  // covers 32 GiB
  std::size_t index(std::uintptr_t granule) const;
  std::uint32_t ttl_ms_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> table_;
};

// Upper bounds on what the staged planner makes of `blocks` blocks of `bytes` bytes in all.
struct PlanBounds {
  std::uint64_t chunks = 0, pieces = 0, ops = 0;
};
PlanBounds plan_bounds(std::size_t blocks, std::uint64_t bytes, const PlanConfig& config);

// Plans a transfer a stretch of blocks at a time, so that the chunks planned first can move
// while the rest is validated and packed. advance(end) validates blocks up to `end` (throwing
// gfd::Error naming the first bad one) and packs them: plan.chunks then holds every chunk closed
// so far, final. check() validates every block and checks the destinations for overlaps (throws);
// after it the whole transfer is known to be valid, and advance() only packs. finish() does what
// is left and closes the last chunk. With `stable`, the plan's ops, pieces and chunks are reserved
// for the whole transfer up front (plan_bounds), so that closed chunks may be read by other
// threads while planning goes on; stable() says whether that was possible (not for absurd sizes).
class PlanBuilder {
 public:
  // `block_bytes`: the blocks' sizes summed (saturating at UINT64_MAX) where the caller has done
  // that already; the builder sums them otherwise.
  PlanBuilder(std::span<const BlockCopy> blocks, const PlanConfig& config,
              const PointerClassifier& classify, Plan& plan, PageableCache* pageable, bool stable,
              std::optional<std::uint64_t> block_bytes = std::nullopt);
  ~PlanBuilder();
  PlanBuilder(const PlanBuilder&) = delete;
  PlanBuilder& operator=(const PlanBuilder&) = delete;
  void advance(std::size_t end);
  void check();
  void finish();
  std::size_t size() const;       // blocks in the transfer
  std::size_t validated() const;  // blocks validated so far
  std::size_t packed() const;     // blocks packed so far
  bool stable() const { return stable_; }

 private:
  struct State;
  std::unique_ptr<State> s_;
  bool stable_ = false;
  bool checked_ = false;
};

// The blocks' sizes summed, saturating at UINT64_MAX (bad sizes are reported by validation).
std::uint64_t total_bytes(std::span<const BlockCopy> blocks);

// Whether `blocks` may be made of constant-stride runs only (a plan that stages nothing): its
// first two blocks and its last two are of one size and advance by one same pitch on each side,
// no smaller than a block, and `config` lets runs go as 2D copies. Looks at four blocks; a
// backend then plans such a list whole before it enqueues anything.
bool may_be_strided(std::span<const BlockCopy> blocks, const PlanConfig& config);

// A list that is one constant-stride run from its first block to its last (2048 x 4 KB at a pitch
// of 2 blocks, with the rules of find_runs, PlanConfig::strided_min_rows and strided_min_bytes)
// planned as that one 2D copy in a single pass: true, `plan` holds it. False where the list is not
// such a run (or spans several allocations on a side, or a host side not all pinned): plan it the
// usual way. Throws gfd::Error for a bad block as make_plan does. make_plan tries it first.
bool plan_one_run(std::span<const BlockCopy> blocks, const PlanConfig& config,
                  const PointerClassifier& classify, Plan& plan, PageableCache* pageable);

// Throws gfd::Error(kInvalidArgument) naming the first bad block; otherwise fills `plan`
// (whatever it held before is replaced; its memory is reused). `pageable`, when given, is
// consulted and updated (the engine keeps one across its transfers).
void make_plan(std::span<const BlockCopy> blocks, const PlanConfig& config,
               const PointerClassifier& classify, Plan& plan, PageableCache* pageable = nullptr,
               std::optional<std::uint64_t> bytes = std::nullopt);
inline Plan make_plan(std::span<const BlockCopy> blocks, const PlanConfig& config,
                      const PointerClassifier& classify, PageableCache* pageable = nullptr) {
  Plan plan;
  make_plan(blocks, config, classify, plan, pageable);
  return plan;
}

// Whether plan_from_ids can plan blocks of `block_bytes` under `config`: every chunk, the
// smallest included, holds at least one whole block with its scatter entry.
bool fits_from_ids(std::uint64_t block_bytes, const PlanConfig& config);

// Plans `plan.id_ops` (filled by the caller; rows * pairs blocks of block_bytes, every one
// staged) as make_plan would pack that list, without listing it: the chunks and pieces are cut
// by arithmetic, one op per block (no block split, none coalesced), none moved in place, and
// only a chunk of one block contiguous on the device side (its op is made here). plan.ops is
// sized for the ops make_ops writes later (those of every other chunk).
// Requires fits_from_ids.
void plan_from_ids(Plan& plan, const PlanConfig& config);

// Writes ops [begin, end) of a plan_from_ids plan; `chunk_begin` is the op_begin of their chunk
// (all of them in one chunk). The ops' storage is the plan's: each op is written by one thread
// before anyone reads it (the piece that gathers it, or the submitter before it publishes the
// chunk), so the plan is written through const here.
void make_ops(const Plan& plan, std::uint32_t begin, std::uint32_t end, std::uint32_t chunk_begin);
// Every op of a plan_from_ids plan, chunk by chunk (a small transfer, made whole on submission).
void make_all_ops(Plan& plan);
// Whether chunk `c`'s ops are still to be made (make_ops): a plan from ids, not made whole, and
// not a one-block chunk (plan_from_ids made that one).
inline bool ops_to_make(const Plan& plan, const PlannedChunk& c) {
  return plan.from_ids && !plan.ops_made && !c.contiguous_device;
}

// Checks the config itself (slot too small for the pieces, ...); throws gfd::Error.
void validate_plan_config(const PlanConfig& config);

// Human-readable kind ("pageable host memory", "device memory of GPU 1", ...).
std::string describe(const PointerInfo& info);

}  // namespace gfd::detail
