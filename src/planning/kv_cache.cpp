#include "gfd/kv_cache.hpp"

#include <string>
#include <vector>

#include "gfd/error.hpp"

namespace gfd {
namespace {

[[noreturn]] void bad(const std::string& msg, std::size_t index = kNoBlock) {
  throw Error(ErrorCode::kInvalidArgument, msg, index);
}

}  // namespace

std::vector<BlockCopy> kv_copy_list(const PagedKvCache& cache, const HostKvPool& pool,
                                    std::span<const std::uint32_t> block_ids,
                                    std::span<const std::uint32_t> host_slots, KvDirection direction) {
  if (cache.block_bytes == 0) bad("cache.block_bytes: is zero");
  if (cache.layers() == 0) bad("cache: has no layers");
  if (cache.v.size() != cache.k.size())
    bad("cache: " + std::to_string(cache.k.size()) + " K arrays but " + std::to_string(cache.v.size()) +
        " V arrays");
  for (std::size_t l = 0; l < cache.layers(); ++l)
    if (cache.k[l] == nullptr || cache.v[l] == nullptr)
      bad("cache: layer " + std::to_string(l) + " has a null K or V array");
  if (pool.base == nullptr) bad("pool.base: is null");
  if (block_ids.size() != host_slots.size())
    bad("block_ids and host_slots: " + std::to_string(block_ids.size()) + " ids but " +
        std::to_string(host_slots.size()) + " slots");
  // The side written to must not receive two blocks in one transfer.
  std::vector<std::uint8_t> seen(direction == KvDirection::kSwapOut ? pool.slots : cache.blocks);
  for (std::size_t i = 0; i < block_ids.size(); ++i) {
    if (block_ids[i] >= cache.blocks)
      bad("block_ids[" + std::to_string(i) + "]: block " + std::to_string(block_ids[i]) +
              " is outside the cache's " + std::to_string(cache.blocks) + " blocks",
          i);
    if (host_slots[i] >= pool.slots)
      bad("host_slots[" + std::to_string(i) + "]: slot " + std::to_string(host_slots[i]) +
              " is outside the pool's " + std::to_string(pool.slots) + " slots",
          i);
    const std::uint32_t written = direction == KvDirection::kSwapOut ? host_slots[i] : block_ids[i];
    if (seen[written]++ != 0)
      bad(std::string(direction == KvDirection::kSwapOut ? "host_slots[" : "block_ids[") + std::to_string(i) +
              "]: " + (direction == KvDirection::kSwapOut ? "slot " : "block ") + std::to_string(written) +
              " is written twice",
          i);
  }
  const std::size_t b = cache.block_bytes;
  const std::size_t slot_bytes = pool.slot_bytes(cache);
  std::vector<BlockCopy> out;
  out.reserve(2 * cache.layers() * block_ids.size());
  // Block by block, each slot in order: the host side of one block is one contiguous run, so the
  // engine coalesces it when the device side is contiguous too.
  for (std::size_t i = 0; i < block_ids.size(); ++i) {
    std::byte* slot = pool.base + host_slots[i] * slot_bytes;
    for (std::size_t l = 0; l < cache.layers(); ++l) {
      std::byte* dk = cache.k[l] + block_ids[i] * b;
      std::byte* dv = cache.v[l] + block_ids[i] * b;
      std::byte* hk = slot + 2 * l * b;
      std::byte* hv = hk + b;
      if (direction == KvDirection::kSwapOut) {
        out.push_back({dk, hk, b});
        out.push_back({dv, hv, b});
      } else {
        out.push_back({hk, dk, b});
        out.push_back({hv, dv, b});
      }
    }
  }
  return out;
}

}  // namespace gfd
