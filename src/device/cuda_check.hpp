// One macro for every CUDA runtime call: a failure becomes gfd::Error(kCuda) naming the call,
// the CUDA error and the source file's base name:line (never a path of the build machine).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "gfd/error.hpp"

namespace gfd::detail {

// `file` may be a path: only its last component goes into the message.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
// The last component of `path` ("src/x.cpp" -> "x.cpp").
const char* base_name(const char* path) noexcept;

}  // namespace gfd::detail

// __FILE_NAME__ (GCC 12+, Clang) keeps build paths out of the binary; throw_cuda_error strips
// them from __FILE__ elsewhere.
#ifdef __FILE_NAME__
#define GFD_SOURCE_FILE_ __FILE_NAME__
#else
#define GFD_SOURCE_FILE_ __FILE__
#endif

#define GFD_CUDA_CHECK(call)                                                        \
  do {                                                                              \
    const cudaError_t gfd_err_ = (call);                                            \
    if (gfd_err_ != cudaSuccess)                                                    \
      ::gfd::detail::throw_cuda_error(gfd_err_, #call, GFD_SOURCE_FILE_, __LINE__); \
  } while (0)
