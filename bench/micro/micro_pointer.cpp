// micro_pointer: what classifying a host or device pointer costs (the planner asks the driver
// once per allocation it has not seen in the transfer; pageable memory has no allocation range,
// so a pageable pool costs one query per page a transfer touches).
//
// Queries a random page of a 1 GiB pageable mapping, of 256 MiB of registered (pinned) host
// memory, or of 256 MiB of device memory; through the engine's classifier (cuPointerGetAttributes
// with five attributes) and through cuPointerGetAttribute with the memory type alone; on 1..N
// threads at once (whether the driver's lookup scales). Needs a GPU: without one every case
// reports the reason and is skipped.
#include <benchmark/benchmark.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "device/device.hpp"

namespace {

constexpr std::size_t kPage = 4096;

struct Fixture {
  std::shared_ptr<gfd::detail::Device> dev;
  std::byte* pageable = nullptr;
  std::size_t pageable_bytes = std::size_t{1} << 30;
  std::byte* pinned = nullptr;
  std::byte* device = nullptr;
  std::size_t small_bytes = std::size_t{256} << 20;
  using GetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
  GetAttribute get_attribute = nullptr;
  std::string error;

  Fixture() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
      error = "no CUDA device";
      return;
    }
    dev = gfd::detail::make_cuda_device(0);
    void* p =
        mmap(nullptr, pageable_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void* q =
        mmap(nullptr, small_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || q == MAP_FAILED) {
      error = "mmap failed";
      return;
    }
    pageable = static_cast<std::byte*>(p);
    pinned = static_cast<std::byte*>(q);
    dev->register_host(pinned, small_bytes);
    device = static_cast<std::byte*>(dev->alloc_device(small_bytes));
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult r{};
    if (cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000, cudaEnableDefault,
                                         &r) == cudaSuccess &&
        r == cudaDriverEntryPointSuccess)
      get_attribute = reinterpret_cast<GetAttribute>(fn);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

enum Memory { kPageable, kPinned, kDevice };

const std::byte* region(const Fixture& f, Memory m, std::size_t& bytes) {
  bytes = m == kPageable ? f.pageable_bytes : f.small_bytes;
  return m == kPageable ? f.pageable : m == kPinned ? f.pinned : f.device;
}

template <bool kAllAttributes>
void BM_Query(benchmark::State& state) {
  Fixture& f = fixture();
  if (!f.error.empty() || (!kAllAttributes && f.get_attribute == nullptr)) {
    state.SkipWithError(f.error.empty() ? "cuPointerGetAttribute not found" : f.error.c_str());
    return;
  }
  std::size_t bytes = 0;
  const std::byte* base = region(f, static_cast<Memory>(state.range(0)), bytes);
  const std::size_t pages = bytes / kPage;
  std::uint64_t x = 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(state.thread_index() + 1);
  std::uint64_t sink = 0;
  for (auto _ : state) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    const std::byte* p = base + (x % pages) * kPage;
    if constexpr (kAllAttributes) {
      sink += static_cast<std::uint64_t>(f.dev->query_pointer(p).kind);
    } else {
      unsigned type = 0;
      if (f.get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                          reinterpret_cast<CUdeviceptr>(p)) == CUDA_SUCCESS)
        sink += type;
    }
  }
  benchmark::DoNotOptimize(sink);
  state.SetItemsProcessed(state.iterations());
  state.SetLabel(state.range(0) == kPageable ? "pageable"
                 : state.range(0) == kPinned ? "pinned"
                                             : "device");
}

void threads(benchmark::internal::Benchmark* b) {
  b->ArgName("memory")->Arg(kPageable)->Arg(kPinned)->Arg(kDevice)->UseRealTime();
  for (int t : {1, 2, 4, 8, 15}) b->Threads(t);
}

BENCHMARK(BM_Query<true>)->Name("BM_QueryPointer/five_attributes")->Apply(threads);
BENCHMARK(BM_Query<false>)->Name("BM_QueryPointer/memory_type_only")->Apply(threads);

}  // namespace

BENCHMARK_MAIN();
