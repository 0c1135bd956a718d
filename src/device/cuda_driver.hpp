// Driver entry points reached through the runtime (cudaGetDriverEntryPointByVersion), so that
// libgfd never links libcuda directly and programs still start on machines without a driver.
#pragma once

#include <cuda.h>

namespace gfd::detail {

struct DriverApi {
  using PointerGetAttributes = CUresult (*)(unsigned, CUpointer_attribute*, void**, CUdeviceptr);
  using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
  using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);
  PointerGetAttributes pointer_get_attributes = nullptr;
  WaitValue64 wait_value64 = nullptr;
  WriteValue64 write_value64 = nullptr;
  DeviceGetAttribute device_get_attribute = nullptr;
};

// The entry points, looked up on first use; throws gfd::Error (kCuda) naming one that is missing.
const DriverApi& driver();

}  // namespace gfd::detail
