#include "backends/baselines/zero_copy_kernel.hpp"

#include <algorithm>
#include <cstddef>
#include <mutex>

#include "host/gather_copy.hpp"

namespace gfd::detail {

// A pass-through plan's list is the kernel's list, byte for byte: it is streamed into the slot
// whole with non-temporal stores (the slot's lines are rarely still cached from their last use),
// less than half the time of copying it entry by entry.
static_assert(sizeof(DirectCopy) == sizeof(ZeroCopyEntry) &&
              offsetof(DirectCopy, src) == offsetof(ZeroCopyEntry, src) &&
              offsetof(DirectCopy, dst) == offsetof(ZeroCopyEntry, dst) &&
              offsetof(DirectCopy, bytes) == offsetof(ZeroCopyEntry, bytes));

void ZeroCopyKernel::submit(TransferState& t, StreamHandle stream) {
  const Plan& p = t.plan;
  const std::size_t total = p.ops.size() + p.direct.size();
  const std::size_t per_slot = ring_.slot_bytes() / sizeof(ZeroCopyEntry);
  auto entry = [&](std::size_t i) -> ZeroCopyEntry {
    if (i < p.ops.size())
      return {reinterpret_cast<std::uint64_t>(p.ops[i].src),
              reinterpret_cast<std::uint64_t>(p.ops[i].dst), p.ops[i].bytes};
    const DirectCopy& d = p.direct[i - p.ops.size()];
    return {reinterpret_cast<std::uint64_t>(d.src), reinterpret_cast<std::uint64_t>(d.dst),
            d.bytes};
  };
  Device& d = *ctx_.device;
  {
    std::lock_guard lk(lock_);
    try {
      for (std::size_t i = 0; i < total; i += per_slot) {
        const auto n = static_cast<std::uint32_t>(std::min(per_slot, total - i));
        Slot& s = ring_[ring_.acquire()];
        ctx_.tracer.record(t.id, TraceEvent::kStage, TraceEvent::kSlotTaken, 0);
        auto* entries = reinterpret_cast<ZeroCopyEntry*>(s.host);
        if (p.ops.empty()) {
          copy_block(entries, p.direct.data() + i, std::size_t{n} * sizeof(ZeroCopyEntry),
                     nontemporal_supported() ? StoreKind::kNonTemporal : StoreKind::kNormal);
          store_fence();
        } else {
          for (std::uint32_t k = 0; k < n; ++k) entries[k] = entry(i + k);
        }
        ctx_.tracer.record(t.id, TraceEvent::kStage, TraceEvent::kListWritten, 0);
        s.issue([&] {
          d.zero_copy(entries, n, stream);
          d.record_event(s.done, stream);
        });
      }
      d.record_event(t.done_event, stream);
    } catch (...) {
      t.fail(std::current_exception());
    }
  }
  t.mark_finalized();
}

namespace {

class ZeroCopyBackend final : public BackendImpl {
 public:
  explicit ZeroCopyBackend(const BackendSetup& setup)
      : BackendImpl(setup.ctx),
        ring_(*ctx_->device, ctx_->counters,
              RingConfig{ctx_->options.staging_bytes / ctx_->options.slot_bytes,
                         ctx_->options.slot_bytes, setup.numa_node, /*device_twin=*/false,
                         /*flags=*/false}),
        kernel_(*ctx_, ring_, lock_) {}

  TransferPtr submit(const Request& r) override {
    const BackendCaps& caps = backend_entry(Backend::kZeroCopyKernel).caps;
    PlanConfig cfg = pass_through_config(*ctx_, caps, r.direction);
    cfg.trust = r.trust;
    TransferPtr t = plan_transfer(ctx_, r, cfg);
    if (!t) return nullptr;
    kernel_.submit(*t, r.stream);
    live_.add(t);
    return t;
  }

  void drain() noexcept override {
    ring_.drain();
    live_.wait_all();
  }

  void report(EngineStats& st) override {
    st.hugepages = ring_.hugepages();
    st.staging_bytes = ring_.bytes();
  }

 private:
  FifoMutex lock_;
  SlotRing ring_;
  ZeroCopyKernel kernel_;
  LiveTransfers live_;
};

}  // namespace

std::unique_ptr<BackendImpl> make_zero_copy_kernel(const BackendSetup& setup) {
  return std::make_unique<ZeroCopyBackend>(setup);
}

}  // namespace gfd::detail
