// The Prometheus text exposition the node's /metrics serves. Where Debian's
// prometheus package provides promtool, its `check metrics` linter reads the
// output too.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "troupe/node/metrics.hpp"

namespace {

using troupe::node::Labels;
using troupe::node::Metrics;
using troupe::node::MetricsWriter;

// promtool's verdict on `text`: "" if clean, its complaints otherwise;
// nullopt without promtool.
std::optional<std::string> promtool_check(const std::string& text) {
  if (::access("/usr/bin/promtool", X_OK) != 0) return std::nullopt;
  auto dir = std::filesystem::temp_directory_path();
  auto in = dir / ("troupe-metrics-" + std::to_string(::getpid()) + ".txt");
  auto out = dir / ("troupe-metrics-" + std::to_string(::getpid()) + ".out");
  std::ofstream(in) << text;
  std::string cmd = "/usr/bin/promtool check metrics < " + in.string() + " > " + out.string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ostringstream read;
  read << std::ifstream(out).rdbuf();
  std::string said = read.str();
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  if (rc != 0 && said.empty()) said = "promtool exited with " + std::to_string(rc);
  return rc == 0 ? std::string() : said;
}

TEST(Metrics, FamiliesAppearOnceWithHelpAndTypeEvenWhenTwoCollectorsAddToOne) {
  Metrics m;
  m.add_collector([](MetricsWriter& w) {
    w.gauge("troupe_entities_active", "Entities in memory, per type.").set({{"type", "payment"}}, 3);
  });
  m.add_collector([](MetricsWriter& w) {
    w.gauge("troupe_entities_active", "Entities in memory, per type.").set({{"type", "account"}}, 4);
  });
  auto text = m.scrape();
  EXPECT_NE(text.find("# HELP troupe_entities_active Entities in memory, per type.\n"
                      "# TYPE troupe_entities_active gauge\n"
                      "troupe_entities_active{type=\"payment\"} 3\n"
                      "troupe_entities_active{type=\"account\"} 4\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("# TYPE troupe_entities_active"), text.rfind("# TYPE troupe_entities_active"));
}

TEST(Metrics, LabelValuesAndHelpAreEscaped) {
  MetricsWriter w;
  w.counter("odd_total", "Help with \\ and\nnewline.").set({{"id", "a\"b\\c\nd"}}, 1);
  EXPECT_EQ(w.text(),
            "# HELP odd_total Help with \\\\ and\\nnewline.\n"
            "# TYPE odd_total counter\n"
            "odd_total{id=\"a\\\"b\\\\c\\nd\"} 1\n");
}

TEST(Metrics, CountersAndHistogramsCountFromAnyThreadAndRenderCumulativeBuckets) {
  Metrics m;
  auto c = m.counter("payments_total", "Payments finished, by outcome.", {"outcome"});
  auto h = m.histogram("settle_seconds", "Settlement latency.", {0.001, 0.01, 0.1});
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        c->add({"completed"});
        h->observe_seconds(0.005);
      }
    });
  for (auto& t : ts) t.join();
  c->add({"failed"}, 2);
  h->observe_seconds(0.5);
  EXPECT_EQ(c->value({"completed"}), 4000u);
  auto text = m.scrape();
  EXPECT_NE(text.find("payments_total{outcome=\"completed\"} 4000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("payments_total{outcome=\"failed\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("settle_seconds_bucket{le=\"0.001\"} 0\n"
                      "settle_seconds_bucket{le=\"0.01\"} 4000\n"
                      "settle_seconds_bucket{le=\"0.1\"} 4000\n"
                      "settle_seconds_bucket{le=\"+Inf\"} 4001\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("settle_seconds_count 4001\n"), std::string::npos);
  EXPECT_NE(text.find("settle_seconds_sum 20.5\n"), std::string::npos);
}

TEST(Metrics, BadNamesAndATypeClashAreProgrammingErrorsFoundAtOnce) {
  Metrics m;
  EXPECT_THROW(m.counter("9lives", "x"), std::invalid_argument);
  EXPECT_THROW(m.counter("ok_total", "x", {"bad-label"}), std::invalid_argument);
  EXPECT_THROW(m.histogram("h", "x", {0.1, 0.1}), std::invalid_argument);
  MetricsWriter w;
  w.counter("x_total", "x");
  EXPECT_THROW(w.gauge("x_total", "x"), std::invalid_argument);
}

TEST(Metrics, ACollectorThatThrowsCostsOnlyItsOwnSamples) {
  Metrics m;
  m.add_collector([](MetricsWriter& w) {
    w.gauge("half_written", "x").set({}, 1);
    throw std::runtime_error("broken");
  });
  m.add_collector([](MetricsWriter& w) { w.gauge("fine", "x").set({}, 2); });
  auto text = m.scrape();
  EXPECT_EQ(text.find("half_written"), std::string::npos) << text;
  EXPECT_NE(text.find("fine 2\n"), std::string::npos);
  EXPECT_NE(text.find("troupe_metrics_collector_failures_total 1\n"), std::string::npos);
}

TEST(Metrics, TheExpositionPassesPromtoolCheckMetrics) {
  Metrics m;
  auto c = m.counter("troupe_payments_total", "Payments finished, by outcome.", {"outcome"});
  c->add({"completed"}, 5);
  auto h = m.histogram("troupe_payment_seconds", "End-to-end payment latency.");
  h->observe_seconds(0.003);
  m.add_collector([](MetricsWriter& w) {
    w.gauge("troupe_mailbox_depth", "User messages waiting in mailboxes.").set({{"node", "n1"}}, 7);
    w.counter("troupe_messages_processed_total", "User messages taken from mailboxes.").set({{"node", "n1"}}, 1e6);
  });
  auto verdict = promtool_check(m.scrape());
  if (!verdict) GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  EXPECT_EQ(*verdict, "") << m.scrape();
}

}  // namespace
