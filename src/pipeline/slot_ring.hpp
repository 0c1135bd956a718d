// The staging ring: pinned host memory (host_memory.hpp: hugepages, NUMA-bound, registered once)
// cut into slots, each with a device twin where chunks are scattered on the GPU, two events
// (without timing: a timing event costs the copy engine microseconds a chunk) and, for
// pre-issued DMAs, a flag in registered memory.
//
// A slot is kFree -> kGathering (taken by a submitter, filled by the gather threads) ->
// kIssued (its DMA or kernel is enqueued; `done` is recorded after it) -> free again once `done`
// has completed. No slot is reused before its event fires: acquire() waits for that. A chunk
// placed by a batched placing launch (Tuning::batch_placement) has no event of its own:
// the kernel writes `placed` in pinned memory once it has read the slot, and acquire() waits
// for that value instead.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/sync.hpp"
#include "device/device.hpp"
#include "host/host_memory.hpp"
#include "planning/planner.hpp"

namespace gfd::detail {

struct Counters;

struct Slot {
  enum State : int { kFree = 0, kGathering = 1, kIssued = 2 };
  std::byte* host = nullptr;
  std::byte* dev = nullptr;  // device staging twin (nullptr where the ring has none)
  EventHandle start = nullptr, done = nullptr;
  std::uint64_t* flag = nullptr;  // registered host memory a pre-issued DMA waits on
  std::uint64_t flag_value = 0;   // value of the last chunk published in this slot
  // Batched placement: registered host memory the placing kernel writes (nullptr: the ring has
  // none), the value that frees the slot's current chunk, and whether that chunk is freed so
  // (set before mark_issued) rather than by `done`.
  std::uint64_t* placed = nullptr;
  std::uint64_t placed_value = 0;
  bool by_flag = false;
  // Device to host with flags (RingConfig::dma_flags): registered host memory written once the
  // slot's DMA is done (Device::write_value on CopyLanes' flag stream), and the value written for
  // the slot's current chunk (set by the submitter before the chunk's item may be polled).
  std::uint64_t* dma_flag = nullptr;
  std::uint64_t dma_value = 0;
  std::atomic<int> state{kFree};

  // The slot's DMA or kernel is enqueued (or failed to be): waiters may look at `done`.
  void mark_issued() {
    state.store(kIssued, std::memory_order_release);
    state.notify_all();
  }
  // Runs `enqueue` (the work that reads the slot, then `done` recorded after it) and marks the
  // slot issued, also when `enqueue` throws (what it throws goes on).
  template <class F>
  void issue(F&& enqueue) {
    struct Mark {
      Slot& s;
      ~Mark() { s.mark_issued(); }
    } mark{*this};
    enqueue();
  }
};

struct RingConfig {
  std::size_t slots = 0;
  std::size_t slot_bytes = 0;
  int numa_node = -1;         // bind the host memory there (-1: no binding)
  bool device_twin = false;   // allocate device staging of the same size
  bool flags = false;         // one flag per slot for pre-issued DMAs
  bool placed_flags = false;  // one flag per slot for the batched placing kernel
  bool dma_flags = false;     // one flag per slot that its device-to-host DMA writes
};

class SlotRing {
 public:
  SlotRing(Device& device, Counters& counters, const RingConfig& config);
  ~SlotRing();
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  std::size_t size() const { return slots_.size(); }
  std::size_t slot_bytes() const { return slot_bytes_; }
  std::size_t bytes() const { return slots_.size() * slot_bytes_; }
  bool has_dma_flags() const { return !slots_.empty() && slots_[0].dma_flag != nullptr; }
  HugepageKind hugepages() const { return memory_.hugepages(); }
  Slot& operator[](std::size_t i) { return slots_[i]; }

  // Takes the next slot in ring order, waiting until it is free (caller holds the submission
  // lock, so slots are taken in order). The slot is kGathering on return.
  // With `free_at`: a slot whose last chunk is enqueued and still to be placed by a placing
  // kernel (by_flag) is taken without waiting, and *free_at is the `placed` value that frees it
  // (0 where the slot was free or waited for): whoever writes into the slot waits for that
  // value first (PlacedWait), so the submitter does not.
  std::uint32_t acquire(std::uint64_t* free_at = nullptr);
  // The next slot in ring order if it is free now (its last chunk's work has completed), else
  // nothing: no waiting. Caller holds the submission lock. The slot is kGathering on return.
  std::optional<std::uint32_t> try_acquire();
  // Waits for every slot's enqueued DMA or kernel (shutdown).
  void drain() noexcept;

 private:
  void wait_free(Slot& s);
  // Waits until the placing kernel has freed `s`'s chunk (throws a device fault).
  void wait_placed(const Slot& s);
  void release() noexcept;

  Device& device_;
  Counters& counters_;
  std::size_t slot_bytes_;
  HostMemory memory_;  // the ring: hugepages, NUMA-bound, registered once for the engine's life
  std::byte* dev_staging_ = nullptr;
  std::uint64_t* flags_ = nullptr;
  std::vector<Slot> slots_;
  std::uint64_t next_ = 0;
};

// Asks the device whether it has failed, for the threads that must make no driver call: the
// gather threads write the flags that pre-issued DMAs wait for, and a driver call may block for
// as long as another thread's cudaFree waits for the whole device to drain, which waits for
// those DMAs: a deadlock (the emulated device's free_waits_for_device models that driver
// lock). A thread of its own makes the queries; when it is the one blocked, nobody waits on it.
class FaultWatch {
 public:
  explicit FaultWatch(Device& device);
  ~FaultWatch();
  FaultWatch(const FaultWatch&) = delete;
  FaultWatch& operator=(const FaultWatch&) = delete;
  // Asks for a query of event `e` (of a slot, alive as long as the ring; the latest request
  // wins); returns the request's number.
  std::uint64_t ask(EventHandle e);
  // True once a query made for request `n` (or a later one) has been answered; `fault` is then
  // the device fault that query threw, or null.
  bool answered(std::uint64_t n, std::exception_ptr& fault) const;

 private:
  void run();
  Device& device_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  EventHandle event_ = nullptr;
  std::uint64_t asked_ = 0, answered_ = 0;
  std::exception_ptr fault_;  // what the latest query threw
  bool stop_ = false;
  std::thread thread_;
};

// One waiter's requests to a FaultWatch, one at a time (PlacedWait's, the device-to-host
// poller's): rethrows the fault that an answered request found and, where no request is pending
// and `due`, asks about event `e`. True when it asked.
class FaultLook {
 public:
  bool step(FaultWatch& watch, EventHandle e, bool due);

 private:
  std::uint64_t asked_ = 0;  // the request waited for (0: none)
};

// Waiting for the placing kernel to free a slot's chunk (its placed flag to reach `value`), a
// look at a time, for a waiter that comes back between looks (SlotRing::acquire loops on it; a
// gather thread returns to its queue): each look spins briefly, sleeps 20 us once the wait has
// lasted 0.5 ms, and every 1 ms asks about the slot's (old) event, which throws a device fault
// that would leave the flag unwritten for good. With `watch` (a gather thread's wait) the
// FaultWatch asks the device; without, the waiter itself.
class PlacedWait {
 public:
  PlacedWait(const Slot& s, std::uint64_t value, FaultWatch* watch = nullptr);
  // True once the chunk is freed; throws a fault of `device` (the slot's ring's).
  bool poll(Device& device);
  bool waits_for(const Slot& s, std::uint64_t value) const { return s_ == &s && value_ == value; }
  // One look, no waiting: whether `s`'s placed flag has reached `value`.
  static bool reached(const Slot& s, std::uint64_t value) {
    return std::atomic_ref<std::uint64_t>(*s.placed).load(std::memory_order_acquire) >= value;
  }

 private:
  const Slot* s_;
  std::uint64_t value_;
  FaultWatch* watch_;
  FaultLook fault_look_;  // with `watch_`
  Clock::time_point since_, look_;
};

// Writes the scatter entries of chunk `c` into its slot after the data (where the chunk's
// planned layout puts them): destinations for host to device (the scatter kernel places the
// blocks), device sources for device to host (the gather kernel packs them).
void write_scatter_entries(const Plan& p, const PlannedChunk& c, std::byte* slot_host, Direction d);
// The entries of ops [first, last) of chunk `c` only (a gather piece's own), written with
// streaming stores and fenced: the slot's lines are rarely in this core's cache (the last DMA
// read them), and plain stores would first read each line from DRAM (read-for-ownership).
// Host to device, each piece's gather thread writes its own entries, spreading the work over
// the threads.
void stream_scatter_entries(const Plan& p, const PlannedChunk& c, std::uint32_t first,
                            std::uint32_t last, std::byte* slot_host, Direction d) noexcept;

}  // namespace gfd::detail
