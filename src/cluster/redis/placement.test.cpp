// Atomic assignment and relocation (one Lua script each), their outcomes as
// values, and epochs as fencing tokens.

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

using cluster::Placement;
using cluster::PlacementOutcome;

// proves: W3
TEST_F(RedisCoordinatorTest, AssigningWithNoLiveMemberIsNoAcceptableWorker) {
  auto s = settings("node-a");
  s.heartbeat_interval = 2s;  // no heartbeat renews node-a during the test
  s.liveness_threshold = 30s;
  auto& a = start_node(make_node(s));
  auto c = client();
  c->cmd({"ZADD", keys.members(), "0", "node-a"});  // its stamp is now ancient
  auto r = await(a->assign("workers", "w1", "spec"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::unreachable);
  EXPECT_EQ(r.error().message().rfind("NO_ACCEPTABLE_WORKER", 0), 0u) << r.error().message();
  EXPECT_NE(r.error().message().find("'w1'"), std::string::npos);
  EXPECT_EQ(c->cmd({"HLEN", keys.group("workers", "assign")}).integer, 0);
}

// Seed 001's log levels: the outcomes that leave a unit without the owner
// asked for are errors, the informational ones info.
// proves: W3, W4
TEST_F(RedisCoordinatorTest, PlacementOutcomesAreLoggedAtTheSeedsLevels) {
  using Level = CoordinatorLogLevel;
  auto& a = add_node("node-a");
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  EXPECT_EQ(a.rec->level_of("ASSIGNED: unit 'w1' of group 'workers' on node-a"), Level::info);
  EXPECT_EQ(a.rec->level_of("ALREADY_INSTALLED: unit 'w1'"), Level::info);
  ASSERT_TRUE(await(a->relocate("workers", "w1", false)).ok());
  EXPECT_EQ(a.rec->level_of("NO_NEED_TO_RELOCATE: unit 'w1'"), Level::info);
  EXPECT_FALSE(await(a->relocate("workers", "w1", true)).ok());
  EXPECT_EQ(a.rec->level_of("NO_OTHER_ACCEPTABLE_WORKER"), Level::error);
  EXPECT_FALSE(await(a->relocate("workers", "nobody", true)).ok());
  EXPECT_EQ(a.rec->level_of("NOT_INSTALLED"), Level::error);
  // Draining, node-a is no member placement may choose: nobody is.
  ASSERT_TRUE(await(a->hand_off(1, {}), 10s).ok());
  EXPECT_FALSE(await(a->assign("workers", "w2", "")).ok());
  EXPECT_EQ(a.rec->level_of("NO_ACCEPTABLE_WORKER"), Level::error);
}

// proves: W3
TEST_F(RedisCoordinatorTest, AssignPutsEachUnitOnTheLeastLoadedLiveMember) {
  auto& a = add_node("node-a");
  add_node("node-b");
  add_node("node-c");
  auto c = client();
  for (int i = 0; i < 9; ++i) {
    auto r = await(a->assign("workers", "w" + std::to_string(i), "s"));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->outcome, PlacementOutcome::assigned);
  }
  EXPECT_EQ(count_of(*c, "workers", "node-a"), 3);
  EXPECT_EQ(count_of(*c, "workers", "node-b"), 3);
  EXPECT_EQ(count_of(*c, "workers", "node-c"), 3);
  // Loads are per group.
  auto other = await(a->assign("shards/payment", "shard/payment/1", ""));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->assignment.owner, "node-a");  // all equal (0): the smallest id
  // Put two more on node-b by hand: the next unit goes to a less loaded one.
  fake_assignment(*c, "workers", "extra1", "node-b", 900);
  fake_assignment(*c, "workers", "extra2", "node-b", 901);
  fake_assignment(*c, "workers", "extra3", "node-a", 902);
  auto next = await(a->assign("workers", "w9", ""));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->assignment.owner, "node-c");
}

TEST_F(RedisCoordinatorTest, WhileTwoAppVersionsAreLiveNewUnitsAndHandedOffOnesGoToTheNewest) {
  auto versioned = [&](const std::string& id, const std::string& version) -> TestNode& {
    auto s = settings(id);
    s.app_version = version;
    return start_node(make_node(std::move(s), {"workers"}, 0ms));
  };
  auto& a = versioned("node-a", "1.9.0");
  versioned("node-b", "1.10.0");  // numerically above 1.9.0, below it as text
  auto& c3 = versioned("node-c", "1.10.0");
  auto& d = add_node("node-d");  // declares none: below every version
  auto c = client();
  for (int i = 0; i < 6; ++i) {
    auto r = await(a->assign("workers", "w" + std::to_string(i), "s"));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  EXPECT_EQ(count_of(*c, "workers", "node-a"), 0);
  EXPECT_EQ(count_of(*c, "workers", "node-b"), 3);
  EXPECT_EQ(count_of(*c, "workers", "node-c"), 3);
  EXPECT_EQ(count_of(*c, "workers", "node-d"), 0);
  // node-c leaves: its units go to node-b, the other newest, however loaded.
  auto left = await(c3->stop());
  ASSERT_TRUE(left.ok()) << left.error().to_string();
  EXPECT_EQ(count_of(*c, "workers", "node-b"), 6);
  EXPECT_EQ(count_of(*c, "workers", "node-a"), 0);
  EXPECT_EQ(count_of(*c, "workers", "node-d"), 0);
  (void)d;
}

// proves: W3
TEST_F(RedisCoordinatorTest, AssigningAnInstalledUnitIsAlreadyInstalledWithTheCurrentAssignment) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto first = await(a->assign("workers", "w1", "v1"));
  ASSERT_TRUE(first.ok());
  auto again = await(b->assign("workers", "w1", "v2"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, PlacementOutcome::already_installed);
  EXPECT_EQ(again->assignment.owner, first->assignment.owner);
  EXPECT_EQ(again->assignment.epoch, first->assignment.epoch);
  EXPECT_EQ(again->assignment.spec, "v1");  // assign never changes a placed unit
  EXPECT_EQ(to_string(again->outcome), "ALREADY_INSTALLED");
}

// proves: W3
TEST_F(RedisCoordinatorTest, ConcurrentAssignsOfOneUnitFromTwoNodesPlaceItOnce) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  for (int i = 0; i < 50; ++i) {
    std::string unit = "race-" + std::to_string(i);
    auto fa = a->assign("workers", unit, "from-a");
    auto fb = b->assign("workers", unit, "from-b");
    auto ra = await(std::move(fa));
    auto rb = await(std::move(fb));
    ASSERT_TRUE(ra.ok() && rb.ok());
    int assigned = (ra->outcome == PlacementOutcome::assigned) + (rb->outcome == PlacementOutcome::assigned);
    EXPECT_EQ(assigned, 1) << unit;
    EXPECT_EQ(ra->assignment.owner, rb->assignment.owner);
    EXPECT_EQ(ra->assignment.epoch, rb->assignment.epoch);
  }
  auto c = client();
  EXPECT_EQ(count_of(*c, "workers", "node-a") + count_of(*c, "workers", "node-b"), 50);
}

// proves: W3, W4
TEST_F(RedisCoordinatorTest, EveryChangeOfOwnerTakesALargerEpochFromOneCounter) {
  auto& a = add_node("node-a");
  add_node("node-b");
  std::set<std::uint64_t> epochs;
  std::uint64_t last = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = await(a->assign(i % 2 ? "workers" : "shards/x", "u" + std::to_string(i), ""));
    ASSERT_TRUE(r.ok());
    EXPECT_GT(r->assignment.epoch, last);
    last = r->assignment.epoch;
    epochs.insert(last);
  }
  for (int i = 0; i < 5; ++i) {
    auto r = await(a->relocate(i % 2 ? "workers" : "shards/x", "u" + std::to_string(i), true));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->outcome, PlacementOutcome::relocated);
    EXPECT_GT(r->assignment.epoch, last);
    last = r->assignment.epoch;
    epochs.insert(last);
  }
  EXPECT_EQ(epochs.size(), 10u);
  auto c = client();
  EXPECT_EQ(std::stoull(c->cmd({"GET", keys.epoch()}).str), last);  // one counter for every group
}

// proves: W4
TEST_F(RedisCoordinatorTest, RelocatingAnUnknownUnitIsNotInstalled) {
  auto& a = add_node("node-a");
  auto r = await(a->relocate("workers", "nobody", true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(r.error().message().rfind("NOT_INSTALLED", 0), 0u) << r.error().message();
}

// proves: W4
TEST_F(RedisCoordinatorTest, RelocatingAUnitWhoseOwnerIsLiveIsNoNeedToRelocateUnlessForced) {
  auto& a = add_node("node-a");
  add_node("node-b");
  auto placed = await(a->assign("workers", "w1", ""));
  ASSERT_TRUE(placed.ok());
  auto r = await(a->relocate("workers", "w1", false));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->outcome, PlacementOutcome::no_need_to_relocate);
  EXPECT_EQ(r->assignment.owner, placed->assignment.owner);
  EXPECT_EQ(r->assignment.epoch, placed->assignment.epoch);
  auto forced = await(a->relocate("workers", "w1", true));
  ASSERT_TRUE(forced.ok());
  EXPECT_EQ(forced->outcome, PlacementOutcome::relocated);
  EXPECT_NE(forced->assignment.owner, placed->assignment.owner);
}

// proves: W4
TEST_F(RedisCoordinatorTest, RelocatingWithNoOtherLiveMemberIsNoOtherAcceptableWorker) {
  auto& a = add_node("node-a");
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  auto r = await(a->relocate("workers", "w1", true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::unreachable);
  EXPECT_EQ(r.error().message().rfind("NO_OTHER_ACCEPTABLE_WORKER", 0), 0u) << r.error().message();
  auto l = await(a->assignment("workers", "w1"));
  ASSERT_TRUE(l.ok() && l->has_value());
  EXPECT_EQ((*l)->owner, "node-a");
}

// proves: W4
TEST_F(RedisCoordinatorTest, ARelocationChangesBothListsTheOwnerAndTheUpdateTimeTogether) {
  auto& a = add_node("node-a");
  add_node("node-b");
  auto placed = await(a->assign("workers", "w1", "cfg"));
  ASSERT_TRUE(placed.ok());
  std::string from = placed->assignment.owner;
  std::string to = from == "node-a" ? "node-b" : "node-a";
  auto c = client();
  long long before = c->time_ms();
  std::this_thread::sleep_for(5ms);
  auto r = await(a->relocate("workers", "w1", true));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->assignment.owner, to);
  EXPECT_EQ(r->assignment.spec, "cfg");
  EXPECT_GE(
      std::chrono::duration_cast<std::chrono::milliseconds>(r->assignment.updated.time_since_epoch()).count(),
      before);
  EXPECT_EQ(c->cmd({"SISMEMBER", keys.units_of("workers", from), "w1"}).integer, 0);
  EXPECT_EQ(c->cmd({"SISMEMBER", keys.units_of("workers", to), "w1"}).integer, 1);
  EXPECT_EQ(owner_in_redis(*c, "workers", "w1"), to);
  // The relocate script is one EVAL: the lists, the owner and the time
  // change in it together (no client-side step between them).
  const std::string& text = cluster::detail::script_text(cluster::detail::Script::relocate);
  EXPECT_NE(text.find("local function move("), std::string::npos);
}

// proves: X1
TEST_F(RedisCoordinatorTest, BadGroupAndUnitNamesAreRefusedBeforeReachingRedis) {
  auto& a = add_node("node-a");
  for (const std::string& g :
       {std::string(""), std::string("a:b"), std::string("a b"), std::string(200, 'g')}) {
    auto r = await(a->assign(g, "u", ""));
    ASSERT_FALSE(r.ok()) << g;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  }
  for (const std::string& u :
       {std::string(""), std::string("a b"), std::string("tab\tx"), std::string(600, 'u')}) {
    auto r = await(a->assign("workers", u, ""));
    ASSERT_FALSE(r.ok()) << u;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  }
  EXPECT_TRUE(a->serve("bad group", {}).error().code() == ErrorCode::invalid_argument);
  EXPECT_EQ(a->serve("workers", {}).error().message(), "group 'workers' is already served on this node");
}

// proves: W3, W4
TEST_F(RedisCoordinatorTest, UnassignRemovesAUnitAndItsOwnerStopsIt) {
  auto& a = add_node("node-a");
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }));
  auto r = await(a->unassign("workers", "w1"));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(*r);
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().empty(); }));
  auto again = await(a->unassign("workers", "w1"));
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
  auto l = await(a->assignment("workers", "w1"));
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->has_value());
}

}  // namespace
}  // namespace troupe::test
