// gfd — the per-GPU transfer engine.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gfd/cache_set.hpp"
#include "gfd/options.hpp"
#include "gfd/stats.hpp"
#include "gfd/types.hpp"

namespace gfd {

namespace detail {
class EngineCore;
class Device;
struct TransferState;
}  // namespace detail

/// Handle of one submitted transfer. Cheap to copy; all copies refer to the same transfer.
/// A default-constructed handle is complete.
class Transfer {
 public:
  Transfer() = default;

  /// True once every byte is in place (on the GPU, or in host memory for copy_to_host), or the
  /// transfer has failed. Never blocks.
  bool done() const;
  /// Blocks until done(); throws the transfer's gfd::Error if it failed.
  void wait() const;
  /// The failure of a completed transfer, or nullptr. Blocks like wait() but does not throw.
  std::exception_ptr error() const;
  /// Bytes this transfer moves.
  std::uint64_t bytes() const;

 private:
  friend class detail::EngineCore;
  explicit Transfer(std::shared_ptr<detail::TransferState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::TransferState> state_;
};

/// A transfer engine bound to one GPU: a pinned staging ring, a pool of gather threads and
/// dedicated copy streams, shared with no other engine. Thread-safe: many threads may submit
/// at once. Destruction waits for every submitted transfer to complete.
class Engine {
 public:
  /// An engine for `options.device`, with `options` used as given: the environment is read only
  /// where the caller asks for it, `Engine(EngineOptions::from_env())`. Throws gfd::Error with
  /// ErrorCode::kNoDevice when no CUDA GPU or driver is present or the device does not exist,
  /// kInvalidArgument for a bad option.
  explicit Engine(const EngineOptions& options);
  /// An engine for `device` with the default options. GFD_* environment variables are not read;
  /// for them use `Engine(EngineOptions::from_env())` (with `device` set as needed).
  explicit Engine(int device = 0);
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Copies every block from host memory to this engine's GPU, ordered on `stream`: the copies
  /// start only after work already queued on `stream`, and work queued on `stream` afterwards
  /// sees the data (no host synchronisation needed). Returns once every DMA is enqueued, while
  /// the gather threads copy (with EngineOptions::submitter_gathers, once every block is
  /// gathered into staging, the calling thread helping); it never waits for a DMA to finish
  /// except to reuse a staging slot when the ring is full. Source blocks must stay
  /// unchanged until the returned handle is done.
  ///
  /// Rejection: every block is validated before any DMA is enqueued (the gather backend may
  /// already be reading the first, validated, source blocks into its staging), so a bad block
  /// (or an overlap) throws gfd::Error(kInvalidArgument) from this call, naming its index, and
  /// nothing reaches the device. What fails later (a CUDA error while the DMAs run, the engine
  /// shutting down) surfaces at wait() / error() of the handle.
  ///
  /// Completion: the handle is done() when the transfer's DMAs have completed, i.e. when the
  /// data is on the GPU; by then `stream` may still have earlier work to run, but anything
  /// queued on `stream` after this call already sees the data, whether done() is true or not.
  [[nodiscard]] Transfer copy_to_device(std::span<const BlockCopy> blocks, cudaStream_t stream);

  /// Copies every block from this engine's GPU to host memory (pinned or pageable), ordered on
  /// `stream`: the copies start only after work already queued on `stream`, and work queued on
  /// `stream` afterwards may overwrite the source blocks (the device has finished reading them).
  /// Validation as for copy_to_device (sources must be device memory of this GPU, destinations
  /// host memory). With the gather backend, scattered device blocks are packed on the GPU into
  /// staging, moved in large DMAs and placed by the gather threads; the call returns once
  /// everything is enqueued.
  ///
  /// Rejection: the gather backend plans while its first DMAs run, but the whole block list is
  /// still checked before this call returns, so a bad block (or an overlap) also throws
  /// gfd::Error(kInvalidArgument) from this call, naming its index, and no byte is written to
  /// host memory (DMAs already enqueued into staging are dropped; `stream` still waits for
  /// them). Later failures surface at wait() / error() of the handle.
  ///
  /// Completion: the handle is done() only when every byte is in host memory. That is after the
  /// DMAs `stream` waits for, because the gather threads place the staged bytes in host memory
  /// once those DMAs complete: `stream` may run on before done() is true, and host code must
  /// wait for the handle (not for the stream) before it reads the destinations.
  [[nodiscard]] Transfer copy_to_host(std::span<const BlockCopy> blocks, cudaStream_t stream);

  /// Describes a runtime's caches to this engine once: every pair's host and device array
  /// (base, blocks, block bytes, stride). Checked here, with a few driver queries per array: the
  /// device arrays lie in device memory of this GPU, the host arrays in host memory (pinned is
  /// fastest; pageable is staged), both sides of a pair have one block size and no two arrays
  /// share a byte. Throws gfd::Error(kInvalidArgument) naming the pair and side. The memory
  /// must stay allocated while the set is used.
  CacheSet register_caches(std::span<const CachePair> pairs);
  /// As above, with the names messages give the arrays: `names[2 * p]` is pair p's host array,
  /// `names[2 * p + 1]` its device array (a binding passes its caller's names: "host[3]"). By
  /// default they are "pairs[p].host" and "pairs[p].device".
  CacheSet register_caches(std::span<const CachePair> pairs, std::span<const std::string> names);

  /// One transfer of block `src_ids[i]` to block `dst_ids[i]` of every pair of `caches`, for
  /// every i: host to device for Direction::kToDevice (src_ids index the host arrays), device
  /// to host for Direction::kToHost. Ordered on `stream` and completed exactly as copy_to_device /
  /// copy_to_host. The call checks only the ids (same count, in range, no destination id
  /// twice) and builds the copy list in one pass, with no per-block or per-array driver call;
  /// a bad id throws gfd::Error(kInvalidArgument) whose block() is its position i and whose
  /// message names the argument, before anything moves. `caches` must come from this engine.
  [[nodiscard]] Transfer copy_blocks(const CacheSet& caches, Direction direction,
                                     const BlockIds& src_ids, const BlockIds& dst_ids,
                                     cudaStream_t stream);

  /// One transfer per set of `caches`, each of block `src_ids[i]` to block `dst_ids[i]` of every
  /// pair of that set, issued in order on `stream`: set k's transfer starts after set k - 1's
  /// has completed, so the sets complete in order (a model's layers, say: the forward pass may
  /// wait for layer l alone). `after_each(k)`, if given, runs once set k's transfer is enqueued
  /// and before set k + 1's (a runtime records its per-layer event on `stream` there). The ids
  /// are checked against every set before anything is enqueued; otherwise as copy_blocks.
  [[nodiscard]] std::vector<Transfer> copy_blocks(
      std::span<const CacheSet> caches, Direction direction, const BlockIds& src_ids,
      const BlockIds& dst_ids, cudaStream_t stream,
      const std::function<void(std::size_t)>& after_each = {});

  /// Counters since creation.
  EngineStats stats() const;
  /// The options in force (with automatic choices resolved).
  const EngineOptions& options() const;

 private:
  friend class detail::EngineCore;
  explicit Engine(std::shared_ptr<detail::EngineCore> core);
  std::shared_ptr<detail::EngineCore> core_;
};

}  // namespace gfd
