/// @file test_logging.cpp
/// @brief The `pmap` spdlog logger (SPEC 4): PMAP_LOG_LEVEL, a user-installed logger,
/// one debug line per dispatch, silence when the level is above debug.

#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "test_util.hpp"

namespace {

using namespace pmap_test;

using F1 = Eigen::Tensor<float, 1, RowMajor>;
using F2 = Eigen::Tensor<float, 2, RowMajor>;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream s(text);
  for (std::string line; std::getline(s, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

/// Installs a logger named "pmap" writing "%v" lines into a string, restoring the default
/// logger on destruction. Not registered with spdlog, so the default stays findable.
class CapturedLogger {
 public:
  explicit CapturedLogger(spdlog::level::level_enum level) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_);
    logger_ = std::make_shared<spdlog::logger>("pmap", sink);
    logger_->set_pattern("%v");
    logger_->set_level(level);
    logger_->flush_on(spdlog::level::trace);
    pmap::set_logger(logger_);
  }
  ~CapturedLogger() { pmap::set_logger(nullptr); }
  CapturedLogger(const CapturedLogger&) = delete;
  CapturedLogger& operator=(const CapturedLogger&) = delete;

  std::vector<std::string> lines() {
    logger_->flush();
    return lines_of(stream_.str());
  }
  const std::shared_ptr<spdlog::logger>& get() const { return logger_; }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::logger> logger_;
};

spdlog::level::level_enum env_level() {
  const char* env = std::getenv("PMAP_LOG_LEVEL");
  return env && *env ? spdlog::level::from_str(env) : spdlog::level::warn;
}

// ---- the default logger ------------------------------------------------------------------

TEST(Logger, NamedPmapAndRegistered) {
  auto l = pmap::logger();
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->name(), "pmap");
  EXPECT_EQ(spdlog::get("pmap"), l);
  EXPECT_EQ(pmap::logger(), l);
}

TEST(Logger, LevelFromEnvironmentOrWarn) {
  EXPECT_EQ(pmap::logger()->level(), env_level());
}

TEST(Logger, SetLoggerReplacesAndNullRestores) {
  auto before = pmap::logger();
  {
    CapturedLogger captured(spdlog::level::debug);
    EXPECT_EQ(pmap::logger(), captured.get());
  }
  EXPECT_EQ(pmap::logger(), before);
}

// ---- dispatch lines ----------------------------------------------------------------------

class Logging : public RuntimeTest {};
PMAP_TEST_INSTANTIATE(Logging);

TEST_P(Logging, OneDebugLinePerDispatch) {
  CapturedLogger captured(spdlog::level::debug);
  pmap::Options o = opts();
  o.name = "my_kernel";
  auto f = pmap::pmap([](auto v, auto w) { return v * 2.f + w; }, o);
  F2 x = make<F2>(1, n(), 3);
  F2 y = make<F2>(2, n(), 3);
  for (int k = 0; k < 3; ++k) (void)f(x, y);
  const auto lines = captured.lines();
  ASSERT_EQ(lines.size(), 3u);
  for (const std::string& line : lines) {
    EXPECT_NE(line.find("my_kernel"), std::string::npos) << line;
    EXPECT_NE(line.find(std::to_string(n())), std::string::npos) << line;
    EXPECT_NE(line.find("us"), std::string::npos) << line;
  }
}

TEST_P(Logging, DispatchLineNamesTheAxisSize) {
  CapturedLogger captured(spdlog::level::debug);
  auto f = pmap::pmap([](auto v) { return v(); }, opts());
  F1 x = make<F1>(1, n());
  (void)f(x);
  const auto lines = captured.lines();
  ASSERT_EQ(lines.size(), 1u);
  // The library's format is "{name}: axis_size={n} ... took {t} us"; keep the check loose.
  EXPECT_NE(lines[0].find("pmap"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("axis_size=" + std::to_string(n())), std::string::npos) << lines[0];
}

TEST_P(Logging, TraceLevelAlsoLogsDispatches) {
  CapturedLogger captured(spdlog::level::trace);
  auto f = pmap::pmap([](auto v) { return v(); }, opts());
  F1 x = make<F1>(1, n());
  for (int k = 0; k < 4; ++k) (void)f(x);
  EXPECT_EQ(captured.lines().size(), 4u);
}

TEST_P(Logging, SilentAboveDebug) {
  for (auto level : {spdlog::level::info, spdlog::level::warn, spdlog::level::off}) {
    CapturedLogger captured(level);
    auto f = pmap::pmap([](auto v) { return v * 2.f; }, opts());
    F2 x = make<F2>(1, n(), 2);
    for (int k = 0; k < 10; ++k) (void)f(x);
    EXPECT_TRUE(captured.lines().empty()) << "level " << static_cast<int>(level);
  }
}

TEST_P(Logging, LevelChangeTakesEffectWithoutReinstalling) {
  CapturedLogger captured(spdlog::level::off);
  auto f = pmap::pmap([](auto v) { return v(); }, opts());
  F1 x = make<F1>(1, n());
  (void)f(x);
  captured.get()->set_level(spdlog::level::debug);
  (void)f(x);
  (void)f(x);
  captured.get()->set_level(spdlog::level::err);
  (void)f(x);
  EXPECT_EQ(captured.lines().size(), 2u);
}

TEST_P(Logging, FailedValidationLogsNoDispatch) {
  CapturedLogger captured(spdlog::level::debug);
  auto f = pmap::pmap([](auto v, auto w) { return v() + w(); }, opts());
  F1 a = make<F1>(1, n());
  F1 b = make<F1>(1, n() + 1);
  (void)catch_message<pmap::ValueError>([&] { (void)f(a, b); });
  for (const std::string& line : captured.lines()) EXPECT_EQ(line.find("took"), std::string::npos) << line;
}

// ---- PMAP_LOG_LEVEL and a pre-registered logger, in a child process ----------------------
// The default logger is created once per process, so the environment is exercised by
// re-running this binary with one child test selected.

std::string self_path() {
  std::array<char, PATH_MAX> buf{};
  const ssize_t len = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (len <= 0) return {};
  return std::string(buf.data(), static_cast<std::size_t>(len));
}

/// Runs this binary with `env` prepended and one child test; returns its output.
std::string run_child(const std::string& env, const std::string& test) {
  const std::string cmd = "env " + env + " '" + self_path() + "' --gtest_filter=" + test + " 2>&1";
  std::string out;
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    std::array<char, 512> chunk{};
    while (std::fgets(chunk.data(), static_cast<int>(chunk.size()), p)) out += chunk.data();
    const int status = ::pclose(p);
    if (status != 0) out += "\n<child exit status " + std::to_string(status) + ">";
  }
  return out;
}

bool child_passed(const std::string& out) {
  return out.find("[  PASSED  ] 1 test") != std::string::npos &&
         out.find("SKIPPED") == std::string::npos && out.find("<child exit") == std::string::npos;
}

/// Child: the default logger's level equals $PMAP_TEST_EXPECT_LEVEL.
TEST(LoggingChild, LevelFromEnvironment) {
  const char* expect = std::getenv("PMAP_TEST_EXPECT_LEVEL");
  if (!expect) GTEST_SKIP() << "run by LoggingEnvironment tests only";
  EXPECT_EQ(pmap::logger()->level(), spdlog::level::from_str(expect));
  EXPECT_EQ(pmap::logger()->name(), "pmap");
}

/// Child: a logger registered as "pmap" before pmap's first use is used as is.
TEST(LoggingChild, PreRegisteredLoggerIsUsed) {
  if (!std::getenv("PMAP_TEST_PREREGISTER")) GTEST_SKIP() << "run by LoggingEnvironment tests only";
  std::ostringstream stream;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(stream);
  auto mine = std::make_shared<spdlog::logger>("pmap", sink);
  mine->set_pattern("%v");
  mine->set_level(spdlog::level::debug);
  spdlog::register_logger(mine);
  pmap::Runtime rt({.num_devices = 2, .num_threads = 1});
  EXPECT_EQ(pmap::logger(), mine);
  auto f = pmap::pmap([](auto v) { return v(); }, on(rt, "prereg"));
  F1 x = make<F1>(1, 2);
  (void)f(x);
  mine->flush();
  const auto lines = lines_of(stream.str());
  ASSERT_EQ(lines.size(), 1u) << stream.str();
  EXPECT_NE(lines[0].find("prereg"), std::string::npos) << lines[0];
}

TEST(LoggingEnvironment, LevelsFromPmapLogLevel) {
  for (const char* level : {"trace", "debug", "info", "warn", "error", "off"}) {
    const std::string out = run_child(std::string("PMAP_LOG_LEVEL=") + level + " PMAP_TEST_EXPECT_LEVEL=" + level,
                                      "LoggingChild.LevelFromEnvironment");
    EXPECT_TRUE(child_passed(out)) << "PMAP_LOG_LEVEL=" << level << "\n" << out;
  }
}

TEST(LoggingEnvironment, DefaultLevelIsWarn) {
  const std::string out =
      run_child("-u PMAP_LOG_LEVEL PMAP_TEST_EXPECT_LEVEL=warn", "LoggingChild.LevelFromEnvironment");
  EXPECT_TRUE(child_passed(out)) << out;
}

TEST(LoggingEnvironment, PreRegisteredLogger) {
  const std::string out = run_child("PMAP_TEST_PREREGISTER=1", "LoggingChild.PreRegisteredLoggerIsUsed");
  EXPECT_TRUE(child_passed(out)) << out;
}

TEST(LoggingEnvironment, DebugLevelLogsDispatchesToTheDefaultLogger) {
  // The default logger writes to stderr; the child's output carries the dispatch line.
  const std::string out = run_child("PMAP_LOG_LEVEL=debug PMAP_TEST_CHILD_DISPATCH=1",
                                    "LoggingChild.DispatchOnDefaultLogger");
  EXPECT_TRUE(child_passed(out)) << out;
  EXPECT_NE(out.find("child_dispatch"), std::string::npos) << out;
  EXPECT_NE(out.find("axis_size=2"), std::string::npos) << out;
}

/// Child: one dispatch on the default logger.
TEST(LoggingChild, DispatchOnDefaultLogger) {
  if (!std::getenv("PMAP_TEST_CHILD_DISPATCH")) GTEST_SKIP() << "run by LoggingEnvironment tests only";
  pmap::Runtime rt({.num_devices = 2, .num_threads = 2});
  auto f = pmap::pmap([](auto v) { return v(); }, on(rt, "child_dispatch"));
  F1 x = make<F1>(1, 2);
  (void)f(x);
  pmap::logger()->flush();
}

}  // namespace
