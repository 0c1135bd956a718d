#include "emulated_device.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <thread>

#include <sys/mman.h>

#include "gfd/error.hpp"

namespace gfd::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Process-wide registry of emulated allocations, so that emulated devices of several ordinals
// recognise each other's memory (as CUDA's unified addressing does).
struct Allocation {
  std::uintptr_t end;
  PointerKind kind;  // kDevice (of `device`) or kPinnedHost
  int device;
};

std::shared_mutex& registry_mutex() {
  static std::shared_mutex m;
  return m;
}
std::map<std::uintptr_t, Allocation>& registry() {
  static std::map<std::uintptr_t, Allocation> r;
  return r;
}

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

EmuStream* stream_of(StreamHandle s) {
  if (s == nullptr)
    throw Error(ErrorCode::kInvalidArgument,
                "stream: the emulated device has no default stream; pass one of its streams");
  return static_cast<EmuStream*>(s);
}

}  // namespace

struct EmulatedDevice::Impl {
  std::mutex m;
  std::set<EmuStream*> streams;
  mutable std::mutex fault_m;
  std::string fault;  // the sticky error in force, "" when none
};

void EmulatedDevice::clear_fault() {
  std::lock_guard lk(impl_->fault_m);
  impl_->fault.clear();
}

std::string EmulatedDevice::fault_message() const {
  std::lock_guard lk(impl_->fault_m);
  return impl_->fault;
}

void EmulatedDevice::check_sticky() const {
  std::lock_guard lk(impl_->fault_m);
  if (!impl_->fault.empty()) throw Error(ErrorCode::kCuda, impl_->fault);
}

void EmulatedDevice::enqueue_data(StreamHandle s, const char* what, std::function<void()> body) {
  const auto delay = options_.copy_delay;
  enqueue(s, [this, what, delay, body = std::move(body)] {
    {
      std::lock_guard lk(impl_->fault_m);
      if (!impl_->fault.empty()) return;  // after a fault nothing more is copied
    }
    if (options_.fault && options_.fault(what)) {
      std::lock_guard lk(impl_->fault_m);
      impl_->fault = std::string("emulated device fault in ") + what +
                     " [sticky: the device is unusable until it is reset]";
      return;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    body();
  });
}

EmulatedDevice::EmulatedDevice(int ordinal, EmulatedDeviceOptions options)
    : ordinal_(ordinal), options_(options), impl_(std::make_unique<Impl>()) {}

EmulatedDevice::~EmulatedDevice() {
  std::set<EmuStream*> left;
  {
    std::lock_guard lk(impl_->m);
    left.swap(impl_->streams);
  }
  for (EmuStream* s : left) destroy_stream(s);
}

PointerInfo EmulatedDevice::query_pointer(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lk(registry_mutex());
  auto& r = registry();
  auto it = r.upper_bound(a);
  if (it == r.begin()) return {};
  --it;
  if (a >= it->second.end) return {};
  PointerInfo info;
  info.kind = it->second.kind;
  info.device = it->second.device;
  if (info.kind == PointerKind::kDevice && info.device != ordinal_) info.kind = PointerKind::kOtherDevice;
  info.begin = it->first;
  info.end = it->second.end;
  return info;
}

// Like the CUDA driver: device memory lies in address ranges reserved in whole 2 MiB units, so
// it never shares a 2 MiB region with host memory (the planner relies on that; see
// PageableCache).
namespace {
constexpr std::size_t kDeviceGranule = std::size_t{2} << 20;

std::size_t device_reservation(std::size_t bytes) {
  return (std::max<std::size_t>(bytes, 1) + kDeviceGranule - 1) / kDeviceGranule * kDeviceGranule;
}
}  // namespace

void* EmulatedDevice::alloc_device(std::size_t bytes) {
  // Reserve one granule more than needed and trim to an aligned range (untouched pages cost
  // nothing).
  const std::size_t size = device_reservation(bytes);
  void* m = mmap(nullptr, size + kDeviceGranule, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) throw Error(ErrorCode::kSystem, "emulated device: out of memory");
  const auto base = reinterpret_cast<std::uintptr_t>(m);
  const std::uintptr_t a = (base + kDeviceGranule - 1) / kDeviceGranule * kDeviceGranule;
  if (a > base) munmap(m, a - base);
  if (base + kDeviceGranule > a) munmap(reinterpret_cast<void*>(a + size), base + kDeviceGranule - a);
  // The rest of the reservation is no accessible memory, as with the driver.
  const std::size_t used = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  if (used < size) mprotect(reinterpret_cast<void*>(a + used), size - used, PROT_NONE);
  std::unique_lock lk(registry_mutex());
  registry()[a] = {a + bytes, PointerKind::kDevice, ordinal_};
  return reinterpret_cast<void*>(a);
}

void EmulatedDevice::free_device(void* p) noexcept {
  if (p == nullptr) return;
  std::size_t bytes = 0;
  {
    std::unique_lock lk(registry_mutex());
    auto it = registry().find(reinterpret_cast<std::uintptr_t>(p));
    if (it == registry().end()) return;
    bytes = it->second.end - it->first;
    registry().erase(it);
  }
  munmap(p, device_reservation(bytes));
}

void EmulatedDevice::register_host(void* p, std::size_t bytes) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::unique_lock lk(registry_mutex());
  auto& r = registry();
  auto it = r.upper_bound(a);
  if (it != r.begin() && std::prev(it)->second.end > a)
    throw Error(ErrorCode::kCuda, "emulated cudaHostRegister: range is already registered");
  r[a] = {a + bytes, PointerKind::kPinnedHost, -1};
}

void EmulatedDevice::unregister_host(void* p) noexcept {
  std::unique_lock lk(registry_mutex());
  registry().erase(reinterpret_cast<std::uintptr_t>(p));
}

StreamHandle EmulatedDevice::create_stream() {
  auto* s = new EmuStream;
  s->thread = std::thread([s] { s->run(); });
  std::lock_guard lk(impl_->m);
  impl_->streams.insert(s);
  return s;
}

void EmulatedDevice::destroy_stream(StreamHandle h) noexcept {
  auto* s = static_cast<EmuStream*>(h);
  {
    std::lock_guard lk(impl_->m);
    impl_->streams.erase(s);
  }
  {
    std::lock_guard lk(s->m);
    s->stop = true;  // like cudaStreamDestroy: queued work still runs
    s->cv.notify_all();
  }
  s->thread.join();
  delete s;
}

void EmulatedDevice::enqueue(StreamHandle h, std::function<void()> op) {
  check_sticky();
  EmuStream* s = stream_of(h);
  std::lock_guard lk(s->m);
  s->ops.push_back(std::move(op));
  ++s->enqueued;
  s->cv.notify_all();
}

void EmulatedDevice::stream_sync(StreamHandle h) {
  EmuStream* s = stream_of(h);
  {
    std::unique_lock lk(s->m);
    const std::uint64_t target = s->enqueued;
    s->cv.wait(lk, [&] { return s->executed >= target; });
  }
  check_sticky();
}

namespace {
// As with CUDA, an event may be destroyed while a stream still has a record of it or a wait on
// it queued: the handle owns one reference and every queued operation another.
struct EmuEventHandle {
  std::shared_ptr<EmuEvent> e = std::make_shared<EmuEvent>();
};
std::shared_ptr<EmuEvent> event_of(EventHandle h) { return static_cast<EmuEventHandle*>(h)->e; }
}  // namespace

EventHandle EmulatedDevice::create_event(bool) { return new EmuEventHandle; }
void EmulatedDevice::destroy_event(EventHandle e) noexcept { delete static_cast<EmuEventHandle*>(e); }

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
  auto e = event_of(h);
  {
    std::unique_lock lk(e->m);
    const std::uint64_t gen = e->recorded;
    e->cv.wait(lk, [&] { return e->completed >= gen; });
  }
  check_sticky();
}

float EmulatedDevice::event_elapsed_ms(EventHandle a, EventHandle b) {
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

void EmulatedDevice::copy_h2d(void* dst, const void* src, std::size_t bytes, StreamHandle s) {
  enqueue_data(s, "copy_h2d", [=] { std::memcpy(dst, src, bytes); });
}

void EmulatedDevice::copy_d2h(void* dst, const void* src, std::size_t bytes, StreamHandle s) {
  enqueue_data(s, "copy_d2h", [=] { std::memcpy(dst, src, bytes); });
}

void EmulatedDevice::memset_async(void* dst, int value, std::size_t bytes, StreamHandle s) {
  enqueue_data(s, "memset", [=] { std::memset(dst, value, bytes); });
}

void EmulatedDevice::scatter(const ScatterEntry* entries, std::uint32_t count, const void* staging,
                             StreamHandle s) {
  enqueue_data(s, "scatter", [=] {
    const auto* base = static_cast<const unsigned char*>(staging);
    for (std::uint32_t i = 0; i < count; ++i)
      std::memcpy(reinterpret_cast<void*>(entries[i].dst), base + entries[i].src_offset,
                  entries[i].bytes);
  });
}

void EmulatedDevice::gather(const ScatterEntry* entries, std::uint32_t count, void* staging,
                            StreamHandle s) {
  enqueue_data(s, "gather", [=] {
    auto* base = static_cast<unsigned char*>(staging);
    for (std::uint32_t i = 0; i < count; ++i)
      std::memcpy(base + entries[i].src_offset, reinterpret_cast<const void*>(entries[i].dst),
                  entries[i].bytes);
  });
}

void EmulatedDevice::copy_batch(void* const* dsts, const void* const* srcs, const std::size_t* sizes,
                                std::size_t count, bool, StreamHandle s) {
  // Like CUDA, take the arrays during the call: the caller may reuse them at once.
  std::vector<ZeroCopyEntry> copies(count);
  for (std::size_t i = 0; i < count; ++i)
    copies[i] = {reinterpret_cast<std::uint64_t>(srcs[i]), reinterpret_cast<std::uint64_t>(dsts[i]),
                 sizes[i]};
  enqueue_data(s, "copy_batch", [copies = std::move(copies)] {
    for (const ZeroCopyEntry& c : copies)
      std::memcpy(reinterpret_cast<void*>(c.dst), reinterpret_cast<const void*>(c.src), c.bytes);
  });
}

void EmulatedDevice::zero_copy(const ZeroCopyEntry* entries, std::uint32_t count, StreamHandle s) {
  // The entries are read when the "kernel" runs, as on the GPU.
  enqueue_data(s, "zero_copy", [=] {
    for (std::uint32_t i = 0; i < count; ++i)
      std::memcpy(reinterpret_cast<void*>(entries[i].dst),
                  reinterpret_cast<const void*>(entries[i].src), entries[i].bytes);
  });
}

namespace {
// One condition for every emulated flag: waits are rare and short.
std::mutex& value_mutex() {
  static std::mutex m;
  return m;
}
std::condition_variable& value_cv() {
  static std::condition_variable cv;
  return cv;
}
}  // namespace

void EmulatedDevice::wait_value_geq(const std::uint64_t* addr, std::uint64_t value, StreamHandle s) {
  auto* a = const_cast<std::uint64_t*>(addr);
  enqueue(s, [=] {
    std::unique_lock lk(value_mutex());
    value_cv().wait(lk, [&] { return std::atomic_ref<std::uint64_t>(*a).load(std::memory_order_acquire) >= value; });
  });
}

void EmulatedDevice::signal_value(std::uint64_t* addr, std::uint64_t value) {
  {
    std::lock_guard lk(value_mutex());
    std::atomic_ref<std::uint64_t>(*addr).store(value, std::memory_order_release);
  }
  value_cv().notify_all();
}

void EmulatedDevice::delay_async(std::uint32_t microseconds, StreamHandle s) {
  enqueue(s, [=] { std::this_thread::sleep_for(std::chrono::microseconds(microseconds)); });
}

}  // namespace gfd::detail
