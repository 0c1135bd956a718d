// The state of one submitted transfer, shared by its Transfer handles, the work items that carry
// it through the pipeline and the backend that submitted it; and how it completes.
//
// Lifetime: it holds the engine's context (device, events, plan pool), not the engine, so that a
// handle outlives its engine safely (the engine waits for every transfer when it shuts down).
// Completion: `finalized` once its last device operation is enqueued (mark_finalized, the one
// place that publishes it), then `done_event`, then, device to host, `host_left` reaching zero
// once the gather threads have placed every staged chunk.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "device/device.hpp"
#include "planning/planner.hpp"

namespace gfd::detail {

struct EngineContext;

struct TransferState {
  TransferState(std::shared_ptr<EngineContext> context, std::uint32_t transfer_id, Direction d);
  ~TransferState();
  TransferState(const TransferState&) = delete;
  TransferState& operator=(const TransferState&) = delete;

  bool to_host() const { return direction == Direction::kToHost; }
  // Records the first failure; the gather threads see `failed` and place nothing more.
  void fail(std::exception_ptr e);
  std::exception_ptr failure();
  // Every device operation of the transfer is enqueued: waiters may look at done_event.
  void mark_finalized();
  // Blocks until complete (Transfer::wait); never throws (a failure is recorded instead).
  void wait();
  // True once complete; never blocks.
  bool poll();
  // Makes `stream` wait for the transfer (work queued on it afterwards sees the data, or may
  // reuse the device blocks it reads). A failure to do so is recorded in the transfer, or with
  // `report` false ignored (a rejected transfer whose own error is what the caller needs).
  void join_stream(StreamHandle stream, bool report = true);

  const std::shared_ptr<EngineContext> ctx;
  const std::uint32_t id;
  const Direction direction;
  Plan plan;
  // False once the call that made it was rejected (it threw): the plan's memory, sized by the
  // rejected list, is freed with the transfer instead of going back to the pool.
  bool keep_plan = true;
  // On the caller's stream at submission (copy lanes wait on it).
  EventHandle start_event = nullptr;
  EventHandle done_event = nullptr;
  std::vector<EventHandle> lane_events;  // one per lane, used when the transfer finalizes
  std::uint32_t lanes_started = 0;       // bit per lane: waits on start_event issued
  // Batched placement: per copy lane, the staged chunks whose DMAs are enqueued there and whose
  // placing launch is not yet (CopyLanes::flush_placing; every lane's at the latest when the
  // transfer finalizes).
  struct Placing {
    std::vector<PlaceChunk> chunks;
    std::uint64_t bytes = 0;
  };
  std::vector<Placing> placing;
  // Tracing only: a timing event at submission and one after each chunk's DMA.
  EventHandle trace_start = nullptr;
  std::uint64_t trace_start_ns = 0;
  std::vector<std::pair<std::uint32_t, EventHandle>> trace_dma;
  // Device to host through staging: chunks whose bytes the gather threads have yet to place
  // (plus one while the submitter may still add chunks, where the transfer is stream-ordered).
  std::atomic<std::uint32_t> host_left{0};
  // Stream-ordered device to host (EngineOptions::stream_ordered_to_host): the flag the
  // caller's stream waits on, written with this value once host_left reaches zero.
  std::uint64_t* host_flag = nullptr;
  std::uint64_t host_flag_value = 0;
  // Device to host, planned while its first DMAs run: placing waits for kValid; kRejected drops
  // the chunks (a bad block was found after some were enqueued).
  enum PlanState : int { kPlanning, kValid, kRejected };
  std::atomic<int> plan_state{kValid};
  std::atomic<bool> failed{false};
  std::atomic<bool> finalized{false};
  std::atomic<bool> complete{false};

 private:
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

using TransferPtr = std::shared_ptr<TransferState>;

// Marks `t` rejected (keep_plan false) when the scope is left by an exception: a submission's
// guard, so that nothing of a rejected list's size stays in the plan pool.
class RejectedOnThrow {
 public:
  explicit RejectedOnThrow(TransferState& t) : t_(t), unwinding_(std::uncaught_exceptions()) {}
  ~RejectedOnThrow() {
    if (std::uncaught_exceptions() > unwinding_) t_.keep_plan = false;
  }
  RejectedOnThrow(const RejectedOnThrow&) = delete;
  RejectedOnThrow& operator=(const RejectedOnThrow&) = delete;

 private:
  TransferState& t_;
  int unwinding_;
};

// A new transfer with its done event taken from the context's pool.
TransferPtr make_transfer(const std::shared_ptr<EngineContext>& ctx, std::uint32_t id, Direction d);

// Transfers that run on callers' streams (block-by-block and kernel backends), for shutdown to
// wait on those whose handles are still held.
class LiveTransfers {
 public:
  void add(const TransferPtr& t);
  void wait_all() noexcept;

 private:
  std::mutex mutex_;
  std::vector<std::weak_ptr<TransferState>> live_;
};

}  // namespace gfd::detail
