// Launchers of gfd's kernels (kernels.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/device.hpp"

namespace gfd::detail {

// Places each entry's bytes from `staging` to its destination.
cudaError_t launch_scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
                           cudaStream_t stream);
// Places `n` chunks (1..kMaxPlaceChunks, `bytes` of data together) in one launch of at most
// `max_blocks` thread blocks, then writes
// each chunk's flag (Device::place). Fills in each chunk's `first`.
cudaError_t launch_place(PlaceChunk* chunks, std::uint32_t n, std::uint64_t bytes,
                         std::uint32_t max_blocks, std::uint32_t* counter, cudaStream_t stream);
// Packs each entry's device bytes (entry.dst holds the device address) into `staging` at the
// entry's offset: the device side of a device-to-host transfer with scattered sources.
cudaError_t launch_gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
                          cudaStream_t stream);
// Packs `n` device-to-host chunks (1..kMaxPlaceChunks, `bytes` of data together) in one launch
// of at most `max_blocks` thread blocks (Device::pack). Fills in each chunk's `first`.
cudaError_t launch_pack(PackChunk* chunks, std::uint32_t n, std::uint64_t bytes,
                        std::uint32_t max_blocks, cudaStream_t stream);
// Copies each entry from pinned host memory to device memory, reading through unified
// addressing (one thread block per entry).
cudaError_t launch_zero_copy(const ZeroCopyEntry* entries, std::uint32_t count,
                             cudaStream_t stream);
// Loads the kernels into the current context (call once per device, before any transfer).
cudaError_t preload_kernels();
// Holds `stream` for about `microseconds` (tests use it to prove stream ordering).
cudaError_t launch_delay(std::uint32_t microseconds, cudaStream_t stream);

}  // namespace gfd::detail
