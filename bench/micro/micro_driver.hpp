// The driver-API error check of the GPU yardsticks in bench/micro that call the driver directly
// (stream memory operations, graphs); they link CUDA::cuda_driver.
#pragma once

#include <cuda.h>

#include <stdexcept>
#include <string>

namespace gfd::micro {

inline void drv(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    const char* s = nullptr;
    cuGetErrorString(r, &s);
    throw std::runtime_error(std::string(what) + ": " + (s != nullptr ? s : "?"));
  }
}

}  // namespace gfd::micro
