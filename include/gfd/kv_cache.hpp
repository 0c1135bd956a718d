// gfd — copy lists for a paged KV cache (swap out, swap in).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gfd/types.hpp"

namespace gfd {

/// A paged KV cache on one GPU, as vLLM and SGLang lay it out: for every layer, a K array and a
/// V array of `blocks` blocks of `block_bytes` each. `k[l]` and `v[l]` are the device addresses
/// of layer l's arrays (anywhere: one allocation or many).
struct PagedKvCache {
  std::size_t block_bytes = 0;
  std::size_t blocks = 0;
  std::vector<std::byte*> k, v;  ///< one entry per layer
  std::size_t layers() const { return k.size(); }
};

/// Where offloaded blocks live in host memory: `slots` slots, each holding one block's K and V
/// of every layer back to back (layer 0 K, layer 0 V, layer 1 K, ...): slot_bytes() each.
struct HostKvPool {
  std::byte* base = nullptr;
  std::size_t slots = 0;
  std::size_t slot_bytes(const PagedKvCache& cache) const { return 2 * cache.layers() * cache.block_bytes; }
};

enum class KvDirection {
  kSwapOut,  ///< device blocks to host slots (Engine::copy_to_host)
  kSwapIn,   ///< host slots to device blocks (Engine::copy_to_device)
};

/// The copy list that moves device block `block_ids[i]` to or from host slot `host_slots[i]`
/// for every i, every layer, K and V: 2 x layers x block_ids.size() copies of block_bytes,
/// ready for Engine::copy_to_host (kSwapOut) or Engine::copy_to_device (kSwapIn). Throws
/// gfd::Error (kInvalidArgument) naming the argument and index when the lists differ in length,
/// an id or slot is out of range, the cache or pool is malformed, or a slot (swap out) or block
/// (swap in) appears twice.
std::vector<BlockCopy> kv_copy_list(const PagedKvCache& cache, const HostKvPool& pool,
                                    std::span<const std::uint32_t> block_ids,
                                    std::span<const std::uint32_t> host_slots, KvDirection direction);

}  // namespace gfd
