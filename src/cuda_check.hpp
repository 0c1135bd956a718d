// One macro for every CUDA runtime call: a failure becomes gfd::Error(kCuda) naming the call,
// the CUDA error and file:line.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "gfd/error.hpp"

namespace gfd::detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

}  // namespace gfd::detail

#define GFD_CUDA_CHECK(call)                                                  \
  do {                                                                        \
    const cudaError_t gfd_err_ = (call);                                      \
    if (gfd_err_ != cudaSuccess)                                              \
      ::gfd::detail::throw_cuda_error(gfd_err_, #call, __FILE__, __LINE__);   \
  } while (0)
