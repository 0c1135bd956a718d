// Faults: a device-side failure makes the affected transfers report it, never leaves a waiter
// hanging, leaks no staging slot, and once the device works again the same engine moves data
// byte-exact. On the emulated device a hook injects the fault; on a GPU a kernel writing to an
// invalid address poisons the context (each CTest case is its own process) and the sticky error
// must be reported as such, naming the failing call.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <random>
#include <thread>

#include "test_support.hpp"

namespace gfd::test {
namespace {

using namespace std::chrono_literals;

// Runs `fn` and fails the test (instead of hanging it) if it takes longer than `limit`.
template <class F>
void within(std::chrono::seconds limit, F&& fn, const char* what) {
  auto f = std::async(std::launch::async, std::forward<F>(fn));
  if (f.wait_for(limit) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not finish within " << limit.count() << " s: something hangs";
    std::quick_exit(1);  // a hung waiter cannot be joined
  }
  f.get();
}

struct FaultCase {
  Backend backend;
  bool scattered;
  const char* op;  // the emulated operation that fails
};

class EmulatedFaultTest : public ::testing::TestWithParam<FaultCase> {
 protected:
  void SetUp() override {
    testkit::EmulatedOptions emu;
    emu.fault = [this](const char* op) {
      return armed_.load() && std::strcmp(op, GetParam().op) == 0 && countdown_.fetch_sub(1) == 1;
    };
    emulated_ = testkit::Device::emulated(0, emu);
    device_ = emulated_.shared();
    stream_ = device_->create_stream();
    host_.resize(16 << 20);
    fill_random(host_.data(), host_.size(), 50);
    device_->register_host(host_.data(), host_.size());  // pinned: every backend can read it
    dst_ = static_cast<std::byte*>(device_->alloc_device(kBlocks * kSize));
  }
  void TearDown() override {
    emulated_.clear_fault();
    device_->free_device(dst_);
    device_->unregister_host(host_.data());
    device_->destroy_stream(stream_);
  }
  Engine make_engine() {
    EngineOptions o = small_options();  // 1 MB ring of 4 slots: later transfers reuse every slot
    o.backend = GetParam().backend;
    o.kernel_max_bytes = 0;  // keep the gather path staged
    return emulated_.make_engine(o);
  }
  std::vector<BlockCopy> blocks(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::size_t> order(kBlocks);
    std::iota(order.begin(), order.end(), 0);
    if (GetParam().scattered) std::shuffle(order.begin(), order.end(), rng);
    std::vector<BlockCopy> v(kBlocks);
    for (std::size_t i = 0; i < kBlocks; ++i)
      v[i] = {host_.data() + (rng() % (host_.size() / kSize / 2)) * 2 * kSize,
              dst_ + order[i] * kSize, kSize};
    return v;
  }
  bool landed(const std::vector<BlockCopy>& v) {
    std::vector<std::byte> back(kBlocks * kSize);
    device_->copy_d2h(back.data(), dst_, back.size(), stream_);
    device_->stream_sync(stream_);
    for (const BlockCopy& b : v)
      if (std::memcmp(back.data() + (static_cast<std::byte*>(b.dst) - dst_), b.src, kSize) != 0)
        return false;
    return true;
  }

  static constexpr std::size_t kBlocks = 512, kSize = 4096;  // 2 MB: two ring lengths
  testkit::Device emulated_ = testkit::Device::emulated(0);
  std::shared_ptr<detail::Device> device_;
  detail::StreamHandle stream_ = nullptr;
  std::vector<std::byte> host_;
  std::byte* dst_ = nullptr;
  std::atomic<bool> armed_{false};
  std::atomic<int> countdown_{1};  // the first matching operation after arming fails
};

TEST_P(EmulatedFaultTest, FailedTransferReportsItAndTheEngineRecovers) {
  Engine engine = make_engine();
  const auto cuda = static_cast<cudaStream_t>(stream_);
  engine.copy_to_device(blocks(1), cuda).wait();  // healthy first
  armed_ = true;
  within(
      30s,
      [&] {
        try {
          engine.copy_to_device(blocks(2), cuda).wait();
          ADD_FAILURE() << "the injected fault was not reported";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kCuda);
          EXPECT_NE(std::string(e.what()).find(GetParam().op), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("sticky"), std::string::npos) << e.what();
        }
      },
      "the failed transfer");
  EXPECT_FALSE(emulated_.fault_message().empty());
  // While the fault is in force every submission fails at once, none hangs.
  within(
      30s,
      [&] {
        for (int i = 0; i < 3; ++i) {
          try {
            engine.copy_to_device(blocks(3 + i), cuda).wait();
            ADD_FAILURE() << "a transfer succeeded on a faulted device";
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kCuda) << e.what();
          }
        }
      },
      "transfers on the faulted device");
  // The device works again: the same engine, every slot reused several times, byte-exact.
  armed_ = false;
  emulated_.clear_fault();
  within(
      60s,
      [&] {
        for (int i = 0; i < 6; ++i) {
          const auto v = blocks(10 + i);
          engine.copy_to_device(v, cuda).wait();
          EXPECT_TRUE(landed(v)) << "round " << i;
        }
      },
      "transfers after recovery");
}

TEST_P(EmulatedFaultTest, ConcurrentTransfersAndDestructionDuringAFaultNeverHang) {
  auto engine = std::make_unique<Engine>(make_engine());
  armed_ = true;
  std::atomic<int> failed{0}, ok{0};
  within(
      60s,
      [&] {
        std::vector<std::thread> threads;
        for (int t = 0; t < 4; ++t)
          threads.emplace_back([&, t] {
            detail::StreamHandle s = device_->create_stream();
            for (int r = 0; r < 5; ++r) {
              try {
                engine->copy_to_device(blocks(100 + t * 10 + r), static_cast<cudaStream_t>(s))
                    .wait();
                ++ok;
              } catch (const Error&) {
                ++failed;
              }
            }
            try {
              device_->stream_sync(s);
            } catch (const Error&) {
            }
            device_->destroy_stream(s);
          });
        for (auto& th : threads) th.join();
      },
      "concurrent transfers");
  EXPECT_GT(failed.load(), 0);
  // Transfers in flight while the engine is destroyed: the destructor drains them.
  within(
      30s,
      [&] {
        std::vector<Transfer> pending;
        for (int i = 0; i < 3; ++i) {
          try {
            pending.push_back(
                engine->copy_to_device(blocks(200 + i), static_cast<cudaStream_t>(stream_)));
          } catch (const Error&) {
          }
        }
        engine.reset();
        for (Transfer& t : pending) EXPECT_TRUE(t.done());
      },
      "destroying the engine");
}

INSTANTIATE_TEST_SUITE_P(Backends, EmulatedFaultTest,
                         ::testing::Values(FaultCase{Backend::kGather, false, "copy_h2d"},
                                           FaultCase{Backend::kGather, true, "scatter"},
                                           FaultCase{Backend::kBatchAsync, true, "copy_batch"},
                                           FaultCase{Backend::kPerBlock, true, "copy_h2d"},
                                           FaultCase{Backend::kZeroCopyKernel, true, "zero_copy"}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.backend)) +
                                  (info.param.scattered ? "_scattered" : "_contiguous");
                         });

// Device to host through staging: a fault in the DMA into the slot (contiguous device blocks) or
// in the kernel that packs scattered ones is reported; the slots it held are freed once its
// pieces have run, and the engine moves data again after the reset.
TEST(EmulatedFaultToHostTest, ReportedAndTheEngineRecovers) {
  for (const char* op : {"copy_d2h", "gather"}) {
    SCOPED_TRACE(op);
    std::atomic<bool> armed{false};
    testkit::EmulatedOptions emu;
    emu.fault = [&](const char* what) {
      return armed.load() && std::strcmp(what, op) == 0 && armed.exchange(false);
    };
    testkit::Device emulated = testkit::Device::emulated(0, emu);
    const std::shared_ptr<detail::Device>& device = emulated.shared();
    detail::StreamHandle stream = device->create_stream();
    const auto cuda = static_cast<cudaStream_t>(stream);
    constexpr std::size_t kBlocks = 512, kSize = 4096;
    auto* src = static_cast<std::byte*>(device->alloc_device(kBlocks * kSize));
    std::vector<std::byte> init(kBlocks * kSize), out(2 * kBlocks * kSize);
    fill_random(init.data(), init.size(), 110);
    std::memcpy(src, init.data(), init.size());  // emulated device memory is host memory
    std::vector<BlockCopy> v;
    const bool scattered = std::strcmp(op, "gather") == 0;
    for (std::size_t i = 0; i < kBlocks; ++i)
      v.push_back(
          {src + (scattered ? (i * 37) % kBlocks : i) * kSize, out.data() + i * 2 * kSize, kSize});
    {
      EngineOptions o = small_options();
      o.kernel_max_bytes = 0;
      Engine engine = emulated.make_engine(o);
      armed = true;
      within(
          30s,
          [&] {
            try {
              engine.copy_to_host(v, cuda).wait();
              ADD_FAILURE() << "the fault was not reported";
            } catch (const Error& e) {
              EXPECT_EQ(e.code(), ErrorCode::kCuda) << e.what();
              EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
            }
          },
          "the failed transfer");
      emulated.clear_fault();
      within(
          30s,
          [&] {
            for (int round = 0; round < 3; ++round) {
              std::fill(out.begin(), out.end(), std::byte{0});
              engine.copy_to_host(v, cuda).wait();
              for (std::size_t i = 0; i < kBlocks; ++i)
                ASSERT_EQ(
                    std::memcmp(out.data() + i * 2 * kSize,
                                init.data() + (scattered ? (i * 37) % kBlocks : i) * kSize, kSize),
                    0)
                    << "round " << round << " block " << i;
            }
          },
          "transfers after recovery");
    }
    device->free_device(src);
    device->destroy_stream(stream);
  }
}

// A stream handle the emulated device did not make (a made-up integer, one destroyed) is
// refused with gfd::Error naming it, by the device and by an engine given it, not followed; the
// engine moves data afterwards on a real stream. (A GPU would fault on such a handle.)
TEST(EmulatedStreamTest, UnknownStreamHandlesAreRefused) {
  testkit::Device emulated = testkit::Device::emulated(0);
  detail::Device& device = emulated.internal();
  const auto made_up = reinterpret_cast<detail::StreamHandle>(std::uintptr_t{0x1234});
  detail::StreamHandle gone = device.create_stream();
  device.destroy_stream(gone);
  for (const detail::StreamHandle s : {made_up, gone}) {
    try {
      device.stream_sync(s);
      ADD_FAILURE() << "stream_sync took an unknown stream";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("not a stream of the emulated device"),
                std::string::npos)
          << e.what();
    }
  }
  device.destroy_stream(made_up);  // nothing to destroy: ignored
  constexpr std::size_t kBlocks = 64, kSize = 4096;
  auto* dst = static_cast<std::byte*>(device.alloc_device(kBlocks * kSize));
  std::vector<std::byte> src(kBlocks * kSize);
  fill_random(src.data(), src.size(), 7);
  std::vector<BlockCopy> v;
  for (std::size_t i = 0; i < kBlocks; ++i)
    v.push_back({src.data() + i * kSize, dst + ((i * 7) % kBlocks) * kSize, kSize});
  {
    Engine engine = emulated.make_engine(small_options());
    try {
      (void)engine.copy_to_device(v, static_cast<cudaStream_t>(made_up));
      ADD_FAILURE() << "copy_to_device took an unknown stream";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("not a stream of the emulated device"),
                std::string::npos)
          << e.what();
    }
    const cudaStream_t s = emulated.create_stream();
    engine.copy_to_device(v, s).wait();
    for (std::size_t i = 0; i < kBlocks; ++i)
      ASSERT_EQ(std::memcmp(dst + ((i * 7) % kBlocks) * kSize, src.data() + i * kSize, kSize), 0)
          << i;
    emulated.destroy_stream(s);
  }
  device.free_device(dst);
}

// On a GPU: a kernel on the caller's stream writes to an invalid address, which poisons the
// context. The engine must report the sticky error, naming the failing call, and not hang.
TEST(CudaFaultTest, StickyErrorIsReportedNamingTheCall) {
  const std::string why = cuda_skip_reason();
  if (!why.empty()) GTEST_SKIP() << why;
  auto td = open_test_device(DeviceKind::kCuda);
  Engine engine = td->make_engine(small_options());
  HostBuffer pool(*td->device, 4 << 20, false);
  fill_random(pool.data(), pool.size(), 60);
  DeviceBuffer dst(*td->device, 256 * 4096);
  std::vector<BlockCopy> v;
  for (std::size_t i = 0; i < 256; ++i)
    v.push_back({pool.data() + i * 8192, dst.data() + i * 4096, 4096});
  engine.copy_to_device(v, td->cuda_stream()).wait();  // healthy first
  // One scatter entry aimed at address 16: an illegal address on the GPU.
  DeviceBuffer entries(*td->device, sizeof(detail::ScatterEntry));
  const detail::ScatterEntry bad{16, 0, 64};
  HostBuffer host_entry(*td->device, 4096, true);
  std::memcpy(host_entry.data(), &bad, sizeof bad);
  td->device->copy_h2d(entries.data(), host_entry.data(), sizeof bad, td->stream);
  td->device->scatter(reinterpret_cast<const detail::ScatterEntry*>(entries.data()), 1, dst.data(),
                      td->stream);
  within(
      30s,
      [&] {
        try {
          engine.copy_to_device(v, td->cuda_stream()).wait();
          ADD_FAILURE() << "the illegal address was not reported";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::kCuda);
          const std::string msg = e.what();
          EXPECT_NE(msg.find("sticky"), std::string::npos) << msg;
          EXPECT_NE(msg.find("failed: cudaError"), std::string::npos) << "names the call: " << msg;
        }
      },
      "the transfer after the fault");
}

}  // namespace
}  // namespace gfd::test
