// GFD_* booleans outside EngineOptions (env_flag) and the library's one stderr line (log_info,
// silenced by GFD_QUIET).
#include "common/env.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <span>
#include <string>

#include "gfd/gfd.hpp"

namespace gfd::detail {
namespace {

// Sets (or clears) one variable for the scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) saved_ = v;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (saved_)
      ::setenv(name_, saved_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> saved_;
};

constexpr const char* kVar = "GFD_ENV_TEST_FLAG";

TEST(EnvFlag, UnsetGivesTheFallback) {
  ScopedEnv e(kVar, nullptr);
  EXPECT_TRUE(env_flag(kVar, true));
  EXPECT_FALSE(env_flag(kVar, false));
}

TEST(EnvFlag, AcceptsExactlyWhatTheOptionBooleansAccept) {
  for (const char* v : {"1", "true", "on"}) {
    ScopedEnv e(kVar, v);
    EXPECT_TRUE(env_flag(kVar, false)) << v;
  }
  for (const char* v : {"0", "false", "off"}) {
    ScopedEnv e(kVar, v);
    EXPECT_FALSE(env_flag(kVar, true)) << v;
  }
}

TEST(EnvFlag, AnythingElseThrowsNamingTheVariable) {
  for (const char* v : {"", "yes", "TRUE", "2", " 1", "1 ", "onn"}) {
    ScopedEnv e(kVar, v);
    try {
      (void)env_flag(kVar, false);
      ADD_FAILURE() << "accepted '" << v << "'";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
      const std::string msg = err.what();
      EXPECT_NE(msg.find(kVar), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("'") + v + "'"), std::string::npos) << msg;
    }
  }
}

std::string logged(const char* quiet) {
  ScopedEnv e("GFD_QUIET", quiet);
  ::testing::internal::CaptureStderr();
  log_info("hello from the test");
  return ::testing::internal::GetCapturedStderr();
}

TEST(LogInfo, WritesOneLineUnlessQuiet) {
  EXPECT_EQ(logged(nullptr), "gfd: hello from the test\n");
  for (const char* v : {"0", "false", "off"})
    EXPECT_EQ(logged(v), "gfd: hello from the test\n") << v;
  for (const char* v : {"1", "true", "on"}) EXPECT_EQ(logged(v), "") << v;
}

TEST(LogInfo, AMalformedQuietDoesNotSilenceAndSaysSo) {
  const std::string out = logged("yes");
  EXPECT_EQ(out.rfind("gfd: hello from the test", 0), 0u) << out;
  EXPECT_NE(out.find("GFD_QUIET='yes'"), std::string::npos) << out;
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1) << "one line: " << out;
}

// The environment is read only through EngineOptions::from_env(): a malformed GFD_* value does
// not matter to a group made with the default options (from_env() would throw).
TEST(EngineGroupDefault, DoesNotReadTheEnvironment) {
  ScopedEnv e("GFD_STAGING_BYTES", "not-a-size");
  EXPECT_THROW((void)EngineOptions::from_env(), Error);
  EXPECT_NO_THROW({
    EngineGroup group(std::span<const int>{});
    EXPECT_EQ(group.size(), 0u);
  });
}

// Engine(int) uses the default options (EngineOptions::from_env() is the way to the
// environment): a malformed GFD_* value is not an invalid argument to it (without a GPU the
// engine fails with kNoDevice instead; with one it is created).
TEST(EngineByOrdinal, DoesNotReadTheEnvironment) {
  ScopedEnv e("GFD_STAGING_BYTES", "not-a-size");
  try {
    Engine engine(0);
  } catch (const Error& err) {
    EXPECT_NE(err.code(), ErrorCode::kInvalidArgument) << err.what();
  }
}

}  // namespace
}  // namespace gfd::detail
