// The engine's whole pipeline (plan, ring, pool, back-pressure, completion, stream ordering,
// errors, concurrency), run against the emulated device everywhere and against CUDA where a
// GPU exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <thread>

#include "test_support.hpp"

namespace gfd::test {
namespace {

// Every case runs on each device kind with each backend: the backends share the validation,
// the handle and the stream semantics, so they share the correctness suite too.
class EngineTest : public ::testing::TestWithParam<std::tuple<DeviceKind, Backend>> {
 protected:
  DeviceKind kind() const { return std::get<0>(GetParam()); }
  Backend backend() const { return std::get<1>(GetParam()); }
  bool gather() const { return backend() == Backend::kGather; }
  // The zero-copy kernel reads sources with SM loads, which needs pinned memory.
  bool pinned_sources() const { return backend() == Backend::kZeroCopyKernel; }
  void copy_to_host_found_bad_late(std::size_t staging);
  void copy_to_device_found_bad_late(std::size_t staging);
  EngineOptions options() const {
    EngineOptions o = small_options();
    o.backend = backend();
    return o;
  }
  // options() with a ring of 16 slots of 64 KB, which the large transfers of a test span several
  // times.
  EngineOptions sixteen_slot_options() const {
    EngineOptions o = options();
    o.staging_bytes = 1 << 20;
    o.slot_bytes = 64 << 10;
    return o;
  }

  void SetUp() override {
    if (kind() == DeviceKind::kCuda) {
      const std::string why = cuda_skip_reason();
      if (!why.empty()) GTEST_SKIP() << why;
    }
    // Slow emulated copies widen the windows in which ordering bugs would show.
    testkit::EmulatedOptions emu;
    emu.copy_delay = std::chrono::microseconds(100);
    td_ = open_test_device(kind(), 0, emu);
    ASSERT_NE(td_, nullptr);
  }
  detail::Device& dev() { return *td_->device; }
  // The driver-lock tests: on the emulated device, frees that wait as the driver's do (no other
  // call starts until every stream has drained: testkit::EmulatedOptions::free_waits_for_device).
  void open_lock_modelled_device() {
    if (kind() != DeviceKind::kEmulated) return;
    testkit::EmulatedOptions emu;
    emu.copy_delay = std::chrono::microseconds(100);
    emu.free_waits_for_device = true;
    td_ = open_test_device(kind(), 0, emu);
  }
  // Allocates and frees device memory without pause on a thread of its own (cudaFree waits for
  // the whole device) until stop(), which returns how many frees got through.
  class Freer {
   public:
    explicit Freer(detail::Device& d)
        : thread_([this, &d] {
            d.make_current();
            while (!stop_.load(std::memory_order_relaxed)) {
              void* p = d.alloc_device(1 << 20);
              d.free_device(p);
              frees_.fetch_add(1, std::memory_order_relaxed);
            }
          }) {}
    ~Freer() { stop(); }
    long stop() {
      stop_.store(true);
      if (thread_.joinable()) thread_.join();
      return frees_.load();
    }

   private:
    std::atomic<bool> stop_{false};
    std::atomic<long> frees_{0};
    std::thread thread_;
  };

  // n blocks of `size` bytes at random places of a pool 4x larger; destinations either
  // consecutive or a random permutation of block-sized pages of `dst`.
  std::vector<BlockCopy> make_blocks(const HostBuffer& pool, const DeviceBuffer& dst, std::size_t n,
                                     std::size_t size, bool scattered, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    const std::size_t slots = pool.size() / size;
    std::vector<std::size_t> src_idx(slots);
    std::iota(src_idx.begin(), src_idx.end(), 0);
    std::shuffle(src_idx.begin(), src_idx.end(), rng);
    std::vector<std::size_t> dst_idx(n);
    std::iota(dst_idx.begin(), dst_idx.end(), 0);
    if (scattered) std::shuffle(dst_idx.begin(), dst_idx.end(), rng);
    std::vector<BlockCopy> blocks(n);
    for (std::size_t i = 0; i < n; ++i)
      blocks[i] = {pool.data() + src_idx[i] * size, dst.data() + dst_idx[i] * size, size};
    return blocks;
  }

  void expect_landed(const std::vector<BlockCopy>& blocks, const DeviceBuffer& dst) {
    const std::vector<std::byte> got = td_->read(dst.data(), dst.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const std::size_t off = static_cast<const std::byte*>(blocks[i].dst) - dst.data();
      if (std::memcmp(got.data() + off, blocks[i].src, blocks[i].bytes) != 0 && bad++ < 5)
        ADD_FAILURE() << "block " << i << " (" << blocks[i].bytes << " bytes at device offset "
                      << off << ") differs";
    }
    EXPECT_EQ(bad, 0u) << "blocks that differ";
  }

  std::unique_ptr<TestDevice> td_;
};

TEST_P(EngineTest, OneByte) {
  Engine engine = td_->make_engine(options());
  HostBuffer src(dev(), 4096, pinned_sources());
  fill_random(src.data(), 1, 1);
  DeviceBuffer dst(dev(), 64);
  td_->fill(dst.data(), 0, 64);
  const BlockCopy b{src.data(), dst.data() + 7, 1};
  engine.copy_to_device({&b, 1}, td_->cuda_stream()).wait();
  const auto got = td_->read(dst.data(), 64);
  EXPECT_EQ(got[7], src.data()[0]);
  EXPECT_EQ(got[6], std::byte{0});
  EXPECT_EQ(got[8], std::byte{0});
}

TEST_P(EngineTest, ScatteredSourcesContiguousDestination) {
  Engine engine = td_->make_engine(options());
  HostBuffer pool(dev(), 4 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 2);
  DeviceBuffer dst(dev(), 256 * 4096);
  const auto blocks = make_blocks(pool, dst, 256, 4096, false, 3);
  engine.copy_to_device(blocks, td_->cuda_stream()).wait();
  expect_landed(blocks, dst);
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.bytes, 256u * 4096);
  if (gather()) {
    EXPECT_EQ(tuning_stats(engine).scattered_chunks, 0u);
    EXPECT_GT(st.chunks, 1u);
  }
}

TEST_P(EngineTest, ScatteredDestinationsUseScatterKernel) {
  Engine engine = td_->make_engine(options());
  HostBuffer pool(dev(), 4 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 4);
  DeviceBuffer dst(dev(), 300 * 2048);
  const auto blocks = make_blocks(pool, dst, 300, 2048, true, 5);
  engine.copy_to_device(blocks, td_->cuda_stream()).wait();
  expect_landed(blocks, dst);
  if (gather()) EXPECT_GT(tuning_stats(engine).scattered_chunks, 0u);
}

TEST_P(EngineTest, RandomSizesAndAlignments) {
  Engine engine = td_->make_engine(options());
  std::mt19937_64 rng(6);
  HostBuffer pool(dev(), 8 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 7);
  DeviceBuffer dst(dev(), 8 << 20);
  for (int round = 0; round < 6; ++round) {
    td_->fill(dst.data(), 0, dst.size());
    std::vector<BlockCopy> blocks;
    std::size_t d = 0, s = 0;
    while (true) {
      const std::size_t size = 1 + rng() % (round % 2 ? 70000 : 5000);
      d += rng() % 64;  // unaligned gaps: scattered destinations of odd sizes
      s += rng() % 4096;
      if (d + size > dst.size() || s + size > pool.size()) break;
      blocks.push_back({pool.data() + s, dst.data() + d, size});
      d += size;
      s += size;
    }
    std::shuffle(blocks.begin(), blocks.end(), rng);
    engine.copy_to_device(blocks, td_->cuda_stream()).wait();
    expect_landed(blocks, dst);
  }
}

TEST_P(EngineTest, TotalFarLargerThanRingCyclesThroughSlots) {
  EngineOptions o = options();  // 1 MB ring of 4 slots
  Engine engine = td_->make_engine(o);
  HostBuffer pool(dev(), 24 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 8);
  DeviceBuffer dst(dev(), 1536 * 4096);  // 6 MB: six times the ring
  const auto blocks = make_blocks(pool, dst, 1536, 4096, true, 9);
  engine.copy_to_device(blocks, td_->cuda_stream()).wait();
  expect_landed(blocks, dst);
  if (gather()) EXPECT_GE(engine.stats().chunks, 24u);
}

TEST_P(EngineTest, OneHugePageableBlockIsSplit) {
  Engine engine = td_->make_engine(options());
  const std::size_t n = (5 << 20) + 123;
  HostBuffer src(dev(), n, pinned_sources());
  fill_random(src.data(), n, 10);
  DeviceBuffer dst(dev(), n);
  const BlockCopy b{src.data(), dst.data(), n};
  engine.copy_to_device({&b, 1}, td_->cuda_stream()).wait();
  expect_landed({b}, dst);
  if (gather()) EXPECT_EQ(engine.stats().direct_copies, 0u);
}

TEST_P(EngineTest, LargePinnedBlocksGoDirect) {
  Engine engine = td_->make_engine(options());  // direct_min_bytes = 512 KB
  HostBuffer src(dev(), 3 << 20, true);
  fill_random(src.data(), src.size(), 11);
  DeviceBuffer dst(dev(), 3 << 20);
  // Two large pinned blocks (direct) and small ones (staged) in one transfer.
  std::vector<BlockCopy> blocks = {{src.data(), dst.data() + (2 << 20), 1 << 20},
                                   {src.data() + (1 << 20), dst.data(), 1 << 20}};
  for (std::size_t i = 0; i < 64; ++i)
    blocks.push_back({src.data() + (2 << 20) + i * 8192, dst.data() + (1 << 20) + i * 8192, 4096});
  engine.copy_to_device(blocks, td_->cuda_stream()).wait();
  expect_landed(blocks, dst);
  if (gather()) EXPECT_EQ(engine.stats().direct_copies, 2u);
}

TEST_P(EngineTest, WorkQueuedBeforeOnTheStreamRunsFirst) {
  Engine engine = td_->make_engine(options());
  HostBuffer pool(dev(), 2 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 12);
  DeviceBuffer dst(dev(), 128 * 4096);
  const auto blocks = make_blocks(pool, dst, 128, 4096, true, 13);
  // The stream is busy for 50 ms and then overwrites the destination: the transfer must land
  // after that, so its data wins.
  dev().delay_async(50000, td_->stream);
  dev().memset_async(dst.data(), 0xEE, dst.size(), td_->stream);
  engine.copy_to_device(blocks, td_->cuda_stream()).wait();
  expect_landed(blocks, dst);
}

TEST_P(EngineTest, WorkQueuedAfterOnTheStreamSeesTheData) {
  Engine engine = td_->make_engine(options());
  HostBuffer pool(dev(), 16 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 14);
  DeviceBuffer dst(dev(), 1024 * 4096);
  HostBuffer back(dev(), dst.size(), true);
  const auto blocks = make_blocks(pool, dst, 1024, 4096, true, 15);
  // No host wait between the transfer and the read-back queued behind it on the stream.
  Transfer t = engine.copy_to_device(blocks, td_->cuda_stream());
  dev().copy_d2h(back.data(), dst.data(), dst.size(), td_->stream);
  dev().stream_sync(td_->stream);
  EXPECT_TRUE(t.done());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const std::size_t off = static_cast<const std::byte*>(blocks[i].dst) - dst.data();
    ASSERT_EQ(std::memcmp(back.data() + off, blocks[i].src, 4096), 0) << "block " << i;
  }
}

TEST_P(EngineTest, HandleCanBePolledAndDefaultHandleIsDone) {
  Engine engine = td_->make_engine(options());
  Transfer none;
  EXPECT_TRUE(none.done());
  EXPECT_NO_THROW(none.wait());
  EXPECT_EQ(none.error(), nullptr);
  HostBuffer pool(dev(), 2 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 16);
  DeviceBuffer dst(dev(), 256 * 4096);
  const auto blocks = make_blocks(pool, dst, 256, 4096, false, 17);
  Transfer t = engine.copy_to_device(blocks, td_->cuda_stream());
  while (!t.done()) std::this_thread::yield();
  EXPECT_EQ(t.error(), nullptr);
  EXPECT_EQ(t.bytes(), 256u * 4096);
  expect_landed(blocks, dst);
  // An empty transfer is complete at once.
  EXPECT_TRUE(engine.copy_to_device({}, td_->cuda_stream()).done());
}

// The default streams (the legacy one as a null handle or cudaStreamLegacy, and the per-thread
// one), which the batch copy calls reject: every backend moves staged and direct blocks there,
// both ways.
TEST_P(EngineTest, DefaultStreamsBothWays) {
  if (kind() != DeviceKind::kCuda)
    GTEST_SKIP() << "CUDA-only: the emulated device has no default stream";
  Engine engine = td_->make_engine(options());
  HostBuffer pool(dev(), 4 << 20, pinned_sources());
  HostBuffer out(dev(), pool.size(), pinned_sources());
  DeviceBuffer dst(dev(), 2 << 20);
  const cudaStream_t streams[] = {nullptr, cudaStreamLegacy, cudaStreamPerThread};
  std::uint64_t seed = 43;
  for (const cudaStream_t s : streams) {
    for (const std::size_t size : {std::size_t{4096}, std::size_t{256} << 10}) {
      SCOPED_TRACE("stream " + std::to_string(reinterpret_cast<std::uintptr_t>(s)) + ", " +
                   std::to_string(size) + "-byte blocks");
      fill_random(pool.data(), pool.size(), seed++);
      std::memset(out.data(), 0, out.size());
      const auto in = make_blocks(pool, dst, dst.size() / size, size, true, seed++);
      engine.copy_to_device(in, s).wait();
      expect_landed(in, dst);
      std::vector<BlockCopy> back(in.size());
      for (std::size_t i = 0; i < in.size(); ++i)
        back[i] = {in[i].dst, out.data() + (static_cast<const std::byte*>(in[i].src) - pool.data()),
                   size};
      engine.copy_to_host(back, s).wait();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < back.size(); ++i)
        if (std::memcmp(back[i].dst, in[i].src, size) != 0 && bad++ < 5)
          ADD_FAILURE() << "block " << i << " came back different";
    }
  }
}

TEST_P(EngineTest, ConcurrentSubmittersWithTinyRing) {
  EngineOptions o = options();
  o.staging_bytes = 128 << 10;  // two slots: constant back-pressure
  o.slot_bytes = 64 << 10;
  o.first_chunk_bytes = 16 << 10;
  Engine engine = td_->make_engine(o);
  constexpr int kThreads = 8, kRounds = 12;
  constexpr std::size_t kBlocks = 96, kSize = 3000;
  HostBuffer pool(dev(), 8 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 18);
  DeviceBuffer dst(dev(), kThreads * kBlocks * kSize);
  std::vector<std::vector<BlockCopy>> per(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      // Each thread owns a disjoint destination region and its own stream.
      detail::StreamHandle s = dev().create_stream();
      for (int r = 0; r < kRounds; ++r) {
        std::vector<BlockCopy> blocks(kBlocks);
        std::vector<std::size_t> order(kBlocks);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (std::size_t i = 0; i < kBlocks; ++i)
          blocks[i] = {pool.data() + (rng() % (pool.size() / kSize)) * kSize,
                       dst.data() + (t * kBlocks + order[i]) * kSize, kSize};
        try {
          engine.copy_to_device(blocks, static_cast<cudaStream_t>(s)).wait();
        } catch (const std::exception& e) {
          ++failures;
          ADD_FAILURE() << e.what();
        }
        per[t] = blocks;
      }
      dev().destroy_stream(s);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  std::vector<BlockCopy> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  expect_landed(all, dst);
  EXPECT_EQ(engine.stats().transfers, std::uint64_t{kThreads} * kRounds);
}

TEST_P(EngineTest, DestroyingEngineWithTransfersInFlightDrainsThem) {
  HostBuffer pool(dev(), 8 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 19);
  DeviceBuffer dst(dev(), 1024 * 4096);
  const auto blocks = make_blocks(pool, dst, 1024, 4096, true, 20);
  Transfer t;
  {
    Engine engine = td_->make_engine(options());
    t = engine.copy_to_device(blocks, td_->cuda_stream());
  }  // no wait: the destructor drains
  EXPECT_TRUE(t.done());
  EXPECT_NO_THROW(t.wait());
  expect_landed(blocks, dst);
}

// ---- device to host ------------------------------------------------------------------------

// Device blocks (scattered or in order) to scattered host blocks, every size and alignment kind;
// pageable host memory except where the backend needs it pinned.
TEST_P(EngineTest, CopyToHostPlacesEveryByte) {
  Engine engine = td_->make_engine(options());
  std::mt19937_64 rng(90);
  DeviceBuffer src(dev(), 4 << 20);
  HostBuffer init(dev(), src.size(), true);
  fill_random(init.data(), init.size(), 91);
  dev().copy_h2d(src.data(), init.data(), src.size(), td_->stream);
  dev().stream_sync(td_->stream);
  HostBuffer out(dev(), 16 << 20, pinned_sources());
  for (int round = 0; round < 4; ++round) {
    std::memset(out.data(), 0, out.size());
    std::vector<BlockCopy> blocks;
    const bool scattered = round % 2 == 1;
    std::size_t s = 0;
    while (true) {
      const std::size_t size = round < 2 ? 4096 : 1 + rng() % 30000;
      if (s + size > src.size()) break;
      blocks.push_back({src.data() + s, nullptr, size});
      s += size + (scattered ? rng() % 4096 : 0);
    }
    // Host destinations: a shuffled, non-overlapping layout with gaps.
    std::vector<std::size_t> order(blocks.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::size_t d = 0;
    for (std::size_t i : order) {
      blocks[i].dst = out.data() + d;
      d += blocks[i].bytes + rng() % 64;
    }
    ASSERT_LE(d, out.size());
    engine.copy_to_host(blocks, td_->cuda_stream()).wait();
    std::size_t bad = 0;
    for (const BlockCopy& b : blocks)
      bad += std::memcmp(b.dst, init.data() + (static_cast<const std::byte*>(b.src) - src.data()),
                         b.bytes) != 0;
    EXPECT_EQ(bad, 0u) << "round " << round << ": blocks that differ of " << blocks.size();
  }
}

// The device has read the blocks when work queued after the call runs: overwriting them on the
// same stream cannot change what arrives in host memory.
TEST_P(EngineTest, CopyToHostReadsBeforeLaterWorkOnTheStream) {
  Engine engine = td_->make_engine(options());
  DeviceBuffer src(dev(), 1 << 20);
  HostBuffer init(dev(), src.size(), true);
  fill_random(init.data(), init.size(), 92);
  dev().copy_h2d(src.data(), init.data(), src.size(), td_->stream);
  HostBuffer out(dev(), 2 << 20, pinned_sources());
  std::vector<BlockCopy> blocks;
  for (std::size_t i = 0; i < 256; ++i)
    blocks.push_back({src.data() + ((i * 37) % 256) * 4096, out.data() + i * 8192, 4096});
  dev().delay_async(20000, td_->stream);  // the copies start after this and the upload above
  Transfer t = engine.copy_to_host(blocks, td_->cuda_stream());
  dev().memset_async(src.data(), 0xEE, src.size(), td_->stream);
  t.wait();
  dev().stream_sync(td_->stream);
  for (std::size_t i = 0; i < blocks.size(); ++i)
    ASSERT_EQ(std::memcmp(blocks[i].dst, init.data() + ((i * 37) % 256) * 4096, 4096), 0)
        << "block " << i;
}

// Swap out, overwrite the device, swap back in: the device holds the original bytes again.
TEST_P(EngineTest, SwapOutAndBackInRoundTrips) {
  Engine engine = td_->make_engine(options());
  DeviceBuffer cache(dev(), 512 * 4096);
  HostBuffer init(dev(), cache.size(), true);
  fill_random(init.data(), init.size(), 93);
  dev().copy_h2d(cache.data(), init.data(), cache.size(), td_->stream);
  HostBuffer pool(dev(), 8 << 20, pinned_sources());
  std::vector<BlockCopy> out, in;
  for (std::size_t i = 0; i < 300; ++i) {
    std::byte* slot = pool.data() + ((i * 7919) % 1000) * 8192;
    out.push_back({cache.data() + i * 4096, slot, 4096});
    in.push_back({slot, cache.data() + i * 4096, 4096});
  }
  engine.copy_to_host(out, td_->cuda_stream()).wait();
  td_->fill(cache.data(), 0x11, cache.size());
  engine.copy_to_device(in, td_->cuda_stream()).wait();
  const auto got = td_->read(cache.data(), cache.size());
  EXPECT_EQ(std::memcmp(got.data(), init.data(), 300 * 4096), 0);
}

TEST_P(EngineTest, CopyToHostBadInputIsRejectedNamingTheBlock) {
  Engine engine = td_->make_engine(options());
  DeviceBuffer src(dev(), 64 * 4096), dst_dev(dev(), 4096);
  HostBuffer out(dev(), 1 << 20, pinned_sources());
  HostBuffer pageable(dev(), 1 << 16, false);
  auto good = [&] {
    std::vector<BlockCopy> v;
    for (std::size_t i = 0; i < 16; ++i)
      v.push_back({src.data() + i * 4096, out.data() + i * 8192, 4096});
    return v;
  };
  struct Case {
    std::size_t block;
    BlockCopy b;
    std::string needle;
  };
  std::vector<Case> cases = {
      {3, {out.data(), out.data() + 3 * 8192, 4096}, "source"},  // host source
      {4, {src.data() + 4 * 4096, dst_dev.data(), 4096}, "needs a host destination"},  // device dst
      {5, {src.data() + 60 * 4096 + 1, out.data() + 5 * 8192, 4 * 4096}, "past the end"},
      {6, {src.data(), out.data() + 5 * 8192 + 100, 4096}, "overlaps block 5"},
  };
  if (backend() == Backend::kZeroCopyKernel)
    cases.push_back({7, {src.data(), pageable.data(), 4096}, "needs pinned host memory"});
  for (const Case& c : cases) {
    auto v = good();
    v[c.block] = c.b;
    try {
      (void)engine.copy_to_host(v, td_->cuda_stream());
      ADD_FAILURE() << "accepted: " << c.needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.block(), c.block) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    }
  }
  const auto ok = good();
  engine.copy_to_host(ok, td_->cuda_stream()).wait();
}

// A late-rejection case: block `block` replaced by `b`, rejected with a message saying `needle`.
struct LateCase {
  std::size_t block;
  BlockCopy b;
  const char* needle;
};

// Runs `submit`, which must throw gfd::Error(kInvalidArgument) saying `needle` (and, with
// `names_block`, naming block `block`).
template <class F>
void expect_rejected(F&& submit, std::size_t block, const std::string& needle, bool names_block) {
  try {
    submit();
    ADD_FAILURE() << "accepted: " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    if (names_block) EXPECT_EQ(e.block(), block) << e.what();
  }
}

// A bad block late in a 4 MB list, or an overlap found at the end, rejects the whole transfer,
// naming the block, and no byte reaches its destination; a good transfer then lands whole, and
// only it is counted. Device to host, the gather backend plans while the first DMAs run (after
// chunks were enqueued); host to device, the first chunks are gathered while the rest is checked
// and packed (block 300: found while they are packed; 900: by the check). Rings of
// 128 slots of 256 KB (the whole transfer fits), of 4 (the ring turns: no slot may be lost
// to a rejected transfer) and of 2 (host to device: one slot only may be taken before the check).
TEST_P(EngineTest, FoundBadLateRejectsWholeAndCopiesNothing) {
  for (std::size_t staging :
       {std::size_t{32} << 20, std::size_t{1} << 20, std::size_t{512} << 10}) {
    SCOPED_TRACE("staging " + std::to_string(staging));
    copy_to_host_found_bad_late(staging);
    copy_to_device_found_bad_late(staging);
  }
}

void EngineTest::copy_to_host_found_bad_late(std::size_t staging) {
  EngineOptions o = options();
  o.staging_bytes = staging;
  // The first chunks wait to be packed (several to a launch) while the list is checked.
  Engine engine = td_->make_engine(o);
  constexpr std::size_t kBlocks = 1024;
  DeviceBuffer src(dev(), kBlocks * 4096), dst_dev(dev(), 4096);
  HostBuffer init(dev(), src.size(), true);
  fill_random(init.data(), init.size(), 95);
  dev().copy_h2d(src.data(), init.data(), src.size(), td_->stream);
  dev().stream_sync(td_->stream);
  HostBuffer out(dev(), 2 * src.size(), pinned_sources());
  std::vector<BlockCopy> good;
  for (std::size_t i = 0; i < kBlocks; ++i)
    good.push_back({src.data() + i * 4096, out.data() + ((i * 613) % kBlocks) * 8192, 4096});
  const std::uint64_t transfers_before = engine.stats().transfers;
  const LateCase cases[] = {
      {900, {src.data() + 900 * 4096, dst_dev.data(), 4096}, "needs a host destination"},
      {1000,
       {src.data() + 1000 * 4096, out.data() + ((10 * 613) % kBlocks) * 8192 + 100, 4096},
       "overlaps"},
  };
  for (const LateCase& c : cases) {
    std::memset(out.data(), 0xAB, out.size());
    std::vector<BlockCopy> v = good;
    v[c.block] = c.b;
    expect_rejected([&] { (void)engine.copy_to_host(v, td_->cuda_stream()); }, c.block, c.needle,
                    std::string(c.needle) != "overlaps");
    dev().stream_sync(td_->stream);
    // The dropped chunks are discarded by the gather threads: give them time to do so wrongly.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::size_t touched = 0;
    for (std::size_t i = 0; i < out.size(); ++i) touched += out.data()[i] != std::byte{0xAB};
    EXPECT_EQ(touched, 0u) << c.needle << ": bytes of host memory written by a rejected transfer";
  }
  EXPECT_EQ(engine.stats().transfers, transfers_before) << "rejected transfers are not counted";
  engine.copy_to_host(good, td_->cuda_stream()).wait();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < kBlocks; ++i)
    bad += std::memcmp(good[i].dst, init.data() + i * 4096, 4096) != 0;
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(engine.stats().transfers, transfers_before + 1);
}

void EngineTest::copy_to_device_found_bad_late(std::size_t staging) {
  EngineOptions o = options();
  o.staging_bytes = staging;
  Engine engine = td_->make_engine(o);
  constexpr std::size_t kBlocks = 1024;
  HostBuffer pool(dev(), 2 * kBlocks * 4096, pinned_sources());
  fill_random(pool.data(), pool.size(), 96);
  DeviceBuffer dst(dev(), kBlocks * 4096), other(dev(), 4096);
  std::vector<BlockCopy> good;
  for (std::size_t i = 0; i < kBlocks; ++i)
    good.push_back({pool.data() + ((i * 613) % kBlocks) * 8192, dst.data() + i * 4096, 4096});
  const std::uint64_t transfers_before = engine.stats().transfers;
  const LateCase cases[] = {
      // Found while the first chunks are packed: the first is out with the gather threads.
      {300, {other.data(), dst.data() + 300 * 4096, 4096}, "needs a host source"},
      {900, {other.data(), dst.data() + 900 * 4096, 4096}, "needs a host source"},
      {1000, {pool.data() + 8192, dst.data() + 10 * 4096 + 100, 4096}, "overlaps"},
  };
  for (const LateCase& c : cases) {
    for (int round = 0; round < 6; ++round) {
      td_->fill(dst.data(), 0x5A, dst.size());
      std::vector<BlockCopy> v = good;
      v[c.block] = c.b;
      expect_rejected([&] { (void)engine.copy_to_device(v, td_->cuda_stream()); }, c.block,
                      c.needle, true);
      dev().stream_sync(td_->stream);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // time for a wrong DMA to land
      const auto got = td_->read(dst.data(), dst.size());
      const auto touched =
          std::count_if(got.begin(), got.end(), [](std::byte b) { return b != std::byte{0x5A}; });
      EXPECT_EQ(touched, 0) << c.needle
                            << ": bytes of device memory written by a rejected transfer";
    }
  }
  EXPECT_EQ(engine.stats().transfers, transfers_before) << "rejected transfers are not counted";
  engine.copy_to_device(good, td_->cuda_stream()).wait();
  expect_landed(good, dst);
  EXPECT_EQ(engine.stats().transfers, transfers_before + 1);
}

// ---- bad input: each is rejected whole, copies nothing and leaves the engine usable ----------
struct BadCase {
  const char* name;
  std::size_t block;   // expected offending index
  const char* needle;  // expected in the message
};

TEST_P(EngineTest, BadInputIsRejectedWholeAndEngineStaysUsable) {
  Engine engine = td_->make_engine(options());
  HostBuffer pool(dev(), 1 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 21);
  HostBuffer pinned(dev(), 1 << 16, true);
  DeviceBuffer dst(dev(), 64 * 4096);
  DeviceBuffer other(dev(), 4096);
  std::vector<std::byte> host_dst(4096);

  auto good = [&] {
    std::vector<BlockCopy> v;
    for (std::size_t i = 0; i < 16; ++i)
      v.push_back({pool.data() + i * 8192, dst.data() + i * 4096, 4096});
    return v;
  };
  struct Case {
    std::string name;
    std::vector<BlockCopy> blocks;
    std::size_t block;
    std::string needle;
  };
  std::vector<Case> cases;
  auto with = [&](std::string name, std::size_t i, BlockCopy b, std::string needle) {
    auto v = good();
    v[i] = b;
    cases.push_back({std::move(name), std::move(v), i, std::move(needle)});
  };
  with("null source", 3, {nullptr, dst.data() + 3 * 4096, 4096}, "source pointer is null");
  with("null destination", 4, {pool.data(), nullptr, 4096}, "destination pointer is null");
  with("zero size", 5, {pool.data(), dst.data() + 5 * 4096, 0}, "size is zero");
  with("source overflow", 6,
       {reinterpret_cast<void*>(UINTPTR_MAX - 10), dst.data() + 6 * 4096, 4096}, "overflows");
  with("destination overflow", 7, {pool.data(), reinterpret_cast<void*>(UINTPTR_MAX - 10), 4096},
       "overflows");
  with("host destination", 8, {pool.data(), host_dst.data(), 4096}, "not device memory");
  with("pinned host destination", 9, {pool.data(), pinned.data(), 4096}, "not device memory");
  with("runs past allocation", 10, {pool.data(), dst.data() + 63 * 4096 + 1, 4096}, "past the end");
  with("device source", 11, {other.data(), dst.data() + 11 * 4096, 4096}, "needs a host source");
  with("overlapping destinations", 12, {pool.data(), dst.data() + 2 * 4096 + 100, 4096},
       "overlaps block 2");
  HostBuffer pageable(dev(), 1 << 16, false);
  if (backend() == Backend::kZeroCopyKernel)
    with("pageable source for the zero-copy kernel", 14,
         {pageable.data(), dst.data() + 14 * 4096, 4096}, "needs pinned host memory");

  std::unique_ptr<TestDevice> second;
  std::unique_ptr<DeviceBuffer> foreign;
  if (kind() == DeviceKind::kEmulated || cuda_skip_reason(2).empty()) {
    second = open_test_device(kind(), 1);
    foreign = std::make_unique<DeviceBuffer>(*second->device, 4096);
    with("destination on another GPU", 13, {pool.data(), foreign->data(), 4096}, "GPU 1");
  }

  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    td_->fill(dst.data(), 0x5A, dst.size());
    try {
      (void)engine.copy_to_device(c.blocks, td_->cuda_stream());
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.block(), c.block);
      EXPECT_NE(std::string(e.what()).find("block " + std::to_string(c.block)), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    }
    dev().stream_sync(td_->stream);
    const auto got = td_->read(dst.data(), dst.size());
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](std::byte b) {
      return b == std::byte{0x5A};
    })) << "something was copied";
    const auto ok = good();
    engine.copy_to_device(ok, td_->cuda_stream()).wait();
    expect_landed(ok, dst);
  }
  EXPECT_EQ(engine.stats().transfers, cases.size()) << "rejected transfers are not counted";
}

TEST_P(EngineTest, AbsurdOptionsAreRejectedNamingTheOption) {
  struct Case {
    const char* needle;
    EngineOptions o;
  };
  std::vector<Case> cases;
  auto add = [&](const char* needle, auto&& mutate) {
    EngineOptions o = options();
    mutate(o);
    cases.push_back({needle, o});
  };
  add("staging_bytes", [](EngineOptions& o) { o.staging_bytes = o.slot_bytes; });
  add("staging_bytes", [](EngineOptions& o) { o.staging_bytes = 0; });
  add("slot_bytes", [](EngineOptions& o) { o.slot_bytes = 100; });
  add("copy_streams", [](EngineOptions& o) { o.copy_streams = 0; });
  add("gather_threads", [](EngineOptions& o) { o.gather_threads = 100000; });
  add("gather_threads", [](EngineOptions& o) { o.gather_threads = -3; });
  add("piece_bytes", [](EngineOptions& o) { o.piece_bytes = 1; });
  add("numa_node", [](EngineOptions& o) { o.numa_node = 4096; });
  add("pageable_cache_ms", [](EngineOptions& o) { o.pageable_cache_ms = -1; });
  add("pageable_cache_ms", [](EngineOptions& o) { o.pageable_cache_ms = 3600001; });
  add("chunk_bytes_to_host", [](EngineOptions& o) { o.chunk_bytes_to_host = 2048; });
  add("chunk_bytes_to_host", [](EngineOptions& o) { o.chunk_bytes_to_host = o.slot_bytes * 2; });
  add("chunk_bytes_to_host", [](EngineOptions& o) { o.chunk_bytes_to_host = 65536 + 8; });
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needle);
    try {
      Engine e = td_->make_engine(c.o);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
    }
  }
}

TEST_P(EngineTest, StatsDescribeTheEngine) {
  EngineOptions o = options();
  Engine engine = td_->make_engine(o);
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.gather_threads, gather() ? 2 : 0);
  EXPECT_EQ(engine.options().backend, backend());
  EXPECT_FALSE(st.cpus.empty());
  EXPECT_EQ(st.transfers, 0u);
  HostBuffer pool(dev(), 2 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 22);
  DeviceBuffer dst(dev(), 200 * 4096);
  const auto blocks = make_blocks(pool, dst, 200, 4096, true, 23);
  engine.copy_to_device(blocks, td_->cuda_stream()).wait();
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.transfers, 1u);
  EXPECT_EQ(after.blocks, 200u);
  EXPECT_EQ(after.bytes, 200u * 4096);
  if (gather()) {
    EXPECT_EQ(after.staging_bytes, o.staging_bytes);
    EXPECT_EQ(after.slot_bytes, o.slot_bytes);
    EXPECT_GT(after.gather_seconds, 0.0);
  }
}

// Many more transfers than the engine's item ring holds, each small enough to be gathered by the
// submitting thread alone: the ring must keep turning (it once stopped after 4100 of them).
TEST_P(EngineTest, ManySmallTransfersKeepTheRingTurning) {
  Engine engine = td_->make_engine(options());
  HostBuffer src(dev(), 1 << 16, pinned_sources());
  fill_random(src.data(), src.size(), 33);
  DeviceBuffer dst(dev(), 1 << 16);
  const int n = 6000;
  for (int i = 0; i < n; ++i) {
    const BlockCopy b{src.data() + (i % 16) * 4096, dst.data() + (i % 16) * 4096, 4096};
    engine.copy_to_device({&b, 1}, td_->cuda_stream()).wait();
  }
  std::vector<BlockCopy> all;
  for (std::size_t i = 0; i < 16; ++i)
    all.push_back({src.data() + i * 4096, dst.data() + i * 4096, 4096});
  expect_landed(all, dst);
  EXPECT_EQ(engine.stats().transfers, static_cast<std::uint64_t>(n));
}

// Transfers of one chunk: gathered by the submitter alone (inline), or, above
// inline_gather_bytes, by the pool with the submitter, which moves the chunk on its own stream.
// Right after a large transfer (pool awake), from several threads at once, contiguous and scattered
// destinations, with preissue on and off: every byte lands, and work queued on the stream after the
// call sees it.
TEST_P(EngineTest, OneChunkTransfersLandWhoeverGathersThem) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  HostBuffer pool(dev(), 16 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 41);
  DeviceBuffer dst(dev(), 4 << 20);
  for (const bool preissue : {true, false}) {
    SCOPED_TRACE(preissue ? "preissue" : "no preissue");
    detail::Tuning t;
    t.preissue = preissue;
    Engine engine = td_->make_engine(options(), t);
    DeviceBuffer big_dst(dev(), 1024 * 4096);
    const auto big = make_blocks(pool, big_dst, 1024, 4096, false, 42);
    std::uint64_t seed = 43;
    // With the suite's options (16 KB inline, 64 KB first chunk): 8 KB inline, 48 and 64 KB one
    // chunk gathered by the pool, 192 and 256 KB through the lanes.
    for (const std::size_t n : {2, 12, 16, 48, 64}) {
      for (const bool scattered : {false, true}) {
        SCOPED_TRACE(std::to_string(n) + " blocks" + (scattered ? ", scattered" : ""));
        Transfer first = engine.copy_to_device(big, td_->cuda_stream());  // the pool is busy
        DeviceBuffer small_dst(dev(), n * 4096);
        const auto blocks = make_blocks(pool, small_dst, n, 4096, scattered, seed++);
        engine.copy_to_device(blocks, td_->cuda_stream()).wait();
        first.wait();
        expect_landed(blocks, small_dst);
      }
    }
    std::vector<std::thread> threads;
    std::vector<std::vector<BlockCopy>> per(4);
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        detail::StreamHandle s = dev().create_stream();
        for (int round = 0; round < 20; ++round) {
          const std::size_t n = round % 2 == 0 ? 16 : 48;
          std::vector<BlockCopy> blocks;
          for (std::size_t i = 0; i < n; ++i)
            blocks.push_back({pool.data() + ((t * 97 + round * 13 + i * 7) % 4096) * 4096,
                              dst.data() + (t * 64 + i) * 4096, 4096});
          engine.copy_to_device(blocks, static_cast<cudaStream_t>(s)).wait();
          if (round == 19) per[t] = blocks;
        }
        dev().destroy_stream(s);
      });
    for (auto& th : threads) th.join();
    std::vector<BlockCopy> all;
    for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
    expect_landed(all, dst);
  }
}

// Batched placement (Tuning::batch_placement): a lane's scattered chunks are placed
// several to a launch, whose kernel frees their slots in pinned memory. Transfers many times the
// ring (slots reused while the lanes hold unplaced chunks), from several threads, with preissue
// on and off, both ways round the option, and a device-to-host transfer in between (its own
// chunks use events): every byte lands, and with the option fewer launches place the chunks.
TEST_P(EngineTest, BatchedPlacementPlacesSeveralChunksPerLaunch) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  HostBuffer pool(dev(), 24 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 61);
  for (const bool preissue : {true, false})
    for (const bool batch : {true, false}) {
      SCOPED_TRACE(std::string(preissue ? "preissue" : "no preissue") +
                   (batch ? ", batched" : ", per chunk"));
      EngineOptions o = options();
      o.staging_bytes = 2 << 20;  // 32 slots of 64 KB: up to 8 unplaced chunks per lane
      o.slot_bytes = 64 << 10;
      o.first_chunk_bytes = 16 << 10;
      detail::Tuning t;
      t.preissue = preissue;
      t.batch_placement = batch;
      t.placement_chunks = 8;
      t.placement_blocks = preissue ? 32 : 1;
      Engine engine = td_->make_engine(o, t);
      DeviceBuffer dst(dev(), 1536 * 4096);  // 6 MB: three times the ring
      const auto blocks = make_blocks(pool, dst, 1536, 4096, true, 62);
      engine.copy_to_device(blocks, td_->cuda_stream()).wait();
      expect_landed(blocks, dst);
      // Swap-out in between, then several submitters at once.
      HostBuffer back(dev(), 1536 * 4096, true);
      std::vector<BlockCopy> out;
      for (std::size_t i = 0; i < 1536; ++i)
        out.push_back({dst.data() + ((i * 7) % 1536) * 4096, back.data() + i * 4096, 4096});
      engine.copy_to_host(out, td_->cuda_stream()).wait();
      const std::vector<std::byte> placed = td_->read(dst.data(), dst.size());
      for (std::size_t i = 0; i < 1536; ++i)
        ASSERT_EQ(
            std::memcmp(back.data() + i * 4096, placed.data() + ((i * 7) % 1536) * 4096, 4096), 0)
            << "swapped-out block " << i;
      std::vector<std::thread> threads;
      std::vector<std::vector<BlockCopy>> per(3);
      std::deque<DeviceBuffer> dsts;
      for (int t = 0; t < 3; ++t) dsts.emplace_back(dev(), 512 * 4096);
      for (int t = 0; t < 3; ++t)
        threads.emplace_back([&, t] {
          for (int round = 0; round < 4; ++round) {
            per[t] = make_blocks(pool, dsts[t], 512, 4096, true, 70 + t * 10 + round);
            engine.copy_to_device(per[t], td_->cuda_stream()).wait();
          }
        });
      for (auto& th : threads) th.join();
      for (int t = 0; t < 3; ++t) expect_landed(per[t], dsts[t]);
      const detail::TuningStats st = tuning_stats(engine);
      EXPECT_GE(st.scattered_chunks, 96u);
      if (batch && dev().host_pointers_usable()) {
        EXPECT_GT(st.placements, 0u);
        EXPECT_LE(st.placements * 4, st.scattered_chunks) << "several chunks per launch";
      } else {
        EXPECT_EQ(st.placements, 0u);
      }
    }
}

// A swap-in larger than the ring, queued behind 50 ms of other work on the caller's stream: no
// chunk can be placed (and no slot freed) before that work ends, so the call could only have
// returned by leaving the later chunks' slots to the gather threads to wait for (slots_deferred)
// instead of waiting itself. Every byte still lands, as does a swap-in of the same size right
// behind it, on the list path and on a CacheSet's ids.
TEST_P(EngineTest, SwapInLargerThanTheRingLeavesTheSlotWaitsToTheGatherThreads) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  if (!dev().host_pointers_usable())
    GTEST_SKIP() << "no batched placement on this device (no placed flags)";
  HostBuffer pool(dev(), 24 << 20, false);
  fill_random(pool.data(), pool.size(), 63);
  Engine engine =
      td_->make_engine(sixteen_slot_options());  // the transfers below are six times the ring
  DeviceBuffer dst(dev(), 1536 * 4096), dst2(dev(), 1536 * 4096);
  const auto blocks = make_blocks(pool, dst, 1536, 4096, true, 64);
  const auto blocks2 = make_blocks(pool, dst2, 1536, 4096, true, 65);
  dev().delay_async(50000, td_->stream);
  Transfer t1 = engine.copy_to_device(blocks, td_->cuda_stream());
  Transfer t2 = engine.copy_to_device(blocks2, td_->cuda_stream());
  const std::uint64_t deferred = tuning_stats(engine).slots_deferred;
  EXPECT_GT(deferred, 0u) << "the calls waited for slots that only the delayed stream's work frees";
  t1.wait();
  t2.wait();
  expect_landed(blocks, dst);
  expect_landed(blocks2, dst2);
  // The same through a CacheSet: 8 pairs of 192 blocks, every block of every pair in one transfer.
  HostBuffer pinned(dev(), 8 * 384 * 4096, true);
  std::memcpy(pinned.data(), pool.data(), pinned.size());
  std::vector<CachePair> pairs;
  std::deque<DeviceBuffer> caches;
  for (std::size_t i = 0; i < 8; ++i) {
    caches.emplace_back(dev(), 192 * 4096);
    pairs.push_back({{pinned.data() + i * 384 * 4096, 384, 4096, 4096},
                     {caches.back().data(), 192, 4096, 4096}});
  }
  CacheSet set = engine.register_caches(pairs);
  std::vector<std::int64_t> src(192), dst_ids(192);
  for (std::size_t r = 0; r < 192; ++r) {
    src[r] = static_cast<std::int64_t>((r * 37 + 5) % 384);
    dst_ids[r] = static_cast<std::int64_t>((r * 11) % 192);
  }
  dev().delay_async(50000, td_->stream);
  engine.copy_blocks(set, Direction::kToDevice, src, dst_ids, td_->cuda_stream()).wait();
  EXPECT_GT(tuning_stats(engine).slots_deferred, deferred);
  for (std::size_t i = 0; i < 8; ++i) {
    const std::vector<std::byte> got = td_->read(caches[i].data(), caches[i].size());
    for (std::size_t r = 0; r < 192; ++r)
      ASSERT_EQ(std::memcmp(got.data() + dst_ids[r] * 4096,
                            pinned.data() + (i * 384 + src[r]) * 4096, 4096),
                0)
          << "pair " << i << ", row " << r;
  }
}

// Batched packing: a swap-out's chunks of scattered device blocks are packed several to a
// launch. Transfers three times the ring (the submitter sends its pending chunks out before it
// waits for a slot), from several threads at once, on a block list and on a CacheSet's ids:
// every byte lands in its host block, and fewer launches than chunks pack them.
TEST_P(EngineTest, BatchedPackingPacksSeveralChunksPerLaunch) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  constexpr std::size_t kBlocks = 1536;
  DeviceBuffer src(dev(), kBlocks * 4096);
  HostBuffer init(dev(), src.size(), true);
  fill_random(init.data(), init.size(), 66);
  dev().copy_h2d(src.data(), init.data(), src.size(), td_->stream);
  dev().stream_sync(td_->stream);
  // Blocks that differ from the device block they were copied from.
  auto differ = [&](const std::vector<BlockCopy>& v) {
    std::size_t bad = 0;
    for (const BlockCopy& b : v)
      bad += std::memcmp(b.dst, init.data() + (static_cast<const std::byte*>(b.src) - src.data()),
                         b.bytes) != 0;
    return bad;
  };
  {
    EngineOptions o = options();
    o.staging_bytes = 2 << 20;  // 32 slots of 64 KB: a launch takes up to 8 chunks
    o.slot_bytes = 64 << 10;
    o.first_chunk_bytes = 16 << 10;
    detail::Tuning t;
    t.placement_chunks = 8;
    Engine engine = td_->make_engine(o, t);
    // 6 MB of scattered device blocks to scattered host blocks: three times the ring.
    HostBuffer out(dev(), 2 * src.size(), pinned_sources());
    std::vector<BlockCopy> blocks;
    for (std::size_t i = 0; i < kBlocks; ++i)
      blocks.push_back({src.data() + ((i * 7) % kBlocks) * 4096,
                        out.data() + ((i * 613) % kBlocks) * 8192, 4096});
    engine.copy_to_host(blocks, td_->cuda_stream()).wait();
    EXPECT_EQ(differ(blocks), 0u) << "blocks of the one large swap-out";
    // Three submitters at once, each into a host buffer of its own.
    std::deque<HostBuffer> outs;
    for (int t = 0; t < 3; ++t) outs.emplace_back(dev(), 512 * 4096, pinned_sources());
    std::vector<std::vector<BlockCopy>> per(3);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        for (int round = 0; round < 4; ++round) {
          per[t].clear();
          for (std::size_t i = 0; i < 512; ++i)
            per[t].push_back({src.data() + ((i * 11 + t * 97 + round * 31) % kBlocks) * 4096,
                              outs[t].data() + ((i * 5) % 512) * 4096, 4096});
          engine.copy_to_host(per[t], td_->cuda_stream()).wait();
        }
      });
    for (auto& th : threads) th.join();
    for (int t = 0; t < 3; ++t) EXPECT_EQ(differ(per[t]), 0u) << "submitter " << t;
    // A CacheSet of 8 pairs (device caches of 192 blocks out of `src`), every id of every pair in
    // one swap-out planned from the ids.
    HostBuffer host(dev(), 8 * 384 * 4096, true);
    std::vector<CachePair> pairs;
    for (std::size_t i = 0; i < 8; ++i)
      pairs.push_back({{host.data() + i * 384 * 4096, 384, 4096, 4096},
                       {src.data() + i * 192 * 4096, 192, 4096, 4096}});
    CacheSet set = engine.register_caches(pairs);
    std::vector<std::int64_t> dev_ids(192), host_ids(192);
    for (std::size_t r = 0; r < 192; ++r) {
      dev_ids[r] = static_cast<std::int64_t>((r * 11) % 192);
      host_ids[r] = static_cast<std::int64_t>((r * 37 + 5) % 384);
    }
    engine.copy_blocks(set, Direction::kToHost, dev_ids, host_ids, td_->cuda_stream()).wait();
    for (std::size_t i = 0; i < 8; ++i)
      for (std::size_t r = 0; r < 192; ++r)
        ASSERT_EQ(std::memcmp(host.data() + (i * 384 + host_ids[r]) * 4096,
                              init.data() + (i * 192 + dev_ids[r]) * 4096, 4096),
                  0)
            << "pair " << i << ", row " << r;
    const detail::TuningStats st = tuning_stats(engine);
    EXPECT_GE(st.scattered_chunks, 96u);
    EXPECT_GT(st.packings, 0u);
    EXPECT_LE(st.packings * 3, st.scattered_chunks) << "several chunks per launch";
  }
}

// A serving runtime's other threads free device memory while transfers run (torch's caching
// allocator calls cudaFree on empty_cache and after an out-of-memory). cudaFree waits for the
// whole device, and while it does the driver was reported to hold other threads' calls (a lock,
// docs/ARCHITECTURE.md, "No driver call where a flag is owed"). The
// engine's lanes wait on flags its gather threads write (pre-issued DMAs), so a gather thread
// that makes a driver call before writing its flag deadlocks the process: the emulated device
// models that lock (free_waits_for_device); a gather thread's PlacedWait::poll that queried an
// event there would hang. Transfers several times the ring,
// both ways, scattered on the device side, from a pinned pool, while another thread allocates
// and frees device memory without pause: every transfer must land and the freeing thread must
// get through.
TEST_P(EngineTest, DeviceMemoryFreedOnAnotherThreadDuringTransfersDoesNotStallThem) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  open_lock_modelled_device();
  ASSERT_NE(td_, nullptr);
  Engine engine =
      td_->make_engine(sixteen_slot_options());  // each transfer below is six times the ring
  HostBuffer pool(dev(), 24 << 20, true);
  fill_random(pool.data(), pool.size(), 67);
  DeviceBuffer dst(dev(), 1536 * 4096);
  HostBuffer back(dev(), dst.size(), true);
  Freer freer(dev());
  for (std::uint64_t round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto blocks = make_blocks(pool, dst, 1536, 4096, true, 70 + round);
    engine.copy_to_device(blocks, td_->cuda_stream()).wait();
    expect_landed(blocks, dst);
    // And back, from scattered device blocks to scattered host blocks.
    std::vector<BlockCopy> out;
    for (std::size_t i = 0; i < 1536; ++i)
      out.push_back({dst.data() + ((i * 7 + round) % 1536) * 4096,
                     back.data() + ((i * 613) % 1536) * 4096, 4096});
    engine.copy_to_host(out, td_->cuda_stream()).wait();
    const std::vector<std::byte> dev_bytes = td_->read(dst.data(), dst.size());
    std::size_t bad = 0;
    for (const BlockCopy& b : out)
      bad +=
          std::memcmp(b.dst, dev_bytes.data() + (static_cast<const std::byte*>(b.src) - dst.data()),
                      4096) != 0;
    EXPECT_EQ(bad, 0u) << "host blocks that differ from their device block";
  }
  EXPECT_GT(freer.stop(), 0) << "the freeing thread got through while transfers ran";
}

// The same with swap-ins and swap-outs at once, from two threads, so that the gather threads'
// queue holds swap-out chunks (whose DMAs a gather thread must see done before their bytes are
// placed) ahead of swap-in chunks whose pre-issued DMAs wait for flags the gather threads owe:
// the device-to-host poll must make no driver call either (docs/ARCHITECTURE.md, "No driver call
// where a flag is owed").
TEST_P(EngineTest, DeviceMemoryFreedWhileSwapsRunBothWaysAtOnceDoesNotStallThem) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  open_lock_modelled_device();
  ASSERT_NE(td_, nullptr);
  Engine engine =
      td_->make_engine(sixteen_slot_options());  // each transfer below is six times the ring
  HostBuffer pool(dev(), 24 << 20, true);
  fill_random(pool.data(), pool.size(), 71);
  DeviceBuffer in(dev(), 1536 * 4096), out_src(dev(), 1536 * 4096);
  HostBuffer back(dev(), out_src.size(), true);
  // The swap-outs' device blocks: filled before anything is freed.
  const auto seed = make_blocks(pool, out_src, 1536, 4096, false, 72);
  engine.copy_to_device(seed, td_->cuda_stream()).wait();
  const std::vector<std::byte> out_bytes = td_->read(out_src.data(), out_src.size());
  Freer freer(dev());
  std::size_t bad_out = 0;
  std::jthread swapper([&] {  // joined on any way out of the test
    dev().make_current();
    const detail::StreamHandle s = dev().create_stream();  // a stream of its own: both ways at once
    try {
      for (std::uint64_t round = 0; round < 6; ++round) {
        std::vector<BlockCopy> out;
        for (std::size_t i = 0; i < 1536; ++i)
          out.push_back({out_src.data() + ((i * 7 + round) % 1536) * 4096,
                         back.data() + ((i * 613) % 1536) * 4096, 4096});
        engine.copy_to_host(out, static_cast<cudaStream_t>(s)).wait();
        for (const BlockCopy& b : out)
          bad_out +=
              std::memcmp(
                  b.dst, out_bytes.data() + (static_cast<const std::byte*>(b.src) - out_src.data()),
                  4096) != 0;
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "swap-out failed: " << e.what();
    }
    dev().destroy_stream(s);
  });
  for (std::uint64_t round = 0; round < 6; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto blocks = make_blocks(pool, in, 1536, 4096, true, 80 + round);
    engine.copy_to_device(blocks, td_->cuda_stream()).wait();
    expect_landed(blocks, in);
  }
  swapper.join();
  EXPECT_EQ(bad_out, 0u) << "swapped-out host blocks that differ from their device block";
  EXPECT_GT(freer.stop(), 0) << "the freeing thread got through while transfers ran";
}

// Without stream memory operations (or with preissue off) the thread that finishes a chunk
// issues its DMA: the same transfers must land, alone and concurrently.
TEST_P(EngineTest, IssuingFromTheGatherThreadsWorksToo) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  detail::Tuning t;
  t.preissue = false;
  Engine engine = td_->make_engine(options(), t);
  EXPECT_FALSE(tuning_of(engine).preissue);
  HostBuffer pool(dev(), 16 << 20, false);
  fill_random(pool.data(), pool.size(), 31);
  DeviceBuffer dst(dev(), 1536 * 4096);
  const auto big = make_blocks(pool, dst, 1536, 4096, true, 32);  // six times the ring
  engine.copy_to_device(big, td_->cuda_stream()).wait();
  expect_landed(big, dst);
  std::vector<std::thread> threads;
  std::vector<std::vector<BlockCopy>> per(4);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<BlockCopy> blocks;
      for (std::size_t i = 0; i < 384; ++i)
        blocks.push_back(
            {pool.data() + (t * 384 + i) * 8192, dst.data() + (t * 384 + i) * 4096, 4096});
      detail::StreamHandle s = dev().create_stream();
      engine.copy_to_device(blocks, static_cast<cudaStream_t>(s)).wait();
      dev().destroy_stream(s);
      per[t] = blocks;
    });
  for (auto& th : threads) th.join();
  std::vector<BlockCopy> all;
  for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
  expect_landed(all, dst);
  // Both directions at once: the issuer and a device-to-host submitter share the copy lanes.
  std::vector<std::byte> out(dst.size());
  std::vector<BlockCopy> back;
  for (std::size_t i = 0; i < 1536; ++i)
    back.push_back({dst.data() + i * 4096, out.data() + i * 4096, 4096});
  std::thread up([&] { engine.copy_to_host(back, td_->cuda_stream()).wait(); });
  detail::StreamHandle s2 = dev().create_stream();
  DeviceBuffer dst2(dev(), 768 * 4096);
  const auto again2 = make_blocks(pool, dst2, 768, 4096, true, 35);
  engine.copy_to_device(again2, static_cast<cudaStream_t>(s2)).wait();
  up.join();
  dev().destroy_stream(s2);
  expect_landed(again2, dst2);
  const auto now = td_->read(dst.data(), dst.size());
  EXPECT_EQ(std::memcmp(out.data(), now.data(), out.size()), 0) << "device to host differs";
}

// The gather backend hands small all-pinned transfers to the zero-copy kernel when asked to;
// pageable ones still go through staging.
TEST_P(EngineTest, SmallPinnedTransfersCanTakeTheKernel) {
  if (!gather()) GTEST_SKIP() << "a gather-backend option";
  EngineOptions o = options();
  o.kernel_max_bytes = 64 << 10;
  Engine engine = td_->make_engine(o);
  HostBuffer pinned(dev(), 1 << 20, true);
  HostBuffer pageable(dev(), 1 << 20, false);
  fill_random(pinned.data(), pinned.size(), 26);
  fill_random(pageable.data(), pageable.size(), 27);
  DeviceBuffer dst(dev(), 32 * 4096);
  const auto small = make_blocks(pinned, dst, 16, 4096, true, 28);
  engine.copy_to_device(small, td_->cuda_stream()).wait();
  expect_landed(small, dst);
  EXPECT_EQ(engine.stats().chunks, 0u) << "went through staging";
  const auto paged = make_blocks(pageable, dst, 16, 4096, true, 29);
  engine.copy_to_device(paged, td_->cuda_stream()).wait();
  expect_landed(paged, dst);
  const std::uint64_t staged = engine.stats().chunks;
  EXPECT_GE(staged, 1u);
  const auto large = make_blocks(pinned, dst, 32, 4096, false, 30);  // 128 KB: over the limit
  engine.copy_to_device(large, td_->cuda_stream()).wait();
  expect_landed(large, dst);
  EXPECT_GT(engine.stats().chunks, staged);
}

// A serving runtime allocates and frees device memory from other threads while transfers are
// in flight. cudaFree synchronises the device, including the caller's stream, which is held on
// the GPU until the engine issues the transfer's last DMA: the engine's threads must still be
// able to issue it, or this would hang (ctest's timeout would then fail the test).
TEST_P(EngineTest, AllocationsAndFreesElsewhereDuringTransfersDoNotHang) {
  EngineOptions o = options();  // 1 MB ring: the 24 MB transfer cycles through it
  Engine engine = td_->make_engine(o);
  HostBuffer pool(dev(), 48 << 20, pinned_sources());
  fill_random(pool.data(), pool.size(), 24);
  DeviceBuffer dst(dev(), 6144 * 4096);
  const auto blocks = make_blocks(pool, dst, 6144, 4096, true, 25);
  std::atomic<bool> submitted{false};
  std::thread submitter([&] {
    Transfer t = engine.copy_to_device(blocks, td_->cuda_stream());
    submitted = true;
    t.wait();
  });
  int cycles = 0;
  while (!submitted.load() || cycles < 20) {
    void* p = dev().alloc_device(1 << 20);
    dev().free_device(p);
    ++cycles;
  }
  submitter.join();
  expect_landed(blocks, dst);
}

TEST_P(EngineTest, CudaEngineByOrdinalRejectsOutOfRangeDevice) {
  if (kind() != DeviceKind::kCuda)
    GTEST_SKIP() << "CUDA-only: the ordinal is checked by the driver";
  EngineOptions o = options();
  o.device = 4096;
  try {
    Engine e(o);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice);
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, EngineTest,
                         ::testing::Combine(::testing::Values(DeviceKind::kEmulated,
                                                              DeviceKind::kCuda),
                                            ::testing::ValuesIn(kAllBackends)),
                         [](const auto& info) {
                           return to_string(std::get<0>(info.param)) + "_" +
                                  to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace gfd::test
