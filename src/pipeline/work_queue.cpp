#include "pipeline/work_queue.hpp"

#include <chrono>
#include <thread>

#include "host/gather_pool.hpp"
#include "pipeline/tracer.hpp"

namespace gfd::detail {
namespace {
constexpr std::uint64_t kClaimOne = std::uint64_t{1} << 16;  // one piece in an item's claim word
}

WorkQueue::WorkQueue(std::size_t capacity, Tracer& tracer) : tracer_(tracer), items_(capacity) {}

void WorkQueue::wake() {
  if (pool_ != nullptr) pool_->wake();
}

void WorkQueue::wake_for_transfer() {
  if (pool_ != nullptr) pool_->wake_one();
}

Item& WorkQueue::append(Item::Kind kind, ItemHandler* handler, const TransferPtr& t,
                        std::uint32_t index, std::uint32_t slot, bool ready) {
  const std::uint64_t n = tail_.load(std::memory_order_relaxed);
  while (n - issued_.load(std::memory_order_acquire) >= items_.size()) {
    tail_waiters_.fetch_add(1, std::memory_order_seq_cst);
    const std::uint64_t v = issued_.load(std::memory_order_seq_cst);
    if (n - v >= items_.size()) issued_.wait(v, std::memory_order_seq_cst);
    tail_waiters_.fetch_sub(1, std::memory_order_seq_cst);
  }
  Item& it = items_[n % items_.size()];
  it.kind = kind;
  it.handler = handler;
  it.t = t;
  it.index = index;
  it.slot = slot;
  it.piece_begin = 0;
  it.flag_value = 0;
  it.dma_ready.store(true, std::memory_order_relaxed);
  it.held.store(false, std::memory_order_relaxed);
  it.awaiting_dma.store(false, std::memory_order_relaxed);
  it.slot_free_at.store(0, std::memory_order_relaxed);
  it.ready.store(ready, std::memory_order_relaxed);
  return it;
}

void WorkQueue::publish(Item& item, std::uint32_t pieces) {
  const std::uint64_t n = tail_.load(std::memory_order_relaxed);
  item.claim.store((n << 32) | pieces, std::memory_order_release);
  tail_.store(n + 1, std::memory_order_seq_cst);
}

void WorkQueue::publish_for_pool(Item& item, std::uint32_t pieces, bool first) {
  const std::uint64_t seq = tail_.load(std::memory_order_relaxed);
  publish(item, pieces);
  // A thread that parks has first seen the head reach the tail.
  if (first || gather_head_.load(std::memory_order_seq_cst) >= seq) wake();
}

void WorkQueue::publish_empty(Item& item) {
  std::uint64_t seq = tail_.load(std::memory_order_relaxed);
  publish(item, 0);
  // Nothing to claim: step the gather head past it where it waits there, as a thread would, so
  // that publish_for_pool still sees when the threads have run dry (they may have parked with
  // the head on this item, and would otherwise not be woken for the next one).
  gather_head_.compare_exchange_strong(seq, seq + 1, std::memory_order_acq_rel);
}

bool WorkQueue::run_next_piece(bool may_poll) {
  for (;;) {
    std::uint64_t h = gather_head_.load(std::memory_order_acquire);
    if (h >= tail_.load(std::memory_order_acquire)) return false;
    Item& it = items_[h % items_.size()];
    std::uint64_t c = it.claim.load(std::memory_order_acquire);
    const std::uint32_t next = static_cast<std::uint32_t>(c >> 16) & 0xffff;
    const std::uint32_t count = static_cast<std::uint32_t>(c) & 0xffff;
    if ((c >> 32) != (h & 0xffffffff) || next >= count) {
      // Every piece of item h is taken (or it was reused, which means the same): move on.
      gather_head_.compare_exchange_weak(h, h + 1, std::memory_order_acq_rel);
      continue;
    }
    switch (it.handler->claimable(it, may_poll)) {
      case ItemHandler::Claim::kNotNow:
        return false;
      case ItemHandler::Claim::kBusy:
        std::this_thread::yield();
        return true;
      case ItemHandler::Claim::kYes:
        break;
    }
    if (!it.claim.compare_exchange_weak(c, c + kClaimOne, std::memory_order_acq_rel)) continue;
    run_piece(it, it.piece_begin + next);
    return true;
  }
}

void WorkQueue::run_piece(Item& item, std::uint32_t piece) {
  const std::uint32_t id = item.t->id, chunk = item.index;
  tracer_.record(id, TraceEvent::kPieceStart, chunk, piece);
  item.handler->run_piece(item, piece);
  tracer_.record(id, TraceEvent::kPieceEnd, chunk, piece);
  // The thread that completes a chunk's last piece issues it (or hands it to the issuer).
  if (item.pieces_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    item.handler->chunk_done(item);
    item.ready.store(true, std::memory_order_seq_cst);
    try_issue();
  }
}

void WorkQueue::try_issue() {
  for (;;) {
    if (issuing_.exchange(true, std::memory_order_seq_cst)) return;
    std::uint64_t n = issued_.load(std::memory_order_relaxed);
    const std::uint64_t start = n;
    while (n < tail_.load(std::memory_order_seq_cst)) {
      Item& it = items_[n % items_.size()];
      if (!it.ready.load(std::memory_order_seq_cst)) break;
      it.handler->issue(it);
      it.t.reset();
      ++n;
      issued_.store(n, std::memory_order_seq_cst);
    }
    issuing_.store(false, std::memory_order_seq_cst);
    if (n != start && tail_waiters_.load(std::memory_order_seq_cst) > 0) issued_.notify_all();
    // A piece may have completed between our last check and the release of the baton.
    if (n < tail_.load(std::memory_order_seq_cst) &&
        items_[n % items_.size()].ready.load(std::memory_order_seq_cst))
      continue;
    return;
  }
}

void WorkQueue::drain() noexcept {
  while (issued_.load(std::memory_order_acquire) < tail_.load(std::memory_order_acquire)) {
    try_issue();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace gfd::detail
