// gfd's placing and packing kernels alone (testkit::StageKernels): the SM side of the pipeline,
// launched over chunks laid out as the staging ring lays them out, so that a benchmark can
// measure what that stage costs a model's kernels without the gather threads or the DMAs.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <vector>

#include "device/cuda_check.hpp"
#include "device/device.hpp"
#include "device/kernels.cuh"
#include "gfd/error.hpp"
#include "testkit/testkit.hpp"

namespace gfd::testkit {

struct StageKernels::State {
  struct Chunk {
    std::uint32_t first = 0;  // its first entry
    std::uint32_t count = 0;
    std::uint64_t offset = 0;  // where it starts in staging
    std::uint64_t bytes = 0;
  };
  std::vector<detail::ScatterEntry> entries;
  std::vector<Chunk> chunks;
  detail::ScatterEntry* device_entries = nullptr;
  std::size_t capacity = 0;        // entries device_entries holds
  std::uint64_t* flags = nullptr;  // pinned: one per chunk of a launch
  std::uint32_t* counter = nullptr;
  std::uint64_t value = 0;

  ~State() {
    (void)cudaFree(device_entries);
    (void)cudaFreeHost(flags);
    (void)cudaFree(counter);
  }
};

StageKernels::StageKernels(const Device& device) : s_(std::make_unique<State>()) {
  if (device.emulated())
    throw Error(ErrorCode::kInvalidArgument,
                "StageKernels: gfd's placing and packing kernels need a CUDA GPU, and this device "
                "is the emulated one");
  GFD_CUDA_CHECK(detail::preload_kernels());
  GFD_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&s_->flags),
                               detail::kMaxPlaceChunks * sizeof(std::uint64_t),
                               cudaHostAllocMapped));
  GFD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s_->counter), sizeof(std::uint32_t)));
  GFD_CUDA_CHECK(cudaMemset(s_->counter, 0, sizeof(std::uint32_t)));
}

StageKernels::~StageKernels() = default;

std::size_t StageKernels::prepare(const void* const* blocks, const std::size_t* sizes,
                                  std::size_t count, std::size_t chunk_bytes) {
  State& s = *s_;
  s.entries.clear();
  s.chunks.clear();
  std::uint64_t staged = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (s.chunks.empty() ||
        (s.chunks.back().bytes + sizes[i] > chunk_bytes && s.chunks.back().count != 0)) {
      State::Chunk c;
      c.first = static_cast<std::uint32_t>(i);
      c.offset = staged;
      s.chunks.push_back(c);
    }
    State::Chunk& c = s.chunks.back();
    s.entries.push_back({reinterpret_cast<std::uint64_t>(blocks[i]), c.bytes, sizes[i]});
    c.bytes += sizes[i];
    ++c.count;
    staged += sizes[i];
  }
  if (s.entries.size() > s.capacity) {
    (void)cudaFree(s.device_entries);
    s.device_entries = nullptr;
    s.capacity = 0;
    GFD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.device_entries),
                              s.entries.size() * sizeof(detail::ScatterEntry)));
    s.capacity = s.entries.size();
  }
  GFD_CUDA_CHECK(cudaMemcpy(s.device_entries, s.entries.data(),
                            s.entries.size() * sizeof(detail::ScatterEntry),
                            cudaMemcpyHostToDevice));
  return staged;
}

void StageKernels::launch(bool pack, void* staging, cudaStream_t stream, int chunks_per_launch,
                          int max_ctas) {
  if (chunks_per_launch < 1 || chunks_per_launch > static_cast<int>(detail::kMaxPlaceChunks) ||
      max_ctas < 1 || max_ctas > 32)
    throw Error(ErrorCode::kInvalidArgument,
                "StageKernels::launch: chunks_per_launch " + std::to_string(chunks_per_launch) +
                    " and max_ctas " + std::to_string(max_ctas) + " must be in 1..32");
  State& s = *s_;
  auto* base = static_cast<unsigned char*>(staging);
  const auto per = static_cast<std::size_t>(chunks_per_launch);
  for (std::size_t k = 0; k < s.chunks.size(); k += per) {
    const auto n = static_cast<std::uint32_t>(std::min(per, s.chunks.size() - k));
    std::uint64_t bytes = 0;
    if (pack) {
      detail::PackChunk pc[detail::kMaxPlaceChunks];
      for (std::uint32_t j = 0; j < n; ++j) {
        const State::Chunk& c = s.chunks[k + j];
        pc[j] = {s.device_entries + c.first, base + c.offset, c.count, 0};
        bytes += c.bytes;
      }
      GFD_CUDA_CHECK(
          detail::launch_pack(pc, n, bytes, static_cast<std::uint32_t>(max_ctas), stream));
    } else {
      detail::PlaceChunk pc[detail::kMaxPlaceChunks];
      ++s.value;
      for (std::uint32_t j = 0; j < n; ++j) {
        const State::Chunk& c = s.chunks[k + j];
        pc[j] = {s.device_entries + c.first, base + c.offset, s.flags + j, s.value, c.count, 0};
        bytes += c.bytes;
      }
      GFD_CUDA_CHECK(detail::launch_place(pc, n, bytes, static_cast<std::uint32_t>(max_ctas),
                                          s.counter, stream));
    }
  }
}

}  // namespace gfd::testkit
