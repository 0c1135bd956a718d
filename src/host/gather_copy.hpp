// The gather threads' copy loop: scattered host blocks into a staging slot.
//
// Cold KV blocks lie scattered over a pool far larger than the caches and the hardware
// prefetcher does not cross pages, so the loads of the next blocks are started while the
// current one is copied.
//
// How staging is written decides how often each byte crosses DRAM; the copy engine reads the
// slot right after it is filled:
//  - plain stores, then CLDEMOTE of every written line: the stores hit the cache (the ring is
//    far smaller than the L3, so a slot's lines are usually still there from its last use) and
//    the demote moves them from the core's private L1/L2 to the shared L3, where the copy
//    engine reads them: one DRAM crossing per byte (the source read).
//  - streaming (non-temporal) stores: no read-for-ownership, but every staged byte goes to
//    DRAM and the DMA reads it back from there: three crossings per byte.
//  - plain stores alone: the DMA finds the lines in a core's private cache and has to snoop
//    them out one by one, which is slow.
// Which is fastest depends on the pipeline around it (docs/performance.md, "Design decisions"):
// resolve_staging_writes says what kAuto picks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gfd/types.hpp"

namespace gfd::detail {

enum class StoreKind : std::uint8_t {
  kNormal,       // plain stores (memcpy)
  kNonTemporal,  // streaming stores (memcpy where the CPU lacks AVX2, and for unaligned ends)
  kCldemote,     // plain stores, then CLDEMOTE of each written line (a NOP where unsupported)
};

// What this CPU offers for writing staging.
struct CpuStoreFeatures {
  bool cldemote = false;   // CPUID.(EAX=7,ECX=0):ECX[25]
  bool streaming = false;  // AVX2 (32-byte streaming stores)
};
// Detected once, at the first call.
CpuStoreFeatures cpu_store_features() noexcept;

// The store kind the gather threads use for `requested` on a CPU with `cpu`. kAuto picks
// streaming stores, else plain stores: in the engine CLDEMOTE tied with streaming stores host
// to device and lost device to host, although a stand-alone pipeline gained from it. An
// explicit request the CPU cannot honour falls back (cldemote -> streaming -> plain; streaming
// -> plain): CLDEMOTE would execute as a NOP there (plain stores, the slowest kind), and
// streaming stores need AVX2. Plain is always honoured.
StoreKind resolve_staging_writes(StagingWrites requested, CpuStoreFeatures cpu) noexcept;
// The same, for this CPU.
inline StoreKind resolve_staging_writes(StagingWrites requested) noexcept {
  return resolve_staging_writes(requested, cpu_store_features());
}
// The public name of a store kind (never kAuto).
StagingWrites to_public(StoreKind kind) noexcept;

// How far ahead the copy loop starts loading: the first `bytes` of the next `ahead` ops, and of
// as many more as `window` asks for.
// A cold 4 KB block costs a DRAM round trip per line unless its loads are started early; one
// core keeps only a few dozen lines in flight, so whole blocks a couple of ops ahead fill it.
struct Prefetch {
  // Where the prefetched lines go: L2 (prefetcht1, the default: more lines can be in flight
  // there than in L1), L1 (prefetcht0), or L1 only, marked non-temporal (prefetchnta: on Intel
  // server cores such lines are not kept in L2 or L3 when they leave L1, so cold sources do not
  // push the staging ring out of the L3).
  enum class Level : std::uint8_t { kL2, kL1, kNonTemporal };
  std::size_t bytes = 4096;
  std::size_t ahead = 2;
  Level level = Level::kL2;
  // And further ops, until the ops started beyond the current one hold this many bytes: small
  // blocks get more of them in flight (1 KB blocks: 8 ahead).
  std::size_t window = 8192;
};

// True when this CPU can stream-store (AVX2). Same as cpu_store_features().streaming.
bool nontemporal_supported() noexcept;
// True when this CPU reports CLDEMOTE. Same as cpu_store_features().cldemote.
bool cldemote_supported() noexcept;

// Copies `count` ops (any struct with src, slot_offset and bytes, such as the planner's
// GatherOp) into `base + slot_offset`, the sources of the next ops prefetched; fences the
// streaming stores at the end. With kCldemote every line the ops wrote is demoted once (see
// copy_demote). Inline so the copy loop has no indirect call per block.
template <class Op>
void gather_ops(const Op* ops, std::size_t count, std::byte* base, StoreKind kind,
                Prefetch pf = {}) noexcept;

// Copies one block (no prefetch, no fence): memcpy, streaming stores, or memcpy and a demote
// of every line the block touched.
void copy_block(void* dst, const void* src, std::size_t bytes, StoreKind kind) noexcept;
// Orders the streaming stores before what follows (sfence on x86).
void store_fence() noexcept;

// Plain-store copy that demotes the lines it wrote, for a run of ops written in ascending
// address order. A line is demoted only once the copy has finished writing it: the last line,
// when the block ends inside it, is left in `pending` (its address; 0: none), because the next
// op usually continues it: demoting it now would have this core pull it straight back (the
// manual warns against touching a demoted line again right away), and demoting it twice costs
// an instruction for nothing. The next call demotes it with its own lines, or on its own when
// the next op starts elsewhere; demote_pending() demotes what is left at the end. Large blocks
// are copied and demoted 16 KB at a time so that the lines are still in L1/L2 when demoted.
void copy_demote(void* dst, const void* src, std::size_t bytes, std::uintptr_t& pending) noexcept;
// The demote half of copy_demote: `bytes` at `p` are done with (written, or read); demotes every
// line of them except a last one they end inside, which becomes `pending` (a pending line that
// this range neither covers nor ends in is demoted now).
void demote_done(const void* p, std::size_t bytes, std::uintptr_t& pending) noexcept;
// demote_done with the line demotes handed to `demote(begin, end)` ([begin, end) 64-byte
// aligned, never empty), for tests.
template <class Demote>
void demote_done_with(std::uintptr_t p, std::size_t bytes, std::uintptr_t& pending,
                      Demote&& demote) noexcept {
  constexpr std::uintptr_t kMask = 63;
  if (bytes == 0) return;
  const std::uintptr_t e = p + bytes;
  const std::uintptr_t lo = p & ~kMask;                   // first line touched
  const std::uintptr_t hi = e & ~kMask;                   // lines [lo, hi) are finished
  const std::uintptr_t next = (e & kMask) != 0 ? hi : 0;  // the line left open, if any
  // A line an earlier range left open that this one neither finishes nor keeps open: the ops
  // moved elsewhere, so nobody will finish it; demote it now.
  if (pending != 0 && (pending < lo || pending >= hi) && pending != next)
    demote(pending, pending + kMask + 1);
  if (lo < hi) demote(lo, hi);
  pending = next;
}
// Demotes the pending line, if any, and clears it.
void demote_pending(std::uintptr_t& pending) noexcept;
// CLDEMOTE of every line in [begin, end) (64-byte aligned); nothing where the CPU lacks it.
void demote_lines(std::uintptr_t begin, std::uintptr_t end) noexcept;

// Starts the loads of the first min(bytes, pf.bytes) bytes of `p`, at pf.level.
inline void prefetch_block(const void* p, std::size_t bytes, const Prefetch& pf) noexcept {
  const auto* c = static_cast<const char*>(p);
  const std::size_t n = bytes < pf.bytes ? bytes : pf.bytes;
  switch (pf.level) {
    case Prefetch::Level::kL2:
      for (std::size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 2);
      break;
    case Prefetch::Level::kL1:
      for (std::size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 3);
      break;
    case Prefetch::Level::kNonTemporal:
      for (std::size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 0);
      break;
  }
}

template <class Op>
void gather_ops(const Op* ops, std::size_t count, std::byte* base, StoreKind kind,
                Prefetch pf) noexcept {
  std::size_t next = 0;        // the first op not prefetched yet
  std::uint64_t beyond = 0;    // bytes of the prefetched ops after the current one
  std::uintptr_t pending = 0;  // kCldemote: a line the last op left partly written
  for (std::size_t i = 0; i < count; ++i) {
    if (pf.bytes != 0) {
      if (next <= i) {
        prefetch_block(ops[i].src, ops[i].bytes, pf);
        next = i + 1;
        beyond = 0;
      } else {
        beyond -= ops[i].bytes;
      }
      while (next < count && (next <= i + pf.ahead || beyond < pf.window)) {
        prefetch_block(ops[next].src, ops[next].bytes, pf);
        beyond += ops[next].bytes;
        ++next;
      }
    }
    if (kind == StoreKind::kCldemote)
      copy_demote(base + ops[i].slot_offset, ops[i].src, ops[i].bytes, pending);
    else
      copy_block(base + ops[i].slot_offset, ops[i].src, ops[i].bytes, kind);
  }
  // Streaming stores are weakly ordered: fence them before the caller publishes the slot.
  // Plain stores need no fence (x86 keeps stores in order; the caller's release does the
  // rest), and CLDEMOTE is only a hint with no effect on what other agents see.
  if (kind == StoreKind::kNonTemporal)
    store_fence();
  else if (kind == StoreKind::kCldemote)
    demote_pending(pending);
}

// The reverse, for device-to-host transfers: each op's bytes from `base + slot_offset` (a staging
// slot the DMA has just filled) to its host destination `dst`. The slot is read in order, which
// the hardware prefetcher follows. Per mode (the engine passes the same kind as for gathering):
//  - kNonTemporal: destinations written with streaming stores. A swapped-out KV block is not
//    read again soon, so there is nothing to gain from caching it, and streaming stores skip the
//    read-for-ownership of the destination: the block crosses DRAM once (the write), not twice.
//  - kCldemote: the destinations are written the same way, with streaming stores: demoting them
//    would only park them in the L3 (no device or core reads them next) and still pay the
//    read-for-ownership. What the demote can do here is on the slot side: the reads leave clean
//    copies of the slot's lines in this core's L1/L2, and the next DMA into this slot has to
//    invalidate each of them there (a snoop per line). Demoting the lines just read moves them
//    to the L3, where the next inbound DMA finds them without asking the core (and leaves the
//    core's L2 to the next piece). It costs one instruction per 64 bytes read. Comparing
//    GFD_STAGING_WRITES=cldemote with =streaming on device-to-host transfers measures exactly
//    this demote; both modes store to the destination the same way.
//  - kNormal: plain stores (a runtime that reads the blocks right back may prefer them cached).
template <class Op>
void scatter_ops(const Op* ops, std::size_t count, const std::byte* base, StoreKind kind) noexcept {
  if (kind == StoreKind::kCldemote) {
    std::uintptr_t pending = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const std::byte* src = base + ops[i].slot_offset;
      copy_block(ops[i].dst, src, ops[i].bytes, StoreKind::kNonTemporal);
      demote_done(src, ops[i].bytes, pending);
    }
    demote_pending(pending);
    store_fence();
    return;
  }
  for (std::size_t i = 0; i < count; ++i)
    copy_block(ops[i].dst, base + ops[i].slot_offset, ops[i].bytes, kind);
  if (kind == StoreKind::kNonTemporal) store_fence();
}

}  // namespace gfd::detail
