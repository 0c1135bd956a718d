// One method on one grid point of gfd_benchmark --layout paged: the calls each method makes,
// timed from the call until every byte is in place, and the check of the bytes it moved.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "decode_load.hpp"
#include "gfd/gfd.hpp"
#include "paged_caches.hpp"
#include "paged_stages.hpp"
#include "paged_types.hpp"
#include "testkit/testkit.hpp"

namespace gfd::bench::paged {

// One method's calls for one repetition: `prepare` (untimed) builds what the call needs from the
// ids, `submit` is the call a runtime's thread makes (its return ends the submit time), `finish`
// waits until every byte is in place.
struct Ops {
  std::function<void(const Ids&)> prepare;
  std::function<void()> submit;
  std::function<void()> finish;
};

class PagedRunner {
 public:
  testkit::Device dev;
  bool host_only = false, warm = false;
  int iters = 20, warmup = 3, stream_priority = 0;
  std::size_t tensors = 0;
  cudaStream_t stream = nullptr;
  std::unique_ptr<Caches> caches;  // before the engines: they go first
  std::optional<Engine> gfd, zero_copy;
  bool trace = false;  // --trace: the engine's timeline of gfd's median transfer (idle runs)
  CacheSet gfd_set, zero_copy_set;
  std::unique_ptr<DecodeLoad> load;
  // Under the load: the matmuls alone before the transfers, during them, and alone after.
  std::array<cudaEvent_t, 6> window{};
  int failures = 0;

  ~PagedRunner();

  // The descriptor lists' pinned and device buffers, for transfers of up to `entries` copies.
  void make_scratch(std::size_t entries);
  // Every host cache holds its host pattern (word i of cache t: pattern_word(host_tag(t), i)).
  void fill_host_caches();
  // Every device cache holds its device pattern (before the stores are measured).
  void fill_device_caches();
  // Registers this grid point's views of the caches with the engines.
  void register_caches(const Config& c);

  // One method on one grid point: `warmup` untimed repetitions, then timed ones until at least
  // `iters` and `min_ms` (under load: the window the matmuls are measured over); then one more
  // transfer with fresh ids, verified. With a `load`, its matmuls run without a break from
  // `kAloneMs` before the first warm-up repetition to `kAloneMs` after the last timed one, and
  // the row gets their slowdown during the timed ones against their mean time in those two
  // windows alone: the same run of matmuls at the same clocks, a drift between the windows
  // averaged out (a baseline taken in a run of its own moved by up to 10% with the clocks).
  Row measure(Method m, const Config& c, bool to_host, DecodeLoad* load, double min_ms);
  static constexpr double kAloneMs = 150;

  // Whether gfd stages blocks of this point's size this way (below its direct_min_bytes): where
  // it does not, its stages alone (gather_only, place_only) have nothing to stand for.
  bool staged(const Config& c, bool to_host) const;

  // After a failed measurement: the stream's work finished and a CUDA error that does not
  // stick cleared, so that the next method starts clean.
  void drain() noexcept;

 private:
  Ops make_ops(Method m, const Config& c, bool to_host);
  Ops dma_ops(std::size_t bytes, bool to_host);
  Ops gfd_ops(Method m, bool to_host);
  Ops batch_ops(const Config& c, bool to_host);
  Ops per_block_ops(const Config& c, bool to_host);
  Ops uva_ops(Method m, const Config& c, bool to_host);
  // gather_only and place_only (paged_stages.hpp), over the gfd engine's settings.
  Ops stage_ops(Method m, const Config& c, bool to_host);

  // The timed repetitions (after the warm-up ones): the call-to-done and the submit times; the
  // matmuls' mean time during them and alone when under a load (-1 otherwise).
  void timed(Method m, const Config& c, bool to_host, Ops& ops, IdStream& ids, DecodeLoad* load,
             double min_ms, std::vector<double>& us, std::vector<double>& submit_us,
             double& loaded_ms, double& alone_ms);
  // One more transfer with fresh ids, its destinations poisoned first; whether it is exact.
  bool verify(const Config& c, bool to_host, Ops& ops, IdStream& ids);

  // Destinations of `ids` poisoned (zero), for the check after one more transfer.
  void poison(const Config& c, bool to_host, const Ids& ids);
  // Whether every destination block of `ids` holds its source block's pattern.
  bool check(const Config& c, bool to_host, const Ids& ids);
  bool check_on_gpu(const Config& c, const Ids& ids);

  void evict_llc(std::size_t touched);
  void sync();
  void build_lists(const Config& c, bool to_host, const Ids& ids);

  struct Lists {
    std::vector<const void*> srcs;
    std::vector<void*> dsts;
    std::vector<std::size_t> sizes;
    void clear() { srcs.clear(), dsts.clear(), sizes.clear(); }
    void reserve(std::size_t n) { srcs.reserve(n), dsts.reserve(n), sizes.reserve(n); }
  } lists_;
  const Ids* ids_ = nullptr;
  Transfer pending_;
  std::vector<std::byte> evict_;
  int evictions_ = 0;
  void* scratch_host_ = nullptr;
  void* scratch_device_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  unsigned long long* mismatches_host_ = nullptr;
  unsigned long long* mismatches_device_ = nullptr;
  std::unique_ptr<Stages> stages_;  // made at the first stage measured
  std::vector<BlockCopy> stage_blocks_;
  std::vector<const void*> device_blocks_;
};

}  // namespace gfd::bench::paged
