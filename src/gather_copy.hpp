// The gather threads' copy loop: scattered host blocks into a staging slot.
//
// Cold KV blocks lie scattered over a pool far larger than the caches and the hardware
// prefetcher does not cross pages, so the loads of the next blocks are started while the
// current one is copied. Staging is written with non-temporal stores where the CPU has them:
// the copy engine reads the slot from memory right after, so pulling its lines into the cache
// first (read-for-ownership) and having the DMA snoop them out again only costs bandwidth.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gfd::detail {

enum class StoreKind : std::uint8_t {
  kNormal,       // memcpy
  kNonTemporal,  // streaming stores (falls back to memcpy where unsupported or unaligned)
};

// How far ahead the copy loop starts loading: the first `bytes` of the op `ahead` places on.
// A cold 4 KB block costs a DRAM round trip per line unless its loads are started early; one
// core keeps only a few dozen lines in flight, so whole blocks a couple of ops ahead fill it.
struct Prefetch {
  std::size_t bytes = 4096;
  std::size_t ahead = 2;
  bool to_l1 = false;  // prefetcht0 instead of prefetcht1
};

// True when this CPU can stream-store (AVX2).
bool nontemporal_supported() noexcept;

// Copies `count` ops (any struct with src, slot_offset and bytes, such as the planner's
// GatherOp) into `base + slot_offset`, the sources of the next ops prefetched, and fences the
// streaming stores at the end. Inline so the copy loop has no indirect call per block.
template <class Op>
void gather_ops(const Op* ops, std::size_t count, std::byte* base, StoreKind kind,
                Prefetch pf = {}) noexcept;

// Copies one block (no prefetch, no fence): memcpy or streaming stores.
void copy_block(void* dst, const void* src, std::size_t bytes, StoreKind kind) noexcept;
// Orders the streaming stores before what follows (sfence on x86).
void store_fence() noexcept;
// Starts the loads of the first min(bytes, pf.bytes) bytes of `p`, into L2 by default (more
// lines can be in flight there than in L1).
inline void prefetch_block(const void* p, std::size_t bytes, const Prefetch& pf) noexcept {
  const auto* c = static_cast<const char*>(p);
  const std::size_t n = bytes < pf.bytes ? bytes : pf.bytes;
  if (pf.to_l1)
    for (std::size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 3);
  else
    for (std::size_t l = 0; l < n; l += 64) __builtin_prefetch(c + l, 0, 2);
}

template <class Op>
void gather_ops(const Op* ops, std::size_t count, std::byte* base, StoreKind kind,
                Prefetch pf) noexcept {
  if (pf.bytes != 0)
    for (std::size_t i = 0; i < count && i < pf.ahead; ++i)
      prefetch_block(ops[i].src, ops[i].bytes, pf);
  for (std::size_t i = 0; i < count; ++i) {
    if (pf.bytes != 0 && i + pf.ahead < count)
      prefetch_block(ops[i + pf.ahead].src, ops[i + pf.ahead].bytes, pf);
    copy_block(base + ops[i].slot_offset, ops[i].src, ops[i].bytes, kind);
  }
  if (kind == StoreKind::kNonTemporal) store_fence();
}

// The reverse, for device-to-host transfers: each op's bytes from `base + slot_offset` (a staging
// slot the DMA has just filled) to its host destination `dst`. The slot is read in order, which
// the hardware prefetcher follows; destinations are written with streaming stores by default,
// since a swapped-out KV block is not read again soon.
template <class Op>
void scatter_ops(const Op* ops, std::size_t count, const std::byte* base, StoreKind kind) noexcept {
  for (std::size_t i = 0; i < count; ++i) copy_block(ops[i].dst, base + ops[i].slot_offset, ops[i].bytes, kind);
  if (kind == StoreKind::kNonTemporal) store_fence();
}

}  // namespace gfd::detail
