// Unit tests of the gather threads' copy loop (src/host/gather_copy.*): every staging write mode
// copies exactly the bytes asked for, whatever the sizes and alignments; gather_ops and scatter_ops
// over random op lists; the CLDEMOTE bookkeeping (every line written is demoted once, after its
// last write); how a requested mode resolves on CPUs with and without CLDEMOTE and AVX2.
#include "host/gather_copy.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gfd/gfd.hpp"

namespace {

using gfd::StagingWrites;
using gfd::detail::CpuStoreFeatures;
using gfd::detail::StoreKind;

constexpr StoreKind kKinds[] = {StoreKind::kNormal, StoreKind::kNonTemporal, StoreKind::kCldemote};

const char* name(StoreKind k) { return gfd::to_string(gfd::detail::to_public(k)); }

// A buffer with a 64-byte aligned base, filled with a pattern that differs from the source's.
struct Buffer {
  std::vector<std::byte> storage;
  std::byte* data;
  explicit Buffer(std::size_t bytes, std::uint8_t seed) : storage(bytes + 128) {
    auto p = reinterpret_cast<std::uintptr_t>(storage.data());
    data = storage.data() + ((64 - (p & 63)) & 63);
    for (std::size_t i = 0; i < bytes; ++i)
      data[i] = static_cast<std::byte>((i * 131 + seed) & 0xff);
  }
};

// Sizes 1..300 all, then around every power of two and multiple of 64 that matters to the
// streaming path (256-byte minimum, 128-byte body, 32-byte head) and to copy_demote's 16 KB
// steps, up to 70000.
std::vector<std::size_t> sizes() {
  std::vector<std::size_t> s;
  for (std::size_t n = 1; n <= 300; ++n) s.push_back(n);
  for (std::size_t base :
       {383u,   384u,   511u,   512u,   1000u,  1024u,  4095u,  4096u,  4097u,  8191u, 12345u,
        16383u, 16384u, 16385u, 32768u, 32769u, 49151u, 65536u, 65537u, 69999u, 70000u})
    s.push_back(base);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 60; ++i) s.push_back(1 + rng() % 70000);
  return s;
}

TEST(GatherCopyTest, CopyBlockIsExactForEveryModeSizeAndAlignment) {
  constexpr std::size_t kMax = 70000 + 64;
  constexpr std::size_t kSpan = kMax + 128;
  const Buffer src(kSpan, 3), pristine(kSpan, 200);
  Buffer dst(kSpan, 0), ref(kSpan, 0);
  const std::vector<std::size_t> all = sizes();
  for (StoreKind kind : kKinds) {
    for (std::size_t n : all) {
      // Source and destination offsets: aligned, odd, and misaligned to each other.
      for (auto [so, dof] : {std::pair<std::size_t, std::size_t>{0, 0},
                             {1, 0},
                             {0, 1},
                             {3, 17},
                             {31, 33},
                             {63, 63},
                             {5, 32}}) {
        // Everything up to 64 bytes past the block, so that a stray byte is caught too.
        const std::size_t span = dof + n + 64;
        std::memcpy(dst.data, pristine.data, span);
        std::memcpy(ref.data, pristine.data, span);
        std::memcpy(ref.data + dof, src.data + so, n);
        gfd::detail::copy_block(dst.data + dof, src.data + so, n, kind);
        gfd::detail::store_fence();
        ASSERT_EQ(std::memcmp(dst.data, ref.data, span), 0)
            << name(kind) << " bytes=" << n << " src+" << so << " dst+" << dof;
      }
    }
  }
}

struct Op {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t slot_offset;
  std::uint64_t bytes;
};

// Random ops packed into a slot in ascending order, sometimes with gaps, any sizes (mostly
// small, some up to 70000), starting at any offset.
std::vector<Op> random_ops(std::mt19937_64& rng, std::size_t count, std::size_t* slot_bytes) {
  std::vector<Op> ops(count);
  std::uint64_t off = rng() % 64;
  for (Op& op : ops) {
    const unsigned pick = rng() % 10;
    op.bytes = pick < 6 ? 1 + rng() % 600 : pick < 9 ? 4096 + (rng() % 3) * 61 : 1 + rng() % 70000;
    op.slot_offset = off;
    off += op.bytes;
    if (rng() % 4 == 0) off += rng() % 200;  // a gap, line-aligned or not
  }
  *slot_bytes = off + 64;
  return ops;
}

TEST(GatherCopyTest, GatherOpsPlacesRandomOpListsExactly) {
  std::mt19937_64 rng(11);
  constexpr std::size_t kPool = std::size_t{4} << 20;
  Buffer pool(kPool, 9);
  for (int round = 0; round < 60; ++round) {
    std::size_t slot_bytes = 0;
    std::vector<Op> ops = random_ops(rng, 1 + rng() % 120, &slot_bytes);
    for (Op& op : ops) op.src = pool.data + rng() % (kPool - op.bytes);
    const gfd::detail::Prefetch pf{rng() % 2 ? std::size_t{4096} : std::size_t{0},
                                   static_cast<std::size_t>(rng() % 4),
                                   static_cast<gfd::detail::Prefetch::Level>(rng() % 3),
                                   std::size_t{1} << (rng() % 16)};  // window: 1 byte to 32 KB
    Buffer ref(slot_bytes, 77);
    for (const Op& op : ops) std::memcpy(ref.data + op.slot_offset, op.src, op.bytes);
    for (StoreKind kind : kKinds) {
      Buffer slot(slot_bytes, 77);
      gfd::detail::gather_ops(ops.data(), ops.size(), slot.data, kind, pf);
      ASSERT_EQ(std::memcmp(slot.data, ref.data, slot_bytes), 0)
          << name(kind) << " round " << round << " ops " << ops.size();
    }
  }
}

TEST(GatherCopyTest, ScatterOpsPlacesRandomOpListsExactly) {
  std::mt19937_64 rng(13);
  for (int round = 0; round < 60; ++round) {
    std::size_t slot_bytes = 0;
    std::vector<Op> ops = random_ops(rng, 1 + rng() % 120, &slot_bytes);
    Buffer slot(slot_bytes, 5);
    // Destinations: disjoint ranges of the host buffer at odd offsets, in shuffled order.
    std::vector<std::size_t> order(ops.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::uint64_t> dst_off(ops.size());
    std::uint64_t at = rng() % 64;
    for (std::size_t i : order) {
      dst_off[i] = at;
      at += ops[i].bytes + rng() % 100;
    }
    const std::size_t host_bytes = at + 64;
    Buffer ref(host_bytes, 123);
    for (std::size_t i = 0; i < ops.size(); ++i)
      std::memcpy(ref.data + dst_off[i], slot.data + ops[i].slot_offset, ops[i].bytes);
    for (StoreKind kind : kKinds) {
      Buffer host(host_bytes, 123);
      for (std::size_t i = 0; i < ops.size(); ++i) ops[i].dst = host.data + dst_off[i];
      gfd::detail::scatter_ops(ops.data(), ops.size(), slot.data, kind);
      ASSERT_EQ(std::memcmp(host.data, ref.data, host_bytes), 0)
          << name(kind) << " round " << round << " ops " << ops.size();
    }
  }
}

TEST(GatherCopyTest, EmptyOpListsAndZeroByteOpsAreFine) {
  Buffer a(256, 1), b(256, 2), ref(256, 2);
  for (StoreKind kind : kKinds) {
    gfd::detail::gather_ops(static_cast<const Op*>(nullptr), 0, b.data, kind);
    gfd::detail::copy_block(b.data + 3, a.data, 0, kind);
    Op op{a.data, b.data + 7, 5, 0};
    gfd::detail::gather_ops(&op, 1, b.data, kind);
    gfd::detail::scatter_ops(&op, 1, a.data, kind);
    EXPECT_EQ(std::memcmp(b.data, ref.data, 256), 0) << name(kind);
  }
}

// The demote bookkeeping, with the demotes recorded instead of executed: over any ascending
// run of writes, every line written is demoted exactly once, and only after the last write
// that touches it.
TEST(GatherCopyTest, DemoteBookkeepingDemotesEachWrittenLineOnceAfterItsLastWrite) {
  std::mt19937_64 rng(17);
  for (int round = 0; round < 2000; ++round) {
    // Ranges in ascending order, contiguous or with gaps, from 1 byte to a few lines, as
    // gather_ops hands them over (copy_demote also cuts a block into 16 KB steps).
    std::vector<std::pair<std::uintptr_t, std::size_t>> ranges;
    std::uintptr_t at = 4096 + rng() % 64;
    const std::size_t count = 1 + rng() % 40;
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t bytes = rng() % 5 == 0 ? 0 : 1 + rng() % (rng() % 2 ? 70 : 400);
      ranges.emplace_back(at, bytes);
      at += bytes;
      if (rng() % 3 == 0) at += rng() % 150;
    }
    std::map<std::uintptr_t, int> demoted;  // line -> times
    std::map<std::uintptr_t, std::size_t>
        last_write;  // line -> index of the last range touching it
    for (std::size_t i = 0; i < ranges.size(); ++i)
      for (std::uintptr_t b = ranges[i].first; b < ranges[i].first + ranges[i].second; ++b)
        last_write[b & ~std::uintptr_t{63}] = i;
    std::uintptr_t pending = 0;
    std::size_t current = 0;
    auto record = [&](std::uintptr_t b, std::uintptr_t e) {
      ASSERT_EQ(b % 64, 0u);
      ASSERT_EQ(e % 64, 0u);
      ASSERT_LT(b, e);
      for (std::uintptr_t l = b; l < e; l += 64) {
        ++demoted[l];
        auto it = last_write.find(l);
        ASSERT_NE(it, last_write.end()) << "demoted a line nobody wrote";
        // Demoted while handling range `current`: no later range may write the line again.
        EXPECT_LE(it->second, current) << "line demoted before its last write";
      }
    };
    for (current = 0; current < ranges.size(); ++current)
      gfd::detail::demote_done_with(ranges[current].first, ranges[current].second, pending, record);
    current = ranges.size();
    if (pending != 0) record(pending, pending + 64);
    for (const auto& [line, idx] : last_write) {
      (void)idx;
      EXPECT_EQ(demoted[line], 1) << "line +" << line - 4096 << " in round " << round;
    }
    EXPECT_EQ(demoted.size(), last_write.size());
    if (HasFailure()) return;
  }
}

TEST(StagingWritesResolveTest, AutoPicksTheFastestTheCpuHas) {
  using gfd::detail::resolve_staging_writes;
  EXPECT_EQ(resolve_staging_writes(StagingWrites::kAuto, CpuStoreFeatures{true, true}),
            StoreKind::kNonTemporal);
  EXPECT_EQ(resolve_staging_writes(StagingWrites::kAuto, CpuStoreFeatures{true, false}),
            StoreKind::kNormal);
  EXPECT_EQ(resolve_staging_writes(StagingWrites::kAuto, CpuStoreFeatures{false, true}),
            StoreKind::kNonTemporal);
  EXPECT_EQ(resolve_staging_writes(StagingWrites::kAuto, CpuStoreFeatures{false, false}),
            StoreKind::kNormal);
}

TEST(StagingWritesResolveTest, ExplicitModesAreHonouredOrFallBackLikeAuto) {
  using gfd::detail::resolve_staging_writes;
  for (bool cl : {false, true}) {
    for (bool st : {false, true}) {
      const CpuStoreFeatures cpu{cl, st};
      SCOPED_TRACE(std::string("cldemote=") + (cl ? "1" : "0") + " streaming=" + (st ? "1" : "0"));
      EXPECT_EQ(resolve_staging_writes(StagingWrites::kPlain, cpu), StoreKind::kNormal);
      EXPECT_EQ(resolve_staging_writes(StagingWrites::kStreaming, cpu),
                st ? StoreKind::kNonTemporal : StoreKind::kNormal);
      EXPECT_EQ(resolve_staging_writes(StagingWrites::kCldemote, cpu), cl ? StoreKind::kCldemote
                                                                       : st
                                                                           ? StoreKind::kNonTemporal
                                                                           : StoreKind::kNormal);
      // Whatever was asked, the result names a real mode.
      for (StagingWrites w : gfd::kAllStagingWrites)
        EXPECT_NE(gfd::detail::to_public(resolve_staging_writes(w, cpu)), StagingWrites::kAuto);
    }
  }
}

TEST(StagingWritesResolveTest, ToPublicNamesEachKind) {
  EXPECT_EQ(gfd::detail::to_public(StoreKind::kNormal), StagingWrites::kPlain);
  EXPECT_EQ(gfd::detail::to_public(StoreKind::kNonTemporal), StagingWrites::kStreaming);
  EXPECT_EQ(gfd::detail::to_public(StoreKind::kCldemote), StagingWrites::kCldemote);
}

TEST(StagingWritesResolveTest, ThisCpuResolvesConsistently) {
  const CpuStoreFeatures cpu = gfd::detail::cpu_store_features();
  EXPECT_EQ(cpu.cldemote, gfd::detail::cldemote_supported());
  EXPECT_EQ(cpu.streaming, gfd::detail::nontemporal_supported());
  EXPECT_EQ(gfd::detail::resolve_staging_writes(StagingWrites::kAuto),
            gfd::detail::resolve_staging_writes(StagingWrites::kAuto, cpu));
}

// On Linux/x86 the kernel lists the same CPUID flags in /proc/cpuinfo.
TEST(StagingWritesResolveTest, DetectionMatchesProcCpuinfo) {
#if defined(__x86_64__)
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line) && line.rfind("flags", 0) != 0) {
  }
  if (line.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  std::istringstream words(line.substr(line.find(':') + 1));
  bool cldemote = false, avx2 = false;
  for (std::string w; words >> w;) {
    cldemote |= w == "cldemote";
    avx2 |= w == "avx2";
  }
  const CpuStoreFeatures cpu = gfd::detail::cpu_store_features();
  EXPECT_EQ(cpu.cldemote, cldemote);
  EXPECT_EQ(cpu.streaming, avx2);
  std::printf("this CPU: cldemote %s, AVX2 %s; auto resolves to %s\n", cldemote ? "yes" : "no",
              avx2 ? "yes" : "no",
              gfd::to_string(gfd::detail::to_public(
                  gfd::detail::resolve_staging_writes(StagingWrites::kAuto))));
#else
  GTEST_SKIP() << "not x86-64";
#endif
}

}  // namespace
