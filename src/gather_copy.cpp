#include "gather_copy.hpp"

#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define GFD_HAVE_X86 1
#endif

namespace gfd::detail {

#if GFD_HAVE_X86
namespace {

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

// 32-byte aligned destination, any source; `bytes` a multiple of 128.
__attribute__((target("avx2"))) void stream_copy(std::byte* dst, const std::byte* src,
                                                 std::size_t bytes) noexcept {
  for (std::size_t i = 0; i < bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
}

}  // namespace

bool nontemporal_supported() noexcept { return kHaveAvx2; }

void copy_block(void* dst, const void* src, std::size_t bytes, StoreKind kind) noexcept {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (kind == StoreKind::kNonTemporal && kHaveAvx2 && bytes >= 256) {
    // Head up to the next 32-byte boundary with memcpy, the body streamed, the tail memcpy.
    const std::size_t head = (32 - (reinterpret_cast<std::uintptr_t>(d) & 31)) & 31;
    const std::size_t body = (bytes - head) & ~std::size_t{127};
    if (head != 0) std::memcpy(d, s, head);
    stream_copy(d + head, s + head, body);
    if (head + body < bytes) std::memcpy(d + head + body, s + head + body, bytes - head - body);
    return;
  }
  std::memcpy(d, s, bytes);
}

void store_fence() noexcept { _mm_sfence(); }

#else

bool nontemporal_supported() noexcept { return false; }
void copy_block(void* dst, const void* src, std::size_t bytes, StoreKind) noexcept {
  std::memcpy(dst, src, bytes);
}
void store_fence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }

#endif

}  // namespace gfd::detail
