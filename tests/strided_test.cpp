// Constant-stride runs through the engine: a run goes as one 2D copy beside the staged rest of
// the list, both directions, every byte checked (emulated device, and a GPU where present).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "test_support.hpp"

namespace gfd::test {
namespace {

class StridedTransferTest : public DeviceParamTest {};

// Host blocks at a pitch of 3 blocks go to a contiguous device range, with random blocks before
// and after; then the same device range back to host slots at a pitch of 2.
TEST_P(StridedTransferTest, RunsBesideRandomBlocksBothWays) {
  constexpr std::size_t kB = 4096, kRun = 300, kRandom = 40;
  HostBuffer host(*td_->device, 8 * 1024 * kB, true);
  fill_random(host.data(), host.size(), 11);
  DeviceBuffer dev(*td_->device, (kRun + 2 * kRandom) * kB);
  std::mt19937_64 rng(5);
  std::vector<BlockCopy> in;
  std::byte* d = dev.data();
  auto random_block = [&] {
    in.push_back({host.data() + (4000 + rng() % 4000) * kB, d, kB});
    d += kB;
  };
  for (std::size_t i = 0; i < kRandom; ++i) random_block();
  for (std::size_t i = 0; i < kRun; ++i, d += kB)
    in.push_back({host.data() + (10 + 3 * i) * kB, d, kB});
  for (std::size_t i = 0; i < kRandom; ++i) random_block();
  EngineOptions o = small_options();
  o.strided_min_rows = 128;
  Engine engine = td_->make_engine(o);
  const std::uint64_t direct_before = engine.stats().direct_copies;
  engine.copy_to_device(in, td_->cuda_stream()).wait();
  EXPECT_GE(engine.stats().direct_copies - direct_before, kRun) << "the run went as a 2D copy";
  const auto got = td_->read(dev.data(), dev.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    ASSERT_EQ(std::memcmp(got.data() + i * kB, in[i].src, kB), 0) << "block " << i;

  HostBuffer back(*td_->device, 2 * in.size() * kB, true);
  std::memset(back.data(), 0, back.size());
  std::vector<BlockCopy> out;
  for (std::size_t i = 0; i < in.size(); ++i)
    out.push_back({dev.data() + i * kB, back.data() + 2 * i * kB, kB});
  engine.copy_to_host(out, td_->cuda_stream()).wait();
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(std::memcmp(back.data() + 2 * i * kB, got.data() + i * kB, kB), 0) << "block " << i;
    for (std::size_t k = 0; k < kB; ++k)
      ASSERT_EQ(back.data()[(2 * i + 1) * kB + k], std::byte{0}) << "gap " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, StridedTransferTest,
                         ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) { return to_string(info.param); });

}  // namespace
}  // namespace gfd::test
