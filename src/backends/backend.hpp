// The interface every backend implements, and the table that maps gfd::Backend to one.
//
// As with NCCL's transports, the engine asks a backend's table entry what it needs
// (capabilities) and otherwise only calls submit() and drain(): nothing outside this table
// branches on which backend an engine runs. A new backend is one file implementing
// BackendImpl plus one row in backend_table.cpp (docs/ARCHITECTURE.md walks through it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "device/device.hpp"
#include "gfd/stats.hpp"
#include "pipeline/engine_context.hpp"
#include "pipeline/transfer.hpp"
#include "planning/cache_set.hpp"

namespace gfd::detail {

// What a backend needs from the engine; read by the engine core when it resolves options and
// by the backend when it builds itself.
struct BackendCaps {
  bool staging_ring = false;         // a pinned staging ring (slot ring)
  bool gather_pool = false;          // gather threads (and so the engine's CPU placement)
  bool copy_lanes = false;           // dedicated copy streams
  bool pinned_sources_only = false;  // host memory must be pinned (a pageable block is rejected)
  bool reads_host_pointers = false;  // GPU code reads pinned host memory at its host address
  bool callers_stream = false;       // its device work runs on the caller's stream itself
  // With pinned_sources_only: who needs pinned memory, for the error message of a pageable block.
  const char* pinned_reason = "";
};

// Everything the engine lends a backend at construction.
struct BackendSetup {
  std::shared_ptr<EngineContext> ctx;
  std::vector<int> cpus;  // CPUs for gather threads
  int numa_node = -1;     // node for staging memory (-1: no binding)
};

// One call of copy_to_device / copy_to_host, or a CacheSet's transfer listed block by block.
struct Request {
  std::span<const BlockCopy> blocks;
  StreamHandle stream = nullptr;
  Direction direction = Direction::kToDevice;
  std::uint32_t id = 0;  // engine-wide transfer number (tracing)
  // Non-null for a CacheSet's transfer: the blocks are pre-validated (PlanConfig::trust).
  const PlanTrust* trust = nullptr;
};

// One call of copy_blocks: a registered CacheSet's transfer as its block ids (not yet checked).
struct SetRequest {
  const CacheSetState& set;
  const BlockIds& src;
  const BlockIds& dst;
  StreamHandle stream = nullptr;
  Direction direction = Direction::kToDevice;
  std::uint32_t id = 0;
  // Direct copies on the caller's stream start with short driver calls (CopyLanes::
  // submit_directs_on's `lead`), so that the copy engine starts on the first blocks while the
  // rest are enqueued. False for a set after the first of one multi-set call: its copies queue
  // behind the earlier sets' anyway, so one driver call for them all costs the caller least.
  bool lead = true;
};

class BackendImpl {
 public:
  explicit BackendImpl(std::shared_ptr<EngineContext> ctx) : ctx_(std::move(ctx)) {}
  virtual ~BackendImpl() = default;
  // Validates and plans the request (all-or-nothing: a bad block throws gfd::Error naming it
  // and nothing reaches its destination), then enqueues it ordered on r.stream. Returns the
  // transfer, or nullptr when there is nothing to move. Device failures after validation are
  // recorded in the transfer rather than thrown.
  virtual TransferPtr submit(const Request& r) = 0;
  // The same for a CacheSet's transfer. The default checks the ids and lists the blocks
  // (CacheSetState::build), then submits the list as pre-validated (submit_listed).
  virtual TransferPtr submit_set(const SetRequest& r);
  // Shutdown: waits until every transfer submitted so far is complete and no engine resource
  // (slot, lane, thread) is in use; afterwards stops the backend's threads.
  virtual void drain() noexcept = 0;
  // Fills what only the backend knows (ring, threads) into `st`.
  virtual void report(EngineStats& st) { (void)st; }

 protected:
  // `r` listed block by block and handed to `submit`; a block that `submit` refuses (pageable
  // host memory for a backend that needs it pinned) is reported as the row and pair it comes from.
  TransferPtr submit_listed(const SetRequest& r,
                            const std::function<TransferPtr(const Request&)>& submit);

  std::shared_ptr<EngineContext> ctx_;
};

struct BackendEntry {
  Backend id;
  BackendCaps caps;
  std::unique_ptr<BackendImpl> (*make)(const BackendSetup& setup);
};

// The table row of `b`.
const BackendEntry& backend_entry(Backend b);

// Plans request `r` whole with `config` (throws gfd::Error for a bad block) and returns the new
// transfer holding the plan, or nullptr when there is nothing to move.
TransferPtr plan_transfer(const std::shared_ptr<EngineContext>& ctx, const Request& r,
                          const PlanConfig& config,
                          std::optional<std::uint64_t> bytes = std::nullopt);

// Pass-through planning (one copy per coalesced block) for the block-by-block and kernel
// backends, with their pinned-memory requirement.
PlanConfig pass_through_config(const EngineContext& ctx, const BackendCaps& caps, Direction d);

}  // namespace gfd::detail
