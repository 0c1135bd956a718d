// The bytes of gfd_benchmark --layout paged: every cache filled with a pattern of its own, and
// each method's last transfer checked against the pattern of the blocks it should have moved.
#include <atomic>
#include <cstring>

#include "bench_cuda.hpp"
#include "paged_runner.hpp"
#include "peer_kernels.cuh"

namespace gfd::bench::paged {

void PagedRunner::fill_host_caches() {
  constexpr std::size_t kChunk = std::size_t{8} << 20;
  const std::size_t chunks = (caches->host_bytes + kChunk - 1) / kChunk;
  parallel_for(tensors * chunks, [&](std::size_t i) {
    const std::size_t t = i / chunks, lo = (i % chunks) * kChunk;
    const std::size_t hi = std::min(caches->host_bytes, lo + kChunk);
    auto* w = reinterpret_cast<std::uint64_t*>(caches->host[t]);
    for (std::size_t k = lo / 8; k < hi / 8; ++k) w[k] = pattern_word(host_tag(t), k);
  });
}

void PagedRunner::fill_device_caches() {
  const std::size_t words = caches->device_bytes / 8;
  if (!host_only) {
    for (std::size_t t = 0; t < tensors; ++t)
      GFD_BENCH_CUDA(launch_fill_pattern(reinterpret_cast<std::uint64_t*>(caches->device[t]), words,
                                         0, device_tag(t), stream));
    GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
    return;
  }
  std::vector<std::uint64_t> buf(std::size_t{1} << 17);
  for (std::size_t t = 0; t < tensors; ++t)
    for (std::size_t lo = 0; lo < words; lo += buf.size()) {
      const std::size_t n = std::min(buf.size(), words - lo);
      for (std::size_t k = 0; k < n; ++k) buf[k] = pattern_word(device_tag(t), lo + k);
      dev.copy_h2d(caches->device[t] + lo * 8, buf.data(), n * 8, stream);
      dev.stream_sync(stream);
    }
}

void PagedRunner::poison(const Config& c, bool to_host, const Ids& ids) {
  if (to_host) {
    parallel_for(tensors, [&](std::size_t t) {
      for (std::int64_t h : ids.host) std::memset(caches->host[t] + h * c.size, 0, c.size);
    });
    return;
  }
  for (std::size_t t = 0; t < tensors; ++t)
    dev.memset_async(caches->device[t], 0, caches->device_bytes, stream);
  dev.stream_sync(stream);
}

bool PagedRunner::check(const Config& c, bool to_host, const Ids& ids) {
  const std::size_t words = c.size / 8;
  std::atomic<std::uint64_t> bad{0};
  if (to_host) {
    parallel_for(tensors, [&](std::size_t t) {
      std::uint64_t b = 0;
      for (std::size_t i = 0; i < c.n; ++i) {
        const auto* w =
            reinterpret_cast<const std::uint64_t*>(caches->host[t] + ids.host[i] * c.size);
        const std::uint64_t first = static_cast<std::uint64_t>(ids.device[i]) * words;
        for (std::size_t k = 0; k < words; ++k) b += w[k] != pattern_word(device_tag(t), first + k);
      }
      bad += b;
    });
    return bad == 0;
  }
  if (!host_only) return check_on_gpu(c, ids);
  std::vector<std::uint64_t> back(words);
  for (std::size_t t = 0; t < tensors; ++t)
    for (std::size_t i = 0; i < c.n; ++i) {
      dev.copy_d2h(back.data(), caches->device[t] + ids.device[i] * c.size, c.size, stream);
      dev.stream_sync(stream);
      const std::uint64_t first = static_cast<std::uint64_t>(ids.host[i]) * words;
      for (std::size_t k = 0; k < words; ++k)
        bad += back[k] != pattern_word(host_tag(t), first + k);
    }
  return bad == 0;
}

// On the GPU a kernel compares the device blocks in place (no copy back of 2L caches).
bool PagedRunner::check_on_gpu(const Config& c, const Ids& ids) {
  const std::size_t words = c.size / 8;
  auto* checks = reinterpret_cast<PatternCheck*>(scratch_host_);
  std::size_t k = 0;
  for (std::size_t t = 0; t < tensors; ++t)
    for (std::size_t i = 0; i < c.n; ++i)
      checks[k++] = PatternCheck{
          reinterpret_cast<const std::uint64_t*>(caches->device[t] + ids.device[i] * c.size), words,
          static_cast<std::uint64_t>(ids.host[i]) * words, host_tag(t)};
  GFD_BENCH_CUDA(cudaMemcpyAsync(scratch_device_, scratch_host_, k * sizeof(PatternCheck),
                                 cudaMemcpyHostToDevice, stream));
  GFD_BENCH_CUDA(cudaMemsetAsync(mismatches_device_, 0, 8, stream));
  GFD_BENCH_CUDA(launch_check_pattern(static_cast<const PatternCheck*>(scratch_device_),
                                      static_cast<std::uint32_t>(k), mismatches_device_, stream));
  GFD_BENCH_CUDA(
      cudaMemcpyAsync(mismatches_host_, mismatches_device_, 8, cudaMemcpyDeviceToHost, stream));
  GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
  return *mismatches_host_ == 0;
}

}  // namespace gfd::bench::paged
