// CopyLanes::submit_bounced: 2D runs through the staging ring's device twin .
#include <algorithm>
#include <optional>
#include <vector>

#include "pipeline/copy_lanes.hpp"
#include "pipeline/engine_context.hpp"
#include "pipeline/slot_ring.hpp"

namespace gfd::detail {

bool CopyLanes::submit_bounced(TransferState& t, StreamHandle stream, SlotRing& ring) {
  const std::vector<StridedCopy>& runs = t.plan.strided;
  const bool to_host = t.to_host();
  const std::size_t room = ring.slot_bytes();
  // A slot takes consecutive runs while they fit (each fits one alone: the caller checks).
  std::size_t groups = 0;
  for (std::size_t i = 0, used = room; i < runs.size(); ++i) {
    const std::size_t b = runs[i].width * runs[i].rows;
    if (used + b > room) {
      ++groups;
      used = 0;
    }
    used += b;
  }
  thread_local std::vector<std::uint32_t> taken;
  taken.clear();
  const std::size_t want = std::min({groups, kBounceSlots, std::max<std::size_t>(ring.size() / 2, 1)});
  while (taken.size() < want) {
    const std::optional<std::uint32_t> i = ring.try_acquire();
    if (!i) break;
    taken.push_back(*i);
  }
  if (taken.empty()) return false;
  // Each slot's `done` follows the last work that reads or writes its device twin (on the lane
  // or on `stream`), so that whoever takes it next waits for exactly that. An enqueue that
  // fails part way leaves the device in an error state in which nothing more runs.
  struct Issued {
    SlotRing& ring;
    ~Issued() {
      for (std::uint32_t i : taken) ring[i].mark_issued();
    }
  } issued{ring};
  thread_local std::vector<void*> dsts;
  thread_local std::vector<const void*> srcs;
  thread_local std::vector<std::size_t> sizes;
  thread_local std::vector<Copy2D> spread;
  try {
    begin(t, stream);
    const std::uint32_t li = to_host ? pack() : next_direct();
    StreamHandle l = lane(t, li);
    std::uint64_t rows = 0;
    for (std::size_t i = 0, g = 0; i < runs.size(); ++g) {
      Slot& sl = ring[taken[g % taken.size()]];
      const bool reused = g >= taken.size();
      dsts.clear();
      srcs.clear();
      sizes.clear();
      spread.clear();
      for (std::size_t off = 0; i < runs.size() && off + runs[i].width * runs[i].rows <= room; ++i) {
        const StridedCopy& c = runs[i];
        std::byte* staged = sl.dev + off;
        if (to_host) {
          spread.push_back({staged, c.width, c.src, c.spitch, c.width, c.rows});
          dsts.push_back(c.dst);
          srcs.push_back(staged);
        } else {
          dsts.push_back(staged);
          srcs.push_back(c.src);
          spread.push_back({c.dst, c.dpitch, staged, c.width, c.width, c.rows});
        }
        sizes.push_back(c.width * c.rows);
        off += sizes.back();
        rows += c.rows;
      }
      const std::size_t n = sizes.size();
      if (!to_host) {
        if (reused) device_.stream_wait_event(stream, sl.done);  // its last runs are spread
        if (n == 1) device_.copy_h2d(dsts[0], srcs[0], sizes[0], stream);
        else device_.copy_batch(dsts.data(), srcs.data(), sizes.data(), n, false, stream);
        device_.record_event(sl.start, stream);
        device_.stream_wait_event(l, sl.start);
        device_.copy_2d_on_device(spread.data(), n, l);
        device_.record_event(sl.done, l);
      } else {
        if (reused) device_.stream_wait_event(l, sl.done);  // its last runs are on the host
        device_.copy_2d_on_device(spread.data(), n, l);
        device_.record_event(sl.start, l);
        device_.stream_wait_event(stream, sl.start);
        if (n == 1) device_.copy_d2h(dsts[0], srcs[0], sizes[0], stream);
        else device_.copy_batch(dsts.data(), srcs.data(), sizes.data(), n, true, stream);
        device_.record_event(sl.done, stream);
      }
    }
    if (!to_host) {
      // The caller's stream sees every row in place (its later work may read them).
      device_.record_event(t.lane_events[li], l);
      device_.stream_wait_event(stream, t.lane_events[li]);
    }
    device_.record_event(t.done_event, stream);
    Counters::add(ctx_.counters.direct, rows);
    Counters::add(ctx_.counters.strided, runs.size());
    Counters::add(ctx_.counters.bounced, runs.size());
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.mark_finalized();
  return true;
}

}  // namespace gfd::detail
