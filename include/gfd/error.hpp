// gfd — errors reported by the library.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace gfd {

/// What went wrong, coarsely. The message says exactly what and where.
enum class ErrorCode {
  kInvalidArgument,  ///< a bad block, option or argument; nothing was copied
  kCuda,             ///< a CUDA call failed (the message names the call and file:line)
  kNoDevice,         ///< no CUDA GPU or driver is present, or the requested GPU does not exist
  kSystem,           ///< an operating-system call failed (mmap, mbind, thread creation, ...)
  kShutdown,         ///< the engine was destroyed before the transfer could run
};

/// Returned by error_block() when an error does not concern one block.
inline constexpr std::size_t kNoBlock = static_cast<std::size_t>(-1);

/// The one exception type gfd throws.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, std::size_t block = kNoBlock)
      : std::runtime_error(message), code_(code), block_(block) {}

  ErrorCode code() const noexcept { return code_; }
  /// Index of the offending block in the submitted list, or kNoBlock.
  std::size_t block() const noexcept { return block_; }

 private:
  ErrorCode code_;
  std::size_t block_;
};

/// Short name of an error code ("invalid_argument", "cuda", "no_device", ...).
const char* to_string(ErrorCode code) noexcept;

}  // namespace gfd
