// --under-load=decode of gfd_benchmark --layout paged: 4096^3 bf16 matmuls (cuBLAS, ~0.2 ms each
// on an H200) back to back on a stream of its own, enqueued by a thread of its own in batches
// bracketed by CUDA events, so that the mean matmul time of the batches that ran wholly inside a
// window can be read off.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

namespace gfd::bench::paged {

class DecodeLoad {
 public:
  static constexpr int kDim = 4096;
  static constexpr int kPerBatch = 10;  // ~2 ms batches
  static constexpr int kRing = 4;       // batches queued ahead at most

  DecodeLoad(int device, int priority);
  ~DecodeLoad();
  DecodeLoad(const DecodeLoad&) = delete;
  DecodeLoad& operator=(const DecodeLoad&) = delete;

  // Starts enqueuing matmuls back to back.
  void start();

  // Stops the load (rethrowing an error of its thread); its windows are read after.
  void stop();

  // Stops the load without reading it (on an error).
  void halt() noexcept { stop_thread(); }

  // After stop(): the mean milliseconds of one matmul over the batches that ran wholly between
  // the events `from` and `to` (recorded on any stream of the device), or -1 for none.
  double mean_ms(cudaEvent_t from, cudaEvent_t to);

 private:
  void make_operands();
  void gemm();
  static double elapsed(cudaEvent_t a, cudaEvent_t z);
  void collect(int slot);
  void loop() noexcept;
  void stop_thread() noexcept;

  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  void* a_ = nullptr;
  void* b_ = nullptr;
  void* c_ = nullptr;
  cudaEvent_t origin_ = nullptr;
  cudaEvent_t begin_[kRing] = {};
  cudaEvent_t end_[kRing] = {};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::vector<std::pair<double, double>> batches_;  // ms from origin_; read after the join
  std::exception_ptr error_;
};

}  // namespace gfd::bench::paged
