// CopyLanes::submit_bounced: 2D runs through the staging ring's device twin.
#include <algorithm>
#include <optional>
#include <vector>

#include "pipeline/copy_lanes.hpp"
#include "pipeline/engine_context.hpp"
#include "pipeline/slot_ring.hpp"

namespace gfd::detail {
namespace {

// The slots the runs fill, a slot taking consecutive runs while they fit (each fits one alone:
// the caller checks).
std::size_t slots_for(const std::vector<StridedCopy>& runs, std::size_t room) {
  std::size_t groups = 0;
  for (std::size_t i = 0, used = room; i < runs.size(); ++i) {
    const std::size_t b = runs[i].width * runs[i].rows;
    if (used + b > room) {
      ++groups;
      used = 0;
    }
    used += b;
  }
  return groups;
}

}  // namespace

// One slot's runs: the link's side (one DMA each) and the device's side (one 2D copy each).
struct CopyLanes::Bounce {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<std::size_t> sizes;
  std::vector<Copy2D> spread;
  std::uint64_t rows = 0;

  // Takes runs from `i` on while they fit in `room` bytes of `staged`; returns the next run.
  std::size_t fill(const std::vector<StridedCopy>& runs, std::size_t i, std::byte* staged,
                   std::size_t room, bool to_host) {
    dsts.clear();
    srcs.clear();
    sizes.clear();
    spread.clear();
    for (std::size_t off = 0; i < runs.size() && off + runs[i].width * runs[i].rows <= room; ++i) {
      const StridedCopy& c = runs[i];
      std::byte* at = staged + off;
      if (to_host) {
        spread.push_back({at, c.width, c.src, c.spitch, c.width, c.rows});
        dsts.push_back(c.dst);
        srcs.push_back(at);
      } else {
        dsts.push_back(at);
        srcs.push_back(c.src);
        spread.push_back({c.dst, c.dpitch, at, c.width, c.width, c.rows});
      }
      sizes.push_back(c.width * c.rows);
      off += sizes.back();
      rows += c.rows;
    }
    return i;
  }
};

bool CopyLanes::submit_bounced(TransferState& t, StreamHandle stream, SlotRing& ring) {
  const std::vector<StridedCopy>& runs = t.plan.strided;
  const std::size_t room = ring.slot_bytes();
  thread_local std::vector<std::uint32_t> taken;
  taken.clear();
  const std::size_t want =
      std::min({slots_for(runs, room), kBounceSlots, std::max<std::size_t>(ring.size() / 2, 1)});
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
  thread_local Bounce b;
  b.rows = 0;
  try {
    begin(t, stream);
    const std::uint32_t li = t.to_host() ? pack() : next_direct();
    StreamHandle l = lane(t, li);
    for (std::size_t i = 0, g = 0; i < runs.size(); ++g) {
      Slot& sl = ring[taken[g % taken.size()]];
      i = b.fill(runs, i, sl.dev, room, t.to_host());
      bounce(b, sl, g >= taken.size(), t.to_host(), stream, l);
    }
    if (!t.to_host()) {
      // The caller's stream sees every row in place (its later work may read them).
      device_.record_event(t.lane_events[li], l);
      device_.stream_wait_event(stream, t.lane_events[li]);
    }
    device_.record_event(t.done_event, stream);
    Counters::add(ctx_.counters.direct, b.rows);
    Counters::add(ctx_.counters.strided, runs.size());
    Counters::add(ctx_.counters.bounced, runs.size());
  } catch (...) {
    t.fail(std::current_exception());
  }
  t.mark_finalized();
  return true;
}

void CopyLanes::bounce(const Bounce& b, Slot& sl, bool reused, bool to_host, StreamHandle stream,
                       StreamHandle l) {
  const std::size_t n = b.sizes.size();
  if (!to_host) {
    if (reused) device_.stream_wait_event(stream, sl.done);  // its last runs are spread
    if (n == 1)
      device_.copy_h2d(b.dsts[0], b.srcs[0], b.sizes[0], stream);
    else
      device_.copy_batch(b.dsts.data(), b.srcs.data(), b.sizes.data(), n, false, stream);
    device_.record_event(sl.start, stream);
    device_.stream_wait_event(l, sl.start);
    device_.copy_2d_on_device(b.spread.data(), n, l);
    device_.record_event(sl.done, l);
  } else {
    if (reused) device_.stream_wait_event(l, sl.done);  // its last runs are on the host
    device_.copy_2d_on_device(b.spread.data(), n, l);
    device_.record_event(sl.start, l);
    device_.stream_wait_event(stream, sl.start);
    if (n == 1)
      device_.copy_d2h(b.dsts[0], b.srcs[0], b.sizes[0], stream);
    else
      device_.copy_batch(b.dsts.data(), b.srcs.data(), b.sizes.data(), n, true, stream);
    device_.record_event(sl.done, stream);
  }
}

}  // namespace gfd::detail
