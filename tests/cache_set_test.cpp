// CacheSet: caches registered once, transfers by block ids. Round trips through every backend
// with every byte checked, the page-first host layout (arrays interleaved on one stride), and
// the input it rejects, naming the argument and row, with nothing moved (emulated device, and a
// GPU where present).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>

#include "test_support.hpp"

namespace gfd::test {
namespace {

// Fills `init` with random bytes from `seed` and device memory at `dev` with the same.
void fill_device_random(TestDevice& td, std::byte* dev, HostBuffer& init, std::uint64_t seed) {
  fill_random(init.data(), init.size(), seed);
  td.device->copy_h2d(dev, init.data(), init.size(), td.stream);
  td.device->stream_sync(td.stream);
}

// `pairs` device arrays of `blocks` blocks (separate allocations, as a runtime's per-layer
// tensors) and host arrays of `host_blocks` blocks, either one allocation each or, with
// `page_first`, interleaved in one allocation (block b of pair p at (b * pairs + p) * bytes).
struct Caches {
  Caches(TestDevice& td, std::size_t pairs, std::size_t blocks, std::size_t host_blocks,
         std::size_t bytes, bool pinned, bool page_first)
      : td(td),
        bytes(bytes),
        host_blocks(host_blocks),
        blocks(blocks),
        page_first(page_first),
        host(*td.device, pairs * host_blocks * bytes, pinned) {
    fill_random(host.data(), host.size(), 7);
    for (std::size_t p = 0; p < pairs; ++p) {
      dev.push_back(std::make_unique<DeviceBuffer>(*td.device, blocks * bytes));
      HostBuffer init(*td.device, blocks * bytes, true);
      fill_device_random(td, dev.back()->data(), init, 100 + p);
      CachePair q;
      q.device = {dev.back()->data(), blocks, bytes, 0};
      q.host = page_first
                   ? BlockArray{host.data() + p * bytes, host_blocks, bytes, pairs * bytes}
                   : BlockArray{host.data() + p * host_blocks * bytes, host_blocks, bytes, 0};
      list.push_back(q);
    }
  }
  std::byte* host_block(std::size_t p, std::size_t b) const {
    const std::size_t stride = list[p].host.stride != 0 ? list[p].host.stride : bytes;
    return static_cast<std::byte*>(list[p].host.base) + b * stride;
  }
  std::vector<std::byte> device_block(std::size_t p, std::size_t b) {
    return td.read(dev[p]->data() + b * bytes, bytes);
  }
  TestDevice& td;
  std::size_t bytes, host_blocks, blocks;
  bool page_first;
  HostBuffer host;
  std::vector<std::unique_ptr<DeviceBuffer>> dev;
  std::vector<CachePair> list;
};

std::vector<std::int64_t> distinct(std::size_t n, std::size_t range, std::uint64_t seed) {
  std::vector<std::int64_t> v(range);
  std::iota(v.begin(), v.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(n);
  return v;
}

struct RoundTrip {
  Backend backend;
  std::size_t bytes;
  bool page_first;
};

class CacheSetRoundTrip : public ::testing::TestWithParam<std::tuple<DeviceKind, RoundTrip>> {};

// Swap-out of random device blocks to random host blocks, then swap-in of other host blocks to
// other device blocks: every block of every pair checked against the bytes it came from.
TEST_P(CacheSetRoundTrip, EveryBlockOfEveryPair) {
  const auto [kind, rt] = GetParam();
  if (kind == DeviceKind::kCuda) {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  auto td = open_test_device(kind);
  ASSERT_NE(td, nullptr);
  if (rt.backend == Backend::kZeroCopyKernel && !td->device->host_pointers_usable())
    GTEST_SKIP() << "the zero-copy kernel needs unified addressing";
  constexpr std::size_t kPairs = 6, kBlocks = 96, kHostBlocks = 160, kMoved = 40;
  Caches c(*td, kPairs, kBlocks, kHostBlocks, rt.bytes, true, rt.page_first);
  EngineOptions o = small_options();
  o.backend = rt.backend;
  o.direct_min_bytes = o.direct_min_bytes_to_host = 64 << 10;  // 128 KB blocks go direct both ways
  Engine engine = td->make_engine(o);
  const CacheSet set = engine.register_caches(c.list);
  ASSERT_EQ(set.size(), kPairs);
  EXPECT_TRUE(set.host_pinned());
  EXPECT_EQ(set.bytes_per_id(), kPairs * rt.bytes);
  EXPECT_EQ(set.host_blocks(), kHostBlocks);
  EXPECT_EQ(set.device_blocks(), kBlocks);

  const auto out_src = distinct(kMoved, kBlocks, 1), out_dst = distinct(kMoved, kHostBlocks, 2);
  std::vector<std::vector<std::byte>> expect;
  for (std::size_t p = 0; p < kPairs; ++p)
    for (std::size_t i = 0; i < kMoved; ++i) expect.push_back(c.device_block(p, out_src[i]));
  engine.copy_blocks(set, Direction::kToHost, out_src, out_dst, td->cuda_stream()).wait();
  // Host rows side by side (page-first) at least direct_min_bytes long move in place, both ways.
  const bool in_place =
      rt.backend == Backend::kGather && rt.page_first && kPairs * rt.bytes >= o.direct_min_bytes;
  const std::uint64_t out_in_place = tuning_stats(engine).host_direct_chunks;
  EXPECT_EQ(out_in_place > 0, in_place);
  for (std::size_t p = 0; p < kPairs; ++p)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(std::memcmp(c.host_block(p, out_dst[i]), expect[p * kMoved + i].data(), rt.bytes),
                0)
          << "swap-out pair " << p << " row " << i;

  // In, as int32 ids (SGLang passes them so), from other host blocks to other device blocks.
  const auto in_src64 = distinct(kMoved, kHostBlocks, 3), in_dst64 = distinct(kMoved, kBlocks, 4);
  const std::vector<std::int32_t> in_src(in_src64.begin(), in_src64.end()),
      in_dst(in_dst64.begin(), in_dst64.end());
  engine.copy_blocks(set, Direction::kToDevice, in_src, in_dst, td->cuda_stream()).wait();
  td->device->stream_sync(td->stream);
  EXPECT_EQ(tuning_stats(engine).host_direct_chunks > out_in_place, in_place);
  // Equal blocks below the direct path's size in arrays not side by side: planned from the ids
  // (plan_from_ids), both ways.
  const bool from_ids =
      rt.backend == Backend::kGather && !rt.page_first && rt.bytes < o.direct_min_bytes;
  EXPECT_EQ(tuning_stats(engine).id_planned_transfers, from_ids ? 2u : 0u);
  for (std::size_t p = 0; p < kPairs; ++p)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(
          std::memcmp(c.device_block(p, in_dst[i]).data(), c.host_block(p, in_src[i]), rt.bytes), 0)
          << "swap-in pair " << p << " row " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Devices, CacheSetRoundTrip,
    ::testing::Combine(
        ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
        ::testing::Values(
            RoundTrip{Backend::kGather, 4096, false}, RoundTrip{Backend::kGather, 4096, true},
            // page-first rows of 6 x 16 KB: read in place (host_direct)
            RoundTrip{Backend::kGather, 16384, true}, RoundTrip{Backend::kGather, 32768, false},
            RoundTrip{Backend::kGather, 131072, false},  // the direct path
            RoundTrip{Backend::kBatchAsync, 4096, false}, RoundTrip{Backend::kPerBlock, 8192, true},
            RoundTrip{Backend::kZeroCopyKernel, 4096, false})),
    [](const auto& info) {
      const RoundTrip& rt = std::get<1>(info.param);
      return to_string(std::get<0>(info.param)) + "_" + to_string(rt.backend) + "_" +
             std::to_string(rt.bytes) + (rt.page_first ? "_page_first" : "");
    });

class CacheSetTest : public DeviceParamTest {};

// The message of the gfd::Error that `f` throws (kInvalidArgument), and its block().
template <class F>
std::pair<std::string, std::size_t> rejection(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return {e.what(), e.block()};
  }
  ADD_FAILURE() << "no gfd::Error thrown";
  return {"", kNoBlock};
}

TEST_P(CacheSetTest, BadIdsNameTheArgumentAndRowAndMoveNothing) {
  Caches c(*td_, 2, 16, 8, 4096, true, false);
  Engine engine = td_->make_engine(small_options());
  const CacheSet set = engine.register_caches(c.list);
  const auto before = c.device_block(1, 3);
  auto in = [&](std::vector<std::int64_t> s, std::vector<std::int64_t> d) {
    return rejection(
        [&] { (void)engine.copy_blocks(set, Direction::kToDevice, s, d, td_->cuda_stream()); });
  };
  auto [m1, b1] = in({0, 8}, {3, 4});
  EXPECT_NE(
      m1.find(
          "src_ids[1] (block 8 -> 4): source block 8 is out of range (pairs[0].host has 8 blocks)"),
      std::string::npos)
      << m1;
  EXPECT_EQ(b1, 1u);
  auto [m2, b2] = in({0, 1, 2}, {3, 4, 16});
  EXPECT_NE(m2.find("dst_ids[2] (block 2 -> 16): destination block 16 is out of range "
                    "(pairs[0].device has 16 blocks)"),
            std::string::npos)
      << m2;
  EXPECT_EQ(b2, 2u);
  auto [m3, b3] = in({0, 1, 2}, {3, 5, 3});
  EXPECT_NE(m3.find("dst_ids[2] (block 2 -> 3): destination block 3 is also that of dst_ids[0]"),
            std::string::npos)
      << m3;
  EXPECT_EQ(b3, 2u);
  auto [m4, b4] = in({-1}, {3});
  EXPECT_NE(m4.find("source block -1 is negative"), std::string::npos) << m4;
  auto [m5, b5] = in({0, 1}, {3});
  EXPECT_NE(m5.find("src_ids has 2 ids, dst_ids 1"), std::string::npos) << m5;
  // Duplicate sources are fine (read twice); a swap-out's destination is the host side.
  engine
      .copy_blocks(set, Direction::kToDevice, std::vector<std::int64_t>{2, 2},
                   std::vector<std::int64_t>{5, 6}, td_->cuda_stream())
      .wait();
  auto [m6, b6] = rejection([&] {
    (void)engine.copy_blocks(set, Direction::kToHost, std::vector<std::int64_t>{9, 1},
                             std::vector<std::int64_t>{7, 7}, td_->cuda_stream());
  });
  EXPECT_NE(m6.find("dst_ids[1] (block 1 -> 7): destination block 7 is also that of dst_ids[0]"),
            std::string::npos)
      << m6;
  // More ids than destination blocks: rejected before any id is read (block() names no row).
  std::vector<std::int64_t> many(100000, 0);
  auto [m7, b7] = rejection(
      [&] { (void)engine.copy_blocks(set, Direction::kToHost, many, many, td_->cuda_stream()); });
  EXPECT_NE(m7.find("dst_ids: 100000 ids, but pairs[0].host has 8 blocks"), std::string::npos)
      << m7;
  EXPECT_EQ(b7, kNoBlock);
  EXPECT_EQ(c.device_block(1, 3), before) << "a rejected transfer moved bytes";
  // The bitmap of destinations is clean again after a rejection: the same ids once each pass.
  engine
      .copy_blocks(set, Direction::kToDevice, std::vector<std::int64_t>{0, 1, 2},
                   std::vector<std::int64_t>{3, 5, 7}, td_->cuda_stream())
      .wait();
  EXPECT_EQ(std::memcmp(c.device_block(1, 3).data(), c.host_block(1, 0), 4096), 0);
}

TEST_P(CacheSetTest, BadCachesNameThePairAndSide) {
  Caches c(*td_, 2, 16, 8, 4096, true, false);
  Engine engine = td_->make_engine(small_options());
  auto reg = [&](std::vector<CachePair> l) {
    return rejection([&] { (void)engine.register_caches(l); }).first;
  };
  EXPECT_NE(reg({}).find("pairs is empty"), std::string::npos);
  {
    auto l = c.list;
    l[1].device.block_bytes = 2048;
    EXPECT_NE(reg(l).find("pairs[1].host has blocks of 4096 bytes, pairs[1].device of 2048"),
              std::string::npos);
  }
  {
    auto l = c.list;
    l[1].device = l[0].device;  // two pairs on one device array
    EXPECT_NE(reg(l).find("overlaps"), std::string::npos);
  }
  {
    auto l = c.list;
    l[0].device.blocks = 17;  // one block past the allocation
    EXPECT_NE(reg(l).find("pairs[0].device: its 17 blocks (69632 bytes) run past the end of their "
                          "device allocation"),
              std::string::npos)
        << reg(l);
  }
  {
    auto l = c.list;
    std::swap(l[0].host, l[0].device);
    EXPECT_NE(reg(l).find("pairs[0].host is device memory of GPU 0, not host memory"),
              std::string::npos)
        << reg(l);
  }
  {
    auto l = c.list;
    l[0].host.stride = 1024;
    EXPECT_NE(reg(l).find("pairs[0].host: stride 1024 is less than block_bytes 4096"),
              std::string::npos);
  }
  {
    auto l = c.list;
    l[1].host.base = nullptr;
    EXPECT_NE(reg(l).find("pairs[1].host: base is null"), std::string::npos);
  }
  // A set is used with the engine it was registered with only.
  Engine other = td_->make_engine(small_options());
  const CacheSet set = engine.register_caches(c.list);
  const std::vector<std::int64_t> ids{0};
  const auto m = rejection(
      [&] { (void)other.copy_blocks(set, Direction::kToDevice, ids, ids, td_->cuda_stream()); });
  EXPECT_NE(m.first.find("registered with another engine"), std::string::npos);
  const auto e = rejection([&] {
    (void)engine.copy_blocks(CacheSet{}, Direction::kToDevice, ids, ids, td_->cuda_stream());
  });
  EXPECT_NE(e.first.find("empty CacheSet"), std::string::npos);
}

TEST_P(CacheSetTest, ACacheOnAnotherGpu) {
  if (GetParam() == DeviceKind::kCuda) {
    const std::string why = cuda_skip_reason(2);
    if (!why.empty()) GTEST_SKIP() << why;
  }
  auto td1 = open_test_device(GetParam(), 1);
  ASSERT_NE(td1, nullptr);
  Caches c(*td_, 1, 8, 8, 4096, true, false);
  DeviceBuffer elsewhere(*td1->device, 8 * 4096);
  auto l = c.list;
  l[0].device.base = elsewhere.data();
  Engine engine = td_->make_engine(small_options());
  const auto m = rejection([&] { (void)engine.register_caches(l); });
  EXPECT_NE(m.first.find("pairs[0].device is device memory of GPU 1, but the engine serves GPU 0"),
            std::string::npos)
      << m.first;
}

// A pageable host cache is staged (correct, slower); the zero-copy kernel refuses it, naming the
// pair and row, before anything moves.
TEST_P(CacheSetTest, PageableHostCache) {
  Caches c(*td_, 2, 16, 8, 4096, false, false);
  Engine engine = td_->make_engine(small_options());
  const CacheSet set = engine.register_caches(c.list);
  EXPECT_FALSE(set.host_pinned());
  EXPECT_FALSE(set.host_pinned(1));
  const std::vector<std::int64_t> s{1, 6}, d{9, 2};
  engine.copy_blocks(set, Direction::kToDevice, s, d, td_->cuda_stream()).wait();
  for (std::size_t p = 0; p < 2; ++p)
    for (std::size_t i = 0; i < 2; ++i)
      EXPECT_EQ(std::memcmp(c.device_block(p, d[i]).data(), c.host_block(p, s[i]), 4096), 0);
  if (!td_->device->host_pointers_usable()) return;
  EngineOptions o = small_options();
  o.backend = Backend::kZeroCopyKernel;
  Engine zc = td_->make_engine(o);
  const CacheSet zset = zc.register_caches(c.list);
  const auto m = rejection(
      [&] { (void)zc.copy_blocks(zset, Direction::kToDevice, s, d, td_->cuda_stream()); });
  EXPECT_NE(m.first.find("pageable"), std::string::npos) << m.first;
  EXPECT_NE(m.first.find("[pairs[0].host -> pairs[0].device, src_ids[0]]"), std::string::npos)
      << m.first;
  EXPECT_EQ(m.second, 0u);
}

// The layers' device caches as views of one allocation at a constant stride (vLLM 0.33's
// allocate_kv_cache), with a host cache laid out by block (every layer's page of an id side by
// side) or by layer (one array per layer, back to back): each id's pages of every layer are one
// constant-stride run (16 x 32 KB = 512 KiB), moved as one 2D copy, both ways, every byte
// checked.
TEST_P(CacheSetTest, LayersOfOneAllocationMoveAsOne2DCopyPerId) {
  constexpr std::size_t kLayers = 16, kBytes = 32 << 10, kBlocks = 24, kHostBlocks = 32,
                        kMoved = 10;
  DeviceBuffer dev(*td_->device, kLayers * kBlocks * kBytes);
  {
    HostBuffer init(*td_->device, dev.size(), true);
    fill_device_random(*td_, dev.data(), init, 41);
  }
  for (const bool by_block : {true, false}) {
    SCOPED_TRACE(by_block ? "host rows by block" : "host arrays by layer");
    HostBuffer host(*td_->device, kLayers * kHostBlocks * kBytes, true);
    std::memset(host.data(), 0, host.size());
    std::vector<CachePair> list;
    for (std::size_t l = 0; l < kLayers; ++l) {
      CachePair q;
      q.device = {dev.data() + l * kBlocks * kBytes, kBlocks, kBytes, 0};
      q.host = by_block
                   ? BlockArray{host.data() + l * kBytes, kHostBlocks, kBytes, kLayers * kBytes}
                   : BlockArray{host.data() + l * kHostBlocks * kBytes, kHostBlocks, kBytes, 0};
      list.push_back(q);
    }
    auto host_block = [&](std::size_t l, std::size_t b) {
      return static_cast<const std::byte*>(list[l].host.base) +
             b * (by_block ? kLayers * kBytes : kBytes);
    };
    Engine engine = td_->make_engine(small_options());
    const CacheSet set = engine.register_caches(list);
    const auto out_src = distinct(kMoved, kBlocks, 5), out_dst = distinct(kMoved, kHostBlocks, 6);
    engine.copy_blocks(set, Direction::kToHost, out_src, out_dst, td_->cuda_stream()).wait();
    EXPECT_EQ(engine.stats().strided_copies, kMoved) << "one 2D copy per id";
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(
            std::memcmp(host_block(l, out_dst[i]),
                        td_->read(dev.data() + (l * kBlocks + out_src[i]) * kBytes, kBytes).data(),
                        kBytes),
            0)
            << "swap-out layer " << l << " row " << i;
    // Back in, to other device blocks.
    const auto in_dst = distinct(kMoved, kBlocks, 7);
    engine.copy_blocks(set, Direction::kToDevice, out_dst, in_dst, td_->cuda_stream()).wait();
    td_->device->stream_sync(td_->stream);
    EXPECT_EQ(engine.stats().strided_copies, 2 * kMoved);
    EXPECT_EQ(engine.stats().chunks, 0u) << "nothing staged";
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(
            std::memcmp(td_->read(dev.data() + (l * kBlocks + in_dst[i]) * kBytes, kBytes).data(),
                        host_block(l, out_dst[i]), kBytes),
            0)
            << "swap-in layer " << l << " row " << i;
    // Bad ids through the same path: named by row, nothing moved.
    const auto before = td_->read(dev.data(), kBytes);
    const std::vector<std::int64_t> dup_src{1, 2}, dup_dst{0, 0},
        far_src{1, static_cast<std::int64_t>(kHostBlocks)};
    auto m = rejection([&] {
      (void)engine.copy_blocks(set, Direction::kToDevice, dup_src, dup_dst, td_->cuda_stream());
    });
    EXPECT_NE(m.first.find("dst_ids[1]"), std::string::npos) << m.first;
    EXPECT_EQ(m.second, 1u);
    m = rejection([&] {
      (void)engine.copy_blocks(set, Direction::kToDevice, far_src, dup_src, td_->cuda_stream());
    });
    EXPECT_NE(m.first.find("out of range"), std::string::npos) << m.first;
    EXPECT_EQ(m.second, 1u);
    td_->device->stream_sync(td_->stream);
    EXPECT_EQ(td_->read(dev.data(), kBytes), before);
    EXPECT_EQ(engine.stats().strided_copies, 2 * kMoved);
  }
}

// One device allocation of `layers` arrays of `blocks` pages, layer after layer; host rows of
// `host_blocks` blocks, each holding its page of every layer side by side.
std::vector<CachePair> block_major_caches(std::byte* dev, std::byte* host, std::size_t layers,
                                          std::size_t blocks, std::size_t host_blocks,
                                          std::size_t bytes) {
  std::vector<CachePair> list;
  for (std::size_t l = 0; l < layers; ++l) {
    CachePair q;
    q.device = {dev + l * blocks * bytes, blocks, bytes, 0};
    q.host = BlockArray{host + l * bytes, host_blocks, bytes, layers * bytes};
    list.push_back(q);
  }
  return list;
}

// Short rows (16 layers x 8 KB pages of one device allocation, each id's host pages side by
// side) go through the staging ring's device twin: one DMA per run across the link, a 2D copy
// on the device spreads its rows. 20 ids through a ring of 4 slots of 2 runs each: the two
// slots a transfer takes are reused five times each. Every byte checked both ways.
TEST_P(CacheSetTest, ShortRowsBounceThroughTheDeviceTwinEveryByteBothWays) {
  constexpr std::size_t kLayers = 16, kBytes = 8 << 10, kBlocks = 48, kHostBlocks = 40, kMoved = 20;
  DeviceBuffer dev(*td_->device, kLayers * kBlocks * kBytes);
  HostBuffer init(*td_->device, dev.size(), true);
  fill_random(init.data(), init.size(), 43);
  {
    td_->device->copy_h2d(dev.data(), init.data(), init.size(), td_->stream);
    td_->device->stream_sync(td_->stream);
    HostBuffer host(*td_->device, kLayers * kHostBlocks * kBytes, true);
    std::memset(host.data(), 0, host.size());
    const auto list =
        block_major_caches(dev.data(), host.data(), kLayers, kBlocks, kHostBlocks, kBytes);
    auto host_page = [&](std::size_t l, std::size_t b) {
      return host.data() + (b * kLayers + l) * kBytes;
    };
    EngineOptions o = small_options();
    o.strided_min_bytes = kLayers * kBytes;  // one 128 KiB run per id (the default asks 512K)
    Engine engine = td_->make_engine(o);
    const CacheSet set = engine.register_caches(list);
    const auto out_src = distinct(kMoved, kBlocks, 15), out_dst = distinct(kMoved, kHostBlocks, 16);
    engine.copy_blocks(set, Direction::kToHost, out_src, out_dst, td_->cuda_stream()).wait();
    EXPECT_EQ(engine.stats().strided_copies, kMoved);
    EXPECT_EQ(tuning_stats(engine).bounced_runs, kMoved);
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(std::memcmp(host_page(l, out_dst[i]),
                              init.data() + (l * kBlocks + out_src[i]) * kBytes, kBytes),
                  0)
            << "swap-out layer " << l << " row " << i;
    // Back in, to other device blocks; the caller's stream sees them once the call returns.
    const auto in_dst = distinct(kMoved, kBlocks, 17);
    (void)engine.copy_blocks(set, Direction::kToDevice, out_dst, in_dst, td_->cuda_stream());
    td_->device->stream_sync(td_->stream);
    EXPECT_EQ(engine.stats().strided_copies, 2 * kMoved);
    EXPECT_EQ(tuning_stats(engine).bounced_runs, 2 * kMoved);
    EXPECT_EQ(engine.stats().chunks, 0u) << "nothing staged";
    const auto now = td_->read(dev.data(), dev.size());
    for (std::size_t l = 0; l < kLayers; ++l)
      for (std::size_t b = 0; b < kBlocks; ++b) {
        const auto at = std::find(in_dst.begin(), in_dst.end(), static_cast<std::int64_t>(b));
        const std::byte* want = at == in_dst.end() ? init.data() + (l * kBlocks + b) * kBytes
                                                   : host_page(l, out_dst[at - in_dst.begin()]);
        ASSERT_EQ(std::memcmp(now.data() + (l * kBlocks + b) * kBytes, want, kBytes), 0)
            << "layer " << l << " device block " << b;
      }
  }
}

// Rows of 32 KiB bounce on the way to host memory only: a load of such rows gains nothing from
// the detour (CopyLanes::kBounceMaxLoadWidth) and goes as plain 2D copies. Bytes checked both ways.
TEST_P(CacheSetTest, RowsOfThirtyTwoKiBBounceOnTheWayOutOnly) {
  constexpr std::size_t kLayers = 8, kBytes = 32 << 10, kBlocks = 12, kHostBlocks = 10, kMoved = 5;
  DeviceBuffer dev(*td_->device, kLayers * kBlocks * kBytes);
  HostBuffer init(*td_->device, dev.size(), true);
  fill_device_random(*td_, dev.data(), init, 45);
  HostBuffer host(*td_->device, kLayers * kHostBlocks * kBytes, true);
  std::memset(host.data(), 0, host.size());
  EngineOptions o = small_options();
  o.strided_min_bytes = kLayers * kBytes;  // one 256 KiB run per id, a slot's worth
  Engine engine = td_->make_engine(o);
  const CacheSet set = engine.register_caches(
      block_major_caches(dev.data(), host.data(), kLayers, kBlocks, kHostBlocks, kBytes));
  const auto out_src = distinct(kMoved, kBlocks, 18), out_dst = distinct(kMoved, kHostBlocks, 19);
  engine.copy_blocks(set, Direction::kToHost, out_src, out_dst, td_->cuda_stream()).wait();
  EXPECT_EQ(tuning_stats(engine).bounced_runs, kMoved);
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(std::memcmp(host.data() + (out_dst[i] * kLayers + l) * kBytes,
                            init.data() + (l * kBlocks + out_src[i]) * kBytes, kBytes),
                0)
          << "swap-out layer " << l << " row " << i;
  const auto in_dst = distinct(kMoved, kBlocks, 20);
  (void)engine.copy_blocks(set, Direction::kToDevice, out_dst, in_dst, td_->cuda_stream());
  td_->device->stream_sync(td_->stream);
  EXPECT_EQ(engine.stats().strided_copies, 2 * kMoved);
  EXPECT_EQ(tuning_stats(engine).bounced_runs, kMoved)
      << "a load of 32 KiB rows went through the device";
  const auto now = td_->read(dev.data(), dev.size());
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(std::memcmp(now.data() + (l * kBlocks + in_dst[i]) * kBytes,
                            host.data() + (out_dst[i] * kLayers + l) * kBytes, kBytes),
                0)
          << "swap-in layer " << l << " row " << i;
}

// A transfer that finds the ring's next slot still in use moves its runs as plain 2D copies,
// without waiting: three loads queued behind a stream held by a host flag, each of 4 runs (two
// slots of the ring's four); the third finds the first's slots not yet free. Every byte checked
// once the flag lets the stream go.
TEST_P(CacheSetTest, ABounceThatFindsTheRingBusyMovesItsRunsAsTheyAre) {
  if (!td_->device->supports_wait_value())
    GTEST_SKIP() << "the device has no stream memory operations";
  constexpr std::size_t kLayers = 16, kBytes = 8 << 10, kBlocks = 16, kHostBlocks = 16, kIds = 4;
  DeviceBuffer dev(*td_->device, kLayers * kBlocks * kBytes);
  HostBuffer host(*td_->device, kLayers * kHostBlocks * kBytes, true);
  fill_random(host.data(), host.size(), 44);
  HostBuffer flag(*td_->device, 4096, true);
  std::memset(flag.data(), 0, flag.size());
  const auto list =
      block_major_caches(dev.data(), host.data(), kLayers, kBlocks, kHostBlocks, kBytes);
  EngineOptions o = small_options();
  o.strided_min_bytes = kLayers * kBytes;
  Engine engine = td_->make_engine(o);
  const CacheSet set = engine.register_caches(list);
  auto* go = reinterpret_cast<std::uint64_t*>(flag.data());
  td_->device->wait_value_geq(go, 1, td_->stream);
  std::vector<Transfer> loads;
  for (std::size_t k = 0; k < 3; ++k) {
    std::vector<std::int64_t> ids(kIds);
    std::iota(ids.begin(), ids.end(), static_cast<std::int64_t>(4 * k));
    loads.push_back(engine.copy_blocks(set, Direction::kToDevice, ids, ids, td_->cuda_stream()));
  }
  EXPECT_EQ(tuning_stats(engine).bounced_runs, 2 * kIds)
      << "the third load did not wait for a slot";
  EXPECT_EQ(engine.stats().strided_copies, 3 * kIds);
  td_->device->signal_value(go, 1);
  for (Transfer& t : loads) t.wait();
  td_->device->stream_sync(td_->stream);
  const auto now = td_->read(dev.data(), dev.size());
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t b = 0; b < 3 * kIds; ++b)
      ASSERT_EQ(std::memcmp(now.data() + (l * kBlocks + b) * kBytes,
                            host.data() + (b * kLayers + l) * kBytes, kBytes),
                0)
          << "layer " << l << " block " << b;
}

// Two device arrays of separate allocations (a layer's K and V tensors), host rows side by side:
// any two arrays lie at "one pitch", but a 2D copy may not span two allocations, so each id's
// pair of 256 KB pages is staged, not one 2D copy (on a GPU the driver would refuse it).
TEST_P(CacheSetTest, ArraysOfSeparateAllocationsAreNotOne2DCopy) {
  constexpr std::size_t kBytes = 256 << 10, kHostBlocks = 8;
  Caches c(*td_, 2, 6, kHostBlocks, kBytes, true, true);
  Engine engine = td_->make_engine(small_options());
  const CacheSet set = engine.register_caches(c.list);
  const std::vector<std::int64_t> s{5, 0, 3}, d{1, 4, 2};
  engine.copy_blocks(set, Direction::kToDevice, s, d, td_->cuda_stream()).wait();
  td_->device->stream_sync(td_->stream);
  EXPECT_EQ(engine.stats().strided_copies, 0u);
  for (std::size_t p = 0; p < 2; ++p)
    for (std::size_t i = 0; i < s.size(); ++i)
      ASSERT_EQ(std::memcmp(c.device_block(p, d[i]).data(), c.host_block(p, s[i]), kBytes), 0)
          << p << " " << i;
  engine.copy_blocks(set, Direction::kToHost, d, s, td_->cuda_stream()).wait();
  EXPECT_EQ(engine.stats().strided_copies, 0u);
}

// Planned from the ids (plan_from_ids): transfers through a ring smaller than each transfer,
// both ways, every byte checked; and ids that make most blocks adjacent on both sides of packed
// arrays keep the listed path, where they coalesce.
TEST_P(CacheSetTest, PlannedFromIdsMovesWhatTheListedPathMoves) {
  constexpr std::size_t kPairs = 12, kBytes = 4096, kBlocks = 200, kMoved = 150;  // 7.2 MB each way
  {
    Caches c(*td_, kPairs, kBlocks, 2 * kBlocks, kBytes, true,
             false);                                    // swap-outs to the upper half
    Engine engine = td_->make_engine(small_options());  // a 1 MiB ring
    const CacheSet set = engine.register_caches(c.list);
    const auto in_src = distinct(kMoved, kBlocks, 21), in_dst = distinct(kMoved, kBlocks, 22);
    engine.copy_blocks(set, Direction::kToDevice, in_src, in_dst, td_->cuda_stream()).wait();
    td_->device->stream_sync(td_->stream);
    for (std::size_t p = 0; p < kPairs; ++p)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(
            std::memcmp(c.device_block(p, in_dst[i]).data(), c.host_block(p, in_src[i]), kBytes), 0)
            << "swap-in pair " << p << " row " << i;
    auto out_dst = distinct(kMoved, kBlocks, 23);
    for (auto& b : out_dst) b += kBlocks;
    engine.copy_blocks(set, Direction::kToHost, in_dst, out_dst, td_->cuda_stream()).wait();
    for (std::size_t p = 0; p < kPairs; ++p)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(std::memcmp(c.host_block(p, out_dst[i]), c.host_block(p, in_src[i]), kBytes), 0)
            << "swap-out pair " << p << " row " << i;
    EngineStats st = engine.stats();
    const std::uint64_t id_planned = tuning_stats(engine).id_planned_transfers;
    EXPECT_EQ(id_planned, 2u);
    EXPECT_EQ(st.blocks, 2 * kPairs * kMoved);
    EXPECT_GT(st.chunks, 2u) << "several chunks each way";
    // Rows 0..39 to 100..139: every row one id after the one before, on both sides.
    std::vector<std::int64_t> run_src(40), run_dst(40);
    std::iota(run_src.begin(), run_src.end(), 0);
    std::iota(run_dst.begin(), run_dst.end(), 100);
    engine.copy_blocks(set, Direction::kToDevice, run_src, run_dst, td_->cuda_stream()).wait();
    td_->device->stream_sync(td_->stream);
    EXPECT_EQ(tuning_stats(engine).id_planned_transfers, id_planned)
        << "adjacent ids keep the listed path";
    for (std::size_t p = 0; p < kPairs; ++p)
      for (std::size_t i = 0; i < run_src.size(); ++i)
        ASSERT_EQ(
            std::memcmp(c.device_block(p, run_dst[i]).data(), c.host_block(p, run_src[i]), kBytes),
            0)
            << "run pair " << p << " row " << i;
  }
}

// Arrays at one pitch on each side (one device allocation, one pinned host allocation), each id
// too small for a 2D copy (strided_min_bytes): listed row by row, and planned from the ids in
// that order; every byte checked, both ways.
TEST_P(CacheSetTest, ArraysAtOnePitchArePlannedFromIdsRowByRow) {
  constexpr std::size_t kPairs = 4, kBytes = 4096, kBlocks = 64, kMoved = 48;
  const std::size_t pitch = kBlocks * kBytes + 8192;  // arrays apart, on both sides
  HostBuffer host(*td_->device, kPairs * pitch * 2, true);
  DeviceBuffer dev(*td_->device, kPairs * pitch);
  fill_random(host.data(), host.size(), 61);
  std::vector<CachePair> pairs;
  for (std::size_t p = 0; p < kPairs; ++p) {
    CachePair q;
    q.host = {host.data() + p * 2 * pitch, 2 * kBlocks, kBytes, 0};
    q.device = {dev.data() + p * pitch, kBlocks, kBytes, 0};
    pairs.push_back(q);
  }
  Engine engine = td_->make_engine(small_options());
  const CacheSet set = engine.register_caches(pairs);
  const auto src = distinct(kMoved, kBlocks, 62), dst = distinct(kMoved, kBlocks, 63);
  engine.copy_blocks(set, Direction::kToDevice, src, dst, td_->cuda_stream()).wait();
  td_->device->stream_sync(td_->stream);
  for (std::size_t p = 0; p < kPairs; ++p)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(std::memcmp(td_->read(dev.data() + p * pitch + dst[i] * kBytes, kBytes).data(),
                            host.data() + p * 2 * pitch + src[i] * kBytes, kBytes),
                0)
          << "swap-in pair " << p << " row " << i;
  auto back = distinct(kMoved, kBlocks, 64);
  for (auto& b : back) b += kBlocks;
  engine.copy_blocks(set, Direction::kToHost, dst, back, td_->cuda_stream()).wait();
  for (std::size_t p = 0; p < kPairs; ++p)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(std::memcmp(host.data() + p * 2 * pitch + back[i] * kBytes,
                            host.data() + p * 2 * pitch + src[i] * kBytes, kBytes),
                0)
          << "swap-out pair " << p << " row " << i;
  EXPECT_EQ(tuning_stats(engine).id_planned_transfers, 2u);
  EXPECT_EQ(engine.stats().strided_copies, 0u);
}

// A transfer planned from its ids that one chunk holds (moved by the submitting thread) and one
// of a single id: every byte checked, both ways.
TEST_P(CacheSetTest, SmallTransfersPlannedFromIds) {
  constexpr std::size_t kPairs = 3, kBytes = 2048, kBlocks = 32;
  Caches c(*td_, kPairs, kBlocks, 2 * kBlocks, kBytes, true, false);  // swap-outs to the upper half
  Engine engine = td_->make_engine(small_options());
  const CacheSet set = engine.register_caches(c.list);
  for (const std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{20}}) {
    const auto src = distinct(n, kBlocks, 31 + n), dst = distinct(n, kBlocks, 41 + n);
    engine.copy_blocks(set, Direction::kToDevice, src, dst, td_->cuda_stream()).wait();
    td_->device->stream_sync(td_->stream);
    for (std::size_t p = 0; p < kPairs; ++p)
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(std::memcmp(c.device_block(p, dst[i]).data(), c.host_block(p, src[i]), kBytes), 0)
            << n << " ids: swap-in pair " << p << " row " << i;
    auto back = distinct(n, kBlocks, 51 + n);
    for (auto& b : back) b += kBlocks;
    engine.copy_blocks(set, Direction::kToHost, dst, back, td_->cuda_stream()).wait();
    for (std::size_t p = 0; p < kPairs; ++p)
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_EQ(std::memcmp(c.host_block(p, back[i]), c.host_block(p, src[i]), kBytes), 0)
            << n << " ids: swap-out pair " << p << " row " << i;
  }
  EXPECT_EQ(tuning_stats(engine).id_planned_transfers, 6u);
}

// stream_ordered_to_host: an event recorded on the caller's stream right after a swap-out of
// staged (scattered, small) blocks fires only once every byte is in host memory, so a runtime
// that acknowledges copies by stream events (SGLang's HiCache) reads whole pages. The handle is
// not waited on before the bytes are checked.
TEST_P(CacheSetTest, StreamOrderedToHostAnEventAfterTheCallSeesEveryByte) {
  // 16 MB a transfer in a ring that holds it: the call returns before the placing is done.
  constexpr std::size_t kPairs = 4, kBytes = 4096, kBlocks = 1024, kHostBlocks = 1024,
                        kMoved = 1024;
  Caches c(*td_, kPairs, kBlocks, kHostBlocks, kBytes, true, false);
  EngineOptions o = small_options();
  o.staging_bytes = 32 << 20;
  o.slot_bytes = 1 << 20;
  o.stream_ordered_to_host = true;
  Engine engine = td_->make_engine(o);
  const CacheSet set = engine.register_caches(c.list);
  detail::Device& d = *td_->device;
  const detail::EventHandle after = d.create_event(false);
  for (std::uint64_t round = 0; round < 4; ++round) {
    const auto src = distinct(kMoved, kBlocks, 60 + round),
               dst = distinct(kMoved, kHostBlocks, 70 + round);
    for (const auto b : dst)
      for (std::size_t p = 0; p < kPairs; ++p) std::memset(c.host_block(p, b), 0, kBytes);
    Transfer t = engine.copy_blocks(set, Direction::kToHost, src, dst, td_->cuda_stream());
    d.record_event(after, td_->stream);
    d.event_sync(after);
    // The last rows first: the gather threads place them last.
    for (std::size_t i = kMoved; i-- > 0;)
      for (std::size_t p = kPairs; p-- > 0;)
        ASSERT_EQ(std::memcmp(c.host_block(p, dst[i]), c.device_block(p, src[i]).data(), kBytes), 0)
            << "round " << round << " pair " << p << " row " << i
            << ": the stream went on before the bytes";
    t.wait();
  }
  EXPECT_GT(engine.stats().chunks, 0u);  // staged: placed by the gather threads, not by DMAs alone
  d.destroy_event(after);
}

// Several sets in one call (a model's layers, each its K and V): issued in order on the stream,
// after_each(k) between them, so that an event recorded there is layer k's: once it fires, that
// layer's blocks are on the device whatever the later layers do. Bad ids are named before
// anything moves.
TEST_P(CacheSetTest, LayersInOneCallCompleteInOrderWithAnEventEach) {
  constexpr std::size_t kLayers = 4, kBytes = 4096, kBlocks = 64, kMoved = 48;
  std::vector<std::unique_ptr<Caches>> layers;
  std::vector<CacheSet> sets;
  EngineOptions o = small_options();
  Engine engine = td_->make_engine(o);
  for (std::size_t l = 0; l < kLayers; ++l) {
    layers.push_back(std::make_unique<Caches>(*td_, 2, kBlocks, kBlocks, kBytes, true, false));
    fill_random(layers.back()->host.data(), layers.back()->host.size(), 500 + l);
    sets.push_back(engine.register_caches(layers.back()->list));
  }
  detail::Device& d = *td_->device;
  std::vector<detail::EventHandle> events;
  for (std::size_t l = 0; l < kLayers; ++l) events.push_back(d.create_event(false));
  const auto src = distinct(kMoved, kBlocks, 81), dst = distinct(kMoved, kBlocks, 82);
  std::vector<std::size_t> called;
  std::vector<Transfer> ts = engine.copy_blocks(sets, Direction::kToDevice, src, dst,
                                                td_->cuda_stream(), [&](std::size_t k) {
                                                  called.push_back(k);
                                                  d.record_event(events[k], td_->stream);
                                                });
  ASSERT_EQ(ts.size(), kLayers);
  EXPECT_EQ(called, (std::vector<std::size_t>{0, 1, 2, 3}));
  for (std::size_t l = 0; l < kLayers; ++l) {
    d.event_sync(events[l]);
    EXPECT_TRUE(ts[l].done()) << "layer " << l << "'s event fired before its transfer was done";
    for (std::size_t p = 0; p < 2; ++p)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(std::memcmp(layers[l]->device_block(p, dst[i]).data(),
                              layers[l]->host_block(p, src[i]), kBytes),
                  0)
            << "layer " << l << " pair " << p << " row " << i;
  }
  for (auto& t : ts) t.wait();
  for (auto e : events) d.destroy_event(e);

  // A set with fewer blocks bounds the ids of all; nothing is enqueued.
  Caches small(*td_, 2, 16, 16, kBytes, true, false);
  std::vector<CacheSet> mixed = sets;
  mixed.push_back(engine.register_caches(small.list));
  const std::uint64_t before = engine.stats().transfers;
  const auto [msg, block] = rejection([&] {
    (void)engine.copy_blocks(mixed, Direction::kToDevice, std::vector<std::int64_t>{3, 20},
                             std::vector<std::int64_t>{1, 2}, td_->cuda_stream());
  });
  EXPECT_NE(msg.find("src_ids[1] (block 20 -> 2): source block 20 is out of range (caches[4]'s "
                     "pairs[0].host has 16 blocks)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(block, 1u);
  EXPECT_EQ(engine.stats().transfers, before);
}

// Layers of blocks that all go to the copy engine as they are (a layered load of 64 KiB pages):
// each layer on the caller's stream, nothing staged; the first layer's copies in short driver
// calls that grow (8, 16, 32, then the rest), so that the copy engine starts on its first pages
// while the rest are enqueued; every later layer's in one call, as they queue behind it. The
// same on the way back, one layer in one call. Every byte checked.
TEST(CacheSetDirect, LargeBlocksGoAsTheyAreTheFirstLayerInGrowingBatches) {
  std::atomic<int> batches{0};
  testkit::EmulatedOptions emu;
  emu.fault = [&](const char* op) {
    if (std::strcmp(op, "copy_batch") == 0) batches.fetch_add(1);
    return false;
  };
  auto td = open_test_device(DeviceKind::kEmulated, 0, emu);
  ASSERT_NE(td, nullptr);
  constexpr std::size_t kLayers = 3, kBytes = 64 << 10, kBlocks = 96, kMoved = 64;
  EngineOptions o = small_options();
  o.direct_min_bytes = o.direct_min_bytes_to_host = kBytes;
  Engine engine = td->make_engine(o);
  std::vector<std::unique_ptr<Caches>> layers;
  std::vector<CacheSet> sets;
  for (std::size_t l = 0; l < kLayers; ++l) {
    layers.push_back(std::make_unique<Caches>(*td, 2, kBlocks, kBlocks, kBytes, true, false));
    fill_random(layers.back()->host.data(), layers.back()->host.size(), 900 + l);
    sets.push_back(engine.register_caches(layers.back()->list));
  }
  const auto src = distinct(kMoved, kBlocks, 91), dst = distinct(kMoved, kBlocks, 92);
  for (auto& t : engine.copy_blocks(sets, Direction::kToDevice, src, dst, td->cuda_stream()))
    t.wait();
  // 128 copies a layer: 8 + 16 + 32 + 72 for the first, one call for each later one.
  EXPECT_EQ(batches.load(), 4 + static_cast<int>(kLayers) - 1);
  for (std::size_t l = 0; l < kLayers; ++l)
    for (std::size_t p = 0; p < 2; ++p)
      for (std::size_t i = 0; i < kMoved; ++i)
        ASSERT_EQ(std::memcmp(layers[l]->device_block(p, dst[i]).data(),
                              layers[l]->host_block(p, src[i]), kBytes),
                  0)
            << "layer " << l << " pair " << p << " row " << i;

  batches = 0;
  const auto back = distinct(kMoved, kBlocks, 93);
  engine.copy_blocks(sets[1], Direction::kToHost, dst, back, td->cuda_stream()).wait();
  EXPECT_EQ(batches.load(), 4);
  for (std::size_t p = 0; p < 2; ++p)
    for (std::size_t i = 0; i < kMoved; ++i)
      ASSERT_EQ(std::memcmp(layers[1]->host_block(p, back[i]),
                            layers[1]->device_block(p, dst[i]).data(), kBytes),
                0)
          << "write-back pair " << p << " row " << i;
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.chunks, 0u);  // nothing staged
  EXPECT_EQ(st.direct_copies, (kLayers + 1) * 2 * kMoved);
}

INSTANTIATE_TEST_SUITE_P(Devices, CacheSetTest,
                         ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace gfd::test
