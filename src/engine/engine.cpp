// Public Engine / Transfer: thin forwarding to the engine core and the transfer state.
#include "gfd/engine.hpp"

#include <string>

#include "device/device.hpp"
#include "engine/engine_core.hpp"
#include "gfd/error.hpp"
#include "planning/cache_set.hpp"

namespace gfd {

bool Transfer::done() const { return !state_ || state_->poll(); }

void Transfer::wait() const {
  if (!state_) return;
  state_->wait();
  if (auto e = state_->failure()) {
    // Thrown as a copy with a message of its own: the stored exception may be released on a
    // gather thread (with the transfer's last reference) while the caller's handler still reads
    // it, and the reference counts that order the two are invisible to ThreadSanitizer.
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      throw Error(err.code(), std::string(err.what()), err.block());
    }
  }
}

std::exception_ptr Transfer::error() const {
  if (!state_) return nullptr;
  state_->wait();
  return state_->failure();
}

std::uint64_t Transfer::bytes() const { return state_ ? state_->plan.total_bytes : 0; }

namespace {
// Options are checked before the device is opened, so that a bad option is reported as such on
// a machine without a GPU too.
const EngineOptions& checked(const EngineOptions& o) {
  o.validate();
  return o;
}
}  // namespace

Engine::Engine(const EngineOptions& options)
    : core_(
          detail::EngineCore::create(options, detail::make_cuda_device(checked(options).device))) {}

Engine::Engine(int device)
    : Engine([device] {
        EngineOptions o;
        o.device = device;
        return o;
      }()) {}

Engine::Engine(std::shared_ptr<detail::EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() {
  if (core_) core_->shutdown();
}

Engine::Engine(Engine&&) noexcept = default;

Engine& Engine::operator=(Engine&& other) noexcept {
  if (this != &other) {
    if (core_) core_->shutdown();
    core_ = std::move(other.core_);
  }
  return *this;
}

namespace {
// Messages of a bad argument start with the call that was given it: the checks below a call
// (planning, ids) are shared by several calls and name only the argument.
template <class F>
auto named(const char* call, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    throw Error(e.code(), std::string(call) + ": " + e.what(), e.block());
  }
}
}  // namespace

Transfer Engine::copy_to_device(std::span<const BlockCopy> blocks, cudaStream_t stream) {
  return named("copy_to_device", [&] {
    return detail::EngineCore::of(*this).submit(blocks, stream, detail::Direction::kToDevice);
  });
}

Transfer Engine::copy_to_host(std::span<const BlockCopy> blocks, cudaStream_t stream) {
  return named("copy_to_host", [&] {
    return detail::EngineCore::of(*this).submit(blocks, stream, detail::Direction::kToHost);
  });
}

CacheSet Engine::register_caches(std::span<const CachePair> pairs) {
  return detail::EngineCore::of(*this).register_caches(pairs);
}

CacheSet Engine::register_caches(std::span<const CachePair> pairs,
                                 std::span<const std::string> names) {
  return detail::EngineCore::of(*this).register_caches(pairs, {names.begin(), names.end()});
}

Transfer Engine::copy_blocks(const CacheSet& caches, Direction direction, const BlockIds& src_ids,
                             const BlockIds& dst_ids, cudaStream_t stream) {
  return named("copy_blocks", [&] {
    return detail::EngineCore::of(*this).submit_blocks(caches, direction, src_ids, dst_ids, stream);
  });
}

std::vector<Transfer> Engine::copy_blocks(std::span<const CacheSet> caches, Direction direction,
                                          const BlockIds& src_ids, const BlockIds& dst_ids,
                                          cudaStream_t stream,
                                          const std::function<void(std::size_t)>& after_each) {
  detail::EngineCore& core = detail::EngineCore::of(*this);
  // Every id against every set before anything is enqueued. (An id given twice as a destination
  // is found by the first set's transfer, before it enqueues anything.)
  named("copy_blocks",
        [&] { detail::CacheSetState::check_sets(caches, &core, direction, src_ids, dst_ids); });
  std::vector<Transfer> out;
  out.reserve(caches.size());
  for (std::size_t k = 0; k < caches.size(); ++k) {
    // Set k > 0 queues behind set k - 1 on `stream`: no short first batch (SetRequest::lead).
    out.push_back(named("copy_blocks", [&] {
      return core.submit_blocks(caches[k], direction, src_ids, dst_ids, stream, k == 0);
    }));
    if (after_each) after_each(k);
  }
  return out;
}

EngineStats Engine::stats() const { return detail::EngineCore::of(*this).stats(); }
const EngineOptions& Engine::options() const { return detail::EngineCore::of(*this).options(); }

}  // namespace gfd
