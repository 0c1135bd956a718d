// Engine settings that are not user options: the two pipeline mechanisms that have a hardware
// fallback, on by default and resolved off where the GPU lacks what they need. Tests switch them
// off on hardware that has it, so that the fallback branches run everywhere; only code of this
// tree sets them (EngineCore::create, testkit::Device::make_engine). The public EngineOptions
// does not carry them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gfd::detail {

struct Tuning {
  // Host-to-device chunks' DMAs are enqueued at submission behind a flag in pinned memory that
  // the thread finishing the chunk sets (a 64-bit stream memory operation), so that no driver
  // call sits between gathering and DMA, and a submitter takes a slot whose last chunk is still
  // to be placed without waiting (the gather threads wait for its placed flag instead). Resolved
  // off where the GPU lacks those operations or the backend has no copy lanes: the finishing
  // thread then issues the DMA itself.
  bool preissue = true;
  // Host to device, staged chunks with scattered destinations: one placing kernel launch for
  // several chunks of a lane, which marks their slots free in pinned memory (no event per
  // chunk). Needs a GPU that reads pinned memory at its host address; off elsewhere.
  bool batch_placement = true;
  // Chunks one placing or packing launch takes at most (1..32; the lanes together never leave
  // more than half the ring's slots unplaced), and its thread blocks at most (1..32).
  int placement_chunks = 8;
  int placement_blocks = 32;

  // Throws gfd::Error(kInvalidArgument) naming the field when one is outside its limits.
  void validate() const;
};

// Counters of the pipeline's mechanisms (the tests check that a branch ran; the benchmark
// reports them), beside the public EngineStats.
struct TuningStats {
  std::uint64_t scattered_chunks = 0;      // chunks placed by the scatter kernel
  std::uint64_t placements = 0;            // launches that placed several of those at once
  std::uint64_t packings = 0;              // launches that packed several device-to-host chunks
  std::uint64_t slots_deferred = 0;        // slots whose wait was left to the gather threads
  std::uint64_t host_direct_chunks = 0;    // chunks read in place from host memory
  std::uint64_t id_planned_transfers = 0;  // CacheSet transfers planned from their ids
  std::uint64_t bounced_runs = 0;          // 2D runs moved through the staging ring's device twin
};

}  // namespace gfd::detail
