// One-off hardware probe for the lent GPU machine (design input, not part of the library).
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("ERR %s: %s line %d\n", #x, cudaGetErrorString(e_), __LINE__); } } while (0)
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }
int main() {
  int dev = 0; CK(cudaSetDevice(dev));
  cudaDeviceProp p{}; CK(cudaGetDeviceProperties(&p, dev));
  printf("name %s sm %d asyncEngines %d\n", p.name, p.multiProcessorCount, p.asyncEngineCount);
  char bus[64]; CK(cudaDeviceGetPCIBusId(bus, 64, dev)); printf("busid %s\n", bus);
  int lo, hi; CK(cudaDeviceGetStreamPriorityRange(&lo, &hi)); printf("prio %d %d\n", lo, hi);
  // memops
  void* fw = nullptr; void* fww = nullptr; cudaDriverEntryPointQueryResult q1, q2;
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &fw, 12000, cudaEnableDefault, &q1));
  CK(cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fww, 12000, cudaEnableDefault, &q2));
  printf("memops entry %p %d %p %d\n", fw, (int)q1, fww, (int)q2);
  int memop = -1;
  {
    void* ga = nullptr; cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &ga, 12000, cudaEnableDefault, &q));
    auto f = (CUresult(*)(int*, CUdevice_attribute, CUdevice))ga;
    f(&memop, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0); printf("memops attr v1 %d\n", memop);
    int w64 = -1; f(&w64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 0); printf("memops64 %d\n", w64);
  }
  cudaStream_t s1, s2; CK(cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, hi)); CK(cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, hi));
  unsigned long long* flag; CK(cudaMalloc(&flag, 8)); CK(cudaMemset(flag, 0, 8));
  {
    auto wr = (CUresult(*)(CUstream, CUdeviceptr, cuuint64_t, unsigned))fw;
    auto wt = (CUresult(*)(CUstream, CUdeviceptr, cuuint64_t, unsigned))fww;
    CUresult r1 = wt((CUstream)s1, (CUdeviceptr)flag, 5, CU_STREAM_WAIT_VALUE_GEQ);
    cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, s1);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    printf("wait r %d, event before write: %s\n", (int)r1, cudaGetErrorString(cudaEventQuery(e)));
    CUresult r2 = wr((CUstream)s2, (CUdeviceptr)flag, 7, 0);
    CK(cudaEventSynchronize(e)); printf("write r %d, event after write: %s\n", (int)r2, cudaGetErrorString(cudaEventQuery(e)));
  }
  // sysfs
  std::string b = bus; for (auto& c : b) c = tolower(c);
  for (std::string f : {"numa_node", "local_cpulist"}) { std::ifstream in("/sys/bus/pci/devices/" + b + "/" + f); std::string s; std::getline(in, s); printf("sysfs %s = '%s'\n", f.c_str(), s.c_str()); }
  printf("hw threads %u\n", std::thread::hardware_concurrency());
  // pinned buffer, chained DMA throughput
  const size_t total = 8 << 20; char* h; CK(cudaHostAlloc((void**)&h, 64 << 20, 0)); memset(h, 1, 64 << 20);
  char* d; CK(cudaMalloc(&d, 64 << 20));
  cudaStream_t ls[3]; for (auto& s : ls) CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, hi));
  cudaEvent_t a, z; cudaEventCreate(&a); cudaEventCreate(&z);
  for (size_t chunk : {size_t(8 << 20), size_t(2 << 20), size_t(1 << 20), size_t(512 << 10), size_t(256 << 10), size_t(128 << 10), size_t(64 << 10)})
    for (int nl : {1, 2, 3}) {
      std::vector<float> t;
      for (int r = 0; r < 25; ++r) {
        size_t off = (r % 4) * total;
        cudaEventRecord(a, ls[0]);
        for (int l = 1; l < nl; ++l) cudaStreamWaitEvent(ls[l], a);
        for (size_t o = 0, i = 0; o < total; o += chunk, ++i) cudaMemcpyAsync(d + o, h + off + o, chunk, cudaMemcpyHostToDevice, ls[i % nl]);
        for (int l = 1; l < nl; ++l) { cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming); cudaEventRecord(e, ls[l]); cudaStreamWaitEvent(ls[0], e); cudaEventDestroy(e); }
        cudaEventRecord(z, ls[0]); cudaEventSynchronize(z); float ms; cudaEventElapsedTime(&ms, a, z); if (r >= 5) t.push_back(ms);
      }
      std::sort(t.begin(), t.end());
      printf("dma chunk %7zu lanes %d: p50 %.1f us = %.1f GB/s\n", chunk, nl, t[t.size() / 2] * 1e3, total / (t[t.size() / 2] * 1e6));
    }
  // API costs
  {
    auto t0 = clk::now(); for (int i = 0; i < 1000; ++i) cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, s1); auto t1 = clk::now();
    cudaStreamSynchronize(s1); printf("memcpyAsync call %.2f us\n", us(t0, t1) / 1000);
    cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    t0 = clk::now(); for (int i = 0; i < 1000; ++i) cudaEventRecord(e, s1); t1 = clk::now(); printf("eventRecord %.2f us\n", us(t0, t1) / 1000);
    t0 = clk::now(); for (int i = 0; i < 1000; ++i) cudaEventQuery(e); t1 = clk::now(); printf("eventQuery %.2f us\n", us(t0, t1) / 1000);
    t0 = clk::now(); for (int i = 0; i < 1000; ++i) cudaStreamWaitEvent(s2, e); t1 = clk::now(); printf("streamWaitEvent %.2f us\n", us(t0, t1) / 1000);
    cudaPointerAttributes at; t0 = clk::now(); for (int i = 0; i < 1000; ++i) cudaPointerGetAttributes(&at, d + i * 64); t1 = clk::now(); printf("ptrattr %.2f us\n", us(t0, t1) / 1000);
    // round trip: small copy and wait
    std::vector<double> rt; for (int i = 0; i < 200; ++i) { auto x = clk::now(); cudaMemcpyAsync(d, h, 65536, cudaMemcpyHostToDevice, s1); cudaEventRecord(e, s1); while (cudaEventQuery(e) == cudaErrorNotReady) {} rt.push_back(us(x, clk::now())); }
    std::sort(rt.begin(), rt.end()); printf("64KB copy+spin roundtrip p50 %.1f us p90 %.1f\n", rt[100], rt[180]);
    rt.clear(); for (int i = 0; i < 200; ++i) { auto x = clk::now(); cudaMemcpyAsync(d, h, 4096, cudaMemcpyHostToDevice, s1); cudaEventRecord(e, s1); while (cudaEventQuery(e) == cudaErrorNotReady) {} rt.push_back(us(x, clk::now())); }
    std::sort(rt.begin(), rt.end()); printf("4KB copy+spin roundtrip p50 %.1f us p90 %.1f\n", rt[100], rt[180]);
  }
  // THP + register + range attrs
  {
    size_t sz = 256 << 20; void* m = mmap(nullptr, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    printf("MAP_HUGETLB %s\n", m == MAP_FAILED ? strerror(errno) : "ok"); if (m != MAP_FAILED) munmap(m, sz);
    m = mmap(nullptr, sz + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char* al = (char*)(((uintptr_t)m + (2 << 20) - 1) & ~uintptr_t((2 << 20) - 1));
    printf("madvise %d\n", madvise(al, sz, MADV_HUGEPAGE)); memset(al, 0, sz);
    auto t0 = clk::now(); CK(cudaHostRegister(al, sz, cudaHostRegisterDefault)); printf("register %.1f ms\n", us(t0, clk::now()) / 1e3);
    cudaPointerAttributes at{}; CK(cudaPointerGetAttributes(&at, al + 12345)); printf("registered type %d dev %d devptr %p host %p\n", at.type, at.device, at.devicePointer, at.hostPointer);
    void* ga = nullptr; cudaDriverEntryPointQueryResult q; CK(cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &ga, 12000, cudaEnableDefault, &q));
    auto f = (CUresult(*)(void*, CUpointer_attribute, CUdeviceptr))ga;
    CUdeviceptr st = 0; size_t rs = 0; CUresult r1 = f(&st, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(al + 12345)); CUresult r2 = f(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)(al + 12345));
    printf("host range r %d %d start %p (al %p) size %zu\n", r1, r2, (void*)st, al, rs);
    r1 = f(&st, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(d + 777)); r2 = f(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)(d + 777));
    printf("dev range r %d %d start %p (d %p) size %zu\n", r1, r2, (void*)st, d, rs);
    r1 = f(&st, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(h + 777)); r2 = f(&rs, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)(h + 777));
    printf("hostalloc range r %d %d start %p (h %p) size %zu\n", r1, r2, (void*)st, h, rs);
    char pg[100]; at = {}; cudaError_t e = cudaPointerGetAttributes(&at, pg); printf("pageable ptrattr %s type %d\n", cudaGetErrorString(e), at.type);
    std::vector<char> big(1 << 20); r1 = f(&st, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)(big.data())); printf("pageable range r %d\n", r1);
    // DMA from THP registered memory
    std::vector<float> t; for (int r = 0; r < 20; ++r) { cudaEventRecord(a, s1); cudaMemcpyAsync(d, al + (r % 8) * (8 << 20), 8 << 20, cudaMemcpyHostToDevice, s1); cudaEventRecord(z, s1); cudaEventSynchronize(z); float ms; cudaEventElapsedTime(&ms, a, z); t.push_back(ms); }
    std::sort(t.begin(), t.end()); printf("thp 8MB dma %.1f GB/s\n", (8 << 20) / (t[10] * 1e6));
    std::ifstream sm("/proc/self/smaps_rollup"); std::string l; while (std::getline(sm, l)) if (l.find("AnonHuge") != std::string::npos) printf("%s\n", l.c_str());
  }
  printf("last %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
