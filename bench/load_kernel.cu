#include "load_kernel.cuh"

namespace gfd::bench {
namespace {

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
  if (a + b + c + d == -1.0f) sink[blockIdx.x] = a;
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

}  // namespace gfd::bench
