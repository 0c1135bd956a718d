#include "stage_only.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STAGE_ONLY_PAUSE() _mm_pause()
#else
#define STAGE_ONLY_PAUSE() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace gfd::bench {

StageOnly::Config StageOnly::of_engine(const Engine& engine, bool to_host) {
  const EngineStats st = engine.stats();
  const EngineOptions& o = engine.options();
  Config c;
  c.workers = st.gather_threads;
  c.cpus = st.cpus;
  c.caller_copies = o.submitter_gathers;
  c.spin_us = o.spin_us;
  c.piece_bytes = o.piece_bytes;
  c.inline_bytes = o.inline_gather_bytes;
  c.first_chunk_bytes = std::min(o.first_chunk_bytes, o.slot_bytes);
  c.writes = st.staging_writes;
  c.to_host = to_host;
  return c;
}

HostPool StageOnly::buffer_for(const testkit::Device& device, const Engine& engine) {
  const EngineStats st = engine.stats();
  HostPoolOptions so;
  so.bytes = st.staging_bytes;
  so.device = device.ordinal();
  so.numa_node =
      st.numa_node >= 0 ? st.numa_node : -2;  // the engine's node, or unbound as its ring
  return testkit::make_host_pool(device, so);
}
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

StageOnly::StageOnly(const Config& config, std::byte* staging, std::size_t staging_bytes)
    : cfg_(config), staging_(staging), staging_bytes_(staging_bytes) {
  if (cfg_.piece_bytes == 0 || staging_bytes_ < cfg_.piece_bytes)
    throw std::invalid_argument("stage-only: staging buffer smaller than one piece");
  threads_.reserve(static_cast<std::size_t>(cfg_.workers));
  for (int i = 0; i < cfg_.workers; ++i) threads_.emplace_back([this] { worker(); });
}

StageOnly::~StageOnly() {
  stop_.store(true);
  claim_.fetch_add(std::uint64_t{1} << (2 * kIdxBits));  // a new generation: parked threads wake
  claim_.notify_all();
  for (auto& t : threads_) t.join();
}

void StageOnly::copy_piece(std::size_t k) {
  const testkit::StagedBlock* ops = ops_.data() + piece_begin_[k];
  const std::size_t count = piece_begin_[k + 1] - piece_begin_[k];
  if (cfg_.to_host)
    testkit::place_like_engine(ops, count, staging_, cfg_.writes);
  else
    testkit::gather_like_engine(ops, count, staging_, cfg_.writes);
}

// Claims the next piece of the current run in order, as the engine's threads do (one
// compare-and-swap each), and copies it. False when no piece is left to claim.
bool StageOnly::claim_and_copy() {
  std::uint64_t c = claim_.load(std::memory_order_acquire);
  while (true) {
    const std::uint64_t idx = c & kIdxMask, total = (c >> kIdxBits) & kIdxMask;
    if (idx >= total) return false;
    if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      copy_piece(static_cast<std::size_t>(idx));
      left_.fetch_sub(1, std::memory_order_acq_rel);
      return true;
    }
  }
}

void StageOnly::worker() {
  // As the engine pins each gather thread: to the whole set of its CPUs.
  if (!testkit::pin_current_thread(cfg_.cpus)) pinned_.store(false);
  while (!stop_.load(std::memory_order_acquire)) {
    if (claim_and_copy()) continue;
    // Idle: spin for spin_us (back-to-back runs pay no wake-up), then park until the claim word
    // changes (a new run), as the engine's threads do.
    const auto deadline = Clock::now() + std::chrono::microseconds(cfg_.spin_us);
    bool got = false;
    while (!got && Clock::now() < deadline && !stop_.load(std::memory_order_relaxed)) {
      for (int i = 0; i < 16; ++i) STAGE_ONLY_PAUSE();
      got = claim_and_copy();
    }
    if (got) continue;
    const std::uint64_t c = claim_.load(std::memory_order_acquire);
    if ((c & kIdxMask) >= ((c >> kIdxBits) & kIdxMask) && !stop_.load(std::memory_order_acquire))
      claim_.wait(c, std::memory_order_acquire);
  }
}

double StageOnly::run(const std::vector<BlockCopy>& blocks) {
  // The layout (not timed): the engine's planner does this before its threads start.
  ops_.clear();
  piece_begin_.assign(1, 0);
  std::size_t total = 0;
  for (const BlockCopy& b : blocks) total += b.bytes;
  piece_ = cfg_.piece_bytes;
  if (total <= cfg_.first_chunk_bytes)
    piece_ =
        std::clamp<std::size_t>(cfg_.first_chunk_bytes / 32,
                                std::min<std::size_t>(4096, cfg_.piece_bytes), cfg_.piece_bytes);
  const std::size_t piece = piece_;
  const std::size_t slots = staging_bytes_ / piece;  // piece positions in the buffer
  std::size_t fill = 0, k = 0, bytes = 0;
  for (const BlockCopy& b : blocks) {
    auto* host = static_cast<std::byte*>(cfg_.to_host ? b.dst : const_cast<void*>(b.src));
    for (std::size_t done = 0; done < b.bytes;) {
      const std::size_t take = std::min(b.bytes - done, piece - fill);
      testkit::StagedBlock op;
      op.src = host + done;
      op.dst = host + done;
      op.slot_offset = (k % slots) * piece + fill;
      op.bytes = take;
      ops_.push_back(op);
      fill += take;
      done += take;
      if (fill == piece) {
        piece_begin_.push_back(static_cast<std::uint32_t>(ops_.size()));
        ++k;
        fill = 0;
      }
    }
    bytes += b.bytes;
  }
  if (fill != 0) piece_begin_.push_back(static_cast<std::uint32_t>(ops_.size()));
  const std::size_t pieces = piece_begin_.size() - 1;
  if (pieces > kIdxMask) throw std::invalid_argument("stage-only: too many pieces");
  const bool alone = bytes <= cfg_.inline_bytes || cfg_.workers == 0;

  const auto t0 = Clock::now();
  if (alone) {
    for (std::size_t p = 0; p < pieces; ++p) copy_piece(p);
  } else {
    left_.store(static_cast<std::uint32_t>(pieces), std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xFFFF;
    claim_.store((generation_ << (2 * kIdxBits)) | (std::uint64_t{pieces} << kIdxBits),
                 std::memory_order_release);
    claim_.notify_all();
    if (cfg_.caller_copies)
      while (claim_and_copy()) {
      }
    while (left_.load(std::memory_order_acquire) != 0) STAGE_ONLY_PAUSE();
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

bool StageOnly::verify() const {
  // Placing leaves every host block equal to its staged bytes. Gathering a transfer larger than
  // the buffer overwrote its first pieces with later ones: check the last buffer-full.
  const std::size_t pieces = piece_begin_.size() - 1;
  const std::size_t slots = staging_bytes_ / piece_;
  const std::size_t first = cfg_.to_host || pieces <= slots ? 0 : piece_begin_[pieces - slots];
  for (std::size_t i = first; i < ops_.size(); ++i)
    if (std::memcmp(staging_ + ops_[i].slot_offset, ops_[i].src, ops_[i].bytes) != 0) return false;
  return true;
}

}  // namespace gfd::bench
