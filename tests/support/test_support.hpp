// Shared helpers of gfd's test suites: the device under test (emulated or CUDA), random data,
// pinned host buffers and device read-back.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.hpp"
#include "engine/engine_core.hpp"
#include "gfd/gfd.hpp"
#include "testkit/testkit.hpp"

namespace gfd::test {

enum class DeviceKind { kEmulated, kCuda };
std::string to_string(DeviceKind k);

// Random bytes (never all zeros) from a fixed seed.
void fill_random(void* p, std::size_t bytes, std::uint64_t seed);
std::vector<std::byte> random_bytes(std::size_t bytes, std::uint64_t seed);

// Page-aligned host memory, optionally registered (pinned) with the device.
class HostBuffer {
 public:
  HostBuffer(detail::Device& d, std::size_t bytes, bool pinned);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  detail::Device& device_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
  bool pinned_ = false;
};

// Device memory freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(detail::Device& d, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  detail::Device& device_;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// The device a parameterised suite runs against, with one stream of the caller's.
struct TestDevice {
  DeviceKind kind;
  testkit::Device facade;                  // the device as the benchmarks and gfd.testing see it
  std::shared_ptr<detail::Device> device;  // the same device, for the tests of internals
  detail::StreamHandle stream = nullptr;

  ~TestDevice();
  // Copies device memory back to the host (synchronously, through `stream`).
  std::vector<std::byte> read(const void* dev, std::size_t bytes);
  void fill(void* dev, int value, std::size_t bytes);
  cudaStream_t cuda_stream() const { return static_cast<cudaStream_t>(stream); }
  // `tuning`: the engine's internal mechanisms (tuning.hpp), for tests that run both branches.
  Engine make_engine(const EngineOptions& options, const detail::Tuning& tuning = {});
};

// Returns nullptr (after GTEST_SKIP in the caller) when the kind is not available here.
std::unique_ptr<TestDevice> open_test_device(DeviceKind kind, int ordinal = 0,
                                             const testkit::EmulatedOptions& emu = {});
// Why a CUDA suite is skipped here, or "" when a GPU is present.
std::string cuda_skip_reason(int needed_devices = 1);

// A suite run once per device kind: SetUp skips the CUDA run where no GPU is visible (with the
// reason) and opens the device into td_.
class DeviceParamTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::kCuda) {
      const std::string why = cuda_skip_reason();
      if (!why.empty()) GTEST_SKIP() << why;
    }
    td_ = open_test_device(GetParam());
    ASSERT_NE(td_, nullptr);
  }
  std::unique_ptr<TestDevice> td_;
};

// The internal mechanisms and their counters of an engine.
inline const detail::Tuning& tuning_of(const Engine& e) {
  return detail::EngineCore::of(e).tuning();
}
inline detail::TuningStats tuning_stats(const Engine& e) {
  return detail::EngineCore::of(e).tuning_stats();
}

// Small engine options for tests: a small ring so that transfers cycle through it.
EngineOptions small_options();

}  // namespace gfd::test
