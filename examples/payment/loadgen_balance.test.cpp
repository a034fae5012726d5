// Tests of payment_loadgen's balancing bookkeeping (loadgen_balance.hpp):
// the round robin over ready nodes with its waiting requests, and the
// latency windows.

#include "loadgen_balance.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace payment_loadgen {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Routes one request at `now` and returns the node it went to at once.
std::optional<std::size_t> route_now(ReadyRoundRobin& rr, Steady::time_point now) {
  std::optional<std::size_t> got;
  bool called = false;
  rr.route(now, now + seconds(1), [&](std::optional<std::size_t> n) {
    got = n;
    called = true;
  });
  EXPECT_TRUE(called) << "a request with a ready node waits for nothing";
  return got;
}

TEST(ReadyRoundRobin, RequestsGoRoundRobinOverTheReadyNodesOnly) {
  ReadyRoundRobin rr({true, false, true});
  const auto t0 = Steady::now();
  std::vector<std::size_t> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(*route_now(rr, t0));
  EXPECT_EQ(seen, (std::vector<std::size_t>{0, 2, 0, 2, 0, 2}));
}

TEST(ReadyRoundRobin, ANodeTurningNotReadyGetsNoNewRequestsAndOneTurningReadyJoinsTheTurn) {
  ReadyRoundRobin rr({true, true, true});
  const auto t0 = Steady::now();
  EXPECT_EQ(*route_now(rr, t0), 0u);
  rr.set_ready(1, false, t0);
  std::vector<std::size_t> seen;
  for (int i = 0; i < 4; ++i) seen.push_back(*route_now(rr, t0));
  EXPECT_EQ(seen, (std::vector<std::size_t>{2, 0, 2, 0}));
  rr.set_ready(1, true, t0);
  seen.clear();
  for (int i = 0; i < 3; ++i) seen.push_back(*route_now(rr, t0));
  EXPECT_EQ(seen, (std::vector<std::size_t>{1, 2, 0}));
  EXPECT_EQ(rr.turned_not_ready(1), 1u);
  EXPECT_EQ(rr.turned_not_ready(0), 0u);
  rr.set_ready(1, true, t0);  // no change: not counted
  rr.set_ready(2, false, t0);
  rr.set_ready(2, false, t0);
  EXPECT_EQ(rr.turned_not_ready(2), 1u);
  EXPECT_EQ(rr.waits(), 0u);
}

TEST(ReadyRoundRobin, WithNoNodeReadyARequestWaitsAndGoesToTheFirstNodeThatTurnsReady) {
  ReadyRoundRobin rr({false, false});
  const auto t0 = Steady::now();
  std::vector<std::optional<std::size_t>> got;
  for (int i = 0; i < 3; ++i)
    rr.route(t0, t0 + seconds(10), [&](std::optional<std::size_t> n) { got.push_back(n); });
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(rr.waits(), 3u);
  rr.expire(t0 + seconds(5));  // before their deadline: still waiting
  EXPECT_TRUE(got.empty());
  ASSERT_TRUE(rr.next_deadline().has_value());
  EXPECT_EQ(*rr.next_deadline(), t0 + seconds(10));

  rr.set_ready(1, true, t0 + milliseconds(300));
  ASSERT_EQ(got.size(), 3u);
  for (const auto& n : got) EXPECT_EQ(n, std::optional<std::size_t>(1));
  EXPECT_EQ(rr.longest_wait(), milliseconds(300));
  EXPECT_EQ(rr.gave_up(), 0u);
  EXPECT_FALSE(rr.next_deadline().has_value());
}

TEST(ReadyRoundRobin, AWaitingRequestGivesUpAtItsDeadlineAndIsNeverSentLater) {
  ReadyRoundRobin rr({false});
  const auto t0 = Steady::now();
  std::vector<std::optional<std::size_t>> early, late;
  rr.route(t0, t0 + seconds(1), [&](std::optional<std::size_t> n) { early.push_back(n); });
  rr.route(t0, t0 + seconds(3), [&](std::optional<std::size_t> n) { late.push_back(n); });
  rr.expire(t0 + seconds(1));
  ASSERT_EQ(early.size(), 1u);
  EXPECT_FALSE(early[0].has_value());
  EXPECT_TRUE(late.empty());
  rr.set_ready(0, true, t0 + seconds(2));
  EXPECT_EQ(early.size(), 1u) << "a request that gave up is not sent after all";
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0], std::optional<std::size_t>(0));
  EXPECT_EQ(rr.waits(), 2u);
  EXPECT_EQ(rr.gave_up(), 1u);
  EXPECT_EQ(rr.longest_wait(), seconds(2));
}

TEST(ReadyRoundRobin, ACallbackMayRouteAgainAndCloseGivesUpEveryWaitingRequest) {
  ReadyRoundRobin rr({false});
  const auto t0 = Steady::now();
  int given_up = 0;
  // As the load generator does: a request that gave up starts the next one.
  std::function<void(std::optional<std::size_t>)> again = [&](std::optional<std::size_t> n) {
    if (n) return;
    if (++given_up < 3) rr.route(t0, t0 + seconds(1), again);
  };
  rr.route(t0, t0 + seconds(1), again);
  rr.expire(t0 + seconds(1));
  EXPECT_EQ(given_up, 1);
  rr.close();
  EXPECT_EQ(given_up, 2);
  rr.close();
  EXPECT_EQ(given_up, 3);
  EXPECT_EQ(rr.gave_up(), 3u);
}

TEST(WindowLatency, EachWindowHasItsCountExactP99AndMax) {
  WindowLatency w(seconds(10));
  for (std::uint64_t v = 1; v <= 100; ++v) w.record(seconds(3), v * 1000);  // window 0
  for (std::uint64_t v = 1; v <= 200; ++v) w.record(seconds(25), v);        // window 2
  w.record(milliseconds(29999), 7);                                         // window 2 as well
  const auto ws = w.windows(4);
  ASSERT_EQ(ws.size(), 4u);
  EXPECT_EQ(ws[0].index, 0u);
  EXPECT_EQ(ws[0].count, 100u);
  EXPECT_EQ(ws[0].p99_us, 99000u);
  EXPECT_EQ(ws[0].max_us, 100000u);
  EXPECT_EQ(ws[1].count, 0u);
  EXPECT_EQ(ws[1].p99_us, 0u);
  EXPECT_EQ(ws[2].count, 201u);
  EXPECT_EQ(ws[2].p99_us, 198u);  // rank ceil(0.99 * 201) = 199, with 7 there twice
  EXPECT_EQ(ws[2].max_us, 200u);
  EXPECT_EQ(ws[3].index, 3u);
  EXPECT_EQ(ws[3].count, 0u);
  EXPECT_EQ(w.windows(0).size(), 3u) << "0: up to the last window with a value";
  const auto two = w.windows(2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].count, 100u);
  EXPECT_EQ(two[1].count, 201u) << "values past the last window count in it";
  EXPECT_EQ(two[1].max_us, 200u);
  // The whole run: 301 values, rank ceil(297.99) = 298, the 97th of the
  // 100 values of window 0.
  EXPECT_EQ(w.p99_all(), 97000u);
}

TEST(WindowLatency, PercentileIsTheNearestRank) {
  std::vector<std::uint32_t> none;
  EXPECT_EQ(WindowLatency::percentile(none, 99), 0u);
  std::vector<std::uint32_t> one{42};
  EXPECT_EQ(WindowLatency::percentile(one, 99), 42u);
  std::vector<std::uint32_t> v{5, 1, 4, 2, 3};
  EXPECT_EQ(WindowLatency::percentile(v, 99), 5u);
  EXPECT_EQ(WindowLatency::percentile(v, 40), 2u);
  EXPECT_EQ(WindowLatency::percentile(v, 0), 1u);
}

}  // namespace
}  // namespace payment_loadgen
