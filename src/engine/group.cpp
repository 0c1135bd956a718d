#include "gfd/group.hpp"

#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "device/device.hpp"
#include "engine/engine_core.hpp"
#include "gfd/error.hpp"
#include "host/topology.hpp"

namespace gfd {

EngineGroup::EngineGroup(std::span<const int> devices, const EngineOptions& options) {
  for (std::size_t i = 0; i < devices.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (devices[i] == devices[j])
        throw Error(ErrorCode::kInvalidArgument,
                    "devices: GPU " + std::to_string(devices[i]) + " appears twice");
  engines_.reserve(devices.size());
  for (int d : devices) {
    EngineOptions o = options;
    o.device = d;
    engines_.emplace_back(o);
  }
}

EngineGroup::EngineGroup(std::vector<Engine> engines) : engines_(std::move(engines)) {}

void EngineGroup::run(const std::function<void(std::size_t, Engine&)>& fn) {
  std::mutex m;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(engines_.size());
  for (std::size_t i = 0; i < engines_.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        Engine& e = engines_[i];
        detail::EngineCore& core = detail::EngineCore::of(e);
        detail::pin_current_thread(core.stats().cpus);
        core.device().make_current();
        fn(i, e);
      } catch (...) {
        std::lock_guard lk(m);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

std::vector<int> visible_devices() {
  std::vector<int> out;
  for (int i = 0; i < detail::cuda_device_count(); ++i) out.push_back(i);
  return out;
}

}  // namespace gfd
