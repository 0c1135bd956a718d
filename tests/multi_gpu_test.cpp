// Several engines in one process, one per device, each driven from its own thread
// (EngineGroup): concurrent transfers land byte-exact, the engines share no CPU, the helper pins
// its threads and reports failures. Emulated devices everywhere; two or more GPUs where present.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>  // operator<< of std::thread::id, for EXPECT_NE

#include "host/topology.hpp"
#include "test_support.hpp"

namespace gfd::test {
namespace {

class MultiEngineTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  static constexpr int kDevices = 2;

  void SetUp() override {
    if (GetParam() == DeviceKind::kCuda) {
      const std::string why = cuda_skip_reason(kDevices);
      if (!why.empty()) GTEST_SKIP() << why;
    }
    for (int d = 0; d < kDevices; ++d) {
      devices_.push_back(open_test_device(GetParam(), d));
      ASSERT_NE(devices_.back(), nullptr);
    }
  }

  // One engine per device, all of `backend`.
  EngineGroup make_group(Backend backend) {
    std::vector<Engine> engines;
    for (auto& td : devices_) {
      EngineOptions o = small_options();
      o.backend = backend;
      engines.push_back(td->make_engine(o));
    }
    return EngineGroup(std::move(engines));
  }

  std::vector<std::unique_ptr<TestDevice>> devices_;
};

// Every device at once, many rounds, random scattered blocks: each device's bytes exact.
TEST_P(MultiEngineTest, ConcurrentTransfersOnEveryDeviceLandExactly) {
  for (Backend backend : {Backend::kGather, Backend::kZeroCopyKernel, Backend::kBatchAsync}) {
    SCOPED_TRACE(to_string(backend));
    EngineGroup group = make_group(backend);
    constexpr std::size_t kBlocks = 512, kSize = 4096;
    std::vector<std::unique_ptr<HostBuffer>> pools;
    std::vector<std::unique_ptr<DeviceBuffer>> dsts;
    for (auto& td : devices_) {
      pools.push_back(std::make_unique<HostBuffer>(*td->device, 8 << 20, true));
      fill_random(pools.back()->data(), pools.back()->size(), 40 + pools.size());
      dsts.push_back(std::make_unique<DeviceBuffer>(*td->device, kBlocks * kSize));
    }
    std::vector<std::vector<BlockCopy>> last(devices_.size());
    group.run([&](std::size_t i, Engine& e) {
      std::mt19937_64 rng(100 + i);
      TestDevice& td = *devices_[i];
      for (int round = 0; round < 10; ++round) {
        std::vector<std::size_t> order(kBlocks);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<BlockCopy> blocks(kBlocks);
        const std::size_t slots = pools[i]->size() / (2 * kSize);
        for (std::size_t k = 0; k < kBlocks; ++k)
          blocks[k] = {pools[i]->data() + (rng() % slots) * 2 * kSize,
                       dsts[i]->data() + order[k] * kSize, kSize};
        e.copy_to_device(blocks, td.cuda_stream()).wait();
        last[i] = blocks;
      }
    });
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      const auto got = devices_[i]->read(dsts[i]->data(), dsts[i]->size());
      std::size_t bad = 0;
      for (const BlockCopy& b : last[i])
        bad += std::memcmp(got.data() + (static_cast<const std::byte*>(b.dst) - dsts[i]->data()),
                           b.src, kSize) != 0;
      EXPECT_EQ(bad, 0u) << "device " << i << ": blocks that differ";
      EXPECT_EQ(group[i].stats().transfers, 10u);
    }
  }
}

// The helper runs each callable on its own thread, pinned to its engine's CPUs.
TEST_P(MultiEngineTest, RunPinsEachThreadToItsEngineCpus) {
  EngineGroup group = make_group(Backend::kGather);
  std::vector<std::vector<int>> seen(group.size());
  std::vector<std::thread::id> ids(group.size());
  group.run([&](std::size_t i, Engine&) {
    cpu_set_t set;
    CPU_ZERO(&set);
    ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) seen[i].push_back(c);
    ids[i] = std::this_thread::get_id();
  });
  for (std::size_t i = 0; i < group.size(); ++i)
    EXPECT_EQ(seen[i], group[i].stats().cpus) << "engine " << i;
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[0], std::this_thread::get_id());
}

// GPUs that share CPUs split them: the gather engines of one process never overlap.
TEST_P(MultiEngineTest, GatherEnginesOfOneProcessShareNoCpu) {
  if (GetParam() == DeviceKind::kEmulated)
    GTEST_SKIP() << "emulated devices have no PCI locality to split";
  EngineGroup group(visible_devices(), small_options());
  for (std::size_t i = 0; i < group.size(); ++i)
    for (std::size_t j = 0; j < i; ++j) {
      const auto a = group[i].stats().cpus, b = group[j].stats().cpus;
      std::vector<int> common;
      std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
      EXPECT_TRUE(common.empty()) << "engines " << j << " and " << i << " share CPUs "
                                  << detail::format_cpulist(common);
    }
}

// An engine works on its own GPU whatever device is current, and leaves the caller's current
// device as it was (a runtime thread may drive several GPUs).
TEST_P(MultiEngineTest, EnginesIgnoreAndKeepTheCallersCurrentDevice) {
  EngineGroup group = make_group(Backend::kGather);
  HostBuffer pool(*devices_[0]->device, 1 << 20, false);
  fill_random(pool.data(), pool.size(), 80);
  DeviceBuffer dst(*devices_[0]->device, 64 * 4096);
  devices_[1]->device->make_current();
  const int before = devices_[1]->device->current();
  std::vector<BlockCopy> v;
  for (std::size_t i = 0; i < 64; ++i)
    v.push_back({pool.data() + i * 8192, dst.data() + i * 4096, 4096});
  group[0].copy_to_device(v, devices_[0]->cuda_stream()).wait();
  EXPECT_EQ(devices_[1]->device->current(), before);
  const auto got = devices_[0]->read(dst.data(), dst.size());
  for (std::size_t i = 0; i < 64; ++i)
    ASSERT_EQ(std::memcmp(got.data() + i * 4096, pool.data() + i * 8192, 4096), 0) << "block " << i;
}

TEST_P(MultiEngineTest, RunRethrowsTheFirstFailureAfterJoiningEveryThread) {
  EngineGroup group = make_group(Backend::kGather);
  std::atomic<int> finished{0};
  try {
    group.run([&](std::size_t i, Engine&) {
      if (i == 1) throw std::runtime_error("worker 1 failed");
      ++finished;
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "worker 1 failed");
  }
  EXPECT_EQ(finished.load(), static_cast<int>(group.size()) - 1);
}

INSTANTIATE_TEST_SUITE_P(Devices, MultiEngineTest,
                         ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) { return to_string(info.param); });

TEST(EngineGroupTest, RepeatedDeviceIsRejected) {
  const int devices[] = {0, 0};
  try {
    EngineGroup g(devices);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("GPU 0 appears twice"), std::string::npos) << e.what();
  }
}

TEST(EngineGroupTest, VisibleDevicesMatchesTheDriver) {
  EXPECT_EQ(static_cast<int>(visible_devices().size()), detail::cuda_device_count());
}

}  // namespace
}  // namespace gfd::test
