// The paged KV-cache helper: the copy lists it builds, the input it rejects, and a whole swap out,
// overwrite, swap in through an engine with every byte checked (emulated device, and a GPU where
// present).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "test_support.hpp"

namespace gfd::test {
namespace {

PagedKvCache fake_cache(std::size_t layers, std::size_t blocks, std::size_t block_bytes) {
  PagedKvCache c;
  c.block_bytes = block_bytes;
  c.blocks = blocks;
  auto* base = reinterpret_cast<std::byte*>(std::uintptr_t{1} << 40);
  for (std::size_t l = 0; l < layers; ++l) {
    c.k.push_back(base + (2 * l) * blocks * block_bytes);
    c.v.push_back(base + (2 * l + 1) * blocks * block_bytes);
  }
  return c;
}

TEST(KvCopyListTest, EveryLayerKAndVOfEveryBlockInSlotOrder) {
  const PagedKvCache c = fake_cache(3, 100, 2048);
  std::vector<std::byte> host(10 * 6 * 2048);
  const HostKvPool pool{host.data(), 10};
  const std::uint32_t ids[] = {7, 42}, slots[] = {3, 0};
  const auto out = kv_copy_list(c, pool, ids, slots, KvDirection::kSwapOut);
  ASSERT_EQ(out.size(), 2u * 3 * 2);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t l = 0; l < 3; ++l) {
      const BlockCopy& k = out[i * 6 + 2 * l];
      const BlockCopy& v = out[i * 6 + 2 * l + 1];
      EXPECT_EQ(k.src, c.k[l] + ids[i] * 2048);
      EXPECT_EQ(v.src, c.v[l] + ids[i] * 2048);
      EXPECT_EQ(k.dst, host.data() + slots[i] * 6 * 2048 + 2 * l * 2048);
      EXPECT_EQ(v.dst, static_cast<std::byte*>(k.dst) + 2048);
      EXPECT_EQ(k.bytes, 2048u);
    }
  const auto in = kv_copy_list(c, pool, ids, slots, KvDirection::kSwapIn);
  ASSERT_EQ(in.size(), out.size());
  for (std::size_t j = 0; j < in.size(); ++j) {
    EXPECT_EQ(in[j].src, out[j].dst);
    EXPECT_EQ(in[j].dst, out[j].src);
  }
}

TEST(KvCopyListTest, BadInputNamesTheArgumentAndIndex) {
  const PagedKvCache c = fake_cache(2, 16, 1024);
  std::vector<std::byte> host(4 * 4 * 1024);
  const HostKvPool pool{host.data(), 4};
  struct Case {
    std::vector<std::uint32_t> ids, slots;
    KvDirection dir;
    std::string needle;
    std::size_t index;
  };
  const std::vector<Case> cases = {
      {{1, 2}, {0}, KvDirection::kSwapOut, "2 ids but 1 slots", kNoBlock},
      {{1, 16}, {0, 1}, KvDirection::kSwapOut, "block_ids[1]: block 16 is outside", 1},
      {{1, 2}, {0, 4}, KvDirection::kSwapOut, "host_slots[1]: slot 4 is outside", 1},
      {{1, 2, 3}, {0, 1, 0}, KvDirection::kSwapOut, "host_slots[2]: slot 0 is written twice", 2},
      {{5, 5}, {0, 1}, KvDirection::kSwapIn, "block_ids[1]: block 5 is written twice", 1},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.needle);
    try {
      (void)kv_copy_list(c, pool, k.ids, k.slots, k.dir);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(k.needle), std::string::npos) << e.what();
      EXPECT_EQ(e.block(), k.index);
    }
  }
  // The same block swapped out to two slots is fine; two blocks into one slot is not.
  const std::uint32_t ids[] = {3, 3}, slots[] = {0, 1};
  EXPECT_NO_THROW((void)kv_copy_list(c, pool, ids, slots, KvDirection::kSwapOut));
  PagedKvCache broken = c;
  broken.v.pop_back();
  EXPECT_THROW((void)kv_copy_list(broken, pool, ids, slots, KvDirection::kSwapOut), Error);
  broken = c;
  broken.block_bytes = 0;
  EXPECT_THROW((void)kv_copy_list(broken, pool, ids, slots, KvDirection::kSwapOut), Error);
}

class KvSwapTest : public ::testing::TestWithParam<DeviceKind> {};

// Swap part of a paged cache out, overwrite those device blocks, swap them back in: the whole
// cache holds its original bytes again.
TEST_P(KvSwapTest, SwapOutOverwriteSwapInRestoresEveryByte) {
  if (GetParam() == DeviceKind::kCuda) {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  auto td = open_test_device(GetParam());
  ASSERT_NE(td, nullptr);
  constexpr std::size_t kLayers = 4, kBlocks = 128, kBlockBytes = 8192, kSlots = 96;
  DeviceBuffer mem(*td->device, 2 * kLayers * kBlocks * kBlockBytes);
  HostBuffer init(*td->device, mem.size(), true);
  fill_random(init.data(), init.size(), 100);
  td->device->copy_h2d(mem.data(), init.data(), mem.size(), td->stream);
  PagedKvCache cache;
  cache.block_bytes = kBlockBytes;
  cache.blocks = kBlocks;
  for (std::size_t l = 0; l < kLayers; ++l) {
    cache.k.push_back(mem.data() + (2 * l) * kBlocks * kBlockBytes);
    cache.v.push_back(mem.data() + (2 * l + 1) * kBlocks * kBlockBytes);
  }
  HostBuffer host(*td->device, kSlots * 2 * kLayers * kBlockBytes, false);  // pageable pool
  const HostKvPool pool{host.data(), kSlots};
  std::mt19937_64 rng(101);
  std::vector<std::uint32_t> ids(kBlocks), slots(kSlots);
  std::iota(ids.begin(), ids.end(), 0);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::shuffle(slots.begin(), slots.end(), rng);
  ids.resize(80);
  slots.resize(80);
  Engine engine = td->make_engine(small_options());
  engine.copy_to_host(kv_copy_list(cache, pool, ids, slots, KvDirection::kSwapOut), td->cuda_stream()).wait();
  for (std::uint32_t id : ids)
    for (std::size_t l = 0; l < kLayers; ++l) {
      td->fill(cache.k[l] + id * kBlockBytes, 0x33, kBlockBytes);
      td->fill(cache.v[l] + id * kBlockBytes, 0x44, kBlockBytes);
    }
  engine.copy_to_device(kv_copy_list(cache, pool, ids, slots, KvDirection::kSwapIn), td->cuda_stream()).wait();
  const auto got = td->read(mem.data(), mem.size());
  EXPECT_EQ(std::memcmp(got.data(), init.data(), mem.size()), 0);
}

INSTANTIATE_TEST_SUITE_P(Devices, KvSwapTest, ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace gfd::test
