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

}  // namespace

std::string name_at(std::string_view name, std::size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

std::string CacheSetState::label(std::size_t pair, bool host) const {
  if (!names.empty()) return names[2 * pair + (host ? 0 : 1)];
  return "pairs[" + std::to_string(pair) + (host ? "].host" : "].device");
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
