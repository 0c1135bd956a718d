// Engines on a machine without a usable GPU, and out of range ordinals: a plain
// ErrorCode::kNoDevice, never a CUDA error code with a path of the build machine. CUDA call
// failures name the call and the source file's base name only.
#include <gtest/gtest.h>

#include <string>

#include "device/cuda_check.hpp"
#include "device/device.hpp"
#include "gfd/gfd.hpp"

namespace gfd {
namespace {

// The plain statement comes first: no driver or GPU, or a driver too old (CUDA's own words after).
void expect_plain_no_device(const std::string& msg) {
  EXPECT_TRUE(msg.rfind("no NVIDIA ", 0) == 0 || msg.rfind("the NVIDIA driver is older", 0) == 0)
      << msg;
}

void expect_no_path(const std::string& msg) {
  EXPECT_EQ(msg.find('/'), std::string::npos) << "a path in: " << msg;
}

TEST(NoDevice, EngineWithoutAGpuSaysSoPlainly) {
  if (detail::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA GPU is present here";
  try {
    Engine engine{EngineOptions{}};
    ADD_FAILURE() << "an engine was created without a GPU";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice) << e.what();
    EXPECT_STREQ(to_string(e.code()), "no_device");
    const std::string msg = e.what();
    expect_plain_no_device(msg);
    expect_no_path(msg);
    // The way forward without a GPU: the emulated device.
    EXPECT_NE(msg.find("emulated device: gfd.testing.emulated_engine()"), std::string::npos) << msg;
  }
}

TEST(NoDevice, OutOfRangeOrdinalIsNoDevice) {
  const int count = detail::cuda_device_count();
  EngineOptions o;
  o.device = count + 7;
  try {
    Engine engine(o);
    ADD_FAILURE() << "an engine was created for device " << o.device;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNoDevice) << e.what();
    const std::string msg = e.what();
    if (count > 0)
      EXPECT_EQ(msg, "CUDA device " + std::to_string(o.device) + " does not exist (" +
                         std::to_string(count) + " visible)");
    else
      expect_plain_no_device(msg);
    expect_no_path(msg);
  }
}

TEST(NoDevice, NegativeOrdinalIsAnInvalidArgument) {
  EngineOptions o;
  o.device = -3;
  try {
    Engine engine(o);
    ADD_FAILURE() << "an engine was created for device -3";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    expect_no_path(e.what());
  }
}

TEST(CudaCheck, NamesTheCallAndTheFileBaseNameOnly) {
  try {
    detail::throw_cuda_error(cudaErrorInvalidValue, "cudaMemcpyAsync(dst, src, n, kind, s)",
                             "/home/builder/gfd/src/cuda_device.cpp", 123);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCuda);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cudaMemcpyAsync(dst, src, n, kind, s) failed: cudaErrorInvalidValue"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(" at cuda_device.cpp:123"), std::string::npos) << msg;
    expect_no_path(msg);
  }
}

TEST(CudaCheck, TheMacroAddsThisFilesBaseName) {
  try {
    GFD_CUDA_CHECK(cudaErrorInvalidValue);
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(" at no_device_test.cpp:"), std::string::npos) << msg;
    expect_no_path(msg);
  }
}

TEST(CudaCheck, BaseName) {
  EXPECT_STREQ(detail::base_name("/a/b/c.cpp"), "c.cpp");
  EXPECT_STREQ(detail::base_name("c.cpp"), "c.cpp");
  EXPECT_STREQ(detail::base_name("a\\b.cu"), "b.cu");
  EXPECT_STREQ(detail::base_name(""), "");
}

}  // namespace
}  // namespace gfd
