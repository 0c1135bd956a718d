// Public Engine / Transfer: thin forwarding to the engine core and the transfer state.
#include "gfd/engine.hpp"

#include <string>

#include "device/device.hpp"
#include "engine_core.hpp"
#include "gfd/error.hpp"

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
    : core_(detail::EngineCore::create(options, detail::make_cuda_device(checked(options).device))) {}

Engine::Engine(int device) : Engine([device] {
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

Transfer Engine::copy_to_device(std::span<const BlockCopy> blocks, cudaStream_t stream) {
  return detail::EngineCore::of(*this).submit(blocks, stream, detail::Direction::kToDevice);
}

Transfer Engine::copy_to_host(std::span<const BlockCopy> blocks, cudaStream_t stream) {
  return detail::EngineCore::of(*this).submit(blocks, stream, detail::Direction::kToHost);
}

CacheSet Engine::register_caches(std::span<const CachePair> pairs) {
  return detail::EngineCore::of(*this).register_caches(pairs);
}

Transfer Engine::copy_blocks(const CacheSet& caches, Direction direction, const BlockIds& src_ids,
                             const BlockIds& dst_ids, cudaStream_t stream) {
  return detail::EngineCore::of(*this).submit_blocks(caches, direction, src_ids, dst_ids, stream);
}

EngineStats Engine::stats() const { return detail::EngineCore::of(*this).stats(); }
const EngineOptions& Engine::options() const { return detail::EngineCore::of(*this).options(); }

}  // namespace gfd
