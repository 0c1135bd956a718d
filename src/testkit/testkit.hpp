// gfd's test-device facade: what the tests, the benchmarks (bench/) and the Python testing module
// (gfd.testing) need and a user program does not. The benchmarks may include this header and the
// public API alone. It gives:
//  - a device (memory, streams, copies) that is either a CUDA GPU or the host-emulated device:
//    device memory is host memory, streams are threads that keep CUDA's ordering, faults can be
//    injected (the real gather threads and staging ring run, with host copies standing in for
//    DMAs);
//  - engines over that device, with the engine's internal mechanisms set (tuning.hpp), and the
//    engine's trace of one transfer's pipeline;
//  - the GPU's locality as gfd sees it, for the benchmarks' topology lines;
//  - the staging write loop itself, for host-memory load probes and gather-only rates, and the
//    engine's piece loops (gather into staging, place from it) over a caller's block list;
//  - gfd::HostPool over this device (on the emulated device too);
//  - the SM copy kernel the benchmarks measure as a peer, and gfd's placing and packing kernels
//    alone for stage-by-stage measurements (a GPU only).
// Everything here is for testing and measurement; none of it is a stable API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/trace_event.hpp"
#include "common/tuning.hpp"
#include "gfd/gfd.hpp"
#include "testkit/emulated_options.hpp"

namespace gfd::detail {
class Device;
class EmulatedDevice;
}  // namespace gfd::detail

namespace gfd::testkit {

using TraceEvent = detail::TraceEvent;

/// Number of usable CUDA GPUs (0 without a driver or GPU; never throws).
int cuda_device_count() noexcept;

/// A GPU, or the host-emulated stand-in for one. Streams are opaque handles (cudaStream_t on a
/// GPU). All calls throw gfd::Error on failure.
class Device {
 public:
  /// The CUDA GPU `ordinal`.
  static Device cuda(int ordinal);
  /// The host-emulated device numbered `ordinal` (device memory is host memory).
  static Device emulated(int ordinal, const EmulatedOptions& options = {});

  bool emulated() const { return emulated_; }
  int ordinal() const;
  /// PCI bus id ("dddd:bb:dd.f"), "" when emulated.
  std::string pci_bus_id() const;
  void make_current();
  cudaStream_t create_stream();
  void destroy_stream(cudaStream_t s);
  void stream_sync(cudaStream_t s);
  void* alloc_device(std::size_t bytes);
  void free_device(void* p);
  void register_host(void* p, std::size_t bytes);
  void unregister_host(void* p);
  void copy_h2d(void* dst, const void* src, std::size_t bytes, cudaStream_t s);
  void copy_d2h(void* dst, const void* src, std::size_t bytes, cudaStream_t s);
  void memset_async(void* dst, int value, std::size_t bytes, cudaStream_t s);
  /// Keeps `s` busy for `microseconds` (a kernel that spins on a GPU).
  void delay_async(std::uint32_t microseconds, cudaStream_t s);
  /// What `p` is to this device: "pageable", "pinned", "device", "other_device" or "managed".
  const char* pointer_kind(const void* p);
  /// Emulated device only: takes [p, p + bytes), memory the caller owns, as device memory until
  /// release_device_memory(p), which returns once the copies queued on it have run.
  void adopt_device_memory(void* p, std::size_t bytes);
  void release_device_memory(void* p);
  /// Emulated device only: leaves the sticky state of an injected fault; its message ("" when
  /// none is in force).
  void clear_fault();
  std::string fault_message() const;
  /// The device behind the facade, for the tests of the library's internals.
  detail::Device& internal() const { return *d_; }
  const std::shared_ptr<detail::Device>& shared() const { return d_; }
  /// An engine over this device (options.device is ignored; the device's ordinal is used), with
  /// the engine's internal mechanisms set as `tuning` says (tuning.hpp).
  Engine make_engine(EngineOptions options, const detail::Tuning& tuning = {}) const;

 private:
  friend HostPool make_host_pool(const Device& device, const HostPoolOptions& options);
  // The emulated device, or gfd::Error naming `call` on a GPU.
  detail::EmulatedDevice& emulator(const char* call) const;
  std::shared_ptr<detail::Device> d_;
  bool emulated_ = false;
};

/// The engine's internal mechanisms in force and their counters.
detail::Tuning tuning_of(const Engine& engine);
detail::TuningStats tuning_stats(const Engine& engine);

/// Tracing of one engine: records up to `capacity` points from now on (0 stops).
void start_trace(Engine& engine, std::size_t capacity);
/// The points recorded since start_trace (DMA completions included), and stops tracing.
std::vector<TraceEvent> take_trace(Engine& engine);

/// The GPU's NUMA node (-1: none reported) and local CPUs, as the engine reads them.
struct Locality {
  int numa_node = -1;
  std::vector<int> cpus;
};
Locality gpu_locality(const Device& device);
/// CPUs this process may run on.
std::vector<int> allowed_cpus();
/// NUMA nodes of this machine (1 without libnuma support).
int numa_nodes();
/// Pins the calling thread to `cpus` (all of them, as the engine pins each gather thread);
/// false when the system refuses. An empty list changes nothing.
bool pin_current_thread(const std::vector<int>& cpus);
/// "0-3,8" for {0,1,2,3,8}.
std::string format_cpulist(const std::vector<int>& cpus);

/// Copies `bytes` from `src` to `dst` the way the gather threads write staging with `writes`
/// (the engine's resolved StagingWrites, as EngineStats reports it).
void copy_like_staging(void* dst, const void* src, std::size_t bytes, StagingWrites writes);

/// One block (or part of one) of a staged piece: `bytes` between host memory and
/// `staging + slot_offset` (src is read when gathering, dst written when placing).
struct StagedBlock {
  const void* src = nullptr;
  void* dst = nullptr;
  std::uint64_t slot_offset = 0;
  std::uint64_t bytes = 0;
};
/// Copies `count` blocks from their `src` into `staging + slot_offset` exactly as a gather thread
/// copies one piece of a host-to-device chunk (the same loop: the next blocks prefetched, the
/// store kind of `writes` resolved as the engine resolves it, streaming stores fenced).
void gather_like_engine(const StagedBlock* blocks, std::size_t count, void* staging,
                        StagingWrites writes);
/// The reverse, as the threads place one piece of a device-to-host chunk: `staging + slot_offset`
/// to each block's `dst`, with the engine's placing stores for `writes`.
void place_like_engine(const StagedBlock* blocks, std::size_t count, const void* staging,
                       StagingWrites writes);

/// A gfd::HostPool made for `device`: its locality and registration go through the facade, so on
/// the emulated device the pool is registered with the emulator (pinned as far as engines over
/// it are concerned) and gets no NUMA locality.
HostPool make_host_pool(const Device& device, const HostPoolOptions& options);

/// Threads of one CTA of the UVA copy kernel: 32 warps, one copy per warp at a time.
inline constexpr int kUvaThreads = 1024;
/// The most CTAs uva_copy takes (a peer measured on a few SMs, not a full-GPU kernel).
inline constexpr int kMaxUvaCtas = 1024;

/// The UVA copy kernel on `ctas` CTAs of kUvaThreads threads on `stream`: `count` copies of
/// `sizes[i]` bytes from `srcs[i]` to `dsts[i]`, either side device memory or pinned host memory
/// (unified addressing), a warp per copy, 16-byte loads with several in flight per lane. The
/// three arrays are read by the kernel as it runs: device or pinned host memory, unchanged until
/// the stream has passed the kernel. A GPU only: gfd::Error on the emulated device, for `ctas`
/// outside [1, kMaxUvaCtas], for a null array, and when the launch fails.
void uva_copy(const Device& device, void* const* dsts, const void* const* srcs,
              const std::uint64_t* sizes, std::size_t count, int ctas, cudaStream_t stream);
/// gfd's SM stages alone, for a benchmark that measures the pipeline stage by stage: the placing
/// kernel (host to device: staged bytes to their device blocks) or the packing kernel (device to
/// host: device blocks into staging) launched as the copy lanes launch them, without the host
/// side or a DMA. The blocks lie in staging in order, cut into chunks of at most `chunk_bytes`
/// (a slot; a larger block is a chunk of its own), several chunks a launch. A GPU only: the
/// constructor throws gfd::Error on the emulated device.
class StageKernels {
 public:
  explicit StageKernels(const Device& device);
  ~StageKernels();
  StageKernels(const StageKernels&) = delete;
  StageKernels& operator=(const StageKernels&) = delete;

  /// Lays out `count` device blocks (`blocks[i]`, `sizes[i]` bytes) in chunks and copies their
  /// entries to device memory (synchronously: outside any timing). Returns the staged bytes.
  std::size_t prepare(const void* const* blocks, const std::size_t* sizes, std::size_t count,
                      std::size_t chunk_bytes);
  /// Every chunk of the last prepare() on `stream`, `chunks_per_launch` chunks (1..32) a launch of
  /// at most `max_ctas` thread blocks (1..32): placed from device memory `staging` into the
  /// blocks, or, with `pack`, packed from the blocks into `staging` (at least the staged bytes).
  void launch(bool pack, void* staging, cudaStream_t stream, int chunks_per_launch, int max_ctas);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

/// Loads the UVA kernel's module now: a lazy module load at its first launch synchronises the
/// context, which would deadlock while an engine's stream waits on a host flag. A GPU only.
void preload_uva_copy(const Device& device);

}  // namespace gfd::testkit
