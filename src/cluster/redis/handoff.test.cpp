// Hand-off for graceful moves: a unit moved away from an owner that may
// still run it starts on its new owner only after the old owner stopped and
// released it, or once the old owner is past threshold + margin.

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::test
