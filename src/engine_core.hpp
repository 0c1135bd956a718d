// The engine: validation and planning, then one of the backends. The gather pipeline:
// plan -> slot -> pieces claimed in order by the pool -> in-order issue of DMAs on the copy
// lanes -> the caller's stream waits on the transfer's last event. The other backends issue
// on the caller's stream directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <boost/lockfree/stack.hpp>

#include "device.hpp"
#include "gather_copy.hpp"
#include "gather_pool.hpp"
#include "gfd/engine.hpp"
#include "planner.hpp"
#include "staging.hpp"

namespace gfd::detail {

class EngineCore;

// A first-come, first-served lock. Submitters hold it while they take staging slots, which can
// mean waiting for DMAs when the ring is full; with an ordinary mutex one thread could then lose
// the race for it again and again (a 5 s wait was seen with 8 threads on a small ring).
class FifoMutex {
 public:
  void lock() noexcept {
    const std::uint32_t ticket = next_.fetch_add(1, std::memory_order_relaxed);
    for (std::uint32_t s = serving_.load(std::memory_order_acquire); s != ticket;
         s = serving_.load(std::memory_order_acquire))
      serving_.wait(s, std::memory_order_acquire);
  }
  void unlock() noexcept {
    serving_.fetch_add(1, std::memory_order_release);
    serving_.notify_all();
  }

 private:
  std::atomic<std::uint32_t> next_{0};
  std::atomic<std::uint32_t> serving_{0};
};

// Events without timing, reused across transfers. Taken by submitters and returned by whichever
// thread drops a transfer's last handle, so the free list is a lock-free stack.
class EventPool {
 public:
  explicit EventPool(Device& d) : device_(d), free_(64) {}
  ~EventPool();
  EventHandle get();
  void put(EventHandle e);

 private:
  Device& device_;
  boost::lockfree::stack<EventHandle> free_;
};

// What the engine records when tracing is on (benchmarks use it to find pipeline bubbles).
struct TraceEvent {
  enum What : std::uint16_t {
    kSubmit,          // copy_to_device entered
    kPlanned,         // validation and planning done
    kChunkPublished,  // a = chunk, b = pieces
    kPieceStart,      // a = chunk, b = piece
    kPieceEnd,        // a = chunk, b = piece
    kChunkIssued,     // a = chunk, b = bytes
    kFinalized,       // the last DMA is enqueued
    kReturn,          // copy_to_device returns
    kDmaDone,         // a = chunk: its DMA completed on the GPU (GPU clock mapped onto the host's,
                      // from an event recorded at submission: early by the launch latency)
  };
  std::uint64_t ns;          // steady clock
  std::uint32_t transfer;    // engine-wide transfer number
  std::uint16_t what;
  std::int16_t thread;       // gather thread index, -1 for other threads
  std::uint32_t a, b;
};

struct TransferState {
  std::shared_ptr<EngineCore> core;  // keeps the device and its events alive
  std::uint32_t id = 0;
  Plan plan;
  EventHandle start_event = nullptr;
  EventHandle done_event = nullptr;
  std::vector<EventHandle> lane_events;  // one per lane, used when the transfer finalizes
  std::uint32_t lanes_started = 0;       // bit per lane: waits on start_event issued (issuer only)
  // Tracing only: a timing event at submission and one after each chunk's DMA.
  EventHandle trace_start = nullptr;
  std::uint64_t trace_start_ns = 0;
  std::vector<std::pair<std::uint32_t, EventHandle>> trace_dma;
  // Device to host through staging: chunks whose bytes the gather threads have yet to place.
  bool to_host = false;
  std::atomic<std::uint32_t> host_left{0};
  // Device to host, planned while its first DMAs run: placing waits for kValid; kRejected drops
  // the chunks (a bad block was found after some were enqueued).
  enum PlanState : int { kPlanning, kValid, kRejected };
  std::atomic<int> plan_state{kValid};
  std::atomic<bool> failed{false};  // fail() was called (read by the gather threads)
  std::atomic<bool> finalized{false};
  std::atomic<bool> complete{false};
  std::mutex error_mutex;
  std::exception_ptr error;

  void fail(std::exception_ptr e);
  std::exception_ptr failure();
  ~TransferState();
};

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  static std::shared_ptr<EngineCore> create(const EngineOptions& options, std::shared_ptr<Device> device);
  // An Engine over any device implementation (the emulated one in tests).
  static Engine make_engine(const EngineOptions& options, std::shared_ptr<Device> device);
  // The core behind an Engine (benchmarks trace it).
  static EngineCore& of(Engine& engine) { return *engine.core_; }

  ~EngineCore();
  Transfer submit(std::span<const BlockCopy> blocks, StreamHandle stream, Direction direction);
  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }
  Device& device() { return *device_; }
  EventPool& events() { return *events_; }
  // Plans are recycled: a transfer's plan returns here when its handle goes away.
  Plan take_plan();
  void recycle_plan(Plan&& plan) noexcept;
  // Waits for every transfer to be issued and every lane to drain, then stops the threads.
  void shutdown() noexcept;

  // Tracing: records up to `capacity` events from now on (0 stops); take_trace returns them.
  void start_trace(std::size_t capacity);
  std::vector<TraceEvent> take_trace();
  void keep_trace_events(std::uint32_t id, std::uint64_t start_ns, EventHandle start,
                         std::vector<std::pair<std::uint32_t, EventHandle>>&& dma);

  // Waits for a transfer on the host (Transfer::wait).
  void wait(TransferState& t);
  bool poll(TransferState& t);

 private:
  enum SlotState : int { kFree = 0, kGathering = 1, kIssued = 2 };
  struct Slot {
    std::byte* host = nullptr;
    std::byte* dev = nullptr;
    EventHandle start = nullptr, done = nullptr;
    bool timed = false;  // start/done hold an unaccounted DMA
    std::uint64_t* flag = nullptr;    // registered host memory the lane waits on (preissue)
    std::uint64_t flag_value = 0;     // value of the last chunk published in this slot
    std::atomic<int> state{kFree};
  };
  enum class ItemKind : std::uint8_t { kChunk, kDirect, kFinalize };
  struct Item {
    ItemKind kind = ItemKind::kChunk;
    std::shared_ptr<TransferState> t;
    std::uint32_t index = 0;  // chunk or direct copy index in the plan
    std::uint32_t slot = 0;
    std::uint32_t piece_begin = 0;
    std::uint64_t flag_value = 0;  // the slot flag's value once this chunk is gathered
    bool to_host = false;          // a device-to-host chunk: pieces place staged bytes
    std::atomic<bool> dma_ready{true};  // to_host: the chunk's DMA into the slot has completed
    // to_host: enqueued while its transfer was still being planned; placing waits until the
    // submitter has found the whole list valid (or rejected it) and clears this. Kept here, not
    // read through `t`, which the issuer may reset while a late poller still looks at the item.
    std::atomic<bool> held{false};
    // Claim word of the pool: item sequence (32 bits) | next piece (16) | pieces (16).
    std::atomic<std::uint64_t> claim{0};
    std::atomic<std::uint32_t> pieces_left{0};
    std::atomic<bool> ready{false};
  };

  EngineCore(const EngineOptions& options, std::shared_ptr<Device> device);
  void start();
  std::uint32_t acquire_slot();
  void wait_slot_free(Slot& s);
  void account_dma(Slot& s);
  Item& append_item(ItemKind kind, const std::shared_ptr<TransferState>& t, std::uint32_t index,
                    std::uint32_t slot, bool ready);
  void publish_item(Item& item, std::uint32_t pieces);
  void publish_for_pool(Item& item, std::uint32_t pieces, bool first);
  bool run_next_piece(bool may_poll = true);
  void run_piece(Item& item, std::uint32_t piece);
  void gather_piece(const Item& item, std::uint32_t piece);
  void begin_trace(TransferState& t, StreamHandle stream, bool dma_events);
  void submit_gather(const std::shared_ptr<TransferState>& t, StreamHandle stream);
  void submit_gather_to_host(const std::shared_ptr<TransferState>& t, StreamHandle stream);
  Transfer submit_to_host_streamed(std::span<const BlockCopy> blocks, StreamHandle stream, std::uint32_t id);
  // Items enqueued while their transfer is being planned are added to `held` (placing waits).
  void enqueue_to_host_chunk(const std::shared_ptr<TransferState>& t, std::uint32_t k,
                             std::vector<Item*>* held = nullptr);
  bool poll_head_dma(Item& item);
  void submit_kernel(const std::shared_ptr<TransferState>& t, StreamHandle stream);
  void submit_copies(const std::shared_ptr<TransferState>& t, StreamHandle stream);
  void trace(std::uint32_t transfer, TraceEvent::What what, std::uint32_t a = 0, std::uint32_t b = 0,
             std::uint64_t ns = 0);
  friend struct TransferState;
  void try_issue();
  void issue(Item& item);
  void issue_chunk(Item& item);
  void issue_direct(Item& item);
  void issue_finalize(Item& item);
  void enqueue_chunk(TransferState& t, std::uint32_t index, std::uint32_t slot, bool wait,
                     std::uint64_t flag_value);
  void enqueue_issued(TransferState& t, std::uint32_t index, std::uint32_t slot, bool wait);
  void enqueue_direct(TransferState& t, std::uint32_t index);
  void finalize(TransferState& t);
  StreamHandle lane_for(TransferState& t, std::uint32_t lane);
  // Host-to-device lanes are 0..copy_streams-1, taken in turn; then the device-to-host lane and
  // the lane that packs scattered device blocks for it.
  std::uint32_t next_h2d_lane() {
    return static_cast<std::uint32_t>(lane_rr_++ % static_cast<std::uint64_t>(options_.copy_streams));
  }
  std::uint32_t d2h_lane() const { return static_cast<std::uint32_t>(options_.copy_streams); }
  std::uint32_t pack_lane() const { return d2h_lane() + 1; }

  EngineOptions options_;
  std::shared_ptr<Device> device_;
  PlanConfig plan_config_;
  std::vector<int> cpus_;
  int numa_node_ = -1;
  int cpu_sharing_ = 1;
  std::unique_ptr<EventPool> events_;
  std::unique_ptr<HostStaging> staging_;
  std::byte* dev_staging_ = nullptr;
  std::vector<StreamHandle> lanes_;
  std::vector<Slot> slots_;
  std::unique_ptr<GatherPool> pool_;
  StoreKind store_kind_ = StoreKind::kNormal;
  bool preissue_ = false;          // DMAs enqueued at submission behind slot flags
  std::uint64_t* flags_ = nullptr; // one cache line per slot, registered host memory
  PlanConfig pass_config_;  // pass-through planning for the block-by-block backends
  std::unique_ptr<PageableCache> pageable_cache_;  // pageable host regions, across transfers

  // Submission (serialised): slots and items are taken in ring order, one transfer at a time.
  FifoMutex submit_mutex_;
  bool shutting_down_ = false;
  std::uint64_t next_slot_ = 0;
  std::vector<Item> items_;
  std::atomic<std::uint64_t> tail_{0};    // items published
  std::atomic<std::uint64_t> issued_{0};  // items issued to the device, in order
  std::atomic<std::uint64_t> gather_head_{0};  // first item that may have unclaimed pieces
  std::atomic<bool> dma_poller_{false};  // a thread is polling the head item's device-to-host DMA
  std::atomic<bool> issuing_{false};      // the issue baton
  std::atomic<int> tail_waiters_{0};
  // Next host-to-device copy lane, round robin: taken by the issuer and, with preissue, by
  // submitters.
  std::atomic<std::uint64_t> lane_rr_{0};

  std::atomic<std::uint32_t> next_id_{0};  // transfer numbers for the trace

  // Stats.
  std::atomic<std::uint64_t> st_bytes_{0}, st_transfers_{0}, st_blocks_{0}, st_chunks_{0},
      st_scattered_{0}, st_direct_{0}, st_gather_ns_{0}, st_submit_wait_ns_{0}, st_plan_ns_{0};
  std::atomic<double> st_dma_ms_{0};

  std::mutex plans_mutex_;
  std::vector<Plan> spare_plans_;

  // Transfers of the non-gather backends, for shutdown to wait on.
  std::mutex live_mutex_;
  std::vector<std::weak_ptr<TransferState>> live_;

  // Trace.
  std::atomic<bool> trace_on_{false};
  std::atomic<std::size_t> trace_n_{0};
  std::vector<TraceEvent> trace_;
  std::mutex trace_mutex_;
  struct PendingTrace {
    std::uint32_t id;
    std::uint64_t start_ns;
    EventHandle start;
    std::vector<std::pair<std::uint32_t, EventHandle>> dma;
  };
  std::vector<PendingTrace> trace_pending_;  // DMA events of traced transfers, read by take_trace
};

}  // namespace gfd::detail
