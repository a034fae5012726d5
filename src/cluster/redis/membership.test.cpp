// Membership and liveness in Redis: registration with an address, heartbeats
// stamped with Redis' clock, one liveness rule, the first-manager question,
// and what happens when Redis or its data cannot be trusted.

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

using cluster::Member;
using cluster::PlacementOutcome;

// proves: W2
TEST_F(RedisCoordinatorTest, AStartedNodeIsAMemberWithItsAddressInEveryNodesView) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto both = [](TestNode& n) {
    auto ms = n->members();
    return ms.size() == 2 && ms[0].id == "node-a" && ms[1].id == "node-b";
  };
  ASSERT_TRUE(wait_until([&] { return both(a) && both(b); }));
  auto ms = a->members();
  EXPECT_EQ(ms[0].address.host, "10.0.0.1");
  EXPECT_EQ(ms[0].address.port, 7100);
  EXPECT_EQ(ms[1].address.host, "10.0.0.2");
  EXPECT_EQ(ms[1].address.port, 7101);
  for (const Member& m : ms) EXPECT_LE(m.heartbeat_age, 1000ms);
}

TEST_F(RedisCoordinatorTest, EachMemberIsSeenWithTheAppVersionItDeclared) {
  auto s = settings("node-a");
  s.app_version = "2.3.1";
  auto& a = start_node(make_node(std::move(s), {"workers"}, 0ms));
  auto& b = add_node("node-b");
  auto seen = [](TestNode& n) {
    auto ms = n->members();
    return ms.size() == 2 && ms[0].app_version == "2.3.1" && ms[1].app_version.empty();
  };
  EXPECT_TRUE(wait_until([&] { return seen(a) && seen(b); }));
}

TEST_F(RedisCoordinatorTest, AnAppVersionOutsideItsCharactersIsRefusedAtCreate) {
  for (const std::string& bad : std::vector<std::string>{"2.3 beta", "v1/2", std::string(65, '1')}) {
    auto s = settings("node-a");
    s.app_version = bad;
    auto c = cluster::Coordinator::create(std::move(s));
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code(), ErrorCode::invalid_argument);
    EXPECT_NE(c.error().message().find("app version"), std::string::npos) << c.error().message();
  }
}

// proves: W2, W7
TEST_F(RedisCoordinatorTest, HeartbeatsAreStampedWithRedisTimeNeverTheClientClock) {
  auto c = client();
  long long before = c->time_ms();
  add_node("node-a");
  std::this_thread::sleep_for(300ms);
  auto score1 = c->cmd({"ZSCORE", keys.members(), "node-a"});
  long long after = c->time_ms();
  long long s1 = std::stoll(score1.str);
  EXPECT_GE(s1, before);
  EXPECT_LE(s1, after);
  // The heartbeat script takes no time from the client at all: its
  // arguments are the node, its session and address, and the cluster rule.
  const std::string& text = cluster::detail::script_text(cluster::detail::Script::heartbeat);
  EXPECT_NE(text.find("redis.call('TIME')"), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return std::stoll(c->cmd({"ZSCORE", keys.members(), "node-a"}).str) > s1; }));
}

// proves: W2
TEST_F(RedisCoordinatorTest, MembersChangedFiresWhenANodeJoinsAndWhenOneStopsHeartbeating) {
  auto& a = add_node("node-a");
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard lk(a.rec->mu);
    return a.rec->last_members == std::vector<std::string>{"node-a"};
  }));
  auto& b = add_node("node-b");
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard lk(a.rec->mu);
    return a.rec->last_members == std::vector<std::string>{"node-a", "node-b"};
  }));
  crash(b);
  // Gone from the live view once its heartbeat is older than the threshold.
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard lk(a.rec->mu);
    return a.rec->last_members == std::vector<std::string>{"node-a"};
  }));
  EXPECT_EQ(a->members().size(), 1u);
}

// One rule, applied the same way by assignment, relocation, rebalance and
// takeover: a member whose stamp is within the threshold is live for all of
// them; past it, live for none; past threshold + margin, taken over.
// proves: W7, W2
TEST_F(RedisCoordinatorTest, OneLivenessRuleDecidesAssignmentRelocationRebalanceAndTakeover) {
  auto s = settings("node-a");
  s.heartbeat_interval = 100ms;
  s.liveness_threshold = 3000ms;
  s.takeover_margin = 2000ms;
  auto& a = start_node(make_node(s));
  auto c = client();
  // "ghost" has 3 units and heartbeat 2.5 s ago: live (2.5 <= 3).
  fake_member(*c, "ghost", 2500);
  for (int i = 0; i < 3; ++i) fake_assignment(*c, "workers", "g" + std::to_string(i), "ghost", 100 + i);
  // Live for assignment: the least-loaded live member is node-a (0 units);
  // then with 3 vs 1, node-a again - but ghost would be picked if a had more.
  auto r1 = await(a->relocate("workers", "g0", false));
  ASSERT_TRUE(r1.ok()) << r1.error().to_string();
  EXPECT_EQ(r1->outcome, PlacementOutcome::no_need_to_relocate);  // live owner
  auto moves = await(a->rebalance_all("workers"));
  ASSERT_TRUE(moves.ok());
  EXPECT_EQ(moves->size(), 1u);  // 3 on ghost, 0 on node-a -> 2 and 1: ghost counts as live
  EXPECT_EQ(owner_in_redis(*c, "workers", "g0"), "node-a");  // the surplus unit, in sorted order
  // Now ghost's heartbeat is 3.5 s old: not live for any check.
  c->cmd({"ZADD", keys.members(), std::to_string(c->time_ms() - 3500), "ghost"});
  auto r2 = await(a->relocate("workers", "g1", false));
  ASSERT_TRUE(r2.ok()) << r2.error().to_string();
  EXPECT_EQ(r2->outcome, PlacementOutcome::relocated);  // owner not live: moved without force
  EXPECT_EQ(r2->assignment.owner, "node-a");
  // ...and still handed off: within threshold + margin it may not have
  // fenced itself yet.
  EXPECT_EQ(r2->assignment.handing_off_from, "ghost");
  auto moves2 = await(a->rebalance_all("workers"));
  ASSERT_TRUE(moves2.ok());
  EXPECT_TRUE(moves2->empty());  // ghost is not live: everything sits on the only live member
  auto placed = await(a->assign("workers", "new-unit", ""));
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->assignment.owner, "node-a");
  EXPECT_EQ(c->cmd({"ZSCORE", keys.members(), "ghost"}).type, cluster::detail::RedisReply::Type::string)
      << "not yet past threshold + margin: not taken over";
  // Past threshold + margin (5 s) the next heartbeat of node-a takes over.
  c->cmd({"ZADD", keys.members(), std::to_string(c->time_ms() - 5200), "ghost"});
  ASSERT_TRUE(wait_until([&] {
    return c->cmd({"ZSCORE", keys.members(), "ghost"}).type == cluster::detail::RedisReply::Type::nil;
  }));
  EXPECT_EQ(count_of(*c, "workers", "ghost"), 0);
  EXPECT_EQ(count_of(*c, "workers", "node-a"), 4);
}

// proves: W5
TEST_F(RedisCoordinatorTest, IsFirstManagerIsNotReadyBeforeStartUpAndTrueOnlyForTheFirstNode) {
  auto& a = make_node(settings("node-a"));
  auto early = a->is_first_manager();
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code(), ErrorCode::not_ready);
  EXPECT_NE(early.error().message().find("started()"), std::string::npos);
  auto waiting = a->started();  // asked before start(): completes when start-up does
  EXPECT_FALSE(waiting.ready());
  auto placed_early = await(a->assign("workers", "w", ""));
  ASSERT_FALSE(placed_early.ok());
  EXPECT_EQ(placed_early.error().code(), ErrorCode::not_ready);
  ASSERT_TRUE(await(a->start()).ok());
  ASSERT_TRUE(await(std::move(waiting)).ok());
  auto first = a->is_first_manager();
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  auto& b = add_node("node-b");
  ASSERT_TRUE(await(b->started()).ok());
  auto second = b->is_first_manager();
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(*second);
}

// proves: X1
TEST_F(RedisCoordinatorTest, StartFailsWithCoordinationFailedNamingHostAndPortWhenRedisIsDown) {
  redis->stop();
  auto& a = make_node(settings("node-a"));
  auto r = await(a->start());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::coordination_failed);
  EXPECT_NE(r.error().message().find("127.0.0.1:" + std::to_string(redis->port())), std::string::npos)
      << r.error().message();
  auto s = await(a->started());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code(), ErrorCode::coordination_failed);
  // A failed start may be retried once Redis is there.
  redis->start();
  auto again = await(a->start());
  ASSERT_TRUE(again.ok()) << again.error().to_string();
}

// proves: X1, W7
TEST_F(RedisCoordinatorTest, AMemberEntryWithAnInvalidNodeIdIsLoggedSkippedAndNeverGivenUnits) {
  auto& a = add_node("node-a");
  auto c = client();
  long long now = c->time_ms();
  c->cmd({"ZADD", keys.members(), std::to_string(now + 60000), "bad id!"});
  c->cmd({"HSET", keys.member_info(), "bad id!", "0 s 1.2.3.4 1"});
  c->cmd({"ZADD", keys.members(), std::to_string(now + 60000), "no-info"});
  c->cmd({"ZADD", keys.members(), std::to_string(now + 60000), "bad-port"});
  c->cmd({"HSET", keys.member_info(), "bad-port", "0 s 1.2.3.4 99999"});
  ASSERT_TRUE(wait_until([&] { return a.rec->log_has("skipping member entry 'bad id!'"); }));
  ASSERT_TRUE(wait_until([&] { return a.rec->log_has("skipping member entry 'bad-port'"); }));
  ASSERT_TRUE(wait_until([&] { return a.rec->log_has("skipping member entry 'no-info'"); }));
  auto ms = a->members();
  ASSERT_EQ(ms.size(), 1u);
  EXPECT_EQ(ms[0].id, "node-a");
  // The scripts apply the same rule: an invalid id never gets a unit.
  for (int i = 0; i < 6; ++i) {
    auto p = await(a->assign("workers", "u" + std::to_string(i), ""));
    ASSERT_TRUE(p.ok()) << p.error().to_string();
    EXPECT_NE(p->assignment.owner, "bad id!");
  }
  EXPECT_EQ(c->cmd({"SCARD", keys.units_of("workers", "bad id!")}).integer, 0);
}

// proves: X1
TEST(RedisCoordinatorSettings, AreCheckedBeforeAnythingTouchesRedis) {
  auto bad = [](auto change, const std::string& needle) {
    CoordinatorSettings s;
    s.node_id = "node-a";
    s.address = {"127.0.0.1", 7100};
    change(s);
    auto r = Coordinator::create(s);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message().find(needle), std::string::npos) << r.error().message();
  };
  bad([](CoordinatorSettings& s) { s.node_id = "a b"; }, "outside");
  bad([](CoordinatorSettings& s) { s.address.port = 0; }, "address.port");
  bad([](CoordinatorSettings& s) { s.key_prefix = "a{b"; }, "key_prefix");
  bad([](CoordinatorSettings& s) { s.liveness_threshold = s.heartbeat_interval; }, "liveness_threshold");
  bad([](CoordinatorSettings& s) { s.takeover_margin = 0ms; }, "takeover_margin");
  bad([](CoordinatorSettings& s) { s.takeover_batch = 0; }, "takeover_batch");
}

// proves: W7
TEST_F(RedisCoordinatorTest, ANodeWithAnotherThresholdThanTheClusterIsRefused) {
  add_node("node-a");
  auto s = settings("node-b");
  s.liveness_threshold = 2000ms;
  auto& b = make_node(s);
  auto r = await(b->start());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("one rule"), std::string::npos) << r.error().message();
}

// proves: W2
TEST_F(RedisCoordinatorTest, ANodeIdHeldByALiveProcessIsRefusedAndARestartWaitsForTheOldEntryToExpire) {
  auto& a = add_node("node-a");
  // A second live process with the same id: refused once the wait is over.
  auto& twin = make_node(settings("node-a"));
  auto r = await(twin->start(), 20s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("in use"), std::string::npos) << r.error().message();
  EXPECT_FALSE(a->is_fenced());
  // The first process crashes; its restart waits out the old entry and starts.
  crash(a);
  auto& again = make_node(settings("node-a"));
  auto t0 = Clock::now();
  ASSERT_TRUE(await(again->start(), 20s).ok());
  EXPECT_GE(Clock::now() - t0, 300ms) << "started before the crashed entry could have expired";
}

// proves: X1
TEST(RedisCoordinatorAuth, UsesThePasswordAndFailsClearlyWithoutIt) {
  RedisTestServer redis({.password = "s3cret"});
  CoordinatorSettings s;
  s.node_id = "node-a";
  s.address = {"127.0.0.1", 7100};
  s.redis_port = static_cast<std::uint16_t>(redis.port());
  s.heartbeat_interval = 100ms;
  s.liveness_threshold = 1000ms;
  s.command_timeout = 800ms;
  s.log = [](CoordinatorLogLevel, std::string_view) {};
  auto without = Coordinator::create(s).value();
  auto r = await(without->start());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::coordination_failed);
  EXPECT_NE(r.error().message().find("NOAUTH"), std::string::npos) << r.error().message();
  s.redis_password = "s3cret";
  auto with = Coordinator::create(s).value();
  ASSERT_TRUE(await(with->start()).ok());
  s.node_id = "node-b";
  s.redis_password = "wrong";
  auto wrong = Coordinator::create(s).value();
  auto w = await(wrong->start());
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message().find("AUTH refused"), std::string::npos) << w.error().message();
}

TEST_F(RedisCoordinatorTest, NoCommandScansTheKeyspaceAndEveryKeySharesOneHashSlot) {
  RedisTestClient monitor(redis->port());
  std::atomic<bool> stop{false};
  std::vector<std::string> seen;
  std::mutex seen_mu;
  monitor.set_timeout(200ms);
  (void)monitor.cmd({"MONITOR"});
  std::thread watcher([&] {
    cluster::detail::RedisReply r;
    while (!stop) {
      if (monitor.next(r) && r.is_text()) {
        std::lock_guard lk(seen_mu);
        seen.push_back(r.str);
      }
    }
  });
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(await(a->assign("workers", "u" + std::to_string(i), "x")).ok());
  ASSERT_TRUE(await(b->relocate("workers", "u0", true)).ok());
  ASSERT_TRUE(await(a->rebalance_all("workers")).ok());
  ASSERT_TRUE(await(a->sync("workers", [] {
                return Result<cluster::DesiredSet>(cluster::DesiredSet{{"u1", "y"}});
              })).ok());
  crash(b);
  auto c = client();
  ASSERT_TRUE(wait_until([&] {
    return c->cmd({"ZSCORE", keys.members(), "node-b"}).type == cluster::detail::RedisReply::Type::nil;
  }));
  stop = true;
  watcher.join();
  std::lock_guard lk(seen_mu);
  ASSERT_GT(seen.size(), 50u);
  for (const auto& line : seen) {
    for (const char* banned : {"\"KEYS\"", "\"SCAN\"", "\"HSCAN\"", "\"SSCAN\"", "\"ZSCAN\""})
      EXPECT_EQ(line.find(banned), std::string::npos) << line;
  }
  // The test may list keys; the coordinator never does. Every key opens
  // with the hash tag "{troupe}", so Redis Cluster hashes only "troupe":
  // one slot for all of them.
  auto all = c->cmd({"KEYS", "*"});
  ASSERT_GT(all.elements.size(), 5u);
  for (const auto& k : all.elements) EXPECT_EQ(k.str.rfind("{troupe}:", 0), 0u) << k.str;
}

}  // namespace
}  // namespace troupe::test
