// The backend table: the one place that knows which gfd::Backend is implemented how and what it
// needs. To add a backend: implement BackendImpl in its own file, add a gfd::Backend value and
// its name (types.hpp, error.cpp's to_string), and add its row here.
#include <iterator>

#include "backends/backend.hpp"
#include "backends/baselines/copy_calls.hpp"
#include "backends/gather/gather.hpp"
#include "backends/baselines/zero_copy_kernel.hpp"
#include "gfd/error.hpp"

namespace gfd::detail {
namespace {

//                     staging  pool   lanes  pinned only  host ptrs  caller's stream
constexpr BackendCaps kGatherCaps{true, true, true, false, false, false};
constexpr BackendCaps kBatchCaps{false, false, false, false, false, true};
constexpr BackendCaps kPerBlockCaps{false, false, false, false, false, true};
constexpr BackendCaps kKernelCaps{true, false, false, true, true, true,
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
  throw Error(ErrorCode::kInvalidArgument,
              "EngineOptions::backend: " + std::to_string(static_cast<int>(b)) + " is not a backend");
}

TransferPtr plan_transfer(const std::shared_ptr<EngineContext>& ctx, const Request& r, const PlanConfig& config,
                          std::optional<std::uint64_t> bytes) {
  Plan plan = ctx->plan(r.blocks, config, r.id, bytes);
  if (plan.total_bytes == 0) {
    ctx->plans.put(std::move(plan));
    return nullptr;
  }
  TransferPtr t = make_transfer(ctx, r.id, r.direction);
  t->plan = std::move(plan);
  return t;
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
