// A registered CacheSet's description (checked once at registration) and the one loop that turns
// a transfer's block ids into its copy list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "device/device.hpp"
#include "gfd/cache_set.hpp"
#include "gfd/types.hpp"
#include "planning/planner.hpp"

namespace gfd::detail {

// An id argument's name at row i: "name[i]".
std::string name_at(std::string_view name, std::size_t i);

struct CacheSetState {
  // Checks `pairs` against `device` (pointer queries: a few per array, once) and describes them.
  // Throws gfd::Error(kInvalidArgument) naming the pair and side: "pairs[p].host", or
  // `names[2 * p]` (host) and `names[2 * p + 1]` (device) where given (a binding's names).
  static CacheSet make(std::span<const CachePair> pairs, Device& device, const void* owner,
                       std::vector<std::string> names = {});
  // The state behind `set` (throws gfd::Error for an empty set or one of another engine);
  // `name` names it in messages ("caches", "caches[3]").
  static const CacheSetState& of(const CacheSet& set, const void* owner,
                                 std::string_view name = "caches");
  // The ids of one transfer per set of `caches` (Engine::copy_blocks over sets), checked before
  // any is enqueued: every set this engine's, the same count, every id in range of every set
  // (the fewest blocks any set has, per side). Messages as check_ids', naming the set.
  static void check_sets(std::span<const CacheSet> caches, const void* owner, Direction d,
                         const BlockIds& src, const BlockIds& dst);

  // The copy list of one transfer: for every pair p and row i, block src[i] of p's source side
  // to block dst[i] of its destination side, at index p * rows + i (i * pairs + p where
  // row_major); `pinned` gets whether each
  // block's host side is pinned. Ids are checked first (same count, in range, no destination id
  // twice): a bad one throws gfd::Error whose block() is the row, naming the argument
  // ("src_ids[5]").
  void build(Direction d, const BlockIds& src, const BlockIds& dst, std::vector<BlockCopy>& out,
             std::vector<std::uint8_t>& pinned) const;
  // Where each id's blocks of every pair are one constant-stride run (id_runs): the transfer as
  // those runs, one per row (the same checks and errors as build), for a 2D copy each, without
  // listing every block.
  void build_runs(Direction d, const BlockIds& src, const BlockIds& dst,
                  std::vector<StridedCopy>& out) const;
  // The transfer as its checked ids (IdOps, for plan_from_ids, in build's order), with the same
  // checks and errors as build. False, with `out` unusable, where the ids would make blocks that
  // the planner coalesces (listed pair by pair, a pair packed at its block size on both sides,
  // and a quarter of the rows or more one id after the previous row's on both sides): build's
  // list moves those in fewer copies.
  bool build_id_ops(Direction d, const BlockIds& src, const BlockIds& dst, IdOps& out) const;
  // How messages name pair `pair`'s host or device array: "pairs[3].host", or its given name.
  std::string label(std::size_t pair, bool host) const;

  const void* owner = nullptr;  // the engine core the set was registered with
  int device = 0;
  std::vector<CachePair> pairs;           // strides resolved
  std::vector<std::uint8_t> host_pinned;  // per pair
  bool all_pinned = true;
  // The host arrays lie side by side (see make): build lists entry i * pairs + p, not
  // p * rows + i.
  bool row_major = false;
  // Of those, the host arrays side by side (pair p + 1's block right after pair p's): each id's
  // host blocks are one contiguous run, which host_direct chunks move in place.
  bool side_by_side = false;
  // Every device array in one allocation, and every host array in one pinned range (the
  // layers' caches of one allocation, as vLLM 0.33 makes them): runs across arrays may go as
  // 2D copies (PlanTrust::one_allocation).
  bool one_allocation = false;
  // Each id's blocks of every pair, in pair order, are one constant-stride run: row-major, one
  // allocation per side, pinned, one block size, each side's arrays at one pitch (positive, no
  // smaller than a block). `ok` false otherwise.
  struct IdRuns {
    bool ok = false;
    std::uint64_t host_pitch = 0, device_pitch = 0;
  } id_runs;
  std::size_t bytes_per_id = 0;
  std::size_t block_bytes = 0;  // every pair's, where all have one size; else 0
  // Some pair's arrays are packed (stride = block size) on both sides: ids one apart on both
  // sides make blocks adjacent on both, which the planner coalesces.
  bool packed_pair = false;
  std::size_t host_blocks = 0, device_blocks = 0;            // the fewest of any array
  std::size_t host_blocks_pair = 0, device_blocks_pair = 0;  // a pair that has that few
  std::vector<std::string> names;  // 2 per pair (host, device), or none: see make

 private:
  // The ids' widths and counts checked (equal, within what one transfer and the destination
  // side take): no work in proportion to the ids.
  void check_counts(Direction d, const BlockIds& src, const BlockIds& dst) const;
  // The ids checked (same count, in range, no destination id twice; a bad one throws naming its
  // row), as [src, dst] pairs per row in thread-local storage that lives until the next call.
  const std::uint64_t* check_ids(Direction d, const BlockIds& src, const BlockIds& dst) const;
};

}  // namespace gfd::detail
