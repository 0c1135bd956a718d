#include "paged_stages.hpp"

#include "bench_cuda.hpp"

namespace gfd::bench::paged {

Stages::Stages(const testkit::Device& device, const Engine& engine)
    : device_(device), engine_(engine) {}

Stages::~Stages() {
  for (auto& t : threads_) t.reset();
  kernels_.reset();
  if (staging_ != nullptr) (void)cudaFree(staging_);
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

StageOnly& Stages::threads(bool to_host) {
  std::unique_ptr<StageOnly>& t = threads_[to_host ? 1 : 0];
  if (!t) {
    if (!buffer_) buffer_ = std::make_unique<HostPool>(StageOnly::buffer_for(device_, engine_));
    t = std::make_unique<StageOnly>(StageOnly::of_engine(engine_, to_host), buffer_->data(),
                                    buffer_->bytes());
  }
  return *t;
}

void Stages::gather(const std::vector<BlockCopy>& blocks, bool to_host) {
  (void)threads(to_host).run(blocks);
}

bool Stages::gathered_right(bool to_host) const {
  const std::unique_ptr<StageOnly>& t = threads_[to_host ? 1 : 0];
  return t && t->verify();
}

void Stages::prepare_place(const std::vector<const void*>& device_blocks,
                           const std::vector<std::size_t>& sizes) {
  if (!kernels_) {
    kernels_ = std::make_unique<testkit::StageKernels>(device_);
    int least = 0, greatest = 0;
    GFD_BENCH_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    GFD_BENCH_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    const detail::Tuning t = testkit::tuning_of(engine_);
    chunks_per_launch_ = t.placement_chunks;
    ctas_ = t.placement_blocks;
  }
  std::size_t bytes = 0;
  for (std::size_t s : sizes) bytes += s;
  if (bytes > staging_bytes_) {
    if (staging_ != nullptr) GFD_BENCH_CUDA(cudaFree(staging_));
    staging_ = nullptr;
    staging_bytes_ = 0;
    GFD_BENCH_CUDA(cudaMalloc(&staging_, bytes));
    staging_bytes_ = bytes;
  }
  (void)kernels_->prepare(device_blocks.data(), sizes.data(), sizes.size(),
                          engine_.stats().slot_bytes);
}

void Stages::place(bool to_host) {
  kernels_->launch(to_host, staging_, stream_, chunks_per_launch_, ctas_);
}

void Stages::finish_place() { GFD_BENCH_CUDA(cudaStreamSynchronize(stream_)); }

}  // namespace gfd::bench::paged
