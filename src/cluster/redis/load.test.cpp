// The coordinator under bulk placement traffic, against a real
// redis-server: a rebalance of thousands of units costs no member its
// lease, and each node's running view follows every unit it starts and
// stops.

#include <gtest/gtest.h>

#include "coordinator_test_support.hpp"

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
}

}  // namespace
}  // namespace troupe::test
