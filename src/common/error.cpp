#include "gfd/error.hpp"

#include <cstddef>
#include <string>
#include <string_view>

#include "gfd/types.hpp"

namespace gfd {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kCuda:
      return "cuda";
    case ErrorCode::kNoDevice:
      return "no_device";
    case ErrorCode::kSystem:
      return "system";
    case ErrorCode::kShutdown:
      return "shutdown";
  }
  return "unknown";
}

const char* to_string(Backend backend) noexcept {
  switch (backend) {
    case Backend::kGather:
      return "gather";
    case Backend::kBatchAsync:
      return "batch_async";
    case Backend::kPerBlock:
      return "per_block";
    case Backend::kZeroCopyKernel:
      return "zero_copy_kernel";
  }
  return "unknown";
}

namespace {

// The value among `all` whose to_string is `name`; otherwise gfd::Error naming the option, what
// it takes and the names it knows.
template <class E, std::size_t N>
E from_name(std::string_view name, const E (&all)[N], const char* option, const char* what) {
  std::string known;
  for (E e : all) {
    if (name == to_string(e)) return e;
    known += known.empty() ? "" : ", ";
    known += to_string(e);
  }
  throw Error(ErrorCode::kInvalidArgument, std::string(option) + ": '" + std::string(name) +
                                               "' is not " + what + " (known: " + known + ")");
}

}  // namespace

Backend backend_from_string(std::string_view name) {
  return from_name(name, kAllBackends, "backend", "a backend");
}

const char* to_string(StagingWrites writes) noexcept {
  switch (writes) {
    case StagingWrites::kAuto:
      return "auto";
    case StagingWrites::kCldemote:
      return "cldemote";
    case StagingWrites::kStreaming:
      return "streaming";
    case StagingWrites::kPlain:
      return "plain";
  }
  return "unknown";
}

StagingWrites staging_writes_from_string(std::string_view name) {
  return from_name(name, kAllStagingWrites, "staging_writes", "a staging write mode");
}

const char* to_string(HugepageKind kind) noexcept {
  switch (kind) {
    case HugepageKind::kHugetlb:
      return "hugetlb";
    case HugepageKind::kTransparent:
      return "transparent";
    case HugepageKind::kNone:
      return "none";
  }
  return "unknown";
}

}  // namespace gfd
