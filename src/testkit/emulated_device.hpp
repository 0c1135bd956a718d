// A host-emulated device: "device memory" is host memory, streams are threads that run their
// operations in order and asynchronously to the caller, events behave as CUDA's do. The engine's
// whole pipeline runs on it, so it is tested without a GPU.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "device/device.hpp"
#include "testkit/emulated_options.hpp"

namespace gfd::detail {

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(int ordinal = 0, testkit::EmulatedOptions options = {});
  ~EmulatedDevice() override;

  int ordinal() const override { return ordinal_; }
  std::string pci_bus_id() const override { return {}; }
  std::vector<std::string> all_bus_ids() const override { return {}; }
  void make_current() override {}
  int current() const override { return -1; }
  void restore_current(int) noexcept override {}

  PointerInfo query_pointer(const void* p) override;
  void* alloc_device(std::size_t bytes) override;
  void free_device(void* p) noexcept override;
  void register_host(void* p, std::size_t bytes) override;
  void unregister_host(void* p) noexcept override;

  StreamHandle create_stream() override;
  void destroy_stream(StreamHandle s) noexcept override;
  void stream_sync(StreamHandle s) override;
  EventHandle create_event(bool timing) override;
  void destroy_event(EventHandle e) noexcept override;
  void record_event(EventHandle e, StreamHandle s) override;
  void stream_wait_event(StreamHandle s, EventHandle e) override;
  bool event_done(EventHandle e) override;
  void event_sync(EventHandle e) override;
  float event_elapsed_ms(EventHandle start, EventHandle end) override;

  void copy_h2d(void* dst, const void* src, std::size_t bytes, StreamHandle s) override;
  void copy_d2h(void* dst, const void* src, std::size_t bytes, StreamHandle s) override;
  void memset_async(void* dst, int value, std::size_t bytes, StreamHandle s) override;
  void scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
               StreamHandle s) override;
  void copy_2d(void* dst, std::size_t dpitch, const void* src, std::size_t spitch,
               std::size_t width, std::size_t rows, bool to_host, StreamHandle s) override;
  void copy_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                  std::size_t count, bool to_host, StreamHandle s) override;
  void copy_2d_on_device(const Copy2D* copies, std::size_t count, StreamHandle s) override;
  void place(PlaceChunk* chunks, std::uint32_t n, std::uint64_t bytes, std::uint32_t max_blocks,
             std::uint32_t* counter, StreamHandle s) override;
  void gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
              StreamHandle s) override;
  void pack(PackChunk* chunks, std::uint32_t n, std::uint64_t bytes, std::uint32_t max_blocks,
            StreamHandle s) override;
  void zero_copy(const ZeroCopyEntry* entries, std::uint32_t count, StreamHandle s) override;
  bool host_pointers_usable() const override { return true; }
  bool supports_wait_value() const override { return true; }
  void wait_value_geq(const std::uint64_t* addr, std::uint64_t value, StreamHandle s) override;
  void signal_value(std::uint64_t* addr, std::uint64_t value) override;
  void write_value(std::uint64_t* addr, std::uint64_t value, StreamHandle s) override;
  void delay_async(std::uint32_t microseconds, StreamHandle s) override;

  // Takes [p, p + bytes), memory the caller owns, as this device's memory until
  // release_device_memory(p): a runtime that runs without a GPU allocates its "GPU" caches in
  // host memory, and the emulated device then serves them as it serves its own allocations.
  // The release, like free_device, returns once the copies queued on the device have run.
  // Throws gfd::Error(kInvalidArgument) where the range overlaps memory already known here.
  void adopt_device_memory(void* p, std::size_t bytes);
  void release_device_memory(void* p) noexcept;

  // Leaves the sticky error state of an injected fault (a fresh context, as it were).
  void clear_fault();
  // The injected fault's message, or "" when none is in force.
  std::string fault_message() const;

  struct Impl;

 private:
  void enqueue(StreamHandle s, std::function<void()> op);
  // The driver lock of testkit::EmulatedOptions::free_waits_for_device: every call holds it shared
  // (or passes it, for calls that then block), free_device() exclusively.
  struct ApiLock {
    std::shared_lock<std::shared_mutex> lk;  // not owning where the option is off
  };
  ApiLock api_call() const;
  void api_gate() const;
  // free_device() with free_waits_for_device: the lock held exclusively, then every stream run
  // dry.
  std::unique_lock<std::shared_mutex> driver_lock();
  void drain_all_streams();
  // A data operation: runs `body` unless a fault is in force or injected now.
  void enqueue_data(StreamHandle s, const char* what, std::function<void()> body);
  void check_sticky() const;
  int ordinal_;
  testkit::EmulatedOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gfd::detail
