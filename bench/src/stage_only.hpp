// The gather-only (host to device) and place-only (device to host) rate for gfd_benchmark: the
// engine's number of threads copying the same block lists between host memory and a
// staging-sized pinned buffer with the engine's copy loop, with no engine, no DMA and no device.
// It is the most the gather pipeline could move if the copy engine were free, so that a reader
// of a gather row sees which side limits it: eff = pipeline / min(gather-only, contiguous DMA).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "gfd/gfd.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench {

class StageOnly {
 public:
  struct Config {
    int workers = 0;            // persistent threads (the engine's gather_threads)
    std::vector<int> cpus;      // their CPUs, each thread pinned to the whole set (the engine's)
    bool caller_copies = true;  // the calling thread copies too (submitter_gathers)
    int spin_us = 200;          // idle workers spin this long, then park (the engine's spin_us)
    std::size_t piece_bytes = 32768;
    std::size_t inline_bytes = 0;  // transfers up to this size: the calling thread alone
    // Transfers of one chunk (up to the engine's first_chunk_bytes) are cut into pieces of a
    // 32nd of it (4 KB at least), as the engine cuts them; 0: piece_bytes throughout.
    std::size_t first_chunk_bytes = 0;
    StagingWrites writes = StagingWrites::kStreaming;  // resolved as the engine resolves it
    bool to_host = false;  // place (staging -> host dst) instead of gather
  };
  // The settings of `engine`'s gather threads: as many threads as copy in the engine
  // (gather_threads, plus the submitting thread when submitter_gathers), pinned to its gather
  // CPUs, with its spin, pieces and staging writes.
  static Config of_engine(const Engine& engine, bool to_host);
  // A buffer the size of `engine`'s ring, allocated as the ring is (HostPool: huge pages, the
  // engine's NUMA node, registered with `device`).
  static HostPool buffer_for(const testkit::Device& device, const Engine& engine);

  // `staging` (`staging_bytes`, a multiple of piece_bytes is best) is the buffer written (gather)
  // or read (place); the caller owns it.
  StageOnly(const Config& config, std::byte* staging, std::size_t staging_bytes);
  ~StageOnly();
  StageOnly(const StageOnly&) = delete;
  StageOnly& operator=(const StageOnly&) = delete;

  // Lays out the host side of `blocks` (src to the device, dst to the host) in pieces (of
  // piece_bytes, or smaller for a one-chunk transfer), in order, at consecutive staging offsets
  // (wrapping at the buffer's end, as the ring's slots do), outside the timed region; then
  // copies them, timed from the call until every piece is done. Returns microseconds.
  double run(const std::vector<BlockCopy>& blocks);
  // Whether the last run copied every byte where it belongs.
  bool verify() const;
  // Threads that copy a transfer larger than inline_bytes.
  int threads() const { return cfg_.workers + (cfg_.caller_copies || cfg_.workers == 0 ? 1 : 0); }
  // False when a worker could not be pinned to the CPUs.
  bool pinned() const { return pinned_.load(); }

 private:
  // The claim word: generation (16 bits) | pieces of the run (24) | next piece (24). One word, so
  // that a thread that read an old run's word can never claim a piece of the next run.
  static constexpr int kIdxBits = 24;
  static constexpr std::uint64_t kIdxMask = (std::uint64_t{1} << kIdxBits) - 1;
  bool claim_and_copy();
  void copy_piece(std::size_t piece);
  void worker();

  Config cfg_;
  std::byte* staging_;
  std::size_t staging_bytes_;
  std::vector<testkit::StagedBlock> ops_;
  std::size_t piece_ = 0;                   // the last run's piece size
  std::vector<std::uint32_t> piece_begin_;  // ops of piece k: [piece_begin_[k], piece_begin_[k+1])
  std::atomic<std::uint64_t> claim_{0};
  std::atomic<std::uint32_t> left_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> pinned_{true};
  std::uint64_t generation_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace gfd::bench
