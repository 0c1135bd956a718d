#include "paged_runner.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench_cuda.hpp"
#include "peer_kernels.cuh"
#include "trace_report.hpp"

namespace gfd::bench::paged {

using Clock = std::chrono::steady_clock;

PagedRunner::~PagedRunner() {
  stages_.reset();
  load.reset();
  gfd_set = CacheSet();
  zero_copy_set = CacheSet();
  gfd.reset();
  zero_copy.reset();
  if (!host_only) {
    (void)cudaFreeHost(scratch_host_);
    (void)cudaFree(scratch_device_);
    (void)cudaFreeHost(mismatches_host_);
    (void)cudaFree(mismatches_device_);
    for (cudaEvent_t e : window)
      if (e != nullptr) (void)cudaEventDestroy(e);
  }
  if (stream != nullptr) {
    if (host_only)
      dev.destroy_stream(stream);
    else
      (void)cudaStreamDestroy(stream);
  }
  caches.reset();
}

void PagedRunner::make_scratch(std::size_t entries) {
  lists_.reserve(entries);
  if (host_only) return;
  scratch_bytes_ = entries * sizeof(PatternCheck);
  // The UVA kernel's three descriptor arrays (destinations, sources, sizes) fit as well.
  static_assert(sizeof(PatternCheck) >= 3 * sizeof(std::uint64_t));
  GFD_BENCH_CUDA(cudaHostAlloc(&scratch_host_, scratch_bytes_, cudaHostAllocDefault));
  GFD_BENCH_CUDA(cudaMalloc(&scratch_device_, scratch_bytes_));
  GFD_BENCH_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&mismatches_host_), 8, 0));
  GFD_BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&mismatches_device_), 8));
  for (cudaEvent_t& e : window) GFD_BENCH_CUDA(cudaEventCreate(&e));
}

void PagedRunner::register_caches(const Config& c) {
  std::vector<CachePair> pairs(tensors);
  for (std::size_t t = 0; t < tensors; ++t) {
    pairs[t].host = BlockArray{caches->host[t], c.host_blocks, c.size, c.size};
    pairs[t].device = BlockArray{caches->device[t], c.gpu_blocks, c.size, c.size};
  }
  if (gfd) gfd_set = gfd->register_caches(pairs);
  if (zero_copy) zero_copy_set = zero_copy->register_caches(pairs);
}

Ops PagedRunner::make_ops(Method m, const Config& c, bool to_host) {
  switch (m) {
    case Method::kDma:
      return dma_ops(c.n * tensors * c.size, to_host);
    case Method::kGfd:
    case Method::kGfdZeroCopy:
      return gfd_ops(m, to_host);
    case Method::kBatch:
      return batch_ops(c, to_host);
    case Method::kPerBlock:
      return per_block_ops(c, to_host);
    case Method::kUva2:
    case Method::kUva12:
      return uva_ops(m, c, to_host);
    case Method::kGatherOnly:
    case Method::kPlaceOnly:
      return stage_ops(m, c, to_host);
  }
  throw std::logic_error("no such method");
}

Ops PagedRunner::dma_ops(std::size_t bytes, bool to_host) {
  Ops ops;
  ops.prepare = [](const Ids&) {};
  ops.submit = [this, bytes, to_host] {
    if (to_host)
      dev.copy_d2h(caches->ref_host, caches->ref_device, bytes, stream);
    else
      dev.copy_h2d(caches->ref_device, caches->ref_host, bytes, stream);
  };
  ops.finish = [this] { sync(); };
  return ops;
}

Ops PagedRunner::gfd_ops(Method m, bool to_host) {
  Engine* engine = m == Method::kGfd ? &*gfd : &*zero_copy;
  const CacheSet* set = m == Method::kGfd ? &gfd_set : &zero_copy_set;
  Ops ops;
  ops.prepare = [this](const Ids& ids) { ids_ = &ids; };
  ops.submit = [this, engine, set, to_host] {
    // The runtime's call: ids only (swap-in: host ids are the sources).
    pending_ =
        to_host ? engine->copy_blocks(*set, Direction::kToHost, ids_->device, ids_->host, stream)
                : engine->copy_blocks(*set, Direction::kToDevice, ids_->host, ids_->device, stream);
  };
  // To the host the handle says when the bytes are placed; to the device the stream.
  ops.finish = [this] {
    pending_.wait();
    sync();
    pending_ = Transfer();
  };
  return ops;
}

Ops PagedRunner::batch_ops(const Config& c, bool to_host) {
  Ops ops;
  ops.prepare = [this, &c, to_host](const Ids& ids) { build_lists(c, to_host, ids); };
  ops.submit = [this, to_host] {
    cudaMemcpyAttributes attr{};
    // Loads: no earlier stream work writes the host caches (vLLM's choice), so the driver may
    // read them in any order; stores must see earlier device work.
    attr.srcAccessOrder = to_host ? cudaMemcpySrcAccessOrderStream : cudaMemcpySrcAccessOrderAny;
    attr.srcLocHint.type = to_host ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    attr.srcLocHint.id = to_host ? dev.ordinal() : 0;
    attr.dstLocHint.type = to_host ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
    attr.dstLocHint.id = to_host ? 0 : dev.ordinal();
    std::size_t attr_index = 0;
    GFD_BENCH_CUDA(cudaMemcpyBatchAsync(lists_.dsts.data(), lists_.srcs.data(), lists_.sizes.data(),
                                        lists_.dsts.size(), &attr, &attr_index, 1, stream));
  };
  ops.finish = [this] { sync(); };
  return ops;
}

Ops PagedRunner::per_block_ops(const Config& c, bool to_host) {
  Ops ops;
  ops.prepare = [this, &c, to_host](const Ids& ids) { build_lists(c, to_host, ids); };
  ops.submit = [this, to_host] {
    const cudaMemcpyKind kind = to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
    for (std::size_t i = 0; i < lists_.dsts.size(); ++i)
      GFD_BENCH_CUDA(
          cudaMemcpyAsync(lists_.dsts[i], lists_.srcs[i], lists_.sizes[i], kind, stream));
  };
  ops.finish = [this] { sync(); };
  return ops;
}

Ops PagedRunner::uva_ops(Method m, const Config& c, bool to_host) {
  const int ctas = m == Method::kUva2 ? 2 : 12;
  Ops ops;
  // The descriptors go to device memory before the timer starts: the kernel alone is timed.
  // Three arrays of n words each: destinations, sources, sizes.
  ops.prepare = [this, &c, to_host](const Ids& ids) {
    build_lists(c, to_host, ids);
    const std::size_t n = lists_.dsts.size();
    auto* words = reinterpret_cast<std::uint64_t*>(scratch_host_);
    for (std::size_t i = 0; i < n; ++i) {
      words[i] = reinterpret_cast<std::uintptr_t>(lists_.dsts[i]);
      words[n + i] = reinterpret_cast<std::uintptr_t>(lists_.srcs[i]);
      words[2 * n + i] = lists_.sizes[i];
    }
    GFD_BENCH_CUDA(cudaMemcpyAsync(scratch_device_, scratch_host_, 3 * n * sizeof(std::uint64_t),
                                   cudaMemcpyHostToDevice, stream));
    GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
  };
  ops.submit = [this, ctas] {
    const std::size_t n = lists_.dsts.size();
    auto* words = static_cast<std::uint64_t*>(scratch_device_);
    testkit::uva_copy(dev, reinterpret_cast<void* const*>(words),
                      reinterpret_cast<const void* const*>(words + n), words + 2 * n, n, ctas,
                      stream);
  };
  ops.finish = [this] { sync(); };
  return ops;
}

bool PagedRunner::staged(const Config& c, bool to_host) const {
  const EngineOptions& o = gfd->options();
  const std::size_t direct = to_host ? o.direct_min_bytes_to_host : o.direct_min_bytes;
  return direct == 0 || c.size < direct;
}

Ops PagedRunner::stage_ops(Method m, const Config& c, bool to_host) {
  if (!stages_) stages_ = std::make_unique<Stages>(dev, *gfd);
  Ops ops;
  if (m == Method::kGatherOnly) {
    ops.prepare = [this, &c, to_host](const Ids& ids) {
      build_lists(c, to_host, ids);
      stage_blocks_.clear();
      for (std::size_t i = 0; i < lists_.dsts.size(); ++i)
        stage_blocks_.push_back({lists_.srcs[i], lists_.dsts[i], lists_.sizes[i]});
    };
    ops.submit = [this, to_host] { stages_->gather(stage_blocks_, to_host); };
    ops.finish = [] {};
    return ops;
  }
  // The device side of each block: the destinations to the device, the sources to the host.
  ops.prepare = [this, &c, to_host](const Ids& ids) {
    build_lists(c, to_host, ids);
    if (to_host)
      device_blocks_.assign(lists_.srcs.begin(), lists_.srcs.end());
    else
      device_blocks_.assign(lists_.dsts.begin(), lists_.dsts.end());
    stages_->prepare_place(device_blocks_, lists_.sizes);
  };
  ops.submit = [this, to_host] { stages_->place(to_host); };
  ops.finish = [this] { stages_->finish_place(); };
  return ops;
}

Row PagedRunner::measure(Method m, const Config& c, bool to_host, DecodeLoad* load, double min_ms) {
  Ops ops = make_ops(m, c, to_host);
  IdStream ids(c, warm);
  if (m != Method::kDma)
    evict_llc(static_cast<std::size_t>(warmup + iters + 1) * c.n * tensors * c.size);
  std::vector<double> us, submit_us;
  double loaded_ms = -1, alone_ms = -1;
  timed(m, c, to_host, ops, ids, load, min_ms, us, submit_us, loaded_ms, alone_ms);
  Row r;
  r.direction = to_host ? "d2h" : "h2d";
  r.method = method_name(m);
  r.load = load ? "decode" : "none";
  r.size = c.size;
  r.n = c.n;
  r.bytes = c.n * tensors * c.size;
  r.host_blocks = c.host_blocks;
  r.gpu_blocks = c.gpu_blocks;
  r.reps = us.size();
  r.us = percentiles(us);
  r.submit_us = percentiles(submit_us).p50;
  if (load && loaded_ms > 0 && alone_ms > 0) r.slowdown = loaded_ms / alone_ms - 1;
  // A stage alone moves scratch bytes: gather_only checks its copies, place_only nothing.
  if (is_stage(m)) {
    r.verified = m == Method::kGatherOnly ? (stages_->gathered_right(to_host) ? 1 : 0) : -1;
    if (r.verified == 0) {
      ++failures;
      std::fprintf(stderr, "VERIFY FAILED: %s gather_only: the copies differ\n",
                   r.direction.c_str());
    }
  } else if (m != Method::kDma) {
    r.verified = verify(c, to_host, ops, ids) ? 1 : 0;
    if (!r.verified) {
      ++failures;
      std::fprintf(stderr, "VERIFY FAILED: %s %s, %zu x %s x %zu caches%s\n", r.direction.c_str(),
                   r.method.c_str(), c.n, format_size(c.size).c_str(), tensors,
                   load ? " (under load)" : "");
    }
  }
  return r;
}

void PagedRunner::timed(Method m, const Config& c, bool to_host, Ops& ops, IdStream& ids,
                        DecodeLoad* load, double min_ms, std::vector<double>& us,
                        std::vector<double>& submit_us, double& loaded_ms, double& alone_ms) {
  // Under the load: the matmuls alone for kAloneMs (after their first batches), then with the
  // transfers, then alone again, all in one run of the load.
  const auto alone_window = [&](cudaEvent_t from, cudaEvent_t to) {
    GFD_BENCH_CUDA(cudaEventRecord(from, stream));
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(kAloneMs));
    GFD_BENCH_CUDA(cudaEventRecord(to, stream));
  };
  if (load) {
    load->start();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  try {
    if (load) alone_window(window[0], window[1]);
    for (int i = 0; i < warmup; ++i) {
      ops.prepare(ids.next());
      ops.submit();
      ops.finish();
    }
    if (load) GFD_BENCH_CUDA(cudaEventRecord(window[2], stream));
    const bool traced = trace && m == Method::kGfd && !load;
    if (traced) testkit::start_trace(*gfd, 1 << 20);
    const auto start = Clock::now();
    while (static_cast<int>(us.size()) < iters ||
           (since_us(start) < min_ms * 1e3 && us.size() < 100000)) {
      ops.prepare(ids.next());
      const auto t0 = Clock::now();
      ops.submit();
      const double sub = since_us(t0);
      ops.finish();
      us.push_back(since_us(t0));
      submit_us.push_back(sub);
    }
    if (load) {
      GFD_BENCH_CUDA(cudaEventRecord(window[3], stream));
      alone_window(window[4], window[5]);
      load->stop();
      loaded_ms = load->mean_ms(window[2], window[3]);
      const double before = load->mean_ms(window[0], window[1]);
      const double after = load->mean_ms(window[4], window[5]);
      if (before > 0 && after > 0) alone_ms = (before + after) / 2;
    }
    if (traced) {
      std::printf("trace of gfd, %s %zu ids x %zu tensors x %zu bytes:\n", to_host ? "d2h" : "h2d",
                  c.n, tensors, c.size);
      print_trace(testkit::take_trace(*gfd), us, c.n * tensors, c.size, warm ? "warm" : "cold",
                  "gather");
    }
  } catch (...) {
    if (load) load->halt();
    throw;
  }
}

bool PagedRunner::verify(const Config& c, bool to_host, Ops& ops, IdStream& ids) {
  const Ids& v = ids.next();
  poison(c, to_host, v);
  ops.prepare(v);
  ops.submit();
  ops.finish();
  return check(c, to_host, v);
}

void PagedRunner::drain() noexcept {
  if (host_only) {
    try {
      dev.stream_sync(stream);
    } catch (...) {
    }
    return;
  }
  (void)cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
}

// Every method moves the same blocks in the same order: at a small grid point the blocks the
// method before touched would still be in the last-level cache, so the cache is flushed first
// (by writing a buffer twice its size) unless that method's own traffic already did.
void PagedRunner::evict_llc(std::size_t touched) {
  const std::size_t l3 = l3_bytes();
  if (touched >= 4 * l3) return;
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  if (evict_.empty()) evict_.resize(std::max(2 * l3, std::size_t{64} << 20) / kChunk * kChunk);
  const int value = ++evictions_ & 0xff;
  parallel_for(evict_.size() / kChunk,
               [&](std::size_t i) { std::memset(evict_.data() + i * kChunk, value, kChunk); });
}

void PagedRunner::sync() {
  if (host_only)
    dev.stream_sync(stream);
  else
    GFD_BENCH_CUDA(cudaStreamSynchronize(stream));
}

// The (src, dst, bytes) of every (tensor, block), tensor by tensor as vLLM's per-layer
// swap_blocks orders them.
void PagedRunner::build_lists(const Config& c, bool to_host, const Ids& ids) {
  lists_.clear();
  for (std::size_t t = 0; t < tensors; ++t)
    for (std::size_t i = 0; i < c.n; ++i) {
      std::byte* h = caches->host[t] + ids.host[i] * c.size;
      std::byte* d = caches->device[t] + ids.device[i] * c.size;
      lists_.srcs.push_back(to_host ? d : h);
      lists_.dsts.push_back(to_host ? h : d);
      lists_.sizes.push_back(c.size);
    }
}

}  // namespace gfd::bench::paged
