// Engine settings that are not user options: the pipeline's mechanisms, each on with the setting
// that measured fastest (docs/performance.md), and still switchable here so that the tests run
// both branches and the benchmarks can compare them. Only code of this tree sets them
// (EngineCore::create, testkit::Device::make_engine); the public EngineOptions does not carry them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gfd::detail {

struct Tuning {
  // Host-to-device chunks' DMAs are enqueued at submission behind a flag in pinned memory that
  // the thread finishing the chunk sets (a 64-bit stream memory operation), so that no driver
  // call sits between gathering and DMA. Resolved off where the GPU lacks those operations or
  // the backend has no copy lanes: the finishing thread then issues the DMA itself.
  bool preissue = true;
  // Host to device, staged chunks with scattered destinations: one placing kernel launch for
  // several chunks of a lane, which marks their slots free in pinned memory (no event per
  // chunk). Needs a GPU that reads pinned memory at its host address; off elsewhere.
  bool batch_placement = true;
  // With batch_placement and preissue, a submitter takes a slot whose last chunk is enqueued but
  // not placed without waiting: the gather threads that fill it wait for its placed flag, so the
  // call returns once every DMA is enqueued whatever the transfer's size.
  bool defer_slot_waits = true;
  // Device to host, staged chunks with scattered sources: one packing launch for several chunks
  // of the lane, waited for once by the device-to-host lane.
  bool batch_packing = true;
  // Chunks one placing or packing launch takes at most (1..32; the lanes together never leave
  // more than half the ring's slots unplaced), and its thread blocks at most (1..32).
  int placement_chunks = 8;
  int placement_blocks = 32;
  // A staging chunk whose pinned host side lies in runs as long as the direct path's blocks is
  // moved by the copy engine in place (no CPU copy); the kernels place or pack it on the GPU.
  bool host_direct = true;
  // A CacheSet transfer of equal, staged blocks is planned from its ids by arithmetic, each
  // gather thread making its own piece's copies, instead of a block list planned by the caller.
  bool plan_from_ids = true;
  // A CacheSet transfer given as 2D runs (one per id: every layer's page of a block) whose host
  // side is contiguous in each run and whose rows are at most bounce_max_load_width bytes (to
  // the device) or bounce_max_store_width bytes (to the host) goes through the staging ring's
  // device twin: each run crosses the link as one 1D DMA and a
  // device-to-device 2D copy on another stream spreads its rows; no SM is used. The copy engine
  // moves short rows across PCIe below the link rate: vLLM's jobs of 64 layers' 8 KiB pages ran
  // at 75-77% of the link as plain 2D copies and 85-88% this way, 16 KiB at 85-87% and 89-90%,
  // 32 KiB stores 89% and 92-93%, but 32 KiB loads 90.6-90.8% and 90.0-90.3% (python -m
  // gfd.bench_vllm on an H100, three runs each). The price is a second copy submission per run
  // in the call (a 64-block job's submit 150-260 us plain, 370-540 us bounced), so loads of
  // 32 KiB rows, which gain nothing, stay plain.
  bool bounce_runs = true;
  std::size_t bounce_max_load_width = std::size_t{16} << 10;
  std::size_t bounce_max_store_width = std::size_t{32} << 10;

  // Throws gfd::Error(kInvalidArgument) naming the field when one is outside its limits.
  void validate() const;
};

// Counters of the mechanisms above (the tests check that a branch ran; the benchmark reports
// them), beside the public EngineStats.
struct TuningStats {
  std::uint64_t scattered_chunks = 0;      // chunks placed by the scatter kernel
  std::uint64_t placements = 0;            // launches that placed several of those at once
  std::uint64_t packings = 0;              // launches that packed several device-to-host chunks
  std::uint64_t slots_deferred = 0;        // slots whose wait was left to the gather threads
  std::uint64_t host_direct_chunks = 0;    // chunks read in place from host memory
  std::uint64_t id_planned_transfers = 0;  // CacheSet transfers planned from their ids
  std::uint64_t bounced_runs = 0;          // 2D runs moved through the device twin (bounce_runs)
};

}  // namespace gfd::detail
