// CacheSet: caches checked once at registration; a transfer's ids checked and turned into its
// copy list in one pass, with no driver call per block or per array.
#include "planning/cache_set.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "gfd/error.hpp"

namespace gfd {

namespace {
const detail::CacheSetState& state_of(const std::shared_ptr<const detail::CacheSetState>& s) {
  if (!s)
    throw Error(ErrorCode::kInvalidArgument, "CacheSet: the set is empty (default-constructed)");
  return *s;
}
}  // namespace

std::size_t CacheSet::size() const { return state_ ? state_->pairs.size() : 0; }
const CachePair& CacheSet::pair(std::size_t i) const { return state_of(state_).pairs.at(i); }
bool CacheSet::host_pinned() const { return state_of(state_).all_pinned; }
bool CacheSet::host_pinned(std::size_t i) const { return state_of(state_).host_pinned.at(i) != 0; }
int CacheSet::device() const { return state_of(state_).device; }
std::size_t CacheSet::bytes_per_id() const { return state_of(state_).bytes_per_id; }
std::size_t CacheSet::host_blocks() const { return state_of(state_).host_blocks; }
std::size_t CacheSet::device_blocks() const { return state_of(state_).device_blocks; }

}  // namespace gfd

namespace gfd::detail {
namespace {

// Ids a thread keeps in its buffer after a rejected call (2 per row: 64 Ki rows, 1 MiB).
constexpr std::size_t kKeptIds = std::size_t{1} << 17;

[[noreturn]] void bad(const std::string& m, std::size_t block = kNoBlock) {
  throw Error(ErrorCode::kInvalidArgument, m, block);
}

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

std::string name_at(std::string_view name, std::size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

std::string CacheSetState::label(std::size_t pair, bool host) const {
  if (!names.empty()) return names[2 * pair + (host ? 0 : 1)];
  return "pairs[" + std::to_string(pair) + (host ? "].host" : "].device");
}

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

const CacheSetState& CacheSetState::of(const CacheSet& set, const void* owner,
                                       std::string_view name) {
  if (!set.state_) bad(std::string(name) + " is an empty CacheSet (default-constructed)");
  if (set.state_->owner != owner)
    bad(std::string(name) + " was registered with another engine (GPU " +
        std::to_string(set.state_->device) + "); register it with this one");
  return *set.state_;
}

namespace {
constexpr std::string_view kSrcName = "src_ids", kDstName = "dst_ids";

// The one wording of a bad id: "src_ids[5] (block 9 -> 2): source block 9 is out of range
// (pairs[0].host has 8 blocks)"; `limit` names what bounds the id.
[[noreturn]] void bad_id(std::string_view name, std::size_t i, std::int64_t s, std::int64_t t,
                         bool source, std::int64_t v, const std::string& limit,
                         std::size_t blocks) {
  bad(name_at(name, i) + " (block " + std::to_string(s) + " -> " + std::to_string(t) +
          "): " + (source ? "source" : "destination") + " block " + std::to_string(v) +
          (v < 0 ? std::string(" is negative")
                 : " is out of range (" + limit + " has " + std::to_string(blocks) + " blocks)"),
      i);
}
}  // namespace

void CacheSetState::check_sets(std::span<const CacheSet> caches, const void* owner, Direction d,
                               const BlockIds& src, const BlockIds& dst) {
  const bool to_device = d == Direction::kToDevice;
  // The set, and its pair, with the fewest blocks per side.
  struct Limit {
    std::size_t blocks = SIZE_MAX, set = 0, pair = 0;
  } src_limit, dst_limit;
  std::vector<const CacheSetState*> states;
  for (std::size_t k = 0; k < caches.size(); ++k) {
    const CacheSetState& s = of(caches[k], owner, name_at("caches", k));
    states.push_back(&s);
    const std::size_t from = to_device ? s.host_blocks : s.device_blocks;
    const std::size_t to = to_device ? s.device_blocks : s.host_blocks;
    if (from < src_limit.blocks)
      src_limit = {from, k, to_device ? s.host_blocks_pair : s.device_blocks_pair};
    if (to < dst_limit.blocks)
      dst_limit = {to, k, to_device ? s.device_blocks_pair : s.host_blocks_pair};
  }
  if (caches.empty()) return;
  // The counts as each set checks them, against the set with the fewest destination blocks.
  states[dst_limit.set]->check_counts(d, src, dst);
  auto label = [&](const Limit& l, bool host) {
    return name_at("caches", l.set) + "'s " + states[l.set]->label(l.pair, host);
  };
  for (std::size_t i = 0; i < src.count; ++i) {
    const std::int64_t s = src[i], t = dst[i];
    if (s < 0 || static_cast<std::uint64_t>(s) >= src_limit.blocks)
      bad_id(kSrcName, i, s, t, true, s, label(src_limit, to_device), src_limit.blocks);
    if (t < 0 || static_cast<std::uint64_t>(t) >= dst_limit.blocks)
      bad_id(kDstName, i, s, t, false, t, label(dst_limit, !to_device), dst_limit.blocks);
  }
}

void CacheSetState::check_counts(Direction d, const BlockIds& src, const BlockIds& dst) const {
  const bool to_device = d == Direction::kToDevice;
  for (const BlockIds* ids : {&src, &dst})
    if (ids->count != 0 && (ids->data == nullptr || (ids->width != 4 && ids->width != 8)))
      bad(std::string(ids == &src ? kSrcName : kDstName) + ": ids must be 4- or 8-byte integers");
  if (src.count != dst.count)
    bad(std::string(kSrcName) + " has " + std::to_string(src.count) + " ids, " +
        std::string(kDstName) + " " + std::to_string(dst.count));
  const std::size_t rows = src.count;
  if (rows > UINT32_MAX / 2 / pairs.size())
    bad(name_at(kSrcName, rows) + ": " + std::to_string(rows) + " ids of " +
        std::to_string(pairs.size()) + " cache pairs is more than one transfer takes");
  // Each destination block is written at most once per transfer, so more ids than destination
  // blocks cannot be valid whatever they are (no work or memory in proportion to them).
  const std::size_t dst_limit = to_device ? device_blocks : host_blocks;
  const std::size_t dst_pair = to_device ? device_blocks_pair : host_blocks_pair;
  if (rows > dst_limit)
    bad(std::string(kDstName) + ": " + std::to_string(rows) + " ids, but " +
        label(dst_pair, !to_device) + " has " + std::to_string(dst_limit) +
        " blocks (each is written at most once per transfer)");
}

const std::uint64_t* CacheSetState::check_ids(Direction d, const BlockIds& src,
                                              const BlockIds& dst) const {
  constexpr std::string_view src_name = kSrcName, dst_name = kDstName;
  const bool to_device = d == Direction::kToDevice;
  check_counts(d, src, dst);  // cheap first
  const std::size_t rows = src.count;
  const std::size_t src_limit = to_device ? host_blocks : device_blocks;
  const std::size_t dst_limit = to_device ? device_blocks : host_blocks;
  const std::size_t src_pair = to_device ? host_blocks_pair : device_blocks_pair;
  const std::size_t dst_pair = to_device ? device_blocks_pair : host_blocks_pair;

  // The ids, checked and read once (the copy loop below reads them once per pair). A bitmap of
  // the destination side finds an id given twice; the bits set are cleared again on the way out,
  // and a large id buffer is given back when the call is rejected (a thread keeps the buffer of
  // its largest accepted call, not of a rejected one).
  thread_local std::vector<std::uint64_t> ids;
  thread_local std::vector<std::uint64_t> seen;
  ids.resize(2 * rows);
  if (seen.size() < (dst_limit + 63) / 64) seen.resize((dst_limit + 63) / 64);
  std::size_t marked = 0;
  struct Clear {
    std::size_t& n;
    const int unwinding = std::uncaught_exceptions();
    ~Clear() {
      for (std::size_t i = 0; i < n; ++i) seen[ids[2 * i + 1] >> 6] = 0;
      if (std::uncaught_exceptions() > unwinding && ids.capacity() > kKeptIds)
        std::vector<std::uint64_t>().swap(ids);
    }
  } clear{marked};
  for (std::size_t i = 0; i < rows; ++i) {
    const std::int64_t s = src[i], t = dst[i];
    if (s < 0 || static_cast<std::uint64_t>(s) >= src_limit)
      bad_id(src_name, i, s, t, true, s, label(src_pair, to_device), src_limit);
    if (t < 0 || static_cast<std::uint64_t>(t) >= dst_limit)
      bad_id(dst_name, i, s, t, false, t, label(dst_pair, !to_device), dst_limit);
    const auto u = static_cast<std::uint64_t>(t);
    const std::uint64_t bit = std::uint64_t{1} << (u & 63);
    if ((seen[u >> 6] & bit) != 0) {
      std::size_t first = 0;
      while (ids[2 * first + 1] != u) ++first;
      bad(name_at(dst_name, i) + " (block " + std::to_string(s) + " -> " + std::to_string(t) +
              "): destination block " + std::to_string(t) + " is also that of " +
              name_at(dst_name, first) + " (each block is written once per transfer)",
          i);
    }
    seen[u >> 6] |= bit;
    ids[2 * i] = static_cast<std::uint64_t>(s);
    ids[2 * i + 1] = u;
    marked = i + 1;
  }
  return ids.data();
}

void CacheSetState::build(Direction d, const BlockIds& src, const BlockIds& dst,
                          std::vector<BlockCopy>& out, std::vector<std::uint8_t>& pinned) const {
  const bool to_device = d == Direction::kToDevice;
  const std::uint64_t* ids = check_ids(d, src, dst);
  const std::size_t rows = src.count;
  out.resize(pairs.size() * rows);
  pinned.resize(out.size());
  BlockCopy* o = out.data();
  if (row_major) {  // entry i * pairs + p: every pair's block of id i side by side
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t p = 0; p < pairs.size(); ++p) {
        const BlockArray& from = to_device ? pairs[p].host : pairs[p].device;
        const BlockArray& to = to_device ? pairs[p].device : pairs[p].host;
        *o++ = {static_cast<const std::byte*>(from.base) + ids[2 * i] * from.stride,
                static_cast<std::byte*>(to.base) + ids[2 * i + 1] * to.stride, from.block_bytes};
      }
    for (std::size_t k = 0; k < out.size(); ++k) pinned[k] = host_pinned[k % pairs.size()];
    return;
  }
  for (std::size_t p = 0; p < pairs.size(); ++p) {
    const BlockArray& from = to_device ? pairs[p].host : pairs[p].device;
    const BlockArray& to = to_device ? pairs[p].device : pairs[p].host;
    const auto* fb = static_cast<const std::byte*>(from.base);
    auto* tb = static_cast<std::byte*>(to.base);
    const std::size_t fs = from.stride, ts = to.stride, n = from.block_bytes;
    for (std::size_t i = 0; i < rows; ++i)
      *o++ = {fb + ids[2 * i] * fs, tb + ids[2 * i + 1] * ts, n};
    std::fill_n(pinned.data() + p * rows, rows, host_pinned[p]);
  }
}

bool CacheSetState::build_id_ops(Direction d, const BlockIds& src, const BlockIds& dst,
                                 IdOps& out) const {
  const bool to_device = d == Direction::kToDevice;
  const std::uint64_t* ids = check_ids(d, src, dst);
  const std::size_t rows = src.count;
  if (packed_pair && !row_major) {
    std::size_t adjacent = 0;
    for (std::size_t i = 1; i < rows; ++i)
      adjacent += ids[2 * i] == ids[2 * i - 2] + 1 && ids[2 * i + 1] == ids[2 * i - 1] + 1;
    if (4 * adjacent >= rows && rows > 1) return false;
  }
  out.rows = rows;
  out.block_bytes = block_bytes;
  out.row_major = row_major;
  out.ids.assign(ids, ids + 2 * rows);
  out.pairs.resize(pairs.size());
  for (std::size_t p = 0; p < pairs.size(); ++p) {
    const BlockArray& from = to_device ? pairs[p].host : pairs[p].device;
    const BlockArray& to = to_device ? pairs[p].device : pairs[p].host;
    out.pairs[p] = {static_cast<const std::byte*>(from.base), static_cast<std::byte*>(to.base),
                    from.stride, to.stride};
  }
  return true;
}

void CacheSetState::build_runs(Direction d, const BlockIds& src, const BlockIds& dst,
                               std::vector<StridedCopy>& out) const {
  const bool to_device = d == Direction::kToDevice;
  const std::uint64_t* ids = check_ids(d, src, dst);
  const BlockArray& from = to_device ? pairs[0].host : pairs[0].device;
  const BlockArray& to = to_device ? pairs[0].device : pairs[0].host;
  const std::uint64_t from_pitch = to_device ? id_runs.host_pitch : id_runs.device_pitch;
  const std::uint64_t to_pitch = to_device ? id_runs.device_pitch : id_runs.host_pitch;
  out.resize(src.count);
  for (std::size_t i = 0; i < src.count; ++i)
    out[i] = {static_cast<const std::byte*>(from.base) + ids[2 * i] * from.stride,
              static_cast<std::byte*>(to.base) + ids[2 * i + 1] * to.stride,
              from.block_bytes,
              from_pitch,
              to_pitch,
              pairs.size()};
}

}  // namespace gfd::detail
