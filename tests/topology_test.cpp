// Unit tests of the topology helpers: CPU list parsing and formatting, and GPU locality read
// from a fake sysfs tree. Expectations are built from allowed_cpus(), never from a particular
// CPU count.
#include "host/topology.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gfd/gfd.hpp"

namespace {

namespace fs = std::filesystem;

void expect_malformed(const std::string& text) {
  try {
    const std::vector<int> cpus = gfd::detail::parse_cpulist(text);
    ADD_FAILURE() << "parse_cpulist accepted '" << text << "' (" << cpus.size() << " CPUs)";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument) << "input '" << text << "'";
  }
}

// ---------------------------------------------------------------------------------------------
// parse_cpulist / format_cpulist

TEST(ParseCpulistTest, RangesAndSingles) {
  EXPECT_EQ(gfd::detail::parse_cpulist("0-3,8,10-11"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
}

TEST(ParseCpulistTest, Single) {
  EXPECT_EQ(gfd::detail::parse_cpulist("5"), (std::vector<int>{5}));
  EXPECT_EQ(gfd::detail::parse_cpulist("0"), (std::vector<int>{0}));
  EXPECT_EQ(gfd::detail::parse_cpulist("7-7"), (std::vector<int>{7}));
}

TEST(ParseCpulistTest, WhitespaceAndNewline) {
  EXPECT_EQ(gfd::detail::parse_cpulist("0-3,8\n"), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(gfd::detail::parse_cpulist("  0-1 , 4 \n"), (std::vector<int>{0, 1, 4}));
  EXPECT_EQ(gfd::detail::parse_cpulist("\t2\r\n"), (std::vector<int>{2}));
}

TEST(ParseCpulistTest, DuplicatesAndOrderAreNormalized) {
  EXPECT_EQ(gfd::detail::parse_cpulist("3,1,2,1,0-2"), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(gfd::detail::parse_cpulist("8-9,0-1,8"), (std::vector<int>{0, 1, 8, 9}));
}

TEST(ParseCpulistTest, EmptyGivesEmpty) {
  EXPECT_TRUE(gfd::detail::parse_cpulist("").empty());
  EXPECT_TRUE(gfd::detail::parse_cpulist("\n").empty());
  EXPECT_TRUE(gfd::detail::parse_cpulist("   ").empty());
}

TEST(ParseCpulistTest, MalformedThrows) {
  expect_malformed("3-1");
  expect_malformed("a");
  expect_malformed("1-");
  expect_malformed("-1");
  expect_malformed("1,,2");
  expect_malformed("0-3,x");
  expect_malformed("1-2-3");
  expect_malformed("1.5");
  expect_malformed("12345678");  // absurdly large CPU number
}

TEST(FormatCpulistTest, Formats) {
  EXPECT_EQ(gfd::detail::format_cpulist({}), "");
  EXPECT_EQ(gfd::detail::format_cpulist({5}), "5");
  EXPECT_EQ(gfd::detail::format_cpulist({1, 2}), "1-2");
  EXPECT_EQ(gfd::detail::format_cpulist({0, 2}), "0,2");
  EXPECT_EQ(gfd::detail::format_cpulist({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
}

TEST(FormatCpulistTest, RoundTrip) {
  for (const std::string text : {"0-3,8,10-11", "0", "1-2", "0,2,4,6", "0-63", "5,7-9,100"})
    EXPECT_EQ(gfd::detail::format_cpulist(gfd::detail::parse_cpulist(text)), text);

  std::mt19937 rng(1234);
  for (int round = 0; round < 50; ++round) {
    std::vector<int> cpus;
    for (int c = 0; c < 128; ++c)
      if (rng() % 3 == 0) cpus.push_back(c);
    const std::string text = gfd::detail::format_cpulist(cpus);
    EXPECT_EQ(gfd::detail::parse_cpulist(text), cpus) << text;
  }
}

TEST(AllowedCpusTest, NonEmptyAscendingUnique) {
  const std::vector<int> cpus = gfd::detail::allowed_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  EXPECT_EQ(std::adjacent_find(cpus.begin(), cpus.end()), cpus.end());
  EXPECT_GE(cpus.front(), 0);
}

// ---------------------------------------------------------------------------------------------
// read_gpu_locality against a fake sysfs tree

// A temporary directory, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("gfd_topology_test_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter++) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

class GpuLocalityTest : public ::testing::Test {
 protected:
  static constexpr const char* kBusId = "0000:3b:00.0";

  // Creates <root>/bus/pci/devices/<bus_id>/ with the given files ("" leaves a file out).
  void make_device(const std::string& bus_id, const std::string& numa_node,
                   const std::string& local_cpulist) {
    const fs::path dir = root_.path() / "bus" / "pci" / "devices" / bus_id;
    fs::create_directories(dir);
    if (!numa_node.empty()) std::ofstream(dir / "numa_node") << numa_node;
    if (!local_cpulist.empty()) std::ofstream(dir / "local_cpulist") << local_cpulist;
  }
  gfd::detail::GpuLocality read(const std::string& bus_id) {
    return gfd::detail::read_gpu_locality(bus_id, root_.path().string());
  }

  TempDir root_;
  const std::vector<int> allowed_ = gfd::detail::allowed_cpus();
};

TEST_F(GpuLocalityTest, NoLocalityReported) {
  make_device(kBusId, "-1\n", gfd::detail::format_cpulist(allowed_) + "\n");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, -1);
  EXPECT_EQ(loc.cpus, allowed_);
  EXPECT_TRUE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, LocalCpusIntersectedWithAllowed) {
  // The GPU's CPUs: the first allowed CPU plus two CPUs this process may not use.
  const int not_allowed = allowed_.back() + 1000;
  make_device(kBusId, "1\n",
              gfd::detail::format_cpulist({allowed_.front(), not_allowed, not_allowed + 1}) + "\n");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, 1);
  EXPECT_EQ(loc.cpus, (std::vector<int>{allowed_.front()}));
  EXPECT_TRUE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, AllButOneAllowedCpuIsLocal) {
  if (allowed_.size() < 2) GTEST_SKIP() << "needs at least two allowed CPUs";
  const std::vector<int> local(allowed_.begin(), allowed_.end() - 1);
  make_device(kBusId, "0\n", gfd::detail::format_cpulist(local) + "\n");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, 0);
  EXPECT_EQ(loc.cpus, local);
}

TEST_F(GpuLocalityTest, LocalCpusDisjointFromAllowedFallsBackToAllowed) {
  const int not_allowed = allowed_.back() + 1000;
  make_device(kBusId, "0\n", std::to_string(not_allowed) + "\n");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, 0);
  EXPECT_EQ(loc.cpus, allowed_);
  EXPECT_TRUE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, MissingLocalCpulistFallsBackToAllowed) {
  make_device(kBusId, "2\n", "");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, 2);
  EXPECT_EQ(loc.cpus, allowed_);
  EXPECT_TRUE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, MalformedLocalCpulistFallsBackToAllowed) {
  make_device(kBusId, "0\n", "garbage\n");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, 0);
  EXPECT_EQ(loc.cpus, allowed_);
}

TEST_F(GpuLocalityTest, MalformedNumaNodeMeansNoLocality) {
  make_device(kBusId, "none\n", gfd::detail::format_cpulist({allowed_.front()}) + "\n");
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, -1);
  EXPECT_EQ(loc.cpus, allowed_);
}

TEST_F(GpuLocalityTest, MissingDeviceDirectory) {
  make_device("0000:01:00.0", "0\n", "0\n");  // some other device exists
  const auto loc = read(kBusId);
  EXPECT_EQ(loc.numa_node, -1);
  EXPECT_EQ(loc.cpus, allowed_);
  EXPECT_FALSE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, MissingSysfsRoot) {
  const auto loc =
      gfd::detail::read_gpu_locality(kBusId, (root_.path() / "does_not_exist").string());
  EXPECT_EQ(loc.numa_node, -1);
  EXPECT_EQ(loc.cpus, allowed_);
  EXPECT_FALSE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, EmptyBusId) {
  make_device(kBusId, "0\n", "0\n");
  const auto loc = read("");
  EXPECT_EQ(loc.numa_node, -1);
  EXPECT_EQ(loc.cpus, allowed_);
  EXPECT_FALSE(loc.from_sysfs);
}

TEST_F(GpuLocalityTest, UpperCaseBusIdIsFound) {
  make_device("0000:af:00.0", "1\n", gfd::detail::format_cpulist({allowed_.front()}) + "\n");
  const auto loc = read("0000:AF:00.0");
  EXPECT_TRUE(loc.from_sysfs);
  EXPECT_EQ(loc.numa_node, 1);
  EXPECT_EQ(loc.cpus, (std::vector<int>{allowed_.front()}));
}

}  // namespace

namespace {

TEST(SplitCpusTest, EqualConsecutiveParts) {
  const std::vector<int> cpus = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 0, 2), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 1, 2), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 2, 3), (std::vector<int>{10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 0, 1), cpus);
}

TEST(SplitCpusTest, PartsCoverEveryCpuOnce) {
  std::vector<int> cpus;
  for (int c = 0; c < 30; c += 3) cpus.push_back(c);  // 10 CPUs, not contiguous
  for (int count = 1; count <= 12; ++count) {
    std::vector<int> all;
    for (int r = 0; r < count; ++r) {
      const auto part = gfd::detail::split_cpus(cpus, r, count);
      EXPECT_FALSE(part.empty()) << count << " " << r;
      if (count <= 10) all.insert(all.end(), part.begin(), part.end());
    }
    if (count <= 10) EXPECT_EQ(all, cpus) << count;
  }
}

TEST(SplitCpusTest, MoreGpusThanCpusGivesOneEachRoundRobin) {
  const std::vector<int> cpus = {4, 5};
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 0, 3), (std::vector<int>{4}));
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 1, 3), (std::vector<int>{5}));
  EXPECT_EQ(gfd::detail::split_cpus(cpus, 2, 3), (std::vector<int>{4}));
}

}  // namespace

TEST_F(GpuLocalityTest, GpusOnOneNodeSplitItsCpus) {
  if (allowed_.size() < 2) GTEST_SKIP() << "needs at least two allowed CPUs";
  const std::string list = gfd::detail::format_cpulist(allowed_);
  make_device("0000:3b:00.0", "0", list);
  make_device("0000:1a:00.0", "0", list);
  make_device("0000:86:00.0", "1", list);  // another node: not part of the split
  const std::vector<std::string> all = {"0000:3b:00.0", "0000:1a:00.0", "0000:86:00.0"};
  const auto a =
      gfd::detail::share_cpus("0000:1a:00.0", read("0000:1a:00.0"), all, root_.path().string());
  const auto b =
      gfd::detail::share_cpus("0000:3B:00.0", read("0000:3b:00.0"), all, root_.path().string());
  EXPECT_EQ(a.sharing, 2);
  EXPECT_EQ(b.sharing, 2);
  EXPECT_EQ(a.cpus, gfd::detail::split_cpus(allowed_, 0, 2));  // bus id order: 1a before 3b
  EXPECT_EQ(b.cpus, gfd::detail::split_cpus(allowed_, 1, 2));
  const auto c =
      gfd::detail::share_cpus("0000:86:00.0", read("0000:86:00.0"), all, root_.path().string());
  EXPECT_EQ(c.sharing, 1);
  EXPECT_EQ(c.cpus, allowed_);
}

TEST_F(GpuLocalityTest, GpusWithoutLocalitySplitAllCpus) {
  if (allowed_.size() < 2) GTEST_SKIP() << "needs at least two allowed CPUs";
  make_device("0000:01:00.0", "-1", "");
  make_device("0000:02:00.0", "-1", "");
  const std::vector<std::string> all = {"0000:01:00.0", "0000:02:00.0"};
  const auto a =
      gfd::detail::share_cpus("0000:01:00.0", read("0000:01:00.0"), all, root_.path().string());
  const auto b =
      gfd::detail::share_cpus("0000:02:00.0", read("0000:02:00.0"), all, root_.path().string());
  EXPECT_EQ(a.sharing, 2);
  std::vector<int> both = a.cpus;
  both.insert(both.end(), b.cpus.begin(), b.cpus.end());
  EXPECT_EQ(both, allowed_);
}

TEST_F(GpuLocalityTest, AloneOrUnknownGpuKeepsItsCpus) {
  make_device(kBusId, "0", gfd::detail::format_cpulist(allowed_));
  const auto alone = gfd::detail::share_cpus(kBusId, read(kBusId), {kBusId}, root_.path().string());
  EXPECT_EQ(alone.sharing, 1);
  EXPECT_EQ(alone.cpus, allowed_);
  const auto emulated = gfd::detail::share_cpus("", read(""), {kBusId}, root_.path().string());
  EXPECT_EQ(emulated.sharing, 1);
}

namespace {

// A fake sysfs device with vendor and class, as the PCI core lists it.
void make_pci(const fs::path& root, const std::string& bus_id, const std::string& vendor,
              const std::string& cls, const std::string& numa_node, const std::string& cpulist) {
  const fs::path dir = root / "bus" / "pci" / "devices" / bus_id;
  fs::create_directories(dir);
  std::ofstream(dir / "vendor") << vendor << "\n";
  std::ofstream(dir / "class") << cls << "\n";
  std::ofstream(dir / "numa_node") << numa_node;
  std::ofstream(dir / "local_cpulist") << cpulist;
}

}  // namespace

// One process per GPU (vLLM's tensor parallelism, a container with one visible GPU): each sees
// one GPU, yet the engines of the host's four GPUs on node 0 must take disjoint CPUs.
TEST_F(GpuLocalityTest, OneVisibleGpuStillSplitsWithTheHostsOthers) {
  const std::string list = gfd::detail::format_cpulist(allowed_);
  const std::vector<std::string> gpus = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                         "0000:5d:00.0"};
  for (const auto& id : gpus) make_pci(root_.path(), id, "0x10de", "0x030200", "0", list);
  make_pci(root_.path(), "0000:19:00.0", "0x15b3", "0x020000", "0", list);  // a NIC: not a GPU
  make_pci(root_.path(), "0000:9a:00.0", "0x10de", "0x030200", "1", list);  // a GPU on node 1
  make_pci(root_.path(), "0000:9b:00.0", "0x10de", "0x040300", "0", list);  // NVIDIA audio: no
  EXPECT_EQ(gfd::detail::host_gpu_bus_ids(root_.path().string()),
            (std::vector<std::string>{"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                      "0000:5d:00.0", "0000:9a:00.0"}));
  std::vector<int> taken;
  for (std::size_t r = 0; r < gpus.size(); ++r) {
    const auto s =
        gfd::detail::share_cpus(gpus[r], read(gpus[r]), {gpus[r]}, root_.path().string());
    EXPECT_EQ(s.sharing, 4) << gpus[r];
    EXPECT_EQ(s.cpus, gfd::detail::split_cpus(allowed_, static_cast<int>(r), 4)) << gpus[r];
    taken.insert(taken.end(), s.cpus.begin(), s.cpus.end());
  }
  std::sort(taken.begin(), taken.end());
  if (allowed_.size() >= 4)
    EXPECT_EQ(taken, allowed_) << "the four parts cover the node's CPUs once";
  // The GPU on node 1 has its node's CPUs to itself.
  const auto other = gfd::detail::share_cpus("0000:9a:00.0", read("0000:9a:00.0"), {"0000:9a:00.0"},
                                             root_.path().string());
  EXPECT_EQ(other.sharing, 1);
}
