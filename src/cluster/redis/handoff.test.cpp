// Hand-off for graceful moves: a unit moved away from an owner that may
// still run it starts on its new owner only after the old owner stopped and
// released it, or once the old owner is past threshold + margin.

#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "coordinator_test_support.hpp"
#include "tcp_test_proxy.hpp"

namespace troupe::test {
namespace {

using cluster::PlacementOutcome;

Clock::time_point first_event(const Fleet& f, const std::string& kind, const std::string& unit,
                              const std::string& node) {
  for (const auto& e : f.events())
    if (e.kind == kind && e.unit == unit && e.node == node) return e.at;
  return Clock::time_point::max();
}

// proves: W4
TEST_F(RedisCoordinatorTest, AMovedUnitStartsOnItsNewOwnerOnlyAfterTheOldOwnerStoppedAndReleasedIt) {
  // node-a takes 400 ms to stop a unit gracefully.
  auto& a = add_node("node-a", {"workers"}, 400ms);
  auto placed = await(a->assign("workers", "w1", "cfg"));
  ASSERT_TRUE(placed.ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }));
  auto& b = add_node("node-b");
  auto moved = await(b->relocate("workers", "w1", true));
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  EXPECT_EQ(moved->assignment.owner, "node-b");
  EXPECT_EQ(moved->assignment.handing_off_from, "node-a");
  EXPECT_EQ(moved->assignment.handoff_epoch, placed->assignment.epoch);
  EXPECT_GT(moved->assignment.epoch, placed->assignment.epoch);
  // While node-a is stopping it, node-b sees it as its own but waits.
  auto owned = await(b->owned_units("workers"));
  ASSERT_TRUE(owned.ok());
  ASSERT_EQ(owned->size(), 1u);
  EXPECT_EQ((*owned)[0].handing_off_from, "node-a");
  ASSERT_TRUE(wait_until([&] { return b.rec->running_now().count("w1") == 1; }));
  EXPECT_EQ(b.rec->running_now().at("w1"), moved->assignment.epoch);
  auto stopped_on_a = first_event(fleet, "stopped", "w1", "node-a");
  auto started_on_b = first_event(fleet, "start", "w1", "node-b");
  EXPECT_LT(stopped_on_a, started_on_b);
  EXPECT_GE(started_on_b - first_event(fleet, "stop-begin", "w1", "node-a"), 380ms);
  auto l = await(a->assignment("workers", "w1"));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->handing_off_from, "");  // released
  EXPECT_EQ(fleet.starts("w1"), 2u);
}

// proves: W4, W2
TEST_F(RedisCoordinatorTest, AHandedOffUnitStartsOnceItsPreviousOwnerIsPastThresholdPlusMargin) {
  TcpTestProxy proxy(redis->port());
  auto sa = settings("node-a", proxy.port());
  // node-a would take a minute to stop: it never releases in time.
  auto& a = start_node(make_node(sa, {"workers"}, 60000ms));
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }));
  auto& b = add_node("node-b");
  auto moved = await(b->relocate("workers", "w1", true));
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->assignment.handing_off_from, "node-a");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(b.rec->running_now().count("w1"), 0u) << "started while node-a may still run it";
  // Cut node-a off: it fences itself (stopping w1 at once, as on_fenced
  // demands) and its entry ages; past threshold + margin node-b starts w1.
  auto cut_at = Clock::now();
  proxy.cut();
  ASSERT_TRUE(wait_until([&] { return b.rec->running_now().count("w1") == 1; }, 15s));
  EXPECT_GE(Clock::now() - cut_at, 1000ms + 500ms - 200ms);
  EXPECT_TRUE(a.rec->is_fenced_now());
}

// proves: W4
TEST_F(RedisCoordinatorTest, AUnitRemovedAndAddedAgainWaitsForItsOldOwnerToStopIt) {
  auto& a = add_node("node-a", {"workers"}, 500ms);
  auto& b = add_node("node-b");
  // Least loaded, ties to the smaller id: w0 -> a, w1 -> b, w2 -> a.
  for (const char* u : {"w0", "w1", "w2"}) ASSERT_TRUE(await(a->assign("workers", u, "")).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w2") == 1; }));
  ASSERT_TRUE(await(a->unassign("workers", "w2")).ok());    // node-a begins a 500 ms stop
  ASSERT_TRUE(await(a->assign("workers", "w3", "")).ok());  // a: w0 w3, b: w1
  auto again = await(a->assign("workers", "w2", ""));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->assignment.owner, "node-b");
  EXPECT_EQ(again->assignment.handing_off_from, "node-a");
  ASSERT_TRUE(wait_until([&] { return b.rec->running_now().count("w2") == 1; }));
  EXPECT_LT(first_event(fleet, "stopped", "w2", "node-a"), first_event(fleet, "start", "w2", "node-b"));
}

// The most units `node` was stopping at one time.
std::size_t most_stopping_at_once(const Fleet& f, const std::string& node) {
  std::size_t now = 0, most = 0;
  for (const auto& e : f.events()) {
    if (e.node != node) continue;
    if (e.kind == "stop-begin") most = std::max(most, ++now);
    if (e.kind == "stopped" && now > 0) --now;
  }
  return most;
}

bool is_member(TestNode& n, const std::string& id) {
  auto ms = n->members();
  return std::any_of(ms.begin(), ms.end(), [&](const cluster::Member& m) { return m.id == id; });
}

// proves: C2
TEST_F(RedisCoordinatorTest, APlannedHandOffMovesEveryUnitABatchAtATimeAndPlacesNothingMoreOnTheDrainingMember) {
  auto& a = add_node("node-a", {"workers"}, 200ms);
  std::vector<std::string> units;
  for (int i = 0; i < 6; ++i) {
    units.push_back("w" + std::to_string(i));
    ASSERT_TRUE(await(a->assign("workers", units.back(), "")).ok());
  }
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() == 6; }));
  auto& b = add_node("node-b");
  auto& c = add_node("node-c");
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 3; }));

  std::vector<cluster::HandOffReport> told;
  std::mutex told_mu;
  auto began = Clock::now();
  auto report = await(a->hand_off(2, [&](const cluster::HandOffReport& r) {
    std::lock_guard lk(told_mu);
    told.push_back(r);
  }), 20s);
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  EXPECT_EQ(report->units, 6u);
  EXPECT_EQ(report->moved, 6u);
  EXPECT_EQ(report->kept, 0u);
  // Two at a time, each taking 200 ms to stop: three rounds at least.
  EXPECT_EQ(most_stopping_at_once(fleet, "node-a"), 2u);
  EXPECT_GE(Clock::now() - began, 550ms);
  {
    std::lock_guard lk(told_mu);
    ASSERT_FALSE(told.empty());
    EXPECT_LT(told.back().moved, 6u);  // progress while it runs; the report says the end
  }
  EXPECT_TRUE(a.rec->running_now().empty());
  for (const auto& u : units) {
    ASSERT_TRUE(wait_until([&] { return !fleet.runner(u).empty(); })) << u;
    EXPECT_NE(fleet.runner(u), "node-a") << u;
    // The new owner started it only once node-a had stopped it.
    auto started = std::min(first_event(fleet, "start", u, "node-b"), first_event(fleet, "start", u, "node-c"));
    EXPECT_LT(first_event(fleet, "stopped", u, "node-a"), started) << u;
  }
  // Still a member, live and heartbeating, but given nothing new: node-a
  // has the fewest units and would otherwise be chosen.
  EXPECT_TRUE(is_member(b, "node-a"));
  for (int i = 0; i < 4; ++i) {
    auto placed = await(b->assign("workers", "late" + std::to_string(i), ""));
    ASSERT_TRUE(placed.ok()) << placed.error().to_string();
    EXPECT_NE(placed->assignment.owner, "node-a");
  }
  // Nor does a rebalance give it any, though it holds none.
  auto moves = await(b->rebalance_all("workers"));
  ASSERT_TRUE(moves.ok()) << moves.error().to_string();
  for (const auto& m : *moves) EXPECT_NE(m.to, "node-a") << m.unit;
  EXPECT_TRUE(a.rec->running_now().empty());
  // It leaves with nothing left to hand over; a later incarnation of the
  // node is placeable again.
  ASSERT_TRUE(await(a->stop()).ok());
  ASSERT_TRUE(wait_until([&] { return !is_member(b, "node-a"); }));
  auto& again = add_node("node-a");
  ASSERT_TRUE(wait_until([&] { return c->members().size() == 3; }));
  auto placed = await(c->assign("workers", "after", ""));
  ASSERT_TRUE(placed.ok()) << placed.error().to_string();
  EXPECT_EQ(placed->assignment.owner, "node-a");
  ASSERT_TRUE(wait_until([&] { return again.rec->running_now().count("after") == 1; }));
}

// proves: C2
TEST_F(RedisCoordinatorTest, AHandOffWithNoOtherMemberKeepsItsUnitsRunningAndSaysSo) {
  auto& a = add_node("node-a");
  for (const char* u : {"w0", "w1"}) ASSERT_TRUE(await(a->assign("workers", u, "")).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() == 2; }));
  auto report = await(a->hand_off(4), 10s);
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  EXPECT_EQ(report->units, 2u);
  EXPECT_EQ(report->moved, 0u);
  EXPECT_EQ(report->kept, 2u);
  EXPECT_EQ(a.rec->running_now().size(), 2u);
  EXPECT_TRUE(a.rec->log_has("stays on this node: NO_OTHER_ACCEPTABLE_WORKER"));
  auto zero = await(a->hand_off(0));
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code(), ErrorCode::invalid_argument);
}

// proves: C2
TEST_F(RedisCoordinatorTest, AMemberCutOffWhileDrainingIsStillGivenNothingWhenItComesBack) {
  TcpTestProxy proxy(redis->port());
  auto& a = start_node(make_node(settings("node-a", proxy.port())));
  auto& b = add_node("node-b");
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 2; }));
  auto report = await(a->hand_off(4), 10s);
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  std::this_thread::sleep_for(1600ms);  // node-b may take over from now on
  // Two cuts: a short one (node-a fences and registers again under the
  // same session), and one past threshold + margin (node-b takes it over,
  // removing the member and its mark, and node-a registers anew).
  for (auto extra : {0ms, 1500ms}) {
    proxy.cut();
    ASSERT_TRUE(wait_until([&] { return a->is_fenced(); }, 5s));
    ASSERT_TRUE(wait_until([&] { return !is_member(b, "node-a"); }, 10s));
    std::this_thread::sleep_for(extra);
    proxy.heal();
    ASSERT_TRUE(wait_until([&] { return !a->is_fenced() && is_member(b, "node-a"); }, 10s));
    std::this_thread::sleep_for(300ms);  // its mark is written again after the register
    // Both hold no unit: the smaller id, node-a, would be chosen.
    auto placed = await(b->assign("workers", "after-cut-" + std::to_string(extra.count()), ""));
    ASSERT_TRUE(placed.ok()) << placed.error().to_string();
    EXPECT_EQ(placed->assignment.owner, "node-b") << "after a cut of " << extra.count() << " ms more";
    ASSERT_TRUE(await(b->unassign("workers", "after-cut-" + std::to_string(extra.count()))).ok());
  }
}

// A unit moved on before its new owner started it (that owner was still
// waiting for the old one's release) never ran there: moved back to the
// old owner, it waits for nobody and runs there again.
// proves: W4
TEST_F(RedisCoordinatorTest, AUnitMovedBackBeforeItsNewOwnerStartedItRunsAgainOnItsFormerOwner) {
  auto& a = start_node(make_node(settings("node-a"), {"workers"}, 300ms));
  auto& b = add_node("node-b");
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 2; }));
  auto placed = await(b->assign("workers", "w1", ""));
  ASSERT_TRUE(placed.ok()) << placed.error().to_string();
  ASSERT_EQ(placed->assignment.owner, "node-a");
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }));
  auto there = await(a->relocate("workers", "w1", true));
  ASSERT_TRUE(there.ok()) << there.error().to_string();
  ASSERT_EQ(there->assignment.owner, "node-b");
  // node-a is still stopping it (300 ms): node-b waits and has not started it.
  auto back = await(a->relocate("workers", "w1", true));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_EQ(back->assignment.owner, "node-a");
  EXPECT_EQ(back->assignment.handing_off_from, "");
  EXPECT_TRUE(wait_until([&] { return fleet.starts("w1", "node-a") == 2 && a.rec->running_now().count("w1") == 1; }))
      << fleet.starts("w1", "node-a");
  EXPECT_EQ(fleet.starts("w1", "node-b"), 0u);
}

}  // namespace
}  // namespace troupe::test
