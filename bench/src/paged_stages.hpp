// gfd's stages alone for gfd_benchmark --layout paged, so that a stage's cost beside the decode
// load can be told from the whole pipeline's:
//  - gather_only: the engine's gather threads (its count, CPUs, spin, pieces and staging writes)
//    copy the transfer's host blocks into a buffer the size of its ring (to the host: from that
//    buffer into the host blocks); no GPU work;
//  - place_only: gfd's placing kernel moves the transfer's bytes from device staging into their
//    device blocks (to the host: its packing kernel the other way), chunks of the engine's slot
//    size, launched as its copy lanes launch them (as many chunks a launch and thread blocks at
//    most), on a stream of the lanes' highest priority; no host side, no DMA.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "gfd/gfd.hpp"
#include "stage_only.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench::paged {

class Stages {
 public:
  Stages(const testkit::Device& device, const Engine& engine);
  ~Stages();
  Stages(const Stages&) = delete;
  Stages& operator=(const Stages&) = delete;

  // gather_only: copies `blocks` (their host sides) and returns once every byte is copied.
  void gather(const std::vector<BlockCopy>& blocks, bool to_host);
  // Whether the last gather() copied every byte where it belongs.
  bool gathered_right(bool to_host) const;

  // place_only: lays out the transfer's device blocks (outside the timing), then places or packs
  // them on the stage's stream; finish_place() waits for it.
  void prepare_place(const std::vector<const void*>& device_blocks,
                     const std::vector<std::size_t>& sizes);
  void place(bool to_host);
  void finish_place();

 private:
  const testkit::Device& device_;
  const Engine& engine_;
  std::unique_ptr<HostPool> buffer_;       // declared first: outlives the threads that write it
  std::unique_ptr<StageOnly> threads_[2];  // [to_host]
  std::unique_ptr<testkit::StageKernels> kernels_;
  void* staging_ = nullptr;  // device memory for place_only
  std::size_t staging_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  int chunks_per_launch_ = 1, ctas_ = 1;  // the engine's placement_chunks and placement_blocks
  StageOnly& threads(bool to_host);
};

}  // namespace gfd::bench::paged
