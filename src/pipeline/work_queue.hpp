// The item queue between submitters, gather threads and the issuer.
//
// Submitters append items in ring order under the submission lock (a chunk to gather or place,
// a direct copy, a transfer's finalization) and publish them. Gather threads claim pieces in
// publication order: the first unclaimed piece of the earliest item that has one, one
// compare-and-swap on the item's claim word, whose sequence number makes a stale claim on a
// reused item fail. The thread that completes an item's last piece marks it ready, and whoever
// holds the issue baton issues ready items strictly in publication order. That keeps every copy
// lane free of work that depends on a later transfer, so a transfer's DMAs never wait behind a
// DMA that waits for it (which could deadlock through the caller's stream), and the copy engine
// sees chunks in ring order.
//
// What an item means is up to its handler (the backend that published it): how its pieces are
// run, what finishing it does and how it is issued.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "pipeline/transfer.hpp"

namespace gfd::detail {

class GatherPool;
class Tracer;
struct Item;

class ItemHandler {
 public:
  enum class Claim { kYes, kNotNow, kBusy };
  virtual ~ItemHandler() = default;
  // Whether the head item's pieces may be claimed now: kNotNow leaves (nothing for this thread),
  // kBusy counts as work (the caller keeps looking). `may_poll`: the caller may ask the device.
  virtual Claim claimable(Item&, bool /*may_poll*/) { return Claim::kYes; }
  // Does piece `piece` of the item (gathers or places its bytes).
  virtual void run_piece(Item& item, std::uint32_t piece) = 0;
  // The item's last piece is done (called on the thread that did it, before the item is ready).
  virtual void chunk_done(Item& item) = 0;
  // Issues a ready item, in publication order (called by the baton holder).
  virtual void issue(Item& item) = 0;
};

struct Item {
  enum class Kind : std::uint8_t { kChunk, kDirect, kFinalize };
  Kind kind = Kind::kChunk;
  ItemHandler* handler = nullptr;
  TransferPtr t;
  std::uint32_t index = 0;  // kChunk: chunk index in the plan
  std::uint32_t slot = 0;
  std::uint32_t piece_begin = 0;
  std::uint64_t flag_value = 0;       // the slot flag's value once this chunk is gathered
  std::atomic<bool> dma_ready{true};  // device to host: the chunk's DMA into the slot completed
  // Device to host: enqueued while its transfer was still being planned; placing waits until the
  // submitter has found the whole list valid (or rejected it) and clears this. Kept here, not
  // read through `t`, which the issuer may reset while a late poller still looks at the item.
  std::atomic<bool> held{false};
  // Device to host with batched packing: published before its DMA is enqueued (it waits for a
  // packing launch with the next chunks), so its slot's `done` is not recorded yet and must not
  // be polled.
  std::atomic<bool> awaiting_dma{false};
  // Host to device: the slot's placed-flag value this chunk's pieces wait for (the slot's last
  // chunk still being placed when the submitter took it: SlotRing::acquire's `free_at`); 0 once
  // the slot is free, or when it was free when taken.
  std::atomic<std::uint64_t> slot_free_at{0};
  // Claim word: item sequence (32 bits) | next piece (16) | pieces (16).
  std::atomic<std::uint64_t> claim{0};
  std::atomic<std::uint32_t> pieces_left{0};
  std::atomic<bool> ready{false};
};

class WorkQueue {
 public:
  WorkQueue(std::size_t capacity, Tracer& tracer);
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;
  // The pool to wake when pieces are published (set once, before any item).
  void set_pool(GatherPool* pool) { pool_ = pool; }
  void wake();
  // Wakes the pool for a transfer about to be planned (GatherPool::wake_one).
  void wake_for_transfer();

  // Takes the next item (caller holds the submission lock); waits while the queue is full.
  Item& append(Item::Kind kind, ItemHandler* handler, const TransferPtr& t, std::uint32_t index,
               std::uint32_t slot, bool ready);
  // Makes `item` visible to the issuer and its `pieces` claimable.
  void publish(Item& item, std::uint32_t pieces);
  // publish() of an item with no pieces (ready already): the gather head steps past it.
  void publish_empty(Item& item);
  // publish(), and wakes the pool where it may be idle: for a transfer's first item, and when
  // every earlier item has been taken (the threads may have run dry and parked). Otherwise the
  // threads are busy with earlier items and reach this one by themselves; waking them again
  // would cost a futex call per chunk (tens of microseconds in a VM while they still wake up).
  void publish_for_pool(Item& item, std::uint32_t pieces, bool first);

  // Runs the next claimable piece; false when there was none. `may_poll`: as in claimable().
  bool run_next_piece(bool may_poll = true);
  // Issues every ready item at the head of the order (whoever holds the baton; others leave).
  void try_issue();
  // Shutdown: issues everything published (the pool must still be running).
  void drain() noexcept;

 private:
  void run_piece(Item& item, std::uint32_t piece);

  Tracer& tracer_;
  GatherPool* pool_ = nullptr;
  std::vector<Item> items_;
  std::atomic<std::uint64_t> tail_{0};         // items published
  std::atomic<std::uint64_t> issued_{0};       // items issued, in order
  std::atomic<std::uint64_t> gather_head_{0};  // first item that may have unclaimed pieces
  std::atomic<bool> issuing_{false};           // the issue baton
  std::atomic<int> tail_waiters_{0};
};

}  // namespace gfd::detail
