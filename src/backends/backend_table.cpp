// The backend table: the one place that knows which gfd::Backend is implemented how and what it
// needs. To add a backend: implement BackendImpl in its own file, add a gfd::Backend value and
// its name (types.hpp, error.cpp's to_string), and add its row here.
#include <iterator>
#include <string>

#include "backends/backend.hpp"
#include "backends/baselines/copy_calls.hpp"
#include "backends/baselines/zero_copy_kernel.hpp"
#include "backends/gather/gather.hpp"
#include "common/sync.hpp"
#include "gfd/error.hpp"

namespace gfd::detail {
namespace {

//                     staging  pool   lanes  pinned only  host ptrs  caller's stream
constexpr BackendCaps kGatherCaps{true, true, true, false, false, false};
constexpr BackendCaps kBatchCaps{false, false, false, false, false, true};
constexpr BackendCaps kPerBlockCaps{false, false, false, false, false, true};
constexpr BackendCaps kKernelCaps{
    true,
    false,
    false,
    true,
    true,
    true,
    "the zero_copy_kernel backend reads sources with SM loads over PCIe and"};

const BackendEntry kTable[] = {
    {Backend::kGather, kGatherCaps, make_gather},
    {Backend::kBatchAsync, kBatchCaps, make_batch_async},
    {Backend::kPerBlock, kPerBlockCaps, make_per_block},
    {Backend::kZeroCopyKernel, kKernelCaps, make_zero_copy_kernel},
};

}  // namespace

const BackendEntry& backend_entry(Backend b) {
  for (const BackendEntry& e : kTable)
    if (e.id == b) return e;
  throw Error(
      ErrorCode::kInvalidArgument,
      "EngineOptions::backend: " + std::to_string(static_cast<int>(b)) + " is not a backend");
}

TransferPtr plan_transfer(const std::shared_ptr<EngineContext>& ctx, const Request& r,
                          const PlanConfig& config, std::optional<std::uint64_t> bytes) {
  Plan plan = ctx->plan(r.blocks, config, r.id, bytes);
  if (plan.total_bytes == 0) {
    ctx->plans.put(std::move(plan));
    return nullptr;
  }
  TransferPtr t = make_transfer(ctx, r.id, r.direction);
  t->plan = std::move(plan);
  return t;
}

TransferPtr BackendImpl::submit_set(const SetRequest& r) {
  return submit_listed(r, [this](const Request& q) { return submit(q); });
}

TransferPtr BackendImpl::submit_listed(const SetRequest& r,
                                       const std::function<TransferPtr(const Request&)>& submit) {
  // Reused by each thread: the planner copies what it keeps, so the list only lives for the call.
  thread_local std::vector<BlockCopy> blocks;
  thread_local std::vector<std::uint8_t> pinned;
  const CacheSetState& set = r.set;
  const auto t0 = Clock::now();
  set.build(r.direction, r.src, r.dst, blocks, pinned);
  Counters::add(ctx_->counters.plan_ns, ns_since(t0));
  const PlanTrust trust{pinned.data(), set.all_pinned, set.one_allocation};
  try {
    return submit(Request{blocks, r.stream, r.direction, r.id, &trust});
  } catch (const Error& e) {
    // Entry p * rows + i of the list (i * pairs + p where row-major) is row i of pair p.
    const std::size_t rows = r.src.count;
    if (e.block() == kNoBlock || rows == 0 || e.block() >= blocks.size()) throw;
    const std::size_t p = set.row_major ? e.block() % set.pairs.size() : e.block() / rows;
    const std::size_t i = set.row_major ? e.block() / set.pairs.size() : e.block() % rows;
    const bool to_device = r.direction == Direction::kToDevice;
    throw Error(e.code(),
                std::string(e.what()) + " [" + set.label(p, to_device) + " -> " +
                    set.label(p, !to_device) + ", " + name_at("src_ids", i) + "]",
                i);
  }
}

PlanConfig pass_through_config(const EngineContext& ctx, const BackendCaps& caps, Direction d) {
  PlanConfig c = ctx.plan_config;
  c.direction = d;
  c.mode = PlanConfig::Mode::kPassThrough;
  c.require_pinned_host = caps.pinned_sources_only;
  c.pinned_reason = caps.pinned_reason;
  return c;
}

}  // namespace gfd::detail
