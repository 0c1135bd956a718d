// gfd — one engine per GPU, each driven from its own thread.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "gfd/engine.hpp"
#include "gfd/options.hpp"

namespace gfd {

/// One engine per GPU, the way a serving runtime with a worker per GPU uses gfd. The engines
/// share nothing: no lock, no thread, no staging memory; each one's ring and gather threads sit
/// on its own GPU's NUMA node, and GPUs that share a node split its CPUs between their engines
/// (EngineOptions::use_all_local_cpus turns that off).
class EngineGroup {
 public:
  /// An engine for each of `devices` (CUDA ordinals, no repeats), each with `options` with its
  /// `device` replaced. Throws gfd::Error naming the device that cannot be used. The default is
  /// the default options: the environment is not read unless the caller passes
  /// `EngineOptions::from_env()` (whose GFD_DEVICE is then replaced like any device).
  explicit EngineGroup(std::span<const int> devices,
                       const EngineOptions& options = EngineOptions{});
  /// A group of engines made elsewhere.
  explicit EngineGroup(std::vector<Engine> engines);

  std::size_t size() const { return engines_.size(); }
  Engine& operator[](std::size_t i) { return engines_.at(i); }

  /// Runs `fn(i, engine i)` for every engine at once, each on its own thread, pinned to that
  /// engine's CPUs with its GPU current. Returns when every call has returned; then rethrows the
  /// first exception one of them threw.
  void run(const std::function<void(std::size_t, Engine&)>& fn);

 private:
  std::vector<Engine> engines_;
};

/// Ordinals of every CUDA device this process can see (empty without a driver or GPU).
std::vector<int> visible_devices();

}  // namespace gfd
