#include "bench_common.hpp"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

namespace gfd::bench {

Flags::Flags(int argc, char** argv, const std::map<std::string, std::string>& known) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0)
      throw std::invalid_argument("unexpected argument '" + a + "'\n" + usage(known));
    a = a.substr(2);
    std::string value = "1";
    const auto eq = a.find('=');
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    auto it = known.find(a);
    if (it == known.end()) throw std::invalid_argument("unknown flag --" + a + "\n" + usage(known));
    // Flags documented with "=" take a value; allow "--name value".
    if (eq == std::string::npos && it->second.rfind("=", 0) == 0) {
      if (i + 1 >= argc) throw std::invalid_argument("flag --" + a + " needs a value");
      value = argv[++i];
    }
    values_[a] = value;
  }
}

bool Flags::has(const std::string& n) const { return values_.count(n) != 0; }

std::string Flags::get(const std::string& n, const std::string& fallback) const {
  auto it = values_.find(n);
  return it == values_.end() ? fallback : it->second;
}

std::vector<std::string> Flags::get_list(const std::string& n, const std::string& fallback) const {
  const std::string s = get(n, fallback);
  std::vector<std::string> out;
  for (std::size_t pos = 0; pos <= s.size();) {
    const std::size_t comma = std::min(s.find(',', pos), s.size());
    out.push_back(s.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

long long Flags::get_int(const std::string& n, long long fallback) const {
  auto it = values_.find(n);
  if (it == values_.end()) return fallback;
  try {
    std::size_t pos = 0;
    const long long v = std::stoll(it->second, &pos);
    if (pos != it->second.size()) throw std::invalid_argument("");
    return v;
  } catch (...) {
    throw std::invalid_argument("--" + n + "=" + it->second + ": expected an integer");
  }
}

std::vector<std::size_t> Flags::get_sizes(const std::string& n,
                                          const std::vector<std::size_t>& fallback) const {
  if (!has(n)) return fallback;
  std::vector<std::size_t> out;
  for (const std::string& part : get_list(n)) {
    try {
      out.push_back(parse_size(part));
    } catch (...) {
      throw std::invalid_argument("--" + n + "=" + get(n) + ": '" + part + "' is not a size");
    }
  }
  return out;
}

std::string Flags::usage(const std::map<std::string, std::string>& known) {
  std::string u = "flags:\n";
  // "=VALUE" and "[=VALUE]" (an optional value) follow the name directly.
  for (const auto& [k, v] : known)
    u += "  --" + k + (v.rfind("=", 0) == 0 || v.rfind("[=", 0) == 0 ? "" : " ") + v + "\n";
  return u;
}

std::size_t parse_size(const std::string& s) {
  std::size_t pos = 0;
  const unsigned long long v = std::stoull(s, &pos);
  std::size_t shift = 0;
  if (pos < s.size()) {
    const char c = s[pos];
    if (c == 'K' || c == 'k')
      shift = 10;
    else if (c == 'M' || c == 'm')
      shift = 20;
    else if (c == 'G' || c == 'g')
      shift = 30;
    else
      throw std::invalid_argument(s);
    if (pos + 1 != s.size()) throw std::invalid_argument(s);
  }
  if (v == 0) throw std::invalid_argument(s);
  return static_cast<std::size_t>(v) << shift;
}

std::string format_size(std::size_t b) {
  if (b >= (1u << 30) && b % (1u << 30) == 0) return std::to_string(b >> 30) + "G";
  if (b >= (1u << 20) && b % (1u << 20) == 0) return std::to_string(b >> 20) + "M";
  if (b >= (1u << 10) && b % (1u << 10) == 0) return std::to_string(b >> 10) + "K";
  return std::to_string(b);
}

Percentiles percentiles(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5))];
  };
  p.p50 = at(0.5);
  p.p90 = at(0.9);
  p.min = v.front();
  return p;
}

std::size_t l3_bytes() {
  for (int idx = 0; idx < 8; ++idx) {
    const std::string base = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/";
    std::ifstream lvl(base + "level"), sz(base + "size");
    int level = 0;
    std::string size;
    if (!(lvl >> level) || !(sz >> size)) continue;
    if (level != 3) continue;
    try {
      return parse_size(size);
    } catch (...) {
    }
  }
  return std::size_t{256} << 20;
}

void fill_random(std::byte* data, std::size_t bytes) {
  const unsigned nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (unsigned t = 0; t < nt; ++t) {
    ts.emplace_back([data, bytes, t, nt] {
      const std::size_t words = bytes / 8;
      const std::size_t lo = words * t / nt, hi = words * (t + 1) / nt;
      std::uint64_t x = 0x9E3779B97F4A7C15ull * (t + 1);
      auto* w = reinterpret_cast<std::uint64_t*>(data);
      for (std::size_t i = lo; i < hi; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w[i] = x | 0x0101010101010101ull;  // random and never zero
      }
    });
  }
  for (auto& t : ts) t.join();
  for (std::size_t i = bytes / 8 * 8; i < bytes; ++i) data[i] = std::byte{0x5A};
}

Pool::Pool(std::size_t b) : bytes(b) {
  void* p = mmap(nullptr, b, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("pool: mmap of " + std::to_string(b) + " bytes failed");
  data = static_cast<std::byte*>(p);
  fill_random(data, bytes);
}

Pool::~Pool() { munmap(data, bytes); }

SourcePicker::SourcePicker(std::size_t pool_bytes, std::size_t block, std::uint64_t seed,
                           std::size_t pitch, bool consecutive)
    : slots_(pool_bytes / (pitch * block)),
      stride_(pitch * block),
      state_(seed | 1),
      consecutive_(consecutive) {}

std::vector<std::size_t> SourcePicker::pick(std::size_t n) {
  if (n > slots_ / 2) throw std::runtime_error("source pool too small for the requested blocks");
  std::vector<std::size_t> out;
  out.reserve(n);
  if (consecutive_) {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    const std::size_t start = state_ % (slots_ - n + 1);
    for (std::size_t i = 0; i < n; ++i) out.push_back((start + i) * stride_);
    return out;
  }
  std::unordered_set<std::size_t> seen;
  seen.reserve(n * 2);
  while (out.size() < n) {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    const std::size_t s = state_ % slots_;
    if (seen.insert(s).second) out.push_back(s * stride_);
  }
  return out;
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace gfd::bench

namespace gfd::bench {

double since_us(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<gfd::Backend> backends_flag(const Flags& flags) {
  if (!flags.has("backends")) return {std::begin(gfd::kAllBackends), std::end(gfd::kAllBackends)};
  std::vector<gfd::Backend> out;
  for (const std::string& name : flags.get_list("backends"))
    out.push_back(gfd::backend_from_string(name));
  return out;
}

}  // namespace gfd::bench
