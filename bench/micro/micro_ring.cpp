// micro_ring: the staging ring's slot cycle, end to end through the public engine API, on the
// host-emulated device (no GPU needed).
//
// One iteration is engine.copy_to_device(blocks, stream) followed by Transfer::wait():
//   BM_SingleBlock  one 4 KB block: a slot is acquired, gathered (by the submitting thread:
//                   below inline_gather_bytes), "DMA"d by an emulated copy stream (a memcpy on
//                   its thread) and released;
//   BM_ManySlots    64 blocks of 64 KB (4 MB) through a 1 MB ring of 256 KB slots, so every
//                   slot is reused several times within one transfer, gathered by the pool and
//                   the submitter; destinations ascending (one DMA per chunk) or shuffled
//                   (scatter), by the argument.
// Wall-clock time. Counters: chunks and scattered chunks per transfer, ring slots, and the
// time per transfer the submitter waited for a free slot (us_submit_wait), from EngineStats.
// The engine, the host sources and the emulated device memory are set up once per run; the
// numbers are host pipeline overheads plus memcpy speed, not PCIe figures.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "engine/engine_core.hpp"
#include "gfd/engine.hpp"
#include "testkit/emulated_device.hpp"

namespace {

using gfd::BlockCopy;

gfd::EngineOptions ring_options() {
  gfd::EngineOptions o;
  o.device = 0;
  o.gather_threads = 1;
  o.staging_bytes = std::size_t{1} << 20;
  o.slot_bytes = std::size_t{256} << 10;
  o.first_chunk_bytes = std::size_t{64} << 10;
  o.piece_bytes = std::size_t{32} << 10;
  return o;
}

// An engine on an emulated device, a caller's stream, `count` host source blocks at a 2x-block
// stride and as many device blocks.
class Rig {
 public:
  Rig(std::size_t count, std::size_t block, bool shuffle_dst)
      : device_(std::make_shared<gfd::detail::EmulatedDevice>(0)),
        engine_(std::in_place, gfd::detail::EngineCore::make_engine(ring_options(), device_)),
        stream_(device_->create_stream()) {
    host_bytes_ = 2 * count * block;
    host_ = static_cast<std::byte*>(std::aligned_alloc(4096, (host_bytes_ + 4095) / 4096 * 4096));
    if (host_ == nullptr) throw std::bad_alloc();
    for (std::size_t i = 0; i < host_bytes_; ++i) host_[i] = std::byte(i * 131 + 1);
    dev_ = static_cast<std::byte*>(device_->alloc_device(count * block));
    std::vector<std::size_t> slot(count);
    std::iota(slot.begin(), slot.end(), std::size_t{0});
    if (shuffle_dst) std::shuffle(slot.begin(), slot.end(), std::mt19937_64(11));
    for (std::size_t i = 0; i < count; ++i)
      blocks_.push_back({host_ + 2 * i * block, dev_ + slot[i] * block, block});
  }
  ~Rig() {
    engine_.reset();  // waits for every transfer
    device_->stream_sync(stream_);
    device_->destroy_stream(stream_);
    device_->free_device(dev_);
    std::free(host_);
  }
  Rig(const Rig&) = delete;
  Rig& operator=(const Rig&) = delete;

  gfd::Engine& engine() { return *engine_; }
  const std::vector<BlockCopy>& blocks() const { return blocks_; }
  cudaStream_t stream() const { return static_cast<cudaStream_t>(stream_); }
  // True when the device memory holds every source block.
  bool verify() {
    device_->stream_sync(stream_);
    for (const BlockCopy& b : blocks_)
      if (std::memcmp(b.dst, b.src, b.bytes) != 0) return false;
    return true;
  }

 private:
  std::shared_ptr<gfd::detail::EmulatedDevice> device_;
  std::optional<gfd::Engine> engine_;
  gfd::detail::StreamHandle stream_;
  std::byte* host_ = nullptr;
  std::size_t host_bytes_ = 0;
  std::byte* dev_ = nullptr;
  std::vector<BlockCopy> blocks_;
};

void run(benchmark::State& state, std::size_t count, std::size_t block, bool shuffle_dst) {
  Rig rig(count, block, shuffle_dst);
  const gfd::EngineStats before = rig.engine().stats();
  for (auto _ : state) {
    gfd::Transfer t = rig.engine().copy_to_device(rig.blocks(), rig.stream());
    t.wait();
  }
  if (!rig.verify()) {
    state.SkipWithError("device memory does not match the sources");
    return;
  }
  const gfd::EngineStats after = rig.engine().stats();
  const auto iters = static_cast<double>(std::max<std::int64_t>(state.iterations(), 1));
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(count * block));
  state.counters["chunks_per_transfer"] = static_cast<double>(after.chunks - before.chunks) / iters;
  state.counters["slots"] =
      static_cast<double>(after.staging_bytes) / static_cast<double>(after.slot_bytes);
  state.counters["us_submit_wait"] =
      (after.submit_wait_seconds - before.submit_wait_seconds) * 1e6 / iters;
}

void BM_SingleBlock(benchmark::State& state) { run(state, 1, 4096, false); }
void BM_ManySlots(benchmark::State& state) {
  run(state, 64, std::size_t{64} << 10, state.range(0) != 0);
}

BENCHMARK(BM_SingleBlock)->UseRealTime();
BENCHMARK(BM_ManySlots)->ArgName("shuffled_dst")->Arg(0)->Arg(1)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
