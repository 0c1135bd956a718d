#include "decode_load.hpp"

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>

#include "bench_cuda.hpp"

namespace gfd::bench::paged {
namespace {

void cublas_check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(call) + ": " + cublasGetStatusString(s) + " (" + file +
                             ":" + std::to_string(line) + ")");
}

#define GFD_BENCH_CUBLAS(call) cublas_check((call), #call, __FILE__, __LINE__)

}  // namespace

DecodeLoad::DecodeLoad(int device, int priority) : device_(device) {
  GFD_BENCH_CUDA(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  // Blocking sync: the load's thread sleeps on its events instead of taking a CPU core from
  // the gather threads.
  GFD_BENCH_CUDA(cudaEventCreateWithFlags(&origin_, cudaEventBlockingSync));
  for (int i = 0; i < kRing; ++i) {
    GFD_BENCH_CUDA(cudaEventCreateWithFlags(&begin_[i], cudaEventBlockingSync));
    GFD_BENCH_CUDA(cudaEventCreateWithFlags(&end_[i], cudaEventBlockingSync));
  }
  make_operands();
  GFD_BENCH_CUBLAS(cublasCreate(&handle_));
  GFD_BENCH_CUBLAS(cublasSetStream(handle_, stream_));
  // A first matmul now: it loads cuBLAS's kernels (a lazy module load synchronises the
  // context, which must not happen while an engine's stream waits on a host flag).
  gemm();
  GFD_BENCH_CUDA(cudaStreamSynchronize(stream_));
}

DecodeLoad::~DecodeLoad() {
  stop_thread();
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
  for (void* m : {a_, b_, c_}) (void)cudaFree(m);
  (void)cudaEventDestroy(origin_);
  for (int i = 0; i < kRing; ++i) {
    (void)cudaEventDestroy(begin_[i]);
    (void)cudaEventDestroy(end_[i]);
  }
  (void)cudaStreamDestroy(stream_);
}

// Random bf16 operands in [-1, 1): tensor-core power (and so clocks) depends on the data.
void DecodeLoad::make_operands() {
  const std::size_t elems = std::size_t{kDim} * kDim;
  std::vector<std::uint16_t> host(elems);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (auto& h : host) {
    const float f = u(rng);
    std::uint32_t bits = 0;
    std::memcpy(&bits, &f, 4);
    h = static_cast<std::uint16_t>(bits >> 16);
  }
  for (void** m : {&a_, &b_, &c_}) {
    GFD_BENCH_CUDA(cudaMalloc(m, elems * 2));
    GFD_BENCH_CUDA(cudaMemcpy(*m, host.data(), elems * 2, cudaMemcpyHostToDevice));
  }
}

void DecodeLoad::start() {
  batches_.clear();
  error_ = nullptr;
  stop_ = false;
  GFD_BENCH_CUDA(cudaEventRecord(origin_, stream_));
  thread_ = std::thread([this] { loop(); });
}

void DecodeLoad::stop() {
  stop_thread();
  if (error_) std::rethrow_exception(error_);
}

double DecodeLoad::mean_ms(cudaEvent_t from, cudaEvent_t to) {
  GFD_BENCH_CUDA(cudaEventSynchronize(from));
  GFD_BENCH_CUDA(cudaEventSynchronize(to));
  const double t0 = elapsed(origin_, from), t1 = elapsed(origin_, to);
  double sum = 0;
  std::size_t count = 0;
  for (auto [a, z] : batches_)
    if (a >= t0 && z <= t1) sum += z - a, ++count;
  return count ? sum / (count * kPerBatch) : -1;
}

void DecodeLoad::gemm() {
  const float alpha = 1.f, beta = 0.f;
  GFD_BENCH_CUBLAS(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, kDim, kDim, kDim, &alpha, a_,
                                CUDA_R_16BF, kDim, b_, CUDA_R_16BF, kDim, &beta, c_, CUDA_R_16BF,
                                kDim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

double DecodeLoad::elapsed(cudaEvent_t a, cudaEvent_t z) {
  float ms = 0;
  GFD_BENCH_CUDA(cudaEventElapsedTime(&ms, a, z));
  return ms;
}

void DecodeLoad::collect(int slot) {
  GFD_BENCH_CUDA(cudaEventSynchronize(end_[slot]));
  batches_.push_back({elapsed(origin_, begin_[slot]), elapsed(origin_, end_[slot])});
}

void DecodeLoad::loop() noexcept {
  std::size_t k = 0;
  try {
    GFD_BENCH_CUDA(cudaSetDevice(device_));
    for (; !stop_.load(std::memory_order_relaxed); ++k) {
      const int slot = static_cast<int>(k % kRing);
      if (k >= kRing) collect(slot);  // its batch of kRing rounds ago is done: reuse its events
      GFD_BENCH_CUDA(cudaEventRecord(begin_[slot], stream_));
      for (int i = 0; i < kPerBatch; ++i) gemm();
      GFD_BENCH_CUDA(cudaEventRecord(end_[slot], stream_));
    }
    for (std::size_t j = k > kRing ? k - kRing : 0; j < k; ++j)
      collect(static_cast<int>(j % kRing));
  } catch (...) {
    error_ = std::current_exception();
    (void)cudaStreamSynchronize(stream_);
  }
}

void DecodeLoad::stop_thread() noexcept {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace gfd::bench::paged
