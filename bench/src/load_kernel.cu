#include "load_kernel.cuh"

namespace gfd::bench {
namespace {

static_assert((kSinkFloats & (kSinkFloats - 1)) == 0, "kSinkFloats must be a power of two");

__global__ void __launch_bounds__(256) fma_load(float* sink, std::uint32_t iters) {
  // Four independent chains keep the FMA pipes busy; the result is stored only if it takes an
  // impossible value, so the compiler cannot drop the work and nothing is written in practice.
  float a = threadIdx.x * 1e-7f, b = blockIdx.x * 1e-7f, c = 1.0f, d = 0.5f;
  for (std::uint32_t i = 0; i < iters; ++i) {
    a = fmaf(a, 0.999999f, 1e-7f);
    b = fmaf(b, 0.999999f, 1e-7f);
    c = fmaf(c, 0.999999f, 1e-7f);
    d = fmaf(d, 0.999999f, 1e-7f);
  }
  if (a + b + c + d == -1.0f) sink[blockIdx.x & (kSinkFloats - 1)] = a;
}

}  // namespace

int sm_count(int device) {
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  return n;
}

cudaError_t launch_fma_load(float* sink, std::uint32_t iters, std::uint32_t waves, int sms,
                            cudaStream_t stream) {
  const std::uint32_t grid = waves * 8u * static_cast<std::uint32_t>(sms);
  fma_load<<<grid, 256, 0, stream>>>(sink, iters);
  return cudaGetLastError();
}

cudaError_t make_fma_series(float* sink, std::uint32_t iters, std::uint32_t waves, int sms,
                            std::uint32_t kernels, cudaStream_t capture_stream,
                            cudaGraphExec_t* out) {
  *out = nullptr;
  // Thread-local capture: other threads (the engines' gather threads) may call CUDA meanwhile.
  cudaError_t e = cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return e;
  const std::uint32_t grid = waves * 8u * static_cast<std::uint32_t>(sms);
  for (std::uint32_t k = 0; k < kernels; ++k)
    fma_load<<<grid, 256, 0, capture_stream>>>(sink, iters);
  const cudaError_t launched = cudaGetLastError();
  cudaGraph_t graph = nullptr;
  e = cudaStreamEndCapture(capture_stream, &graph);
  if (launched != cudaSuccess || e != cudaSuccess) {
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    return launched != cudaSuccess ? launched : e;
  }
  e = cudaGraphInstantiate(out, graph, 0);
  (void)cudaGraphDestroy(graph);
  return e;
}

}  // namespace gfd::bench
