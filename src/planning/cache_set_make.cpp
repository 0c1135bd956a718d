// CacheSetState::make: every array of a CacheSet checked once at registration (device memory of
// this GPU, host memory pinned or not, one block size per pair, no overlaps) and the set's layout
// found (row-major, side by side, one constant-stride run per id).
#include <algorithm>
#include <string>

#include "gfd/error.hpp"
#include "planning/cache_set.hpp"

namespace gfd::detail {
namespace {

[[noreturn]] void bad(const std::string& m) { throw Error(ErrorCode::kInvalidArgument, m); }

// One array's address range and block grid, for the overlap check.
struct Extent {
  std::uintptr_t begin, end;
  std::size_t stride, block_bytes;
  std::size_t index;  // 2 * pair + (0 host, 1 device)
};

// Whether any block of `a` shares a byte with a block of `b` (their ranges do overlap). Arrays
// on one stride whose blocks interleave without touching (every layer's K of a page-first host
// pool, say) do not overlap; arrays on different strides are taken to overlap (conservative).
bool blocks_overlap(const Extent& a, const Extent& b) {
  if (a.stride != b.stride) return true;
  const std::size_t s = a.stride;
  const std::size_t d = static_cast<std::size_t>((b.begin - a.begin) % s);  // b.begin >= a.begin
  return !(d >= a.block_bytes && d + b.block_bytes <= s);
}

}  // namespace

namespace {

constexpr const char* kRegister = "register_caches";

// Side `side` (0 host, 1 device) of pair `p`: its fields checked (stride 0 resolved), its memory
// asked of the device; records whether the host side is pinned and whether the set still lies
// in one allocation per side (`alloc`: that allocation's start). Returns its extent.
Extent check_array(CacheSetState& st, std::size_t p, int side, Device& device,
                   std::uintptr_t (&alloc)[2]) {
  BlockArray& a = side == 0 ? st.pairs[p].host : st.pairs[p].device;
  const std::string name = std::string(kRegister) + ": " + st.label(p, side == 0);
  if (a.base == nullptr) bad(name + ": base is null");
  if (a.blocks == 0) bad(name + ": has no blocks");
  if (a.block_bytes == 0) bad(name + ": block_bytes is 0");
  if (a.stride == 0) a.stride = a.block_bytes;
  if (a.stride < a.block_bytes)
    bad(name + ": stride " + std::to_string(a.stride) + " is less than block_bytes " +
        std::to_string(a.block_bytes) + " (blocks would overlap)");
  const auto begin = reinterpret_cast<std::uintptr_t>(a.base);
  if ((a.blocks - 1) > (UINTPTR_MAX - begin - a.block_bytes) / a.stride)
    bad(name + ": " + std::to_string(a.blocks) + " blocks at stride " + std::to_string(a.stride) +
        " run past the end of the address space");
  const std::uintptr_t end = begin + (a.blocks - 1) * a.stride + a.block_bytes;
  const PointerInfo info = device.query_pointer(a.base);
  const bool known = info.end != 0 && begin >= info.begin && end <= info.end &&
                     (side == 1 || info.kind == PointerKind::kPinnedHost);
  if (!known || (p > 0 && alloc[side] != info.begin)) st.one_allocation = false;
  alloc[side] = info.begin;
  const bool within = info.end == 0 || (begin >= info.begin && end <= info.end);
  if (side == 1) {
    if (info.kind == PointerKind::kOtherDevice)
      bad(name + " is device memory of GPU " + std::to_string(info.device) +
          ", but the engine serves GPU " + std::to_string(st.device));
    if (info.kind != PointerKind::kDevice)
      bad(name + " is " + describe(info) + ", not device memory of GPU " +
          std::to_string(st.device));
    if (!within)
      bad(name + ": its " + std::to_string(a.blocks) + " blocks (" + std::to_string(end - begin) +
          " bytes) run past the end of their device allocation");
  } else {
    if (info.kind == PointerKind::kDevice || info.kind == PointerKind::kOtherDevice ||
        info.kind == PointerKind::kManaged)
      bad(name + " is " + describe(info) + ", not host memory");
    // Pinned only when the whole array lies in one pinned allocation; otherwise it is staged
    // like pageable memory, which is correct for either.
    st.host_pinned[p] = info.kind == PointerKind::kPinnedHost && within && info.end != 0;
  }
  return {begin, end, a.stride, a.block_bytes, 2 * p + static_cast<std::size_t>(side)};
}

// What pair `p` adds to the set's summary: sizes, pinning, the fewest blocks of each side.
void add_pair(CacheSetState& st, std::size_t p) {
  const CachePair& q = st.pairs[p];
  if (q.host.block_bytes != q.device.block_bytes)
    bad(std::string(kRegister) + ": " + st.label(p, true) + " has blocks of " +
        std::to_string(q.host.block_bytes) + " bytes, " + st.label(p, false) + " of " +
        std::to_string(q.device.block_bytes));
  st.all_pinned = st.all_pinned && st.host_pinned[p] != 0;
  if (p == 0)
    st.block_bytes = q.host.block_bytes;
  else if (st.block_bytes != q.host.block_bytes)
    st.block_bytes = 0;
  st.packed_pair = st.packed_pair ||
                   (q.host.stride == q.host.block_bytes && q.device.stride == q.device.block_bytes);
  st.bytes_per_id += q.host.block_bytes;
  if (q.host.blocks < st.host_blocks) {
    st.host_blocks = q.host.blocks;
    st.host_blocks_pair = p;
  }
  if (q.device.blocks < st.device_blocks) {
    st.device_blocks = q.device.blocks;
    st.device_blocks_pair = p;
  }
}

// The pitch between one side's arrays where it is one (no smaller than a block), else 0.
std::uintptr_t pitch_of(const CacheSetState& st, bool host) {
  const auto side = [&](std::size_t p) -> const BlockArray& {
    return host ? st.pairs[p].host : st.pairs[p].device;
  };
  const auto addr = [](const BlockArray& a) { return reinterpret_cast<std::uintptr_t>(a.base); };
  const std::size_t block = st.pairs[0].host.block_bytes;
  if (st.pairs.size() < 2 || addr(side(1)) < addr(side(0)) + block) return 0;
  const std::uintptr_t pitch = addr(side(1)) - addr(side(0));
  for (std::size_t p = 1; p < st.pairs.size(); ++p) {
    const BlockArray &a = side(p - 1), &b = side(p);
    if (a.stride != b.stride || a.block_bytes != b.block_bytes || addr(b) < addr(a) ||
        addr(b) - addr(a) != pitch)
      return 0;
  }
  return pitch;
}

// A transfer lists each id's blocks of every pair together (row-major) where that makes them
// runs: host arrays side by side (pair p + 1's block right after pair p's, one stride for all:
// a host cache laid out block-major), so that one id's host side is one contiguous run the copy
// engine can take in place; or the arrays of both sides each at one constant pitch (the layers'
// caches of one allocation, as vLLM 0.33 allocates them, with a host cache laid out either way),
// so that one id's blocks are a constant-stride run: one 2D copy.
void find_layout(CacheSetState& st) {
  bool side_by_side = st.pairs.size() > 1;
  for (std::size_t p = 1; p < st.pairs.size() && side_by_side; ++p) {
    const BlockArray &a = st.pairs[p - 1].host, &b = st.pairs[p].host;
    side_by_side =
        a.stride == b.stride && static_cast<const std::byte*>(a.base) + a.block_bytes == b.base;
  }
  const std::uintptr_t host_pitch = pitch_of(st, true),
                       device_pitch = host_pitch != 0 ? pitch_of(st, false) : 0;
  const bool both_at_one_pitch = host_pitch != 0 && device_pitch != 0;
  st.row_major = side_by_side || both_at_one_pitch;
  st.side_by_side = side_by_side;
  if (both_at_one_pitch && st.one_allocation && st.all_pinned)
    st.id_runs = {true, host_pitch, device_pitch};
}

// No two arrays may share a byte: a transfer writes each destination block once, and a block of
// one array that is also a block of another would be written twice (or read while written).
void check_no_overlap(const CacheSetState& st, std::vector<Extent>& extents) {
  std::sort(extents.begin(), extents.end(),
            [](const Extent& a, const Extent& b) { return a.begin < b.begin; });
  const auto name = [&](const Extent& e) { return st.label(e.index / 2, e.index % 2 == 0); };
  for (std::size_t i = 0; i < extents.size(); ++i)
    for (std::size_t j = i + 1; j < extents.size() && extents[j].begin < extents[i].end; ++j)
      if (blocks_overlap(extents[i], extents[j]))
        bad(std::string(kRegister) + ": " + name(extents[j]) + " overlaps " + name(extents[i]));
}

}  // namespace

CacheSet CacheSetState::make(std::span<const CachePair> pairs, Device& device, const void* owner,
                             std::vector<std::string> names) {
  auto st = std::make_shared<CacheSetState>();
  st->owner = owner;
  st->device = device.ordinal();
  if (pairs.empty()) bad(std::string(kRegister) + ": pairs is empty");
  if (!names.empty() && names.size() != 2 * pairs.size())
    bad(std::string(kRegister) + ": " + std::to_string(names.size()) + " names for " +
        std::to_string(pairs.size()) + " pairs (one for each host and each device array)");
  st->names = std::move(names);
  st->pairs.assign(pairs.begin(), pairs.end());
  st->host_pinned.assign(pairs.size(), 0);
  st->host_blocks = st->device_blocks = SIZE_MAX;
  std::vector<Extent> extents;
  extents.reserve(2 * pairs.size());
  // The allocation each side's arrays lie in (its start; 0: unknown extent), while all agree.
  std::uintptr_t alloc[2] = {0, 0};
  st->one_allocation = true;
  for (std::size_t p = 0; p < pairs.size(); ++p) {
    for (int side = 0; side < 2; ++side)
      extents.push_back(check_array(*st, p, side, device, alloc));
    add_pair(*st, p);
  }
  find_layout(*st);
  check_no_overlap(*st, extents);
  return CacheSet(std::move(st));
}

}  // namespace gfd::detail
