// The logging facade: levels per component, text and JSON lines, the
// current trace id on every line (SPEC X2, X4), a file destination, and a
// disabled level that builds nothing.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/core/log.hpp"
#include "troupe/core/trace.hpp"

namespace {

namespace log = troupe::log;
using log::Component;
using log::Level;

// Captures the lines for one test and puts the default configuration back.
class LogTest : public ::testing::Test {
 protected:
  void use(log::Config c) {
    c.sink = [this](std::string_view line) {
      std::lock_guard lk(mu_);
      lines_.emplace_back(line);
    };
    ASSERT_TRUE(log::configure(c).ok());
  }
  std::vector<std::string> lines() {
    std::lock_guard lk(mu_);
    return lines_;
  }
  void TearDown() override { ASSERT_TRUE(log::configure(log::Config{}).ok()); }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

TEST_F(LogTest, EachComponentHasItsOwnLevel) {
  use({.level = Level::warn, .levels = {{Component::cluster, Level::debug}}});
  EXPECT_TRUE(log::enabled(Component::cluster, Level::debug));
  EXPECT_FALSE(log::enabled(Component::cluster, Level::trace));
  EXPECT_FALSE(log::enabled(Component::persist, Level::info));
  EXPECT_TRUE(log::enabled(Component::persist, Level::warn));
  log::debug(Component::cluster, "kept");
  log::info(Component::persist, "dropped");
  log::error(Component::persist, "kept too");
  auto l = lines();
  ASSERT_EQ(l.size(), 2u);
  EXPECT_NE(l[0].find("debug cluster kept"), std::string::npos) << l[0];
  EXPECT_NE(l[1].find("error persist kept too"), std::string::npos) << l[1];
}

TEST_F(LogTest, ADisabledLevelDoesNotBuildTheMessage) {
  use({.level = Level::info});
  int built = 0;
  auto expensive = [&] {
    ++built;
    return std::string("expensive");
  };
  TROUPE_LOG(Component::core, Level::debug, expensive());
  EXPECT_EQ(built, 0);
  TROUPE_LOG(Component::core, Level::info, expensive(), {{"n", 1}});
  EXPECT_EQ(built, 1);
  EXPECT_EQ(lines().size(), 1u);
}

// proves: X4
TEST_F(LogTest, JsonLinesCarryTheFieldsAndTheCurrentTraceId) {
  use({.level = Level::info, .format = log::Format::json, .fields = {{"node", "pay-1"}}});
  auto ctx = troupe::TraceContext::generate();
  log::info(Component::app, "no trace yet", {{"n", -3}});
  {
    troupe::TraceScope scope(ctx);
    log::warn(Component::persist, "say \"hi\"\n", {{"entity", std::string("payment|p1")}, {"after_ms", 1500u},
                                                    {"ok", true}, {"ratio", 0.5}, {"msg", "clash"}});
  }
  auto l = lines();
  ASSERT_EQ(l.size(), 2u);
  auto a = nlohmann::json::parse(l[0]);
  EXPECT_EQ(a["msg"], "no trace yet");
  EXPECT_EQ(a["n"], -3);
  EXPECT_FALSE(a.contains("trace_id"));
  EXPECT_EQ(a["node"], "pay-1");
  auto b = nlohmann::json::parse(l[1]);
  EXPECT_EQ(b["level"], "warn");
  EXPECT_EQ(b["component"], "persist");
  EXPECT_EQ(b["msg"], "say \"hi\"\n");
  EXPECT_EQ(b["trace_id"], ctx.trace_id.hex());
  EXPECT_EQ(b["entity"], "payment|p1");
  EXPECT_EQ(b["after_ms"], 1500);
  EXPECT_EQ(b["ok"], true);
  EXPECT_EQ(b["ratio"], 0.5);
  EXPECT_EQ(b["_msg"], "clash") << "a field never overwrites the line's own keys";
  EXPECT_EQ(b["node"], "pay-1");
  EXPECT_TRUE(b["ts"].get<std::string>().ends_with("Z"));
}

// proves: X4
TEST_F(LogTest, TextLinesShowTheTraceIdAndQuoteValuesWithSpaces) {
  use({.level = Level::info});
  auto ctx = troupe::TraceContext::generate();
  troupe::TraceScope scope(ctx);
  log::info(Component::node, "drained", {{"why", "asked to"}, {"ms", 12}});
  auto l = lines();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_NE(l[0].find("info  node [" + ctx.trace_id.hex() + "] drained why=\"asked to\" ms=12"), std::string::npos)
      << l[0];
}

TEST_F(LogTest, LinesGoToTheConfiguredFile) {
  auto path = std::filesystem::temp_directory_path() / ("troupe-log-test-" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(path);
  ASSERT_TRUE(log::configure({.level = Level::info, .format = log::Format::json, .file = path.string()}).ok());
  log::info(Component::core, "to the file");
  ASSERT_TRUE(log::configure(log::Config{}).ok());  // closes it
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  EXPECT_EQ(nlohmann::json::parse(line)["msg"], "to the file");
  std::filesystem::remove(path);
}

TEST_F(LogTest, AFileThatCannotBeOpenedIsAnErrorAndKeepsThePreviousSettings) {
  use({.level = Level::debug});
  // A directory: spdlog would create missing parent directories, but it
  // cannot append to a directory.
  auto r = log::configure({.level = Level::error, .file = std::filesystem::temp_directory_path().string()});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), troupe::ErrorCode::invalid_argument);
  EXPECT_TRUE(log::enabled(Component::core, Level::debug));
}

TEST(LogNamesTest, LevelsAndComponentsParse) {
  EXPECT_EQ(log::parse_level("warning"), Level::warn);
  EXPECT_EQ(log::parse_level("off"), Level::off);
  EXPECT_FALSE(log::parse_level("loud"));
  EXPECT_EQ(log::parse_component("cluster"), Component::cluster);
  EXPECT_FALSE(log::parse_component("Cluster"));
  for (std::size_t i = 0; i < log::kComponents; ++i) {
    auto c = static_cast<Component>(i);
    EXPECT_EQ(log::parse_component(log::to_string(c)), c);
  }
}

}  // namespace
