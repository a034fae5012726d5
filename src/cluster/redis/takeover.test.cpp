// Dead-member takeover: members past threshold + margin lose their units to
// live members, in bounded batches, by an idempotent script any node may run.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>

#include "coordinator_test_support.hpp"
#include "tcp_test_proxy.hpp"

namespace troupe::test {
namespace {

using cluster::DesiredSet;
using cluster::Member;
using cluster::detail::RedisReply;
using cluster::detail::Script;

DesiredSet units(int n) {
  DesiredSet d;
  for (int i = 0; i < n; ++i) d.emplace("w" + std::to_string(i), "cfg" + std::to_string(i));
  return d;
}

// An owner whose member entry is gone altogether (deleted by hand, or lost
// with part of Redis' data) is taken over like an expired one: its units
// run elsewhere within threshold + margin of a heartbeat noticing, and it
// is forgotten once it has none.
// proves: W2
TEST_F(RedisCoordinatorTest, AnOwnerMissingFromTheMembersIsTakenOverLikeADeadOne) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto& c = add_node("node-c");
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(units(9)); })).ok());
  ASSERT_TRUE(wait_until([&] { return c.rec->running_now().size() == 3; }));
  auto c_units = c.rec->running_now();
  std::this_thread::sleep_for(1600ms);  // the others may take over from here on
  auto redis_client = client();
  // node-c dies, and its entry goes with it: nothing expires any more.
  crash(c);
  auto deleted_at = Clock::now();
  redis_client->cmd({"ZREM", keys.members(), "node-c"});
  redis_client->cmd({"HDEL", keys.member_info(), "node-c"});
  ASSERT_TRUE(
      wait_until([&] { return a.rec->running_now().size() + b.rec->running_now().size() == 9; }, 8s))
      << "node-c's units never ran elsewhere";
  for (const auto& [unit, old_epoch] : c_units) {
    EXPECT_EQ(fleet.starts(unit, "node-a") + fleet.starts(unit, "node-b"), 1u) << unit;
    for (const auto& e : fleet.events()) {
      if (e.unit == unit && e.kind == "start" && e.node != "node-c") {
        EXPECT_LE(e.at - deleted_at, 1000ms + 500ms + 2000ms) << "later than the takeover bound";
      }
    }
  }
  EXPECT_EQ(count_of(*redis_client, "workers", "node-c"), 0);
  ASSERT_TRUE(wait_until([&] {
    return redis_client->cmd({"ZSCORE", keys.owners(), "node-c"}).type == RedisReply::Type::nil &&
           redis_client->cmd({"HEXISTS", keys.absent(), "node-c"}).integer == 0;
  }));
  EXPECT_NE(redis_client->cmd({"ZSCORE", keys.owners(), "node-a"}).type, RedisReply::Type::nil);
}

// proves: W2, W7
TEST_F(RedisCoordinatorTest, ADeadMembersUnitsMoveToLiveMembersOnceItIsPastThresholdPlusMargin) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto& c = add_node("node-c");
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(units(9)); })).ok());
  ASSERT_TRUE(
      wait_until([&] { return c.rec->running_now().size() == 3 && a.rec->running_now().size() == 3; }));
  auto c_units = c.rec->running_now();
  auto crashed_at = Clock::now();
  crash(c);
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() + b.rec->running_now().size() == 9; }));
  auto redis_client = client();
  for (const auto& [unit, old_epoch] : c_units) {
    EXPECT_EQ(fleet.starts(unit, "node-a") + fleet.starts(unit, "node-b"), 1u) << unit;
    auto l = await(a->assignment("workers", unit));
    ASSERT_TRUE(l.ok() && l->has_value());
    EXPECT_GT((*l)->epoch, old_epoch);
    EXPECT_EQ((*l)->spec, "cfg" + unit.substr(1));
    EXPECT_EQ((*l)->handing_off_from, "");  // an expired owner needs no release
    for (const auto& e : fleet.events()) {
      if (e.unit == unit && e.kind == "start" && e.node != "node-c") {
        EXPECT_GE(e.at - crashed_at, 1000ms + 500ms - 150ms) << "taken before threshold + margin";
      }
    }
  }
  EXPECT_EQ(redis_client->cmd({"ZSCORE", keys.members(), "node-c"}).type, RedisReply::Type::nil);
  EXPECT_EQ(redis_client->cmd({"HGET", keys.member_info(), "node-c"}).type, RedisReply::Type::nil);
}

// node-c keeps running, but its heartbeats stop reaching Redis (its
// connection goes through a proxy that is cut). node-a's view keeps it
// live while Redis' time since its last stamp is within the threshold, and
// drops it once past it; past threshold + margin its units move.
// proves: W2
TEST_F(RedisCoordinatorTest, AMemberWhoseHeartbeatsStopIsNotLiveOncePastTheThresholdNotBeforeAndItsUnitsMove) {
  TcpTestProxy proxy(redis->port());
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto& c = start_node(make_node(settings("node-c", proxy.port())));
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(units(9)); })).ok());
  ASSERT_TRUE(wait_until([&] {
    return c.rec->running_now().size() == 3 && a.rec->running_now().size() == 3 && a->members().size() == 3;
  }));
  auto c_units = c.rec->running_now();
  auto rc = client();
  auto cut_at = Clock::now();
  proxy.cut();
  std::this_thread::sleep_for(50ms);  // a heartbeat already forwarded lands
  long long last_beat = std::stoll(rc->cmd({"ZSCORE", keys.members(), "node-c"}).str);
  const long long threshold = 1000;  // settings(): liveness_threshold
  long long oldest_live_age = 0;     // the oldest stamp node-a's view still counted live
  long long age_when_gone = -1;      // Redis time since the stamp when first seen not live
  auto give_up = Clock::now() + 10s;
  while (Clock::now() < give_up) {
    auto view = a->members();  // the view first: Redis' time read after it is later than the view's
    long long redis_now = rc->time_ms();
    auto it = std::find_if(view.begin(), view.end(), [](const Member& m) { return m.id == "node-c"; });
    if (it == view.end()) {
      age_when_gone = redis_now - last_beat;
      break;
    }
    auto age = std::chrono::duration_cast<std::chrono::milliseconds>(it->heartbeat_age).count();
    EXPECT_LE(age, threshold);
    oldest_live_age = std::max<long long>(oldest_live_age, age);
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_GE(age_when_gone, 0) << "node-c stayed live 10 s after its heartbeats stopped";
  EXPECT_GT(age_when_gone, threshold) << "seen not live before the threshold";
  // Views come every heartbeat interval (100 ms): generous bounds on when.
  EXPECT_LT(age_when_gone, threshold + 1000) << "seen not live long after the threshold";
  EXPECT_GE(oldest_live_age, threshold - 500) << "dropped from the view well before the threshold";
  // Its units move to the live members, each started once, after the
  // threshold plus the takeover margin; node-c fenced itself meanwhile.
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() + b.rec->running_now().size() == 9; }));
  for (const auto& [unit, epoch] : c_units) {
    EXPECT_EQ(fleet.starts(unit, "node-a") + fleet.starts(unit, "node-b"), 1u) << unit;
    for (const auto& e : fleet.events()) {
      if (e.unit == unit && e.kind == "start" && e.node != "node-c") {
        EXPECT_GE(e.at - cut_at, 1000ms + 500ms - 150ms) << unit << " taken before threshold + margin";
      }
    }
  }
  EXPECT_TRUE(c.rec->is_fenced_now());
  EXPECT_TRUE(c.rec->running_now().empty());
  EXPECT_EQ(rc->cmd({"ZSCORE", keys.members(), "node-c"}).type, RedisReply::Type::nil);
}

// proves: W2
TEST_F(RedisCoordinatorTest, TwoNodesTakingOverTheSameDeadMemberMoveEachUnitOnce) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto& c = add_node("node-c");
  ASSERT_TRUE(await(a->sync("workers", [] { return Result<DesiredSet>(units(30)); })).ok());
  ASSERT_TRUE(wait_until([&] { return c.rec->running_now().size() == 10; }));
  auto c_units = c.rec->running_now();
  crash(c);
  // node-a and node-b both see node-c expire and both run the takeover.
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() + b.rec->running_now().size() == 30; }));
  for (const auto& [unit, e] : c_units)
    EXPECT_EQ(fleet.starts(unit) - fleet.starts(unit, "node-c"), 1u) << unit;

  // The script itself, run by two takers at once on one dead member (of a
  // cluster with another prefix, which no coordinator here belongs to).
  cluster::detail::KeyNames raw("raw");
  auto rc = client();
  rc->cmd({"HSET", raw.config(), "liveness_threshold_ms", "1000", "takeover_margin_ms", "500"});
  fake_member(*rc, "taker-1", 0, "s1", &raw);
  fake_member(*rc, "taker-2", 0, "s2", &raw);
  fake_member(*rc, "corpse", 60000, "s3", &raw);
  fake_assignments(*rc, "bulk", "corpse", "b", 0, 300, &raw);
  auto run = [&](const std::string& taker, const std::string& session, std::vector<std::string>* moved) {
    RedisTestClient own(redis->port());
    auto r = run_script(own, Script::takeover, {taker, session, "1000", "corpse"}, &raw);
    ASSERT_TRUE(r.is_array()) << r.describe();
    ASSERT_EQ(r.elements[0].str, "OK");
    for (const auto& m : r.elements[2].elements)
      if (m.elements[0].str == "bulk") moved->push_back(m.elements[1].str);
  };
  std::vector<std::string> m1, m2;
  std::thread t1([&] { run("taker-1", "s1", &m1); });
  std::thread t2([&] { run("taker-2", "s2", &m2); });
  t1.join();
  t2.join();
  EXPECT_EQ(m1.size() + m2.size(), 300u);
  EXPECT_TRUE(m1.empty() || m2.empty()) << "the second taker found nothing left to do";
  std::set<std::string> all(m1.begin(), m1.end());
  all.insert(m2.begin(), m2.end());
  EXPECT_EQ(all.size(), 300u);
  EXPECT_EQ(rc->cmd({"ZSCORE", raw.members(), "corpse"}).type, RedisReply::Type::nil);
  EXPECT_EQ(count_of(*rc, "bulk", "corpse", &raw), 0);
  EXPECT_EQ(count_of(*rc, "bulk", "taker-1", &raw) + count_of(*rc, "bulk", "taker-2", &raw), 300);
}

// proves: W2
TEST_F(RedisCoordinatorTest, ALargeDeadMemberIsTakenOverInBoundedBatches) {
  // The script moves at most the batch and says there is more.
  cluster::detail::KeyNames raw("raw");
  auto rc = client();
  rc->cmd({"HSET", raw.config(), "liveness_threshold_ms", "1000", "takeover_margin_ms", "500"});
  fake_member(*rc, "taker", 0, "s1", &raw);
  fake_member(*rc, "corpse", 60000, "s3", &raw);
  fake_assignments(*rc, "bulk", "corpse", "b", 0, 100, &raw);
  auto r = run_script(*rc, Script::takeover, {"taker", "s1", "64", "corpse"}, &raw);
  ASSERT_EQ(r.elements.at(0).str, "OK") << r.describe();
  EXPECT_EQ(r.elements.at(1).integer, 1);  // more to do
  EXPECT_EQ(r.elements.at(2).elements.size(), 64u);
  EXPECT_EQ(rc->cmd({"ZSCORE", raw.members(), "corpse"}).type, RedisReply::Type::string);  // still a member
  auto r2 = run_script(*rc, Script::takeover, {"taker", "s1", "64", "corpse"}, &raw);
  EXPECT_EQ(r2.elements.at(1).integer, 0);
  EXPECT_EQ(r2.elements.at(2).elements.size(), 36u);
  EXPECT_EQ(rc->cmd({"ZSCORE", raw.members(), "corpse"}).type, RedisReply::Type::nil);

  // A coordinator keeps going, batch after batch, until the member is gone.
  auto s = settings("node-a");
  s.takeover_batch = 64;
  auto& a = start_node(make_node(s, {}));
  fake_member(*rc, "corpse", 60000, "s3");
  fake_assignments(*rc, "bulk", "corpse", "b", 0, 500);
  ASSERT_TRUE(wait_until(
      [&] {
        return rc->cmd({"ZSCORE", keys.members(), "corpse"}).type == RedisReply::Type::nil;
      },
      20s));
  EXPECT_EQ(count_of(*rc, "bulk", "node-a"), 500);
  EXPECT_EQ(count_of(*rc, "bulk", "corpse"), 0);
  std::lock_guard lk(a.rec->mu);
  EXPECT_GE(std::count_if(a.rec->log.begin(), a.rec->log.end(),
                          [](const std::string& l) {
                            return l.find("took over 64 units of expired member 'corpse'") !=
                                   std::string::npos;
                          }),
            7);
}

}  // namespace
}  // namespace troupe::test
