// Internal access to HostPool: a pool over any device implementation (the emulated one in tests
// and in the Python package's testing hooks).
#pragma once

#include <memory>

#include "device/device.hpp"
#include "gfd/host_pool.hpp"

namespace gfd::detail {

struct HostPoolAccess {
  // Like HostPool(options), with `device` for locality and registration instead of a CUDA device
  // (may be null when options.register_memory is false and no locality is wanted).
  static HostPool make(const HostPoolOptions& options, std::shared_ptr<Device> device) {
    return HostPool(options, std::move(device));
  }
};

}  // namespace gfd::detail
