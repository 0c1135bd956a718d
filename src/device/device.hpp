// The narrow device interface the engine is written against. Two implementations: CUDA
// (cuda_device.cpp) and a host-emulated device (emulated_device.cpp) so that the whole pipeline
// runs and is tested on machines without a GPU.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace gfd::detail {

// Opaque handles: cudaStream_t / cudaEvent_t for CUDA, emulator objects otherwise.
using StreamHandle = void*;
using EventHandle = void*;

enum class PointerKind {
  kPageableHost,  // ordinary host memory the device does not know
  kPinnedHost,    // page-locked host memory (cudaHostAlloc / cudaHostRegister)
  kDevice,        // device memory of this device
  kOtherDevice,   // device memory of another device
  kManaged,       // managed (unified) memory
};

struct PointerInfo {
  PointerKind kind = PointerKind::kPageableHost;
  int device = -1;
  // The allocation the pointer lies in, [begin, end); both 0 when unknown (pageable memory).
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;
};

// One block placed by the scatter kernel: `bytes` bytes from staging offset `src_offset` to
// device address `dst`. Lives in device memory, written by the host into the staging slot.
struct ScatterEntry {
  std::uint64_t dst;
  std::uint64_t src_offset;
  std::uint64_t bytes;
};

// One staged chunk placed by the placing kernel (Device::place): its `count` scatter entries
// (device memory, or pinned host memory the GPU reads at its host address) from the staging
// area `staging`; once every chunk of the launch is placed, `*flag = value` (pinned host memory)
// says that the chunk's slot may be used again. `first`: the entries of the launch's earlier
// chunks (filled in by place()).
struct PlaceChunk {
  const ScatterEntry* entries;
  const void* staging;
  std::uint64_t* flag;
  std::uint64_t value;
  std::uint32_t count;
  std::uint32_t first;
};
// Chunks one launch of the placing kernel takes at most (they travel as its parameter).
inline constexpr std::uint32_t kMaxPlaceChunks = 32;

// One device-to-host chunk packed by the packing kernel (Device::pack): the device bytes of its
// `count` entries (as for gather()) into the device staging area `staging`. `first`: the entries
// of the launch's earlier chunks (filled in by pack()).
struct PackChunk {
  const ScatterEntry* entries;
  void* staging;
  std::uint32_t count;
  std::uint32_t first;
};

// One block copied by the zero-copy kernel: an SM kernel reads `bytes` from pinned host memory
// `src` (through unified addressing) and writes them to device memory `dst`. The entries
// themselves lie in pinned host memory and are read by the kernel the same way.
struct ZeroCopyEntry {
  std::uint64_t src;
  std::uint64_t dst;
  std::uint64_t bytes;
};

// One 2D copy: `rows` rows of `width` bytes, row r from src + r * spitch to dst + r * dpitch.
struct Copy2D {
  void* dst;
  std::size_t dpitch;
  const void* src;
  std::size_t spitch;
  std::size_t width;
  std::size_t rows;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual int ordinal() const = 0;
  // PCI bus id as "dddd:bb:dd.f" in lower case, or "" when there is none (emulated).
  virtual std::string pci_bus_id() const = 0;
  // PCI bus ids of every GPU this process sees (this one included), to split CPUs fairly
  // between their engines; empty when unknown (emulated).
  virtual std::vector<std::string> all_bus_ids() const = 0;
  // Makes this device current for the calling thread.
  virtual void make_current() = 0;
  // The device current for the calling thread (-1 where that means nothing), and back to it:
  // the engine leaves its caller's current device as it found it.
  virtual int current() const = 0;
  virtual void restore_current(int previous) noexcept = 0;

  virtual PointerInfo query_pointer(const void* p) = 0;
  virtual void* alloc_device(std::size_t bytes) = 0;
  virtual void free_device(void* p) noexcept = 0;
  virtual void register_host(void* p, std::size_t bytes) = 0;
  virtual void unregister_host(void* p) noexcept = 0;

  // alloc_device, create_stream and create_event act on this device whatever device is current
  // (CUDA's would follow the current device); streams are non-blocking (no implicit sync with
  // the legacy stream), highest priority.
  virtual StreamHandle create_stream() = 0;
  virtual void destroy_stream(StreamHandle s) noexcept = 0;
  virtual void stream_sync(StreamHandle s) = 0;
  // timing = true: usable with event_elapsed_ms.
  virtual EventHandle create_event(bool timing) = 0;
  virtual void destroy_event(EventHandle e) noexcept = 0;
  virtual void record_event(EventHandle e, StreamHandle s) = 0;
  virtual void stream_wait_event(StreamHandle s, EventHandle e) = 0;
  // True when the last record has completed; throws gfd::Error when it failed.
  virtual bool event_done(EventHandle e) = 0;
  virtual void event_sync(EventHandle e) = 0;
  virtual float event_elapsed_ms(EventHandle start, EventHandle end) = 0;

  virtual void copy_h2d(void* dst, const void* src, std::size_t bytes, StreamHandle s) = 0;
  virtual void copy_d2h(void* dst, const void* src, std::size_t bytes, StreamHandle s) = 0;
  virtual void memset_async(void* dst, int value, std::size_t bytes, StreamHandle s) = 0;
  // Places `count` entries (device memory) from the device staging area `staging`.
  virtual void scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
                       StreamHandle s) = 0;
  // Places `n` (1..kMaxPlaceChunks) staged chunks, `bytes` of data together (which sizes the
  // grid, at most `max_blocks` thread blocks), in one launch and then writes each chunk's flag;
  // `counter` is 4 bytes of zeroed device memory no other stream uses at the same time (the
  // launch's thread blocks count themselves out there, and the last leaves it zero again). The
  // array is read during the call only.
  virtual void place(PlaceChunk* chunks, std::uint32_t n, std::uint64_t bytes,
                     std::uint32_t max_blocks, std::uint32_t* counter, StreamHandle s) = 0;
  // The reverse, for device-to-host transfers: packs each entry's device bytes (at its `dst`
  // field, the device address) into `staging` at its offset.
  virtual void gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
                      StreamHandle s) = 0;
  // Packs `n` (1..kMaxPlaceChunks) device-to-host chunks, `bytes` of data together (which sizes
  // the grid as for place(), at most `max_blocks` thread blocks), in one launch. The array is
  // read during the call only.
  virtual void pack(PackChunk* chunks, std::uint32_t n, std::uint64_t bytes,
                    std::uint32_t max_blocks, StreamHandle s) = 0;
  // Copies `count` blocks with one cudaMemcpyBatchAsync (sources read in stream order), host to
  // device or, with `to_host`, device to host (on a default stream, which that call rejects, one
  // copy at a time). The arrays are read during the call only.
  virtual void copy_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                          std::size_t count, bool to_host, StreamHandle s) = 0;
  // One 2D copy of `rows` rows of `width` bytes: row r from src + r * spitch to dst + r * dpitch
  // (cudaMemcpy2DAsync), host to device or, with `to_host`, device to host. The copy engine
  // moves a constant-stride run of blocks this way at the link rate, where it pays a per-copy
  // cost for each block of a batch.
  virtual void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                       std::size_t width, std::size_t rows, bool to_host, StreamHandle s) = 0;
  // `count` such copies, in any order among themselves (none may write what another reads or
  // writes); the array is read during the call only. A GPU takes them in one driver call
  // (cudaMemcpy3DBatchAsync: a job of 64 blocks, each one 2D copy of its layers' pages, costs
  // one call instead of 64); this default enqueues them one by one.
  virtual void copy_2d_batch(const Copy2D* copies, std::size_t count, bool to_host,
                             StreamHandle s) {
    for (std::size_t i = 0; i < count; ++i) {
      const Copy2D& c = copies[i];
      copy_2d(c.dst, c.dpitch, c.src, c.spitch, c.width, c.rows, to_host, s);
    }
  }
  // `count` 2D copies within this device's memory, in any order among themselves, by the copy
  // engine (no SM); the array is read during the call only.
  virtual void copy_2d_on_device(const Copy2D* copies, std::size_t count, StreamHandle s) = 0;
  // Copies `count` entries (in pinned host memory) with the zero-copy kernel.
  virtual void zero_copy(const ZeroCopyEntry* entries, std::uint32_t count, StreamHandle s) = 0;
  // Whether kernels may read pinned host memory at its host address (zero_copy needs it).
  virtual bool host_pointers_usable() const = 0;
  // Stream memory operations on a 64-bit flag in registered host memory: the engine enqueues a
  // chunk's DMA behind a wait on its slot's flag before the chunk is gathered, and the gather
  // thread that finishes the chunk sets the flag (no driver call on the critical path).
  virtual bool supports_wait_value() const = 0;
  // `s` waits until *addr >= value.
  virtual void wait_value_geq(const std::uint64_t* addr, std::uint64_t value, StreamHandle s) = 0;
  // Sets *addr = value from the host (a release store; the emulated device also wakes its
  // streams).
  virtual void signal_value(std::uint64_t* addr, std::uint64_t value) = 0;
  // Enqueues a write of `value` to registered host memory `addr` on stream `s` (a stream memory
  // operation: what follows the work before it, as a record does). Needs supports_wait_value().
  virtual void write_value(std::uint64_t* addr, std::uint64_t value, StreamHandle s) = 0;
  // Test support: holds the stream for `microseconds` (a spin kernel on a GPU).
  virtual void delay_async(std::uint32_t microseconds, StreamHandle s) = 0;
};

// Makes `device` current for the scope and gives the calling thread its previous device back.
class ScopedCurrentDevice {
 public:
  explicit ScopedCurrentDevice(Device& device) : device_(device), previous_(device.current()) {
    device.make_current();
  }
  ~ScopedCurrentDevice() { device_.restore_current(previous_); }
  ScopedCurrentDevice(const ScopedCurrentDevice&) = delete;
  ScopedCurrentDevice& operator=(const ScopedCurrentDevice&) = delete;

 private:
  Device& device_;
  int previous_;
};

// The CUDA implementation for `ordinal`; throws gfd::Error when the device cannot be used.
std::shared_ptr<Device> make_cuda_device(int ordinal);
// Number of usable CUDA devices (0 when there is no driver or no GPU).
int cuda_device_count() noexcept;

// Waits for an event: spin first (a DMA of one slot lasts tens of microseconds, less than a
// futex round trip), then block in the driver. Throws what the device reports.
inline void wait_event(Device& d, EventHandle e) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  while (!d.event_done(e)) {
    if (std::chrono::steady_clock::now() > until) {
      d.event_sync(e);
      return;
    }
    std::this_thread::yield();
  }
}

}  // namespace gfd::detail
