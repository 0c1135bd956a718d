#include "device/cuda_driver.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "device/cuda_check.hpp"

namespace gfd::detail {
namespace {

template <class F>
void load(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  GFD_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
  if (q != cudaDriverEntryPointSuccess || p == nullptr)
    throw Error(ErrorCode::kCuda, std::string("CUDA driver entry point ") + name + " is missing");
  fn = reinterpret_cast<F>(p);
}

}  // namespace

const DriverApi& driver() {
  static std::once_flag once;
  static DriverApi api;
  std::call_once(once, [] {
    load("cuPointerGetAttributes", api.pointer_get_attributes);
    load("cuStreamWaitValue64", api.wait_value64);
    load("cuStreamWriteValue64", api.write_value64);
    load("cuDeviceGetAttribute", api.device_get_attribute);
  });
  return api;
}

}  // namespace gfd::detail
