// One point of an engine trace (tracer.hpp records them; benchmarks read them through
// testkit/testkit.hpp to find pipeline bubbles).
#pragma once

#include <cstdint>

namespace gfd::detail {

struct TraceEvent {
  enum What : std::uint16_t {
    kSubmit,          // copy_to_device / copy_to_host entered
    kPlanned,         // validation and planning done
    kChunkPublished,  // a = chunk, b = pieces
    kPieceStart,      // a = chunk, b = piece
    kPieceEnd,        // a = chunk, b = piece
    kChunkIssued,     // a = chunk, b = bytes
    kFinalized,       // the last DMA is enqueued
    kReturn,          // the submitting call returns
    kDmaDone,         // a = chunk: its DMA completed on the GPU (GPU clock mapped onto the host's,
                      // from an event recorded at submission: early by the launch latency)
    kStage,           // a = Stage: a step of the submission path is done
  };
  // kStage points, in submission order.
  enum Stage : std::uint32_t {
    kPoolWoken,       // the gather pool was woken
    kPlanStorage,     // the plan's storage is reserved (planning while gathering)
    kLanesBegun,      // the transfer's start is recorded on the caller's stream
    kSlotTaken,       // zero-copy kernel, one-chunk transfer: a slot (for the block list) is taken
    kListWritten,     // zero-copy kernel: the block list is written into it
    kGathered,        // one-chunk transfer: the submitter has gathered it
    kEarlyPublished,  // the chunks packed before the whole list was checked are published
    kPacked,          // host to device: a stretch of the list is packed (b = blocks packed so far)
    kEnqueued,        // host to device, preissue: chunk b's DMA is enqueued by the submitter
  };
  std::uint64_t ns;        // steady clock
  std::uint32_t transfer;  // engine-wide transfer number
  std::uint16_t what;
  std::int16_t thread;  // gather thread index, -1 for other threads
  std::uint32_t a, b;
};

}  // namespace gfd::detail
