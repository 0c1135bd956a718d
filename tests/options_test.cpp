// Unit tests of the engine options: GFD_* environment overrides (from_env), set, get and names.
// Every test runs under an EnvGuard that clears the GFD_* variables first and restores the original
// environment after.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/option_table.hpp"
#include "gfd/gfd.hpp"
#include "host/topology.hpp"

namespace {

// Every GFD_* variable of an option (from the option table), and one that is not an option.
const std::vector<std::string>& gfd_variables() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& opt : gfd::detail::option_table()) v.emplace_back(opt.variable);
    v.emplace_back("GFD_NOT_AN_OPTION");
    return v;
  }();
  return names;
}

// Saves and clears every GFD_* variable; restores them on destruction.
class EnvGuard {
 public:
  EnvGuard() {
    for (const auto& name : gfd_variables()) {
      const char* v = std::getenv(name.c_str());
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name.c_str());
    }
  }
  ~EnvGuard() {
    for (const auto& [name, value] : saved_) {
      if (value)
        ::setenv(name.c_str(), value->c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

  void set(const std::string& name, const std::string& value) {
    ASSERT_EQ(::setenv(name.c_str(), value.c_str(), 1), 0) << name;
  }
  void unset(const std::string& name) { ::unsetenv(name.c_str()); }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// A base that differs from the defaults in every field, so that "unchanged" means something.
gfd::EngineOptions custom_base() {
  gfd::EngineOptions o;
  o.device = 3;
  o.staging_bytes = std::size_t{32} << 20;
  o.slot_bytes = std::size_t{1} << 20;
  o.first_chunk_bytes = std::size_t{128} << 10;
  o.piece_bytes = std::size_t{16} << 10;
  o.direct_min_bytes = std::size_t{3} << 20;
  o.direct_min_bytes_to_host = std::size_t{5} << 20;
  o.strided_min_rows = 7;
  o.strided_min_bytes = std::size_t{96} << 10;
  o.cpus = "0";
  o.inline_gather_bytes = std::size_t{8} << 10;
  o.gather_threads = 5;
  o.copy_streams = 4;
  o.numa_node = 1;
  o.spin_us = 7;
  o.check_overlaps = false;
  o.submitter_gathers = true;
  o.staging_writes = gfd::StagingWrites::kPlain;
  o.chunk_bytes_to_host = std::size_t{1} << 20;
  o.use_all_local_cpus = true;
  o.kernel_max_bytes = std::size_t{24} << 10;
  o.pageable_cache_ms = 250;
  o.backend = gfd::Backend::kPerBlock;
  return o;
}

void expect_same(const gfd::EngineOptions& a, const gfd::EngineOptions& b) {
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.staging_bytes, b.staging_bytes);
  EXPECT_EQ(a.slot_bytes, b.slot_bytes);
  EXPECT_EQ(a.first_chunk_bytes, b.first_chunk_bytes);
  EXPECT_EQ(a.piece_bytes, b.piece_bytes);
  EXPECT_EQ(a.direct_min_bytes, b.direct_min_bytes);
  EXPECT_EQ(a.direct_min_bytes_to_host, b.direct_min_bytes_to_host);
  EXPECT_EQ(a.strided_min_rows, b.strided_min_rows);
  EXPECT_EQ(a.strided_min_bytes, b.strided_min_bytes);
  EXPECT_EQ(a.cpus, b.cpus);
  EXPECT_EQ(a.inline_gather_bytes, b.inline_gather_bytes);
  EXPECT_EQ(a.gather_threads, b.gather_threads);
  EXPECT_EQ(a.copy_streams, b.copy_streams);
  EXPECT_EQ(a.numa_node, b.numa_node);
  EXPECT_EQ(a.spin_us, b.spin_us);
  EXPECT_EQ(a.check_overlaps, b.check_overlaps);
  EXPECT_EQ(a.submitter_gathers, b.submitter_gathers);
  EXPECT_EQ(a.staging_writes, b.staging_writes);
  EXPECT_EQ(a.chunk_bytes_to_host, b.chunk_bytes_to_host);
  EXPECT_EQ(a.use_all_local_cpus, b.use_all_local_cpus);
  EXPECT_EQ(a.kernel_max_bytes, b.kernel_max_bytes);
  EXPECT_EQ(a.pageable_cache_ms, b.pageable_cache_ms);
  EXPECT_EQ(a.backend, b.backend);
}

// Expects from_env to reject `value` for `name` with a message naming the variable.
void expect_rejected(EnvGuard& env, const std::string& name, const std::string& value) {
  SCOPED_TRACE(name + "='" + value + "'");
  env.set(name, value);
  try {
    const gfd::EngineOptions o = gfd::EngineOptions::from_env(custom_base());
    ADD_FAILURE() << "accepted; slot_bytes=" << o.slot_bytes << " device=" << o.device;
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, name, e.what());
  }
  env.unset(name);
}

const std::vector<std::string> kSizeVariables = {
    "GFD_STAGING_BYTES",       "GFD_SLOT_BYTES",       "GFD_FIRST_CHUNK_BYTES",
    "GFD_PIECE_BYTES",         "GFD_DIRECT_MIN_BYTES", "GFD_DIRECT_MIN_BYTES_TO_HOST",
    "GFD_INLINE_GATHER_BYTES", "GFD_KERNEL_MAX_BYTES"};
const std::vector<std::string> kIntVariables = {"GFD_DEVICE",       "GFD_GATHER_THREADS",
                                                "GFD_COPY_STREAMS", "GFD_NUMA_NODE",
                                                "GFD_SPIN_US",      "GFD_PAGEABLE_CACHE_MS"};

TEST(OptionsFromEnvTest, NoVariablesLeavesBaseUnchanged) {
  EnvGuard env;
  expect_same(gfd::EngineOptions::from_env(custom_base()), custom_base());
  expect_same(gfd::EngineOptions::from_env(), gfd::EngineOptions{});
}

TEST(OptionsFromEnvTest, UnrelatedVariablesAreIgnored) {
  EnvGuard env;
  ::setenv("GFD_NOT_AN_OPTION", "garbage", 1);
  const gfd::EngineOptions o = gfd::EngineOptions::from_env(custom_base());
  ::unsetenv("GFD_NOT_AN_OPTION");
  expect_same(o, custom_base());
}

TEST(OptionsFromEnvTest, EachVariableOverridesOnlyItsField) {
  struct Case {
    const char* name;
    const char* value;
    std::function<void(gfd::EngineOptions&)> apply;  // the expected change to the base
  };
  const std::vector<Case> cases = {
      {"GFD_DEVICE", "1", [](auto& o) { o.device = 1; }},
      {"GFD_STAGING_BYTES", "128M", [](auto& o) { o.staging_bytes = std::size_t{128} << 20; }},
      {"GFD_SLOT_BYTES", "2M", [](auto& o) { o.slot_bytes = std::size_t{2} << 20; }},
      {"GFD_FIRST_CHUNK_BYTES", "256K",
       [](auto& o) { o.first_chunk_bytes = std::size_t{256} << 10; }},
      {"GFD_PIECE_BYTES", "32k", [](auto& o) { o.piece_bytes = std::size_t{32} << 10; }},
      {"GFD_DIRECT_MIN_BYTES", "1G", [](auto& o) { o.direct_min_bytes = std::size_t{1} << 30; }},
      {"GFD_DIRECT_MIN_BYTES_TO_HOST", "96K",
       [](auto& o) { o.direct_min_bytes_to_host = std::size_t{96} << 10; }},
      {"GFD_STRIDED_MIN_ROWS", "0", [](auto& o) { o.strided_min_rows = 0; }},
      {"GFD_STRIDED_MIN_BYTES", "1M", [](auto& o) { o.strided_min_bytes = std::size_t{1} << 20; }},
      {"GFD_CPUS", "0-1", [](auto& o) { o.cpus = "0-1"; }},
      {"GFD_INLINE_GATHER_BYTES", "4096", [](auto& o) { o.inline_gather_bytes = 4096; }},
      {"GFD_GATHER_THREADS", "9", [](auto& o) { o.gather_threads = 9; }},
      {"GFD_COPY_STREAMS", "3", [](auto& o) { o.copy_streams = 3; }},
      {"GFD_NUMA_NODE", "-2", [](auto& o) { o.numa_node = -2; }},
      {"GFD_SPIN_US", "0", [](auto& o) { o.spin_us = 0; }},
      {"GFD_CHECK_OVERLAPS", "1", [](auto& o) { o.check_overlaps = true; }},
      {"GFD_SUBMITTER_GATHERS", "off", [](auto& o) { o.submitter_gathers = false; }},
      {"GFD_STAGING_WRITES", "cldemote",
       [](auto& o) { o.staging_writes = gfd::StagingWrites::kCldemote; }},
      {"GFD_CHUNK_BYTES_TO_HOST", "512K",
       [](auto& o) { o.chunk_bytes_to_host = std::size_t{512} << 10; }},
      {"GFD_USE_ALL_LOCAL_CPUS", "0", [](auto& o) { o.use_all_local_cpus = false; }},
      {"GFD_KERNEL_MAX_BYTES", "256K",
       [](auto& o) { o.kernel_max_bytes = std::size_t{256} << 10; }},
      {"GFD_BACKEND", "zero_copy_kernel",
       [](auto& o) { o.backend = gfd::Backend::kZeroCopyKernel; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + "=" + c.value);
    EnvGuard env;
    env.set(c.name, c.value);
    gfd::EngineOptions expected = custom_base();
    c.apply(expected);
    expect_same(gfd::EngineOptions::from_env(custom_base()), expected);
  }
}

TEST(OptionsFromEnvTest, AllVariablesTogether) {
  EnvGuard env;
  env.set("GFD_DEVICE", "2");
  env.set("GFD_STAGING_BYTES", "1g");
  env.set("GFD_SLOT_BYTES", "4m");
  env.set("GFD_FIRST_CHUNK_BYTES", "65536");
  env.set("GFD_PIECE_BYTES", "8K");
  env.set("GFD_DIRECT_MIN_BYTES", "0");
  env.set("GFD_INLINE_GATHER_BYTES", "0K");
  env.set("GFD_GATHER_THREADS", "0");
  env.set("GFD_COPY_STREAMS", "1");
  env.set("GFD_NUMA_NODE", "-1");
  env.set("GFD_SPIN_US", "1000");
  env.set("GFD_CHECK_OVERLAPS", "0");
  const gfd::EngineOptions o = gfd::EngineOptions::from_env(custom_base());
  EXPECT_EQ(o.device, 2);
  EXPECT_EQ(o.staging_bytes, std::size_t{1} << 30);
  EXPECT_EQ(o.slot_bytes, std::size_t{4} << 20);
  EXPECT_EQ(o.first_chunk_bytes, 65536u);
  EXPECT_EQ(o.piece_bytes, std::size_t{8} << 10);
  EXPECT_EQ(o.direct_min_bytes, 0u);
  EXPECT_EQ(o.inline_gather_bytes, 0u);
  EXPECT_EQ(o.gather_threads, 0);
  EXPECT_EQ(o.copy_streams, 1);
  EXPECT_EQ(o.numa_node, -1);
  EXPECT_EQ(o.spin_us, 1000);
  EXPECT_FALSE(o.check_overlaps);
  EXPECT_EQ(o.backend, custom_base().backend);
}

TEST(OptionsFromEnvTest, CheckOverlapsAcceptsBooleanSpellings) {
  EnvGuard env;
  for (const char* v : {"0", "false", "off"}) {
    env.set("GFD_CHECK_OVERLAPS", v);
    gfd::EngineOptions base;
    base.check_overlaps = true;
    EXPECT_FALSE(gfd::EngineOptions::from_env(base).check_overlaps) << v;
  }
  for (const char* v : {"1", "true", "on"}) {
    env.set("GFD_CHECK_OVERLAPS", v);
    gfd::EngineOptions base;
    base.check_overlaps = false;
    EXPECT_TRUE(gfd::EngineOptions::from_env(base).check_overlaps) << v;
  }
}

TEST(OptionsFromEnvTest, CheckOverlapsRejectsOtherValues) {
  EnvGuard env;
  for (const char* v : {"", "yes", "2", "TRUE ", "-1"})
    expect_rejected(env, "GFD_CHECK_OVERLAPS", v);
}

TEST(OptionsFromEnvTest, BadSizesAreRejected) {
  EnvGuard env;
  for (const auto& name : kSizeVariables) {
    for (const char* v : {"abc", "12X", "-5", "", "1KB", "2M ", "1.5M", "K", "0x10",
                          "99999999999999999999", "17179869184G"})
      expect_rejected(env, name, v);
  }
}

TEST(OptionsFromEnvTest, BadIntegersAreRejected) {
  EnvGuard env;
  for (const auto& name : kIntVariables) {
    for (const char* v : {"abc", "", "12X", "1.5", "3 ", "1K", "99999999999999999999"})
      expect_rejected(env, name, v);
  }
}

TEST(OptionsFromEnvTest, ErrorLeavesNothingHalfApplied) {
  // One bad variable makes the whole call throw; a later call with it fixed works.
  EnvGuard env;
  env.set("GFD_DEVICE", "1");
  env.set("GFD_PIECE_BYTES", "lots");
  EXPECT_THROW((void)gfd::EngineOptions::from_env(custom_base()), gfd::Error);
  env.set("GFD_PIECE_BYTES", "16K");
  const gfd::EngineOptions o = gfd::EngineOptions::from_env(custom_base());
  EXPECT_EQ(o.device, 1);
  EXPECT_EQ(o.piece_bytes, std::size_t{16} << 10);
}

TEST(OptionsFromEnvTest, GuardRestoresEnvironment) {
  const char* before = std::getenv("GFD_SLOT_BYTES");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  {
    EnvGuard env;
    env.set("GFD_SLOT_BYTES", "8M");
    EXPECT_EQ(gfd::EngineOptions::from_env().slot_bytes, std::size_t{8} << 20);
  }
  const char* after = std::getenv("GFD_SLOT_BYTES");
  EXPECT_EQ(after != nullptr, saved.has_value());
  if (after && saved) EXPECT_EQ(std::string(after), *saved);
}

// strtoull skips leading blanks and accepts a minus sign: such sizes must still be rejected.
TEST(OptionsFromEnvTest, NegativeSizeWithLeadingSpaceIsRejected) {
  EnvGuard env;
  expect_rejected(env, "GFD_SLOT_BYTES", " -5");
  expect_rejected(env, "GFD_STAGING_BYTES", "\t-1");
}

// Integers that do not fit the field are rejected, not silently wrapped.
TEST(OptionsFromEnvTest, OutOfRangeIntegerIsRejected) {
  EnvGuard env;
  expect_rejected(env, "GFD_COPY_STREAMS", "4294967298");
  expect_rejected(env, "GFD_DEVICE", "4294967296");
}

}  // namespace

namespace {

TEST(BackendNamesTest, EveryBackendRoundTripsThroughItsName) {
  for (gfd::Backend b : gfd::kAllBackends)
    EXPECT_EQ(gfd::backend_from_string(gfd::to_string(b)), b);
  EXPECT_STREQ(gfd::to_string(gfd::Backend::kBatchAsync), "batch_async");
}

TEST(BackendNamesTest, UnknownNameListsTheKnownOnes) {
  try {
    (void)gfd::backend_from_string("memcpy");
    ADD_FAILURE() << "accepted";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
    for (gfd::Backend b : gfd::kAllBackends)
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, gfd::to_string(b), e.what());
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "memcpy", e.what());
  }
}

TEST(OptionsFromEnvTest, UnknownBackendIsRejectedNamingTheVariable) {
  EnvGuard env;
  expect_rejected(env, "GFD_BACKEND", "fast");
}

TEST(StagingWritesNamesTest, EveryModeRoundTripsThroughItsName) {
  for (gfd::StagingWrites w : gfd::kAllStagingWrites)
    EXPECT_EQ(gfd::staging_writes_from_string(gfd::to_string(w)), w);
  EXPECT_STREQ(gfd::to_string(gfd::StagingWrites::kAuto), "auto");
  EXPECT_STREQ(gfd::to_string(gfd::StagingWrites::kCldemote), "cldemote");
  EXPECT_STREQ(gfd::to_string(gfd::StagingWrites::kStreaming), "streaming");
  EXPECT_STREQ(gfd::to_string(gfd::StagingWrites::kPlain), "plain");
}

TEST(StagingWritesNamesTest, UnknownNameListsTheKnownOnes) {
  try {
    (void)gfd::staging_writes_from_string("nontemporal");
    ADD_FAILURE() << "accepted";
  } catch (const gfd::Error& e) {
    EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
    for (gfd::StagingWrites w : gfd::kAllStagingWrites)
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, gfd::to_string(w), e.what());
    EXPECT_PRED_FORMAT2(::testing::IsSubstring, "nontemporal", e.what());
  }
}

TEST(OptionsFromEnvTest, StagingWritesDefaultsToAuto) {
  EXPECT_EQ(gfd::EngineOptions{}.staging_writes, gfd::StagingWrites::kAuto);
}

TEST(OptionsFromEnvTest, StagingWritesAcceptsEveryModeName) {
  EnvGuard env;
  const std::pair<const char*, gfd::StagingWrites> cases[] = {
      {"auto", gfd::StagingWrites::kAuto},
      {"cldemote", gfd::StagingWrites::kCldemote},
      {"streaming", gfd::StagingWrites::kStreaming},
      {"plain", gfd::StagingWrites::kPlain}};
  for (const auto& [name, mode] : cases) {
    env.set("GFD_STAGING_WRITES", name);
    gfd::EngineOptions expected = custom_base();
    expected.staging_writes = mode;
    expect_same(gfd::EngineOptions::from_env(custom_base()), expected);
  }
}

TEST(OptionsFromEnvTest, StagingWritesRejectsOtherValuesNamingTheVariable) {
  EnvGuard env;
  for (const char* v : {"", "1", "true", "nontemporal", "Streaming", "CLDEMOTE", "plain ", " auto"})
    expect_rejected(env, "GFD_STAGING_WRITES", v);
}

}  // namespace

TEST(OptionsCpusTest, ACpuListIsCheckedAndNamed) {
  const std::vector<int> allowed = gfd::detail::allowed_cpus();
  gfd::EngineOptions o;
  o.cpus = gfd::detail::format_cpulist(allowed);
  EXPECT_NO_THROW(o.validate());
  o.cpus = "3-x";
  try {
    o.validate();
    ADD_FAILURE() << "a malformed list passed";
  } catch (const gfd::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpus: '3-x' is not a CPU list"), std::string::npos)
        << e.what();
  }
  o.cpus = std::to_string(allowed.back() + 1000);
  try {
    o.validate();
    ADD_FAILURE() << "a CPU this process may not use passed";
  } catch (const gfd::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not one this process may run on"), std::string::npos)
        << e.what();
  }
}

namespace {

TEST(OptionsTableTest, NamesAndVariablesComeFromOneTable) {
  const std::vector<std::string> names = gfd::EngineOptions::names();
  const auto table = gfd::detail::option_table();
  ASSERT_EQ(names.size(), table.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::string upper = names[i];
    for (char& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    EXPECT_EQ(std::string(table[i].variable), "GFD_" + upper);
    EXPECT_NE(std::string(table[i].description), "") << names[i];
    for (std::size_t j = 0; j < i; ++j) EXPECT_NE(names[i], names[j]);
  }
  EXPECT_NE(std::find(names.begin(), names.end(), "staging_bytes"), names.end());
}

TEST(OptionsTableTest, SetParsesEachKindOfValue) {
  gfd::EngineOptions o;
  EXPECT_TRUE(o.set("device", "1"));
  EXPECT_TRUE(o.set("staging_bytes", "64M"));
  EXPECT_TRUE(o.set("piece_bytes", "16k"));
  EXPECT_TRUE(o.set("strided_min_rows", "3"));
  EXPECT_TRUE(o.set("check_overlaps", "off"));
  EXPECT_TRUE(o.set("submitter_gathers", "true"));
  EXPECT_TRUE(o.set("cpus", "0"));
  EXPECT_TRUE(o.set("staging_writes", "plain"));
  EXPECT_TRUE(o.set("backend", "batch_async"));
  EXPECT_EQ(o.device, 1);
  EXPECT_EQ(o.staging_bytes, std::size_t{64} << 20);
  EXPECT_EQ(o.piece_bytes, std::size_t{16} << 10);
  EXPECT_EQ(o.strided_min_rows, 3u);
  EXPECT_FALSE(o.check_overlaps);
  EXPECT_TRUE(o.submitter_gathers);
  EXPECT_EQ(o.cpus, "0");
  EXPECT_EQ(o.staging_writes, gfd::StagingWrites::kPlain);
  EXPECT_EQ(o.backend, gfd::Backend::kBatchAsync);
}

TEST(OptionsTableTest, UnknownNamesAreNotSet) {
  gfd::EngineOptions o;
  EXPECT_FALSE(o.set("no_such_option", "1"));
  EXPECT_FALSE(o.set("", "1"));
  EXPECT_THROW((void)o.get("no_such_option"), gfd::Error);
}

TEST(OptionsTableTest, BadValuesNameTheOption) {
  const std::pair<const char*, const char*> cases[] = {
      {"slot_bytes", "lots"},     {"device", "1.5"},     {"check_overlaps", "yes"}, {"cpus", "3-x"},
      {"staging_writes", "fast"}, {"backend", "memcpy"}, {"strided_min_rows", "-1"}};
  for (const auto& [name, value] : cases) {
    SCOPED_TRACE(std::string(name) + "=" + value);
    gfd::EngineOptions o;
    try {
      (void)o.set(name, value);
      ADD_FAILURE() << "accepted";
    } catch (const gfd::Error& e) {
      EXPECT_EQ(e.code(), gfd::ErrorCode::kInvalidArgument);
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, std::string("EngineOptions::") + name, e.what());
      EXPECT_PRED_FORMAT2(::testing::IsSubstring, value, e.what());
    }
  }
}

// get gives what set takes back, for every option, at the defaults and away from them.
TEST(OptionsTableTest, GetAndSetRoundTripEveryOption) {
  for (const gfd::EngineOptions& base : {gfd::EngineOptions{}, custom_base()}) {
    for (const std::string& name : gfd::EngineOptions::names()) {
      SCOPED_TRACE(name + "=" + base.get(name));
      gfd::EngineOptions o;
      EXPECT_TRUE(o.set(name, base.get(name)));
      EXPECT_EQ(o.get(name), base.get(name));
    }
  }
  EXPECT_EQ(gfd::EngineOptions{}.get("staging_bytes"), "128M");
  EXPECT_EQ(gfd::EngineOptions{}.get("check_overlaps"), "true");
  EXPECT_EQ(gfd::EngineOptions{}.get("backend"), "gather");
}

// Every option of the table is read from its variable: a base at the defaults, every variable
// set to custom_base's value, gives custom_base.
TEST(OptionsTableTest, FromEnvReadsEveryOption) {
  EnvGuard env;
  const gfd::EngineOptions custom = custom_base();
  for (const auto& opt : gfd::detail::option_table()) env.set(opt.variable, custom.get(opt.name));
  const gfd::EngineOptions o = gfd::EngineOptions::from_env();
  for (const std::string& name : gfd::EngineOptions::names())
    EXPECT_EQ(o.get(name), custom.get(name)) << name;
}

}  // namespace
