// The address-space property the engine's PageableCache relies on: a 2 MiB region that holds
// device memory holds no host memory the process can read and the driver reports as pageable.
// (The engine remembers pageable memory in whole 2 MiB regions; if device memory could share such
// a region, a device pointer passed as a host address there would be taken for host memory.)
// Checked against the process's own memory map, for device allocations of many sizes made
// between small host allocations, on the emulated device (which reserves device memory as the
// driver does) and on a GPU: cudaMalloc, cudaMallocAsync and the engine's own allocator.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.hpp"

namespace gfd::test {
namespace {

constexpr std::uintptr_t kRegion = std::uintptr_t{2} << 20;
constexpr std::uintptr_t kPage = 4096;

struct Mapping {
  std::uintptr_t begin, end;
  bool readable;
  std::string line;
};

std::vector<Mapping> read_maps() {
  std::vector<Mapping> out;
  std::ifstream f("/proc/self/maps");
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    const std::size_t dash = range.find('-');
    out.push_back({std::stoull(range.substr(0, dash), nullptr, 16),
                   std::stoull(range.substr(dash + 1), nullptr, 16),
                   !perms.empty() && perms[0] == 'r', line});
  }
  return out;
}

// Every page of the 2 MiB region around `p` that the device calls pageable must be unreadable.
void expect_region_clean(detail::Device& dev, const void* p, const std::string& what,
                         const std::vector<Mapping>& maps) {
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(p) & ~(kRegion - 1);
  int bad = 0;
  for (std::uintptr_t q = begin; q < begin + kRegion; q += kPage) {
    const detail::PointerInfo info = dev.query_pointer(reinterpret_cast<const void*>(q));
    if (info.kind != detail::PointerKind::kPageableHost) continue;
    for (const Mapping& m : maps) {
      if (q >= m.begin && q < m.end && m.readable && bad++ < 3)
        ADD_FAILURE() << what << " at " << p << ": page " << reinterpret_cast<void*>(q)
                      << " of its 2 MiB region is readable host memory the driver calls pageable: "
                      << m.line;
    }
  }
}

class DeviceMemoryTest : public ::testing::TestWithParam<DeviceKind> {};

TEST_P(DeviceMemoryTest, DeviceMemoryNeverSharesA2MiBRegionWithPageableHostMemory) {
  if (GetParam() == DeviceKind::kCuda) {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  auto td = open_test_device(GetParam());
  detail::Device& dev = *td->device;
  const std::size_t sizes[] = {256, 4096, 65536, 1 << 20, (2 << 20) + 4096, 64 << 20, 100, 12288};
  std::vector<std::pair<void*, std::string>> device_ptrs;
  std::vector<std::unique_ptr<char[]>> host;  // small host allocations in between, touched
  for (std::size_t bytes : sizes) {
    host.emplace_back(new char[bytes]());
    device_ptrs.emplace_back(dev.alloc_device(bytes),
                             "engine allocation of " + std::to_string(bytes) + " B");
    host.emplace_back(new char[4096]());
  }
  std::vector<void*> runtime_ptrs;
  cudaStream_t stream = nullptr;
  if (GetParam() == DeviceKind::kCuda) {
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    for (std::size_t bytes : sizes) {
      void* p = nullptr;
      ASSERT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
      runtime_ptrs.push_back(p);
      device_ptrs.emplace_back(p, "cudaMalloc of " + std::to_string(bytes) + " B");
      ASSERT_EQ(cudaMallocAsync(&p, bytes, stream), cudaSuccess);
      runtime_ptrs.push_back(p);
      device_ptrs.emplace_back(p, "cudaMallocAsync of " + std::to_string(bytes) + " B");
      host.emplace_back(new char[bytes]());
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  const std::vector<Mapping> maps = read_maps();
  ASSERT_FALSE(maps.empty()) << "/proc/self/maps could not be read";
  for (const auto& [p, what] : device_ptrs) {
    EXPECT_EQ(dev.query_pointer(p).kind, detail::PointerKind::kDevice) << what;
    expect_region_clean(dev, p, what, maps);
  }
  for (std::size_t i = 0; i < std::size(sizes); ++i) dev.free_device(device_ptrs[i].first);
  for (std::size_t i = 0; i < runtime_ptrs.size(); ++i)
    EXPECT_EQ(i % 2 == 0 ? cudaFree(runtime_ptrs[i]) : cudaFreeAsync(runtime_ptrs[i], stream),
              cudaSuccess);
  if (stream != nullptr) {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  }
}

// cudaFree waits for the whole device, so a buffer freed while copies into it are still queued
// is unmapped only after they ran; the emulated device does the same (a test or a runtime's CI
// that drops its buffers with transfers in flight must not see them copy into unmapped pages).
// Pinned host memory unregistered with copies from it queued: on the emulated device, too, they
// run first.
TEST_P(DeviceMemoryTest, FreeingMemoryWaitsForTheCopiesQueuedOnIt) {
  if (GetParam() == DeviceKind::kCuda) {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  testkit::EmulatedOptions emu;
  emu.copy_delay = std::chrono::milliseconds(20);  // the copies are still queued at the free
  auto td = open_test_device(GetParam(), 0, emu);
  detail::Device& dev = *td->device;
  constexpr std::size_t kBytes = 64 << 20;
  std::vector<std::byte> host(kBytes, std::byte{7});
  dev.register_host(host.data(), kBytes);
  const detail::StreamHandle s = dev.create_stream();
  const detail::EventHandle done = dev.create_event(false);
  for (int round = 0; round < 2; ++round) {
    void* p = dev.alloc_device(kBytes);
    for (int i = 0; i < 4; ++i) dev.copy_h2d(p, host.data(), kBytes, s);
    dev.record_event(done, s);
    if (round == 0) {
      dev.free_device(p);
      EXPECT_TRUE(dev.event_done(done))
          << "free_device returned before the copies into the buffer ran";
    } else {
      if (GetParam() == DeviceKind::kEmulated) {
        dev.unregister_host(host.data());
        EXPECT_TRUE(dev.event_done(done))
            << "unregister_host returned before the copies from the memory ran";
      } else {
        dev.stream_sync(s);
        dev.unregister_host(host.data());
      }
      dev.free_device(p);
    }
  }
  dev.destroy_event(done);
  dev.destroy_stream(s);
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceMemoryTest,
                         ::testing::Values(DeviceKind::kEmulated, DeviceKind::kCuda),
                         [](const auto& info) {
                           return info.param == DeviceKind::kCuda ? "Cuda" : "Emulated";
                         });

}  // namespace
}  // namespace gfd::test
