// The coordinator under bulk placement traffic, against a real
// redis-server: a rebalance of thousands of units costs no member its
// lease, releases go out in batches with one notice each, a `released`
// notice makes only a node waiting for one of its units read again, and a
// node whose command traffic is stuck keeps its lease on the heartbeat's
// own connection.

#include <gtest/gtest.h>

#include <thread>

#include "coordinator_test_support.hpp"
#include "tcp_test_proxy.hpp"

namespace troupe::test {
namespace {

// 3,000 units on two nodes, then a third joins and the group is balanced:
// 1,000 moves, each unit stopped before it starts elsewhere, nobody fenced,
// and the running views match what each node runs.
// proves: W6, W7
TEST_F(RedisCoordinatorTest, ARebalanceOfThousandsOfUnitsCompletesWithoutAnyMemberBeingFenced) {
  auto& a = add_node("node-a");
  auto& b = add_node("node-b");
  auto c = client();
  fake_assignments(*c, "workers", "node-a", "u-", 0, 1500);
  fake_assignments(*c, "workers", "node-b", "u-", 1500, 1500);
  c->cmd({"PUBLISH", keys.events(), "changed workers"});
  ASSERT_TRUE(wait_until(
      [&] { return a.rec->running_now().size() == 1500 && b.rec->running_now().size() == 1500; }, 30s));
  auto& n3 = add_node("node-c");
  const long long publishes = calls_of(*c, "publish");

  auto moves = await(a->rebalance_all("workers"), 30s);
  ASSERT_TRUE(moves.ok()) << moves.error().to_string();
  EXPECT_EQ(moves->size(), 1000u);
  ASSERT_TRUE(wait_until(
      [&] {
        return a.rec->running_now().size() == 1000 && b.rec->running_now().size() == 1000 &&
               n3.rec->running_now().size() == 1000;
      },
      30s));
  for (auto* n : {&a, &b, &n3}) {
    EXPECT_EQ(n->rec->fenced_count(), 0) << n->id << " was fenced during the rebalance";
    ASSERT_TRUE(wait_until([&] { return (*n)->running("workers") == n->rec->running_now(); }))
        << n->id << "'s running view differs from what it runs";
  }
  for (const auto& m : *moves) EXPECT_EQ(fleet.starts(m.unit), 2u) << m.unit;
  // The 1,000 hand-offs were released in batches, one notice each (the
  // rest: the rebalance's `moved`).
  EXPECT_LT(calls_of(*c, "publish") - publishes, 100);
}

// proves: W7
TEST_F(RedisCoordinatorTest, AReleasedNoticeMakesOnlyANodeWaitingForOneOfItsUnitsReadAgain) {
  auto quiet = [&](const std::string& id) {
    auto s = settings(id);
    s.sync_interval = 60s;  // no periodic read during the count
    return s;
  };
  auto& a = start_node(make_node(quiet("node-a")));
  auto& b = start_node(make_node(quiet("node-b")));
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(await(a->assign("workers", "w" + std::to_string(i), "")).ok());
  ASSERT_TRUE(wait_until(
      [&] { return a.rec->running_now().size() + b.rec->running_now().size() == 20; }));
  auto c = client();
  std::this_thread::sleep_for(300ms);  // reads the assigns caused are over
  // my_units is the only script that reads a member's unit set with
  // SMEMBERS while nothing is placed.
  const long long reads = calls_of(*c, "smembers");
  for (int i = 0; i < 50; ++i)
    c->cmd({"PUBLISH", keys.events(), "released workers w" + std::to_string(i % 20) + " other"});
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(calls_of(*c, "smembers") - reads, 0) << "nobody waits for a hand-off, yet nodes read again";

  // The count does see reads: a `changed` notice makes both nodes read.
  c->cmd({"PUBLISH", keys.events(), "changed workers"});
  std::this_thread::sleep_for(300ms);
  const long long after_changed = calls_of(*c, "smembers");
  EXPECT_EQ(after_changed - reads, 2);
}

// The connections of node-a to Redis all stall but the heartbeat's: its
// commands time out again and again, yet its lease holds, it stays
// unfenced, and nobody takes its units.
// proves: W7
TEST_F(RedisCoordinatorTest, ANodeWhoseCommandTrafficIsStuckKeepsItsLeaseOnTheHeartbeatConnection) {
  TcpTestProxy proxy(redis->port());
  // Accepted in this order: commands, notices, heartbeats.
  auto& a = start_node(make_node(settings("node-a", proxy.port())));
  auto& b = add_node("node-b");
  ASSERT_TRUE(await(b->sync("workers", [] {
                  cluster::DesiredSet d;
                  for (int i = 0; i < 6; ++i) d.emplace("w" + std::to_string(i), "");
                  return Result<cluster::DesiredSet>(d);
                })).ok());
  ASSERT_TRUE(
      wait_until([&] { return a.rec->running_now().size() == 3 && b.rec->running_now().size() == 3; }));
  auto a_units = a.rec->running_now();
  std::this_thread::sleep_for(1600ms);  // node-b may take over from here on

  proxy.stall_all_but(2);
  auto during = await(a->assign("workers", "x", ""), 5s);
  ASSERT_FALSE(during.ok()) << "the commands connection is stalled";
  std::this_thread::sleep_for(3000ms);  // three liveness thresholds
  EXPECT_EQ(a.rec->fenced_count(), 0) << "the heartbeat connection was not stalled";
  EXPECT_FALSE(a->is_fenced());
  EXPECT_EQ(a.rec->running_now(), a_units);
  for (const auto& [unit, epoch] : a_units) EXPECT_EQ(fleet.runner(unit), "node-a") << unit;

  proxy.heal();
  ASSERT_TRUE(wait_until([&] { return await(a->assign("workers", "x", ""), 2s).ok(); }, 10s));
  EXPECT_EQ(a.rec->fenced_count(), 0);
}

}  // namespace
}  // namespace troupe::test
