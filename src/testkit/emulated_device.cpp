// Emulated device core: lifetime, sticky faults, streams (one worker thread each) and events.
#include "testkit/emulated_device.hpp"

#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "gfd/error.hpp"

namespace gfd::detail {
namespace {

using Clock = std::chrono::steady_clock;

struct EmuEvent {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // generation of the latest record call
  std::uint64_t completed = 0;  // generation whose record has executed
  Clock::time_point when{};
};

struct EmuStream {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  std::uint64_t enqueued = 0, executed = 0;
  bool stop = false;
  std::thread thread;

  void run() {
    std::unique_lock lk(m);
    for (;;) {
      cv.wait(lk, [&] { return stop || !ops.empty(); });
      if (ops.empty()) return;
      auto op = std::move(ops.front());
      ops.pop_front();
      lk.unlock();
      op();
      lk.lock();
      ++executed;
      cv.notify_all();
    }
  }
};

// Every live stream of every emulated device of the process: one may be used by any of them,
// as a GPU's streams are by every engine of that GPU (each emulated engine has a device of its
// own). A handle not in it is refused.
struct LiveStreams {
  std::mutex m;
  std::set<EmuStream*> streams;
};
LiveStreams& live_streams() {
  static auto* l = new LiveStreams();  // never destroyed: streams may outlive static destruction
  return *l;
}

// Stops a stream once its queued work has run (like cudaStreamDestroy) and frees it.
void stop_and_delete(EmuStream* s) {
  {
    LiveStreams& l = live_streams();
    std::lock_guard lk(l.m);
    l.streams.erase(s);
  }
  {
    std::lock_guard lk(s->m);
    s->stop = true;
    s->cv.notify_all();
  }
  s->thread.join();
  delete s;
}

}  // namespace

struct EmulatedDevice::Impl {
  std::mutex m;
  std::set<EmuStream*> streams;
  mutable std::mutex fault_m;
  mutable std::condition_variable fault_cv;
  std::string fault;  // the sticky error in force, "" when none
  // Copies and kernels that passed the fault check and have not finished (under fault_m): a
  // fault is reported only once none is left, as on a GPU nothing runs once the error is seen
  // (a slot freed after its failed DMA must not still be read by it).
  int running = 0;
  // testkit::EmulatedOptions::free_waits_for_device: the driver's lock.
  std::shared_mutex driver;

  // The stream behind handle `h`. A handle no emulated device made (a made-up integer from
  // Python, a stream destroyed) is refused rather than followed: the emulator knows its
  // streams, where a GPU would fault on such a handle.
  static EmuStream* stream(StreamHandle h) {
    if (h == nullptr)
      throw Error(ErrorCode::kInvalidArgument,
                  "stream: the emulated device has no default stream; pass one of its streams");
    auto* s = static_cast<EmuStream*>(h);
    LiveStreams& l = live_streams();
    std::lock_guard lk(l.m);
    if (l.streams.count(s) == 0) {
      char text[32];
      std::snprintf(text, sizeof text, "%p", h);
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("stream ") + text +
                      ": not a stream of the emulated device (one it made and "
                      "has not destroyed)");
    }
    return s;
  }
};

EmulatedDevice::ApiLock EmulatedDevice::api_call() const {
  if (!options_.free_waits_for_device) return {};
  return {std::shared_lock(impl_->driver)};
}

void EmulatedDevice::api_gate() const { (void)api_call(); }

std::unique_lock<std::shared_mutex> EmulatedDevice::driver_lock() {
  return std::unique_lock(impl_->driver);
}

void EmulatedDevice::drain_all_streams() {
  std::lock_guard lk(impl_->m);
  for (EmuStream* s : impl_->streams) {
    std::unique_lock slk(s->m);
    s->cv.wait(slk, [&] { return s->executed >= s->enqueued; });
  }
}

void EmulatedDevice::clear_fault() {
  std::lock_guard lk(impl_->fault_m);
  impl_->fault.clear();
}

std::string EmulatedDevice::fault_message() const {
  std::lock_guard lk(impl_->fault_m);
  return impl_->fault;
}

void EmulatedDevice::check_sticky() const {
  std::unique_lock lk(impl_->fault_m);
  if (impl_->fault.empty()) return;
  impl_->fault_cv.wait(lk, [&] { return impl_->running == 0; });
  throw Error(ErrorCode::kCuda, impl_->fault);
}

void EmulatedDevice::enqueue_data(StreamHandle s, const char* what, std::function<void()> body) {
  const auto delay = options_.copy_delay;
  enqueue(s, [this, what, delay, body = std::move(body)] {
    {
      std::lock_guard lk(impl_->fault_m);
      if (!impl_->fault.empty()) return;  // after a fault nothing more is copied
      if (options_.fault && options_.fault(what)) {
        impl_->fault = std::string("emulated device fault in ") + what +
                       " [sticky: the device is unusable until it is reset]";
        return;
      }
      ++impl_->running;
    }
    struct Done {
      Impl& impl;
      ~Done() {
        std::lock_guard lk(impl.fault_m);
        if (--impl.running == 0) impl.fault_cv.notify_all();
      }
    } done{*impl_};
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    body();
  });
}

EmulatedDevice::EmulatedDevice(int ordinal, testkit::EmulatedOptions options)
    : ordinal_(ordinal), options_(options), impl_(std::make_unique<Impl>()) {}

EmulatedDevice::~EmulatedDevice() {
  std::set<EmuStream*> left;
  {
    std::lock_guard lk(impl_->m);
    left.swap(impl_->streams);
  }
  for (EmuStream* s : left) stop_and_delete(s);
}

StreamHandle EmulatedDevice::create_stream() {
  const auto api = api_call();
  auto* s = new EmuStream;
  s->thread = std::thread([s] { s->run(); });
  {
    LiveStreams& l = live_streams();
    std::lock_guard lk(l.m);
    l.streams.insert(s);
  }
  std::lock_guard lk(impl_->m);
  impl_->streams.insert(s);
  return s;
}

void EmulatedDevice::destroy_stream(StreamHandle h) noexcept {
  api_gate();
  auto* s = static_cast<EmuStream*>(h);
  {
    std::lock_guard lk(impl_->m);
    if (impl_->streams.erase(s) == 0) return;  // not one of its streams: nothing to destroy
  }
  stop_and_delete(s);
}

void EmulatedDevice::enqueue(StreamHandle h, std::function<void()> op) {
  const auto api = api_call();
  check_sticky();
  EmuStream* s = impl_->stream(h);
  std::lock_guard lk(s->m);
  s->ops.push_back(std::move(op));
  ++s->enqueued;
  s->cv.notify_all();
}

void EmulatedDevice::stream_sync(StreamHandle h) {
  api_gate();
  EmuStream* s = impl_->stream(h);
  {
    std::unique_lock lk(s->m);
    const std::uint64_t target = s->enqueued;
    s->cv.wait(lk, [&] { return s->executed >= target; });
  }
  check_sticky();
}

void EmulatedDevice::write_value(std::uint64_t* addr, std::uint64_t value, StreamHandle s) {
  enqueue(s, [this, addr, value] {
    {
      // As on a GPU, nothing runs once a fault is in force: the flag stays unwritten, and
      // whoever waits for it learns of the fault by asking about an event.
      std::lock_guard lk(impl_->fault_m);
      if (!impl_->fault.empty()) return;
    }
    signal_value(addr, value);
  });
}

namespace {
// As with CUDA, an event may be destroyed while a stream still has a record of it or a wait on
// it queued: the handle owns one reference and every queued operation another.
struct EmuEventHandle {
  std::shared_ptr<EmuEvent> e = std::make_shared<EmuEvent>();
};
std::shared_ptr<EmuEvent> event_of(EventHandle h) { return static_cast<EmuEventHandle*>(h)->e; }
}  // namespace

EventHandle EmulatedDevice::create_event(bool) {
  const auto api = api_call();
  return new EmuEventHandle;
}
void EmulatedDevice::destroy_event(EventHandle e) noexcept {
  const auto api = api_call();
  delete static_cast<EmuEventHandle*>(e);
}

void EmulatedDevice::record_event(EventHandle h, StreamHandle s) {
  check_sticky();
  auto e = event_of(h);
  std::uint64_t gen;
  {
    std::lock_guard lk(e->m);
    gen = ++e->recorded;
  }
  auto complete = [e, gen] {
    std::lock_guard lk(e->m);
    if (e->completed < gen) {
      e->completed = gen;
      e->when = Clock::now();
    }
    e->cv.notify_all();
  };
  try {
    enqueue(s, complete);
  } catch (...) {
    // A fault became sticky in between: the record never runs, so it must not leave waiters
    // behind (their queries then report the fault).
    complete();
    throw;
  }
}

void EmulatedDevice::stream_wait_event(StreamHandle s, EventHandle h) {
  auto e = event_of(h);
  std::uint64_t gen;
  {
    std::lock_guard lk(e->m);
    gen = e->recorded;  // CUDA semantics: the record current at the time of the call
  }
  if (gen == 0) return;
  enqueue(s, [e, gen] {
    std::unique_lock lk(e->m);
    e->cv.wait(lk, [&] { return e->completed >= gen; });
  });
}

bool EmulatedDevice::event_done(EventHandle h) {
  const auto api = api_call();
  auto e = event_of(h);
  bool done;
  {
    std::lock_guard lk(e->m);
    done = e->completed >= e->recorded;
  }
  if (done) check_sticky();
  return done;
}

void EmulatedDevice::event_sync(EventHandle h) {
  api_gate();
  auto e = event_of(h);
  {
    std::unique_lock lk(e->m);
    const std::uint64_t gen = e->recorded;
    e->cv.wait(lk, [&] { return e->completed >= gen; });
  }
  check_sticky();
}

float EmulatedDevice::event_elapsed_ms(EventHandle a, EventHandle b) {
  const auto api = api_call();
  auto x = event_of(a);
  auto y = event_of(b);
  Clock::time_point ta, tb;
  {
    std::lock_guard lk(x->m);
    ta = x->when;
  }
  {
    std::lock_guard lk(y->m);
    tb = y->when;
  }
  return std::chrono::duration<float, std::milli>(tb - ta).count();
}

}  // namespace gfd::detail
