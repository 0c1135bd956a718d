#include "backends/baselines/copy_calls.hpp"

#include <vector>

namespace gfd::detail {
namespace {

class CopyCalls final : public BackendImpl {
 public:
  CopyCalls(const BackendSetup& setup, const BackendCaps& caps, bool batched)
      : BackendImpl(setup.ctx), caps_(caps), batched_(batched) {}

  TransferPtr submit(const Request& r) override {
    PlanConfig cfg = pass_through_config(*ctx_, caps_, r.direction);
    cfg.trust = r.trust;
    TransferPtr t = plan_transfer(ctx_, r, cfg);
    if (!t) return nullptr;
    try {
      if (batched_)
        copy_batched(*t, r.stream);
      else
        copy_each(*t, r.stream);
      ctx_->device->record_event(t->done_event, r.stream);
    } catch (...) {
      t->fail(std::current_exception());
    }
    t->mark_finalized();
    live_.add(t);
    return t;
  }

  void drain() noexcept override { live_.wait_all(); }

 private:
  void copy_each(TransferState& t, StreamHandle s) {
    Device& d = *ctx_->device;
    for (const DirectCopy& c : t.plan.direct) {
      if (t.to_host())
        d.copy_d2h(c.dst, c.src, c.bytes, s);
      else
        d.copy_h2d(c.dst, c.src, c.bytes, s);
    }
  }

  // One cudaMemcpyBatchAsync per slot_bytes of blocks (at least one block each).
  void copy_batched(TransferState& t, StreamHandle s) {
    const std::vector<DirectCopy>& c = t.plan.direct;
    thread_local std::vector<void*> dsts;
    thread_local std::vector<const void*> srcs;
    thread_local std::vector<std::size_t> sizes;
    for (std::size_t i = 0; i < c.size();) {
      dsts.clear();
      srcs.clear();
      sizes.clear();
      std::size_t bytes = 0;
      do {
        dsts.push_back(c[i].dst);
        srcs.push_back(c[i].src);
        sizes.push_back(c[i].bytes);
        bytes += c[i].bytes;
        ++i;
      } while (i < c.size() && bytes + c[i].bytes <= ctx_->options.slot_bytes);
      ctx_->device->copy_batch(dsts.data(), srcs.data(), sizes.data(), dsts.size(), t.to_host(), s);
      Counters::add(ctx_->counters.chunks, 1);
    }
  }

  BackendCaps caps_;
  bool batched_;
  LiveTransfers live_;
};

}  // namespace

std::unique_ptr<BackendImpl> make_per_block(const BackendSetup& setup) {
  return std::make_unique<CopyCalls>(setup, backend_entry(Backend::kPerBlock).caps, false);
}

std::unique_ptr<BackendImpl> make_batch_async(const BackendSetup& setup) {
  return std::make_unique<CopyCalls>(setup, backend_entry(Backend::kBatchAsync).caps, true);
}

}  // namespace gfd::detail
