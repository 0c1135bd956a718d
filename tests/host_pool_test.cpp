// gfd::HostPool: pages, placement, registration and lifetime of a runtime's host KV pool, on the
// emulated device everywhere and on CUDA where a GPU exists; the pool as the source and
// destination of engine transfers, one pool serving two engines.
#include "host/host_pool.hpp"

#include <gtest/gtest.h>
#include <numa.h>
#include <numaif.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "host/host_memory.hpp"
#include "test_support.hpp"

namespace gfd::test {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

class HostPoolTest : public DeviceParamTest {
 protected:
  // The public constructor on CUDA; the same options over the emulated device otherwise.
  HostPool make(const HostPoolOptions& o) {
    if (GetParam() == DeviceKind::kCuda) return HostPool(o);
    return testkit::make_host_pool(td_->facade, o);
  }
  detail::Device& dev() { return *td_->device; }
};

TEST_P(HostPoolTest, ReportsWhatItGot) {
  HostPool pool = make({.bytes = 3 * kMiB + 5, .device = 0});
  ASSERT_NE(pool.data(), nullptr);
  EXPECT_EQ(pool.bytes(), 4 * kMiB) << "rounded up to whole 2 MiB pages";
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(pool.data()) % (2 * kMiB), 0u) << "2 MiB aligned";
  EXPECT_TRUE(pool.registered());
  EXPECT_EQ(pool.device(), 0);
  EXPECT_TRUE(pool.hugepages() == HugepageKind::kHugetlb ||
              pool.hugepages() == HugepageKind::kTransparent ||
              pool.hugepages() == HugepageKind::kNone);
  const detail::PointerInfo info = dev().query_pointer(pool.data() + pool.bytes() - 1);
  EXPECT_EQ(info.kind, detail::PointerKind::kPinnedHost) << "the whole range is registered";
  for (std::size_t i = 0; i < pool.bytes(); i += 4096) ASSERT_EQ(pool.data()[i], std::byte{0}) << i;
  std::memset(pool.data(), 0x5A, pool.bytes());  // writable throughout
}

// The THP policy line as the kernel writes it: the bracketed word is the one in force.
TEST(HostMemoryThp, PolicyNeverMeansNoTransparentHugePages) {
  EXPECT_TRUE(detail::thp_policy_allows_madvise("always [madvise] never"));
  EXPECT_TRUE(detail::thp_policy_allows_madvise("[always] madvise never"));
  EXPECT_FALSE(detail::thp_policy_allows_madvise("always madvise [never]"));
  EXPECT_TRUE(detail::thp_policy_allows_madvise("")) << "no such file: assume the request works";
}

TEST_P(HostPoolTest, SameHugePagesAsTheStagingRing) {
  HostPool pool = make({.bytes = 2 * kMiB, .device = 0});
  Engine engine = td_->make_engine(small_options());
  EXPECT_EQ(pool.hugepages(), engine.stats().hugepages) << "one way of getting pages for both";
  EXPECT_EQ(pool.numa_node(), engine.stats().numa_node) << "the same node as the engine's ring";
}

TEST_P(HostPoolTest, UnregistersOnDestructionAndMoves) {
  std::byte* p = nullptr;
  {
    HostPool a = make({.bytes = kMiB, .device = 0});
    p = a.data();
    HostPool b = std::move(a);
    EXPECT_EQ(a.data(), nullptr) << "a moved-from pool is empty";
    EXPECT_EQ(a.bytes(), 0u);
    EXPECT_FALSE(a.registered());
    EXPECT_EQ(b.data(), p);
    EXPECT_TRUE(b.registered());
    HostPool c = make({.bytes = kMiB, .device = 0});
    c = std::move(b);  // frees c's own memory, takes b's
    EXPECT_EQ(c.data(), p);
    EXPECT_EQ(dev().query_pointer(p).kind, detail::PointerKind::kPinnedHost);
  }
  EXPECT_NE(dev().query_pointer(p).kind, detail::PointerKind::kPinnedHost)
      << "the registration ends with the pool";
}

TEST_P(HostPoolTest, UnregisteredPoolIsPageable) {
  HostPool pool = make({.bytes = kMiB, .device = -1, .register_memory = false});
  EXPECT_FALSE(pool.registered());
  EXPECT_EQ(pool.numa_node(), -1) << "device -1: no locality";
  EXPECT_EQ(dev().query_pointer(pool.data()).kind, detail::PointerKind::kPageableHost);
}

// The pool as the source of swap-ins and the destination of swap-outs, shared by two engines.
TEST_P(HostPoolTest, ServesTwoEngines) {
  constexpr std::size_t kBlock = 4096, kBlocks = 256;
  HostPool pool = make({.bytes = 2 * kBlocks * kBlock, .device = 0});
  fill_random(pool.data(), kBlocks * kBlock, 7);
  Engine first = td_->make_engine(small_options());
  EngineOptions direct = small_options();
  direct.backend = Backend::kBatchAsync;
  Engine second = td_->make_engine(direct);
  DeviceBuffer dst(dev(), kBlocks * kBlock);
  for (Engine* engine : {&first, &second}) {
    td_->fill(dst.data(), 0, dst.size());
    std::vector<BlockCopy> in, out;
    for (std::size_t i = 0; i < kBlocks; ++i) {
      const std::size_t s = (i * 37) % kBlocks;  // scattered over the pool
      in.push_back({pool.data() + s * kBlock, dst.data() + i * kBlock, kBlock});
      out.push_back({dst.data() + i * kBlock, pool.data() + (kBlocks + s) * kBlock, kBlock});
    }
    engine->copy_to_device(in, td_->cuda_stream()).wait();
    const std::vector<std::byte> got = td_->read(dst.data(), dst.size());
    for (std::size_t i = 0; i < kBlocks; ++i)
      ASSERT_EQ(std::memcmp(got.data() + i * kBlock, in[i].src, kBlock), 0) << "block " << i;
    std::memset(pool.data() + kBlocks * kBlock, 0, kBlocks * kBlock);
    engine->copy_to_host(out, td_->cuda_stream()).wait();
    EXPECT_EQ(std::memcmp(pool.data(), pool.data() + kBlocks * kBlock, kBlocks * kBlock), 0)
        << "swapped out back into the pool";
  }
}

TEST_P(HostPoolTest, BindsToTheNodeAskedFor) {
  if (numa_available() < 0) GTEST_SKIP() << "libnuma reports no NUMA support on this machine";
  HostPool pool = make({.bytes = 2 * kMiB, .device = 0, .numa_node = 0, .register_memory = false});
  EXPECT_EQ(pool.numa_node(), 0);
  std::memset(pool.data(), 1, pool.bytes());
  void* page = pool.data();
  int status = -1;
  ASSERT_EQ(numa_move_pages(0, 1, &page, nullptr, &status, 0), 0);
  EXPECT_EQ(status, 0) << "the first page lies on node 0";
  HostPool unbound = make({.bytes = kMiB, .device = 0, .numa_node = -2, .register_memory = false});
  EXPECT_EQ(unbound.numa_node(), -1) << "-2: no binding";
}

TEST_P(HostPoolTest, RejectsBadOptionsNamingThem) {
  auto expect_bad = [&](const HostPoolOptions& o, const std::string& name) {
    try {
      make(o);
      ADD_FAILURE() << "accepted bad " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  expect_bad({.bytes = 0}, "bytes");
  expect_bad({.bytes = kMiB, .device = -2}, "device");
  expect_bad({.bytes = kMiB, .numa_node = -3}, "numa_node");
  expect_bad({.bytes = kMiB, .numa_node = 100000}, "numa_node");
}

INSTANTIATE_TEST_SUITE_P(Devices, HostPoolTest,
                         ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) { return to_string(info.param); });

// The public constructor: without registration it needs no GPU; with it, a clear gfd::Error
// where there is none.
TEST(HostPoolPublic, WithoutRegistrationNeedsNoGpu) {
  HostPool pool(HostPoolOptions{.bytes = kMiB, .device = -1, .register_memory = false});
  EXPECT_EQ(pool.bytes(), 2 * kMiB);
  EXPECT_FALSE(pool.registered());
  pool.data()[pool.bytes() - 1] = std::byte{1};
  // For device 0 too (its locality where the GPU is there, none where it is not).
  HostPool for_gpu(HostPoolOptions{.bytes = kMiB, .device = 0, .register_memory = false});
  EXPECT_FALSE(for_gpu.registered());
  EXPECT_EQ(for_gpu.device(), 0);
}

TEST(HostPoolPublic, RegisteredNeedsAGpu) {
  if (!cuda_skip_reason().empty()) {
    try {
      HostPool pool(kMiB, 0);
      ADD_FAILURE() << "registered a pool without a GPU";
    } catch (const Error& e) {
      EXPECT_NE(e.code(), ErrorCode::kInvalidArgument) << e.what();
      // It says what needs the GPU and how to do without one; it speaks of the pool, not an engine.
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("HostPool: registering the memory with CUDA needs device 0", 0), 0u)
          << msg;
      EXPECT_NE(msg.find("register_memory = false"), std::string::npos) << msg;
      EXPECT_EQ(msg.find("Engine"), std::string::npos) << msg;
    }
    return;
  }
  HostPool pool(kMiB, 0);
  EXPECT_TRUE(pool.registered());
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, pool.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  HostPool any(HostPoolOptions{.bytes = kMiB, .device = -1});
  EXPECT_TRUE(any.registered());
  int after = -1;
  ASSERT_EQ(cudaGetDevice(&after), cudaSuccess);
  EXPECT_EQ(after, current) << "making a pool leaves the caller's current device alone";
}

}  // namespace
}  // namespace gfd::test
