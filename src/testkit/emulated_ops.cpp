// Emulated device operations: copies, scatter/gather and zero-copy "kernels", flag waits, delays.
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "testkit/emulated_device.hpp"

namespace gfd::detail {

void EmulatedDevice::copy_h2d(void* dst, const void* src, std::size_t bytes, StreamHandle s) {
  enqueue_data(s, "copy_h2d", [=] { std::memcpy(dst, src, bytes); });
}

void EmulatedDevice::copy_d2h(void* dst, const void* src, std::size_t bytes, StreamHandle s) {
  enqueue_data(s, "copy_d2h", [=] { std::memcpy(dst, src, bytes); });
}

void EmulatedDevice::memset_async(void* dst, int value, std::size_t bytes, StreamHandle s) {
  enqueue_data(s, "memset", [=] { std::memset(dst, value, bytes); });
}

namespace {
// The scatter kernel's work: each entry's bytes from `staging` to its destination.
void place_entries(const ScatterEntry* entries, std::uint32_t count, const void* staging) {
  const auto* base = static_cast<const unsigned char*>(staging);
  for (std::uint32_t i = 0; i < count; ++i)
    std::memcpy(reinterpret_cast<void*>(entries[i].dst), base + entries[i].src_offset,
                entries[i].bytes);
}
// The packing kernel's work: each entry's device bytes into `staging` at its offset.
void pack_entries(const ScatterEntry* entries, std::uint32_t count, void* staging) {
  auto* base = static_cast<unsigned char*>(staging);
  for (std::uint32_t i = 0; i < count; ++i)
    std::memcpy(base + entries[i].src_offset, reinterpret_cast<const void*>(entries[i].dst),
                entries[i].bytes);
}
}  // namespace

void EmulatedDevice::scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
                             StreamHandle s) {
  enqueue_data(s, "scatter", [=] { place_entries(entries, count, staging); });
}

void EmulatedDevice::place(PlaceChunk* chunks, std::uint32_t n, std::uint64_t, std::uint32_t,
                           std::uint32_t*, StreamHandle s) {
  // Like the kernel's parameter, the chunks are taken during the call; the entries are read when
  // the "kernel" runs. Its fault-injection name is the scatter kernel's: it does that job.
  std::vector<PlaceChunk> list(chunks, chunks + n);
  std::uint32_t first = 0;
  for (PlaceChunk& c : list) c.first = std::exchange(first, first + c.count);
  enqueue_data(s, "scatter", [list = std::move(list)] {
    for (const PlaceChunk& c : list) place_entries(c.entries, c.count, c.staging);
    for (const PlaceChunk& c : list)
      std::atomic_ref<std::uint64_t>(*c.flag).store(c.value, std::memory_order_release);
  });
}

void EmulatedDevice::gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
                            StreamHandle s) {
  enqueue_data(s, "gather", [=] { pack_entries(entries, count, staging); });
}

void EmulatedDevice::pack(PackChunk* chunks, std::uint32_t n, std::uint64_t, std::uint32_t,
                          StreamHandle s) {
  // As place(): the chunks are taken during the call, their entries read when the "kernel"
  // runs. Its fault-injection name is the packing kernel's (gather): it does that job.
  std::vector<PackChunk> list(chunks, chunks + n);
  std::uint32_t first = 0;
  for (PackChunk& c : list) c.first = std::exchange(first, first + c.count);
  enqueue_data(s, "gather", [list = std::move(list)] {
    for (const PackChunk& c : list) pack_entries(c.entries, c.count, c.staging);
  });
}

void EmulatedDevice::copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
                             std::size_t width, std::size_t rows, bool to_host, StreamHandle s) {
  (void)to_host;
  enqueue_data(s, "copy_2d", [=] {
    for (std::size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<std::byte*>(dst) + r * dpitch,
                  static_cast<const std::byte*>(src) + r * spitch, width);
  });
}

void EmulatedDevice::copy_2d_on_device(const Copy2D* copies, std::size_t count, StreamHandle s) {
  // Taken during the call, as copy_batch's arrays.
  std::vector<Copy2D> list(copies, copies + count);
  enqueue_data(s, "copy_2d_on_device", [list = std::move(list)] {
    for (const Copy2D& c : list)
      for (std::size_t r = 0; r < c.rows; ++r)
        std::memcpy(static_cast<std::byte*>(c.dst) + r * c.dpitch,
                    static_cast<const std::byte*>(c.src) + r * c.spitch, c.width);
  });
}

void EmulatedDevice::copy_batch(void* const* dsts, const void* const* srcs,
                                const std::size_t* sizes, std::size_t count, bool, StreamHandle s) {
  // Like CUDA, take the arrays during the call: the caller may reuse them at once.
  std::vector<ZeroCopyEntry> copies(count);
  for (std::size_t i = 0; i < count; ++i)
    copies[i] = {reinterpret_cast<std::uint64_t>(srcs[i]), reinterpret_cast<std::uint64_t>(dsts[i]),
                 sizes[i]};
  enqueue_data(s, "copy_batch", [copies = std::move(copies)] {
    for (const ZeroCopyEntry& c : copies)
      std::memcpy(reinterpret_cast<void*>(c.dst), reinterpret_cast<const void*>(c.src), c.bytes);
  });
}

void EmulatedDevice::zero_copy(const ZeroCopyEntry* entries, std::uint32_t count, StreamHandle s) {
  // The entries are read when the "kernel" runs, as on the GPU.
  enqueue_data(s, "zero_copy", [=] {
    for (std::uint32_t i = 0; i < count; ++i)
      std::memcpy(reinterpret_cast<void*>(entries[i].dst),
                  reinterpret_cast<const void*>(entries[i].src), entries[i].bytes);
  });
}

namespace {
// One condition for every emulated flag: waits are rare and short.
std::mutex& value_mutex() {
  static std::mutex m;
  return m;
}
std::condition_variable& value_cv() {
  static std::condition_variable cv;
  return cv;
}
}  // namespace

void EmulatedDevice::wait_value_geq(const std::uint64_t* addr, std::uint64_t value,
                                    StreamHandle s) {
  auto* a = const_cast<std::uint64_t*>(addr);
  enqueue(s, [=] {
    std::unique_lock lk(value_mutex());
    value_cv().wait(lk, [&] {
      return std::atomic_ref<std::uint64_t>(*a).load(std::memory_order_acquire) >= value;
    });
  });
}

void EmulatedDevice::signal_value(std::uint64_t* addr, std::uint64_t value) {
  {
    std::lock_guard lk(value_mutex());
    std::atomic_ref<std::uint64_t>(*addr).store(value, std::memory_order_release);
  }
  value_cv().notify_all();
}

void EmulatedDevice::delay_async(std::uint32_t microseconds, StreamHandle s) {
  enqueue(s, [=] { std::this_thread::sleep_for(std::chrono::microseconds(microseconds)); });
}

}  // namespace gfd::detail
