#include "test_support.hpp"

#include <cstdlib>
#include <cstring>

namespace gfd::test {

std::string to_string(DeviceKind k) { return k == DeviceKind::kCuda ? "Cuda" : "Emulated"; }

void fill_random(void* p, std::size_t bytes, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const std::uint64_t v = rng() | 0x0101010101010101ull;  // no zero bytes: zeros hide misses
    std::memcpy(b + i, &v, 8);
  }
  for (; i < bytes; ++i) b[i] = static_cast<unsigned char>(rng() | 1);
}

std::vector<std::byte> random_bytes(std::size_t bytes, std::uint64_t seed) {
  std::vector<std::byte> v(bytes);
  fill_random(v.data(), bytes, seed);
  return v;
}

HostBuffer::HostBuffer(detail::Device& d, std::size_t bytes, bool pinned)
    : device_(d), bytes_(bytes), pinned_(pinned) {
  const std::size_t rounded = (bytes + 4095) / 4096 * 4096;
  data_ = static_cast<std::byte*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  if (pinned_) device_.register_host(data_, rounded == 0 ? 4096 : rounded);
}

HostBuffer::~HostBuffer() {
  if (pinned_) device_.unregister_host(data_);
  std::free(data_);
}

DeviceBuffer::DeviceBuffer(detail::Device& d, std::size_t bytes) : device_(d), bytes_(bytes) {
  data_ = static_cast<std::byte*>(d.alloc_device(bytes));
}
DeviceBuffer::~DeviceBuffer() { device_.free_device(data_); }

TestDevice::~TestDevice() {
  if (stream != nullptr) device->destroy_stream(stream);
}

std::vector<std::byte> TestDevice::read(const void* dev, std::size_t bytes) {
  std::vector<std::byte> out(bytes);
  device->copy_d2h(out.data(), dev, bytes, stream);
  device->stream_sync(stream);
  return out;
}

void TestDevice::fill(void* dev, int value, std::size_t bytes) {
  device->memset_async(dev, value, bytes, stream);
  device->stream_sync(stream);
}

Engine TestDevice::make_engine(const EngineOptions& options, const detail::Tuning& tuning) {
  return facade.make_engine(options, tuning);
}

std::string cuda_skip_reason(int needed) {
  const int n = testkit::cuda_device_count();
  if (n >= needed) return {};
  return "needs " + std::to_string(needed) + " CUDA device(s), found " + std::to_string(n) +
         " (no GPU or no driver on this machine); the emulated-device suite covers the pipeline";
}

std::unique_ptr<TestDevice> open_test_device(DeviceKind kind, int ordinal,
                                             const testkit::EmulatedOptions& emu) {
  if (kind == DeviceKind::kCuda && !cuda_skip_reason(ordinal + 1).empty()) return nullptr;
  auto td = std::make_unique<TestDevice>(
      TestDevice{kind, kind == DeviceKind::kCuda ? testkit::Device::cuda(ordinal)
                                                 : testkit::Device::emulated(ordinal, emu)});
  td->device = td->facade.shared();
  td->device->make_current();
  td->stream = td->device->create_stream();
  return td;
}

EngineOptions small_options() {
  EngineOptions o;
  o.staging_bytes = 1 << 20;
  o.slot_bytes = 256 << 10;
  o.first_chunk_bytes = 64 << 10;
  o.piece_bytes = 16 << 10;
  o.direct_min_bytes = 512 << 10;
  o.direct_min_bytes_to_host = 512 << 10;
  o.inline_gather_bytes = 16 << 10;
  o.gather_threads = 2;
  o.copy_streams = 2;
  o.spin_us = 20;
  return o;
}

}  // namespace gfd::test
