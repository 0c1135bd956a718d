#include "trace_report.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <set>
#include <utility>

#include "bench_common.hpp"

namespace gfd::bench {

void print_trace(const std::vector<testkit::TraceEvent>& ev, const std::vector<double>& us,
                 std::size_t n, std::size_t size, const std::string& mode,
                 const std::string& backend) {
  using E = testkit::TraceEvent;
  std::vector<std::uint32_t> ids;
  for (const E& e : ev)
    if (e.what == E::kSubmit) ids.push_back(e.transfer);
  if (ids.empty() || ids.size() != us.size()) {
    std::printf("trace: unusable (%zu transfers traced for %zu repetitions)\n", ids.size(),
                us.size());
    return;
  }
  std::vector<std::size_t> order(us.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return us[a] < us[b]; });
  const std::size_t rep = order[order.size() / 2];
  const std::uint32_t id = ids[rep];
  std::uint64_t t0 = 0;
  struct Chunk {
    double published = -1, first = 1e18, last = 0, issued = -1, dma_done = -1, slowest = 0,
           enqueued = -1;
    int slowest_thread = 0;
    std::uint32_t bytes = 0, pieces = 0;
    std::set<int> threads;
  };
  std::map<std::uint32_t, Chunk> chunks;
  std::map<int, double> busy;
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint64_t> open;
  double planned = 0, finalized = 0, returned = 0, first_piece = 1e18, last_piece = 0;
  std::map<std::uint32_t, double> stages;                // E::Stage -> time
  std::vector<std::pair<double, std::uint32_t>> packed;  // each stretch packed: time, blocks so far
  std::vector<double> piece_us;                          // how long each piece took
  for (const E& e : ev)
    if (e.transfer == id && e.what == E::kSubmit) t0 = e.ns;
  for (const E& e : ev) {
    if (e.transfer != id) continue;
    const double t = (static_cast<double>(e.ns) - static_cast<double>(t0)) * 1e-3;
    switch (e.what) {
      case E::kPlanned:
        planned = t;
        break;
      case E::kChunkPublished:
        chunks[e.a].published = t;
        chunks[e.a].pieces = e.b;
        break;
      case E::kPieceStart:
        open[{e.a, e.b}] = e.ns;
        chunks[e.a].first = std::min(chunks[e.a].first, t);
        chunks[e.a].threads.insert(e.thread);
        first_piece = std::min(first_piece, t);
        break;
      case E::kPieceEnd: {
        chunks[e.a].last = std::max(chunks[e.a].last, t);
        last_piece = std::max(last_piece, t);
        const double took =
            (static_cast<double>(e.ns) - static_cast<double>(open[{e.a, e.b}])) * 1e-3;
        busy[e.thread] += took;
        piece_us.push_back(took);
        if (took > chunks[e.a].slowest)
          chunks[e.a].slowest = took, chunks[e.a].slowest_thread = e.thread;
        break;
      }
      case E::kChunkIssued:
        chunks[e.a].issued = t;
        chunks[e.a].bytes = e.b;
        break;
      case E::kFinalized:
        finalized = t;
        break;
      case E::kDmaDone:
        chunks[e.a].dma_done = t;
        break;
      case E::kReturn:
        returned = t;
        break;
      case E::kStage:
        if (e.a == E::kEnqueued)
          chunks[e.b].enqueued = t;
        else
          stages[e.a] = t;
        if (e.a == E::kPacked) packed.emplace_back(t, e.b);
        break;
      default:
        break;
    }
  }
  double busy_sum = 0;
  for (auto& [th, b] : busy) busy_sum += b;
  const double window = last_piece - first_piece;
  std::printf(
      "\ntrace: %s, %zu x %s, %s destinations, median timed repetition (%.1f us call to sync)\n",
      backend.c_str(), n, format_size(size).c_str(), mode.c_str(), us[rep]);
  std::printf(
      "  planned %.1f us | first piece starts %.1f | last piece ends %.1f | last DMA enqueued %.1f "
      "| "
      "call returns %.1f\n",
      planned, first_piece, last_piece, finalized, returned);
  if (!stages.empty()) {
    const char* names[] = {"pool woken",       "plan storage",       "lanes begun",
                           "slot taken",       "list written",       "gathered",
                           "early chunks out", "last stretch packed"};
    std::printf("  submission:");
    for (auto [k, t] : stages) std::printf(" %s %.1f |", k < std::size(names) ? names[k] : "?", t);
    std::printf("\n");
  }
  if (!packed.empty()) {
    std::printf("  stretches packed (us: blocks so far):");
    for (auto [t, b] : packed) std::printf(" %.1f:%u", t, b);
    std::printf("\n");
  }
  std::printf(
      "  threads that gathered: %zu (-1 = the submitting thread); busy %.1f us in total = %.1f "
      "threads "
      "on average over the %.1f us gather window\n",
      busy.size(), busy_sum, window > 0 ? busy_sum / window : 0, window);
  if (!piece_us.empty()) {
    // Stragglers: one slow piece holds its chunk's DMA, and the DMAs behind it on its lane.
    std::sort(piece_us.begin(), piece_us.end());
    auto at = [&](double q) {
      return piece_us[static_cast<std::size_t>(q * (piece_us.size() - 1))];
    };
    const double slow = 4 * at(0.5);
    const auto stragglers =
        piece_us.end() - std::upper_bound(piece_us.begin(), piece_us.end(), slow);
    std::printf(
        "  pieces: %zu, us each p50 %.1f p90 %.1f p99 %.1f max %.1f; %td took over 4x the median\n",
        piece_us.size(), at(0.5), at(0.9), at(0.99), piece_us.back(), stragglers);
  }
  std::printf("  (times in us from the call; dma_done is read on the GPU clock, a few us early)\n");
  std::printf("  %-6s %-7s %-7s %10s %10s %10s %10s %10s %10s %8s %14s\n", "chunk", "bytes",
              "pieces", "published", "enqueued", "1st_piece", "last_piece", "issued", "dma_done",
              "threads", "slowest(thr)");
  for (auto& [k, c] : chunks)
    std::printf("  %-6u %-7s %-7u %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %8zu %9.1f(%3d)\n", k,
                (std::to_string(c.bytes >> 10) + "K").c_str(), c.pieces, c.published, c.enqueued,
                c.first < 1e17 ? c.first : -1.0, c.last, c.issued, c.dma_done, c.threads.size(),
                c.slowest, c.slowest_thread);
}

}  // namespace gfd::bench
