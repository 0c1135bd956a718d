#include "device/cuda_check.hpp"

#include <string>

#include "gfd/error.hpp"

namespace gfd {
namespace detail {

const char* base_name(const char* path) noexcept {
  const char* base = path;
  for (const char* p = path; *p != '\0'; ++p)
    if (*p == '/' || *p == '\\') base = p + 1;
  return base;
}

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // A sticky error poisons the context: say so, the caller cannot recover by retrying.
  const bool sticky = err == cudaErrorIllegalAddress || err == cudaErrorLaunchFailure ||
                      err == cudaErrorHardwareStackError || err == cudaErrorIllegalInstruction ||
                      err == cudaErrorMisalignedAddress || err == cudaErrorInvalidAddressSpace ||
                      err == cudaErrorInvalidPc || err == cudaErrorAssert;
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")" +
                    (sticky ? " [sticky: the CUDA context is unusable]" : "") + " at " +
                    base_name(file) + ":" + std::to_string(line);
  throw Error(ErrorCode::kCuda, msg);
}

}  // namespace detail
}  // namespace gfd
