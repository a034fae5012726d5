// Self-fencing: a node whose heartbeats stop succeeding stops everything
// before any other node may take its units over, and when Redis answers
// again it registers anew and runs only what Redis gives it.

#include <gtest/gtest.h>

#include <thread>

#include "coordinator_test_support.hpp"
#include "tcp_test_proxy.hpp"

namespace troupe::test {
namespace {

using cluster::DesiredSet;

DesiredSet units(int n) {
  DesiredSet d;
  for (int i = 0; i < n; ++i) d.emplace("w" + std::to_string(i), "");
  return d;
}

Clock::time_point first_start_on(const Fleet& f, const std::string& unit, const std::string& node) {
  for (const auto& e : f.events())
    if (e.kind == "start" && e.unit == unit && e.node == node) return e.at;
  return Clock::time_point::max();
}

// Node-a loses Redis (a partition: its connections go silent) while node-b
// keeps it.
// proves: W2, W7
TEST_F(RedisCoordinatorTest, ANodeCutOffFromRedisFencesBeforeAPeerCanTakeOverAndResumesWithWhatRedisGivesIt) {
  TcpTestProxy proxy(redis->port());
  auto& a = start_node(make_node(settings("node-a", proxy.port())));
  auto& b = add_node("node-b");
  ASSERT_TRUE(await(b->sync("workers", [] { return Result<DesiredSet>(units(6)); })).ok());
  ASSERT_TRUE(
      wait_until([&] { return a.rec->running_now().size() == 3 && b.rec->running_now().size() == 3; }));
  auto a_units = a.rec->running_now();
  std::this_thread::sleep_for(1600ms);  // node-b registered for threshold + margin: it may take over

  auto cut_at = Clock::now();
  proxy.cut();
  // Fenced within the threshold of its last successful heartbeat, and every
  // unit stopped.
  ASSERT_TRUE(wait_until([&] { return a->is_fenced(); }, 5s));
  EXPECT_LE(a.rec->fenced_time() - cut_at, 1000ms + 600ms);  // the threshold, plus a loaded machine
  EXPECT_TRUE(a.rec->running_now().empty());
  EXPECT_TRUE(a->running("workers").empty());
  // node-b takes a's units, each exactly once, and only after a fenced.
  ASSERT_TRUE(wait_until([&] { return b.rec->running_now().size() == 6; }, 10s));
  for (const auto& [unit, epoch] : a_units) {
    EXPECT_EQ(fleet.starts(unit, "node-b"), 1u) << unit;
    EXPECT_LT(a.rec->fenced_time(), first_start_on(fleet, unit, "node-b")) << unit;
    EXPECT_GE(first_start_on(fleet, unit, "node-b") - a.rec->fenced_time(), 300ms)
        << "the margin was eaten: " << unit;
    EXPECT_GT(b.rec->running_now().at(unit), epoch);
  }
  // Calls on the cut-off node fail as values, promptly.
  auto during = await(a->assign("workers", "x", ""), 5s);
  ASSERT_FALSE(during.ok());
  EXPECT_EQ(during.error().code(), ErrorCode::coordination_failed);

  proxy.heal();
  ASSERT_TRUE(wait_until([&] { return !a->is_fenced(); }, 10s));
  EXPECT_EQ(a.rec->unfenced_count(), 1);
  // Redis gives it nothing now; it runs nothing.
  auto owned = await(a->owned_units("workers"));
  ASSERT_TRUE(owned.ok());
  EXPECT_TRUE(owned->empty());
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(a.rec->running_now().empty());
  // A rebalance hands it three back; it runs exactly those, with new epochs.
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 2; }));
  auto moves = await(b->rebalance_all("workers"));
  ASSERT_TRUE(moves.ok());
  EXPECT_EQ(moves->size(), 3u);
  ASSERT_TRUE(
      wait_until([&] { return a.rec->running_now().size() == 3 && b.rec->running_now().size() == 3; }));
  auto owned_after = await(a->owned_units("workers"));
  ASSERT_TRUE(owned_after.ok());
  std::map<std::string, std::uint64_t> given;
  for (const auto& x : *owned_after) given.emplace(x.unit, x.epoch);
  EXPECT_EQ(a.rec->running_now(), given);
}

// Redis itself goes away for about ten seconds, with the default ratio of
// heartbeat : threshold : margin (1 : 5 : 1, here 200 ms : 1 s : 200 ms).
// Every node fences; one node's coordinator is destroyed meanwhile, in this
// process, without leaving (as a crash looks to Redis). When Redis returns
// the others come back with their own units (nobody takes a survivor's
// units: a node takes over only after being registered for threshold +
// margin), and the destroyed node's units move to a live node exactly once.
// proves: W2, W7
TEST_F(RedisCoordinatorTest, RedisStoppedForTenSecondsFencesEveryNodeAndMovesOnlyTheUnitsOfANodeDestroyedMeanwhile) {
  auto ratio = [&](const std::string& id) {
    auto s = settings(id);
    s.heartbeat_interval = 200ms;
    s.liveness_threshold = 1000ms;
    s.takeover_margin = 200ms;
    s.command_timeout = 500ms;
    s.reconnect_max_backoff = 500ms;
    return s;
  };
  auto& a = start_node(make_node(ratio("node-a")));
  auto& b = start_node(make_node(ratio("node-b")));
  auto& c = start_node(make_node(ratio("node-c")));
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(units(12)); })).ok());
  ASSERT_TRUE(wait_until([&] {
    return a.rec->running_now().size() == 4 && b.rec->running_now().size() == 4 &&
           c.rec->running_now().size() == 4;
  }));
  auto a_units = a.rec->running_now(), b_units = b.rec->running_now(), c_units = c.rec->running_now();

  auto stopped_at = Clock::now();
  redis->stop();
  ASSERT_TRUE(wait_until([&] { return a->is_fenced() && b->is_fenced() && c->is_fenced(); }, 5s));
  for (auto* n : {&a, &b, &c}) {
    EXPECT_LE(n->rec->fenced_time() - stopped_at, 1000ms + 600ms) << n->id;
    EXPECT_TRUE(n->rec->running_now().empty()) << n->id;
  }
  std::this_thread::sleep_for(2s);
  crash(c);
  std::this_thread::sleep_for(10s - (Clock::now() - stopped_at));
  auto restarted_at = Clock::now();
  redis->start();

  ASSERT_TRUE(wait_until([&] { return !a->is_fenced() && !b->is_fenced(); }, 10s));
  // Survivors run their own units again, under the same epochs: nothing moved.
  ASSERT_TRUE(
      wait_until([&] { return a.rec->running_now().size() >= 4 && b.rec->running_now().size() >= 4; }));
  for (const auto& [unit, epoch] : a_units) EXPECT_EQ(a.rec->running_now().at(unit), epoch) << unit;
  for (const auto& [unit, epoch] : b_units) EXPECT_EQ(b.rec->running_now().at(unit), epoch) << unit;
  // The destroyed node's units: once each, on a or b, after the survivors had
  // been registered again for threshold + margin.
  ASSERT_TRUE(
      wait_until([&] { return a.rec->running_now().size() + b.rec->running_now().size() == 12; }, 10s));
  for (const auto& [unit, epoch] : c_units) {
    auto on_a = fleet.starts(unit, "node-a"), on_b = fleet.starts(unit, "node-b");
    EXPECT_EQ(on_a + on_b, 1u) << unit;
    auto at = std::min(first_start_on(fleet, unit, "node-a"), first_start_on(fleet, unit, "node-b"));
    EXPECT_GE(at - restarted_at, 1200ms - 100ms) << unit;
    auto owner = on_a ? a.rec->running_now() : b.rec->running_now();
    EXPECT_GT(owner.at(unit), epoch) << unit;
  }
  for (const auto& [unit, epoch] : a_units) EXPECT_EQ(fleet.starts(unit), 2u) << unit;  // before and after
  EXPECT_EQ(a.rec->fenced_count(), 1);
  EXPECT_EQ(a.rec->unfenced_count(), 1);
}

// proves: W2
TEST_F(RedisCoordinatorTest, AGracefulStopHandsEveryUnitOverAndLeaves) {
  auto& a = add_node("node-a", {"workers"}, 200ms);
  auto& b = add_node("node-b");
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(units(6)); })).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() == 3; }));
  auto t0 = Clock::now();
  ASSERT_TRUE(await(a->stop()).ok());
  auto stopped = Clock::now();
  EXPECT_GE(stopped - t0, 190ms);  // it waited for the graceful stops
  EXPECT_TRUE(a.rec->running_now().empty());
  ASSERT_TRUE(wait_until([&] { return b.rec->running_now().size() == 6; }, 3s));
  // At once, not after threshold + margin (1.5 s) as for a crashed node.
  EXPECT_LE(Clock::now() - stopped, 1000ms);
  auto c = client();
  EXPECT_EQ(c->cmd({"ZSCORE", keys.members(), "node-a"}).type, cluster::detail::RedisReply::Type::nil);
  auto late = await(a->assign("workers", "x", ""));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code(), ErrorCode::shutting_down);
}

}  // namespace
}  // namespace troupe::test
