// Redis going away, coming back, forgetting its scripts or its data: calls
// fail as values, nothing crashes, and epochs never go back.

#include <gtest/gtest.h>

#include <thread>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

using cluster::DesiredSet;

// proves: X1
TEST_F(RedisCoordinatorTest, CallsFailWithCoordinationFailedWhileRedisIsAwayAndWorkAgainAfterItReturns) {
  auto& a = add_node("node-a");
  ASSERT_TRUE(await(a->assign("workers", "w1", "")).ok());
  redis->stop();
  ASSERT_TRUE(wait_until([&] { return a.rec->log_has("lost Redis"); }));
  for (int i = 0; i < 20; ++i) {
    auto r = await(a->assign("workers", "w" + std::to_string(i + 2), ""), 5s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::coordination_failed);
    EXPECT_NE(r.error().message().find("127.0.0.1:" + std::to_string(redis->port())), std::string::npos)
        << r.error().message();
  }
  auto lookup = await(a->assignment("workers", "w1"));
  ASSERT_FALSE(lookup.ok());
  EXPECT_EQ(lookup.error().code(), ErrorCode::coordination_failed);
  redis->start();
  ASSERT_TRUE(wait_until([&] { return await(a->assignment("workers", "w1")).ok(); }, 10s));
  auto back = await(a->assignment("workers", "w1"));
  ASSERT_TRUE(back.ok() && back->has_value());
  EXPECT_EQ((*back)->owner, "node-a");  // the data survived the restart
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1 && !a->is_fenced(); }));
}

// proves: X1
TEST_F(RedisCoordinatorTest, AFlushedScriptCacheIsLoadedAgainWithoutAnError) {
  auto& a = add_node("node-a");
  auto c = client();
  c->cmd({"SCRIPT", "FLUSH"});
  auto r = await(a->assign("workers", "w1", ""));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->assignment.owner, "node-a");
  EXPECT_FALSE(a->is_fenced());
}

// Redis restarted without its data: members find themselves gone, fence,
// register again, and the epoch counter resumes above what they had seen.
// proves: X1
TEST_F(RedisCoordinatorTest, RedisThatLostItsDataMakesNodesRegisterAgainAndEpochsNeverGoBack) {
  auto& a = add_node("node-a");
  std::uint64_t high = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = await(a->assign("workers", "w" + std::to_string(i), ""));
    ASSERT_TRUE(r.ok());
    high = r->assignment.epoch;
  }
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() == 5; }));
  auto c = client();
  c->cmd({"FLUSHALL"});
  ASSERT_TRUE(wait_until([&] { return a.rec->unfenced_count() == 1; }, 10s));
  EXPECT_EQ(a.rec->fenced_count(), 1);
  EXPECT_TRUE(a.rec->running_now().empty());  // Redis gives it nothing now
  auto r = await(a->assign("workers", "fresh", ""));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_GT(r->assignment.epoch, high);
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("fresh") == 1; }));
}

// proves: X1
TEST_F(RedisCoordinatorTest, AMalformedAssignmentWrittenBySomeoneElseIsSkipped) {
  auto& a = add_node("node-a");
  ASSERT_TRUE(await(a->assign("workers", "good", "")).ok());
  auto c = client();
  // An entry in node-a's set whose assignment is garbage, and one owned by
  // someone else.
  c->cmd({"SADD", keys.units_of("workers", "node-a"), "junk", "stolen"});
  c->cmd({"HSET", keys.group("workers", "assign"), "junk", "not an assignment"});
  c->cmd({"HSET", keys.group("workers", "assign"), "stolen", "7 node-z 1"});
  c->cmd({"PUBLISH", keys.events(), "changed workers"});
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(a.rec->running_now(),
            (std::map<std::string, std::uint64_t>{{"good", a.rec->running_now()["good"]}}));
  // The stale set entries were dropped; the lookup of junk does not pretend.
  EXPECT_EQ(c->cmd({"SISMEMBER", keys.units_of("workers", "node-a"), "junk"}).integer, 0);
  auto l = await(a->assignment("workers", "junk"));
  ASSERT_TRUE(l.ok());
  EXPECT_FALSE(l->has_value());
  // Garbage notices are ignored.
  c->cmd({"PUBLISH", keys.events(), ""});
  c->cmd({"PUBLISH", keys.events(), "moved"});
  c->cmd({"PUBLISH", keys.events(), "moved no/such/group extra words"});
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(a->is_fenced());
  EXPECT_TRUE(await(a->assign("workers", "after", "")).ok());
}

// With the periodic re-read off, the notice a placement script publishes
// is all that tells the owner: it starts the unit at once.
// proves: W3
TEST_F(RedisCoordinatorTest, ThePubSubNoticeAloneStartsANewUnitOnItsOwner) {
  auto quiet = [&](const std::string& id) {
    auto s = settings(id);
    s.sync_interval = std::chrono::hours(1);  // no periodic re-read during the test
    return s;
  };
  auto& a = start_node(make_node(quiet("node-a")));
  auto& b = start_node(make_node(quiet("node-b")));
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 2; }));
  // Both hold nothing: the unit goes to the smaller id, node-a, placed by node-b.
  auto placed = await(b->assign("workers", "w1", "spec-1"));
  ASSERT_TRUE(placed.ok()) << placed.error().to_string();
  ASSERT_EQ(placed->assignment.owner, "node-a");
  auto at = Clock::now();
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("w1") == 1; }, 5s));
  EXPECT_LT(Clock::now() - at, 2s);
}

// proves: W1
TEST_F(RedisCoordinatorTest, ClustersWithDifferentPrefixesShareOneRedisWithoutSeeingEachOther) {
  auto s1 = settings("node-a");
  auto s2 = settings("node-a");  // the same id, another cluster
  s2.key_prefix = "other";
  auto& a = start_node(make_node(s1, {"workers"}));
  auto& b = start_node(make_node(s2, {"workers"}));
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(DesiredSet{{"x", ""}}); })).ok());
  ASSERT_TRUE(await(b->sync("workers", [] { return Result<DesiredSet>(DesiredSet{{"y", ""}}); })).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().count("x") && b.rec->running_now().count("y"); }));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(a.rec->running_now().size(), 1u);
  EXPECT_EQ(b.rec->running_now().size(), 1u);
  EXPECT_EQ(a->members().size(), 1u);
}

}  // namespace
}  // namespace troupe::test
