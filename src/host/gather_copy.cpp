#include "host/gather_copy.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define GFD_HAVE_X86 1
#endif

namespace gfd::detail {

StoreKind resolve_staging_writes(StagingWrites requested, CpuStoreFeatures cpu) noexcept {
  const StoreKind without_cldemote = cpu.streaming ? StoreKind::kNonTemporal : StoreKind::kNormal;
  switch (requested) {
    case StagingWrites::kPlain:
      return StoreKind::kNormal;
    // auto: streaming stores where the CPU has them. In the engine CLDEMOTE tied with them host
    // to device and lost device to host, so it is chosen only when asked for.
    case StagingWrites::kAuto:
    case StagingWrites::kStreaming:
      return without_cldemote;
    case StagingWrites::kCldemote:
      break;
  }
  return cpu.cldemote ? StoreKind::kCldemote : without_cldemote;
}

StagingWrites to_public(StoreKind kind) noexcept {
  switch (kind) {
    case StoreKind::kNormal:
      return StagingWrites::kPlain;
    case StoreKind::kNonTemporal:
      return StagingWrites::kStreaming;
    case StoreKind::kCldemote:
      return StagingWrites::kCldemote;
  }
  return StagingWrites::kPlain;
}

namespace {

// Lines copied between demotes in copy_demote: small enough that the lines are still in L1/L2
// when demoted, large enough that the loop costs nothing.
constexpr std::size_t kDemoteStep = std::size_t{16} << 10;
constexpr std::uintptr_t kLine = 64;

}  // namespace

#if GFD_HAVE_X86
namespace {

CpuStoreFeatures detect() noexcept {
  __builtin_cpu_init();  // this runs during static initialisation
  CpuStoreFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) != 0) f.cldemote = ((c >> 25) & 1) != 0;
  f.streaming = __builtin_cpu_supports("avx2") != 0;
  return f;
}

const CpuStoreFeatures kCpu = detect();

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

// The target attribute lets this one function use CLDEMOTE without -mcldemote for the whole
// build; it is only called where CPUID reports the instruction (elsewhere it would run as a
// NOP, but a loop of NOPs is still a loop, and some emulators fault on the encoding).
__attribute__((target("cldemote"))) void cldemote_range(std::uintptr_t begin,
                                                        std::uintptr_t end) noexcept {
  for (std::uintptr_t l = begin; l < end; l += kLine) _cldemote(reinterpret_cast<void*>(l));
}

}  // namespace

CpuStoreFeatures cpu_store_features() noexcept { return kCpu; }

void copy_block(void* dst, const void* src, std::size_t bytes, StoreKind kind) noexcept {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  if (kind == StoreKind::kNonTemporal && kCpu.streaming && bytes >= 256) {
    // Head up to the next 32-byte boundary with memcpy, the body streamed, the tail memcpy.
    const std::size_t head = (32 - (reinterpret_cast<std::uintptr_t>(d) & 31)) & 31;
    const std::size_t body = (bytes - head) & ~std::size_t{127};
    if (head != 0) std::memcpy(d, s, head);
    stream_copy(d + head, s + head, body);
    if (head + body < bytes) std::memcpy(d + head + body, s + head + body, bytes - head - body);
    return;
  }
  if (kind == StoreKind::kCldemote) {
    std::uintptr_t pending = 0;
    copy_demote(d, s, bytes, pending);
    demote_pending(pending);
    return;
  }
  std::memcpy(d, s, bytes);
}

void demote_lines(std::uintptr_t begin, std::uintptr_t end) noexcept {
  if (kCpu.cldemote) cldemote_range(begin, end);
}

void store_fence() noexcept { _mm_sfence(); }

#else

CpuStoreFeatures cpu_store_features() noexcept { return {}; }
void copy_block(void* dst, const void* src, std::size_t bytes, StoreKind) noexcept {
  std::memcpy(dst, src, bytes);
}
void demote_lines(std::uintptr_t, std::uintptr_t) noexcept {}
void store_fence() noexcept { std::atomic_thread_fence(std::memory_order_seq_cst); }

#endif

bool nontemporal_supported() noexcept { return cpu_store_features().streaming; }
bool cldemote_supported() noexcept { return cpu_store_features().cldemote; }

void demote_done(const void* p, std::size_t bytes, std::uintptr_t& pending) noexcept {
  demote_done_with(reinterpret_cast<std::uintptr_t>(p), bytes, pending, demote_lines);
}

void demote_pending(std::uintptr_t& pending) noexcept {
  if (pending != 0) demote_lines(pending, pending + kLine);
  pending = 0;
}

void copy_demote(void* dst, const void* src, std::size_t bytes, std::uintptr_t& pending) noexcept {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  for (std::size_t off = 0; off < bytes; off += kDemoteStep) {
    const std::size_t n = std::min(kDemoteStep, bytes - off);
    std::memcpy(d + off, s + off, n);
    demote_done(d + off, n, pending);
  }
}

}  // namespace gfd::detail
