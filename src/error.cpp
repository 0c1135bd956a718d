#include "gfd/error.hpp"

#include "cuda_check.hpp"
#include "gfd/types.hpp"

namespace gfd {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid_argument";
    case ErrorCode::kCuda: return "cuda";
    case ErrorCode::kSystem: return "system";
    case ErrorCode::kShutdown: return "shutdown";
  }
  return "unknown";
}

const char* to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::kGather: return "gather";
  }
  return "unknown";
}

const char* to_string(HugepageKind kind) noexcept {
  switch (kind) {
    case HugepageKind::kHugetlb: return "hugetlb";
    case HugepageKind::kTransparent: return "transparent";
    case HugepageKind::kNone: return "none";
  }
  return "unknown";
}

namespace detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // A sticky error poisons the context: say so, the caller cannot recover by retrying.
  const bool sticky = err == cudaErrorIllegalAddress || err == cudaErrorLaunchFailure ||
                      err == cudaErrorHardwareStackError || err == cudaErrorIllegalInstruction ||
                      err == cudaErrorMisalignedAddress || err == cudaErrorInvalidAddressSpace ||
                      err == cudaErrorInvalidPc || err == cudaErrorAssert;
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")" + (sticky ? " [sticky: the CUDA context is unusable]" : "") +
                    " at " + file + ":" + std::to_string(line);
  throw Error(ErrorCode::kCuda, msg);
}

}  // namespace detail
}  // namespace gfd
