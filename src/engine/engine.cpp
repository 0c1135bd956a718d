// Public Engine / Transfer: thin forwarding to the engine core and the transfer state.
#include "gfd/engine.hpp"

#include <string>

#include "device/device.hpp"
#include "engine/engine_core.hpp"
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

std::vector<Transfer> Engine::copy_blocks(std::span<const CacheSet> sets, Direction direction,
                                          const BlockIds& src_ids, const BlockIds& dst_ids, cudaStream_t stream,
                                          const std::function<void(std::size_t)>& after_each) {
  // Every id against every set before anything is enqueued: the fewest blocks any set has, per
  // side. (An id given twice as a destination is found by the first set's transfer, before it
  // enqueues anything.)
  const bool to_device = direction == Direction::kToDevice;
  std::uint64_t src_limit = UINT64_MAX, dst_limit = UINT64_MAX;
  std::size_t src_set = 0, dst_set = 0;
  for (std::size_t k = 0; k < sets.size(); ++k) {
    const std::uint64_t s = to_device ? sets[k].host_blocks() : sets[k].device_blocks();
    const std::uint64_t d = to_device ? sets[k].device_blocks() : sets[k].host_blocks();
    if (s < src_limit) src_limit = s, src_set = k;
    if (d < dst_limit) dst_limit = d, dst_set = k;
  }
  if (src_ids.count != dst_ids.count)
    throw Error(ErrorCode::kInvalidArgument,
                std::to_string(src_ids.count) + " src_ids but " + std::to_string(dst_ids.count) + " dst_ids");
  const char* src_side = to_device ? "host" : "device";
  const char* dst_side = to_device ? "device" : "host";
  for (std::size_t i = 0; i < src_ids.count && !sets.empty(); ++i) {
    const std::int64_t s = src_ids[i], t = dst_ids[i];
    auto bad = [&](const char* name, const char* what, std::int64_t v, const char* side, std::size_t k,
                   std::uint64_t n) {
      throw Error(ErrorCode::kInvalidArgument,
                  std::string(name) + "[" + std::to_string(i) + "] (block " + std::to_string(s) +
                      " -> " + std::to_string(t) + "): " + what + " block " + std::to_string(v) +
                      (v < 0 ? std::string(" is negative")
                             : " is out of range (set " + std::to_string(k) + "'s " + side + " caches have " +
                                   std::to_string(n) + " blocks)"),
                  i);
    };
    if (s < 0 || static_cast<std::uint64_t>(s) >= src_limit) bad("src_ids", "source", s, src_side, src_set, src_limit);
    if (t < 0 || static_cast<std::uint64_t>(t) >= dst_limit)
      bad("dst_ids", "destination", t, dst_side, dst_set, dst_limit);
  }
  std::vector<Transfer> out;
  out.reserve(sets.size());
  for (std::size_t k = 0; k < sets.size(); ++k) {
    // Set k > 0 queues behind set k - 1 on `stream`: no short first batch (SetRequest::lead).
    out.push_back(detail::EngineCore::of(*this).submit_blocks(sets[k], direction, src_ids, dst_ids, stream, k == 0));
    if (after_each) after_each(k);
  }
  return out;
}

EngineStats Engine::stats() const { return detail::EngineCore::of(*this).stats(); }
const EngineOptions& Engine::options() const { return detail::EngineCore::of(*this).options(); }

}  // namespace gfd
