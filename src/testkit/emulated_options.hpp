// How the host-emulated device behaves (testkit::Device::emulated): delays that widen race
// windows, injected faults, and the CUDA driver's lock while memory is freed.
#pragma once

#include <chrono>
#include <functional>

namespace gfd::testkit {

struct EmulatedOptions {
  // Each copy or scatter sleeps this long before it runs, to widen race windows in tests.
  std::chrono::microseconds copy_delay{0};
  // Fault injection: asked before each data operation runs on a stream ("copy_h2d", "scatter",
  // "zero_copy", "copy_batch", "gather", ...). Returning true makes it fail as a GPU fault does on
  // CUDA: nothing is copied and the device is left in a sticky error state in which every later
  // call and every event query throws gfd::Error(kCuda), until clear_fault().
  std::function<bool(const char* op)> fault;
  // Models what the CUDA driver was seen to do when one thread frees device memory (cuMemFree):
  // it takes a lock that every other driver call waits for, and holds it until the whole device
  // has drained. With this set, free_device() waits for every stream to run dry while no other
  // call of this device (an enqueue, an event query, ...) may start; a stream that waits for a
  // host flag whose writer first needs such a call then deadlocks, as it would on a GPU.
  bool free_waits_for_device = false;
};

}  // namespace gfd::testkit
