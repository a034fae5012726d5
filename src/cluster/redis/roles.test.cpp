// Roles (SPEC W8): a group that names roles is placed only on members that
// are live, not draining and hold one of them, by every script that
// places (assign, relocate, rebalance, takeover, leave, a hand-off's
// relocation); members must agree on a group's roles.

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

using cluster::PlacementOutcome;

class RolesTest : public RedisCoordinatorTest {
 protected:
  // A node holding `roles`, declaring that only "worker" may host "workers".
  TestNode& add_member(const std::string& id, std::vector<std::string> roles,
                       std::vector<std::string> group_roles = {"worker"}) {
    auto s = settings(id);
    s.roles = std::move(roles);
    s.group_roles["workers"] = std::move(group_roles);
    return start_node(make_node(s));
  }
  std::map<std::string, long long> counts(RedisTestClient& c, const std::vector<std::string>& ids) {
    std::map<std::string, long long> out;
    for (const auto& id : ids) out[id] = count_of(c, "workers", id);
    return out;
  }
};

// proves: W8
TEST_F(RolesTest, AssignRelocateAndRebalanceChooseOnlyMembersHoldingTheGroupsRole) {
  auto& a = add_member("node-a", {"worker"});
  add_member("node-b", {"manager", "worker"});
  auto& c = add_member("node-c", {"manager"});
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 3; }));
  // Each member is seen with the roles it declared, sorted.
  std::map<std::string, std::vector<std::string>> seen;
  for (const auto& m : a->members()) seen[m.id] = m.roles;
  EXPECT_EQ(seen["node-b"], (std::vector<std::string>{"manager", "worker"}));
  EXPECT_EQ(seen["node-c"], (std::vector<std::string>{"manager"}));
  for (int i = 0; i < 20; ++i) {
    auto r = await(c->assign("workers", "w" + std::to_string(i), ""));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_NE(r->assignment.owner, "node-c");
  }
  auto redis_client = client();
  auto n = counts(*redis_client, {"node-a", "node-b", "node-c"});
  EXPECT_EQ(n["node-c"], 0);
  EXPECT_EQ(n["node-a"], 10);
  EXPECT_EQ(n["node-b"], 10);
  // node-c is the least loaded, yet a forced relocation passes it by.
  auto moved = await(a->relocate("workers", "w0", true));
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  EXPECT_EQ(moved->outcome, PlacementOutcome::relocated);
  EXPECT_NE(moved->assignment.owner, "node-c");
  // Rebalance evens node-a and node-b (11 and 9, or 9 and 11) and gives
  // node-c nothing.
  auto report = await(a->rebalance("workers"));
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  EXPECT_EQ(report->moves.size(), 1u);
  for (const auto& m : report->moves) EXPECT_NE(m.to, "node-c");
  n = counts(*redis_client, {"node-a", "node-b", "node-c"});
  EXPECT_EQ(n["node-a"], 10);
  EXPECT_EQ(n["node-b"], 10);
  EXPECT_EQ(n["node-c"], 0);
  EXPECT_TRUE(wait_until([&] { return c.rec->running_now().empty() && a.rec->running_now().size() == 10; }))
      << a.rec->running_now().size() << " " << c.rec->running_now().size();
}

// proves: W8
TEST_F(RolesTest, NoMemberHoldingTheRoleIsNoAcceptableWorkerLoggedAsAnError) {
  auto& a = add_member("node-a", {"manager"});
  add_member("node-b", {});
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 2; }));
  auto r = await(a->assign("workers", "w1", ""));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::unreachable);
  EXPECT_EQ(r.error().message().rfind("NO_ACCEPTABLE_WORKER", 0), 0u) << r.error().message();
  EXPECT_NE(r.error().message().find("role worker"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("2 live members"), std::string::npos) << r.error().message();
  EXPECT_EQ(a.rec->level_of("NO_ACCEPTABLE_WORKER"), CoordinatorLogLevel::error);
  // A unit already on node-a (placed when it held the role) has nowhere to go.
  auto c = client();
  fake_assignment(*c, "workers", "w2", "node-a", 1);
  auto moved = await(a->relocate("workers", "w2", true));
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.error().message().rfind("NO_OTHER_ACCEPTABLE_WORKER", 0), 0u) << moved.error().message();
  EXPECT_EQ(a.rec->level_of("NO_OTHER_ACCEPTABLE_WORKER"), CoordinatorLogLevel::error);
  auto rebalanced = await(a->rebalance("workers"));
  ASSERT_FALSE(rebalanced.ok());
  EXPECT_EQ(rebalanced.error().message().rfind("NO_ACCEPTABLE_WORKER", 0), 0u) << rebalanced.error().message();
  EXPECT_EQ(owner_in_redis(*c, "workers", "w2"), "node-a");
}

// proves: W8
TEST_F(RolesTest, AUnitWhoseLiveOwnerHoldsNoRoleAnyMoreIsMovedByRelocateAndRebalance) {
  auto& a = add_member("node-a", {"worker"});
  add_member("node-b", {"worker"});
  add_member("node-c", {"manager"});
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 3; }));
  // Placed on node-c when it held the role; it came back without it.
  auto c = client();
  fake_assignments(*c, "workers", "node-c", "u", 0, 6);
  fake_assignments(*c, "workers", "node-a", "v", 0, 2);
  auto r = await(a->relocate("workers", "u0", false));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->outcome, PlacementOutcome::relocated);
  EXPECT_NE(r->assignment.owner, "node-c");
  // A live owner with the role keeps its unit.
  auto kept = await(a->relocate("workers", "v0", false));
  ASSERT_TRUE(kept.ok()) << kept.error().to_string();
  EXPECT_EQ(kept->outcome, PlacementOutcome::no_need_to_relocate);
  // 8 units over the 2 eligible members, the 5 left on node-c moved first:
  // the fewest moves that leave node-a and node-b with 4 each.
  auto report = await(a->rebalance("workers"));
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  std::size_t from_c = 0;
  for (const auto& m : report->moves) {
    EXPECT_NE(m.to, "node-c");
    if (m.from == "node-c") ++from_c;
  }
  EXPECT_EQ(from_c, 5u);
  EXPECT_EQ(report->moves.size(), 5u);
  auto n = counts(*c, {"node-a", "node-b", "node-c"});
  EXPECT_EQ(n["node-c"], 0);
  EXPECT_EQ(n["node-a"], 4);
  EXPECT_EQ(n["node-b"], 4);
}

// proves: W8
TEST_F(RolesTest, TakeoverAndALeaveHandUnitsOnlyToMembersHoldingTheRole) {
  auto& a = add_member("node-a", {"worker"});
  auto& b = add_member("node-b", {"worker"});
  auto& c = add_member("node-c", {});
  auto& d = add_member("node-d", {"worker"});
  ASSERT_TRUE(wait_until([&] { return d->members().size() == 4; }));
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(await(c->assign("workers", "w" + std::to_string(i), "")).ok());
  auto redis_client = client();
  EXPECT_EQ(count_of(*redis_client, "workers", "node-c"), 0);
  crash(a);
  ASSERT_TRUE(wait_until([&] { return count_of(*redis_client, "workers", "node-a") == 0; }, 15s));
  EXPECT_EQ(count_of(*redis_client, "workers", "node-c"), 0);
  EXPECT_EQ(count_of(*redis_client, "workers", "node-b") + count_of(*redis_client, "workers", "node-d"), 12);
  ASSERT_TRUE(await(b->stop()).ok());
  EXPECT_EQ(count_of(*redis_client, "workers", "node-c"), 0);
  EXPECT_EQ(count_of(*redis_client, "workers", "node-d"), 12);
  EXPECT_TRUE(wait_until([&] { return d.rec->running_now().size() == 12; }));
  EXPECT_TRUE(c.rec->running_now().empty());
}

// proves: W8
TEST_F(RolesTest, APlannedHandOffMovesUnitsOnlyToMembersHoldingTheRole) {
  auto& a = add_member("node-a", {"worker"});
  auto& c = add_member("node-c", {"manager"});
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(await(a->assign("workers", "w" + std::to_string(i), "")).ok());
  add_member("node-b", {"worker"});
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 3; }));
  auto report = await(a->hand_off(2), 10s);
  ASSERT_TRUE(report.ok()) << report.error().to_string();
  EXPECT_EQ(report->moved, 6u);
  auto redis_client = client();
  EXPECT_EQ(count_of(*redis_client, "workers", "node-b"), 6);
  EXPECT_EQ(count_of(*redis_client, "workers", "node-c"), 0);
  EXPECT_TRUE(c.rec->running_now().empty());
}

// proves: W8
TEST_F(RolesTest, MembersDisagreeingOnAGroupsRolesAreRefusedAndAFullRestartMayChangeThem) {
  auto& a = add_member("node-a", {"worker"}, {"worker"});
  // Refused at start, naming the group and both lists; never a member.
  auto& b = make_node([&] {
    auto s = settings("node-b");
    s.group_roles["workers"] = {"gpu", "worker"};
    return s;
  }());
  auto r = await(b->start());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  const auto& m = r.error().message();
  EXPECT_NE(m.find("'workers'"), std::string::npos) << m;
  EXPECT_NE(m.find("roles worker may"), std::string::npos) << m;
  EXPECT_NE(m.find("roles gpu,worker"), std::string::npos) << m;
  EXPECT_EQ(a->members().size(), 1u);
  // A group declared after start-up is checked the same way.
  ASSERT_TRUE(await(a->declare_roles("reports", {"manager"})).ok());
  auto& e = add_member("node-e", {"worker"});
  auto late = await(e->declare_roles("reports", {}));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(late.error().message().find("any member"), std::string::npos) << late.error().message();
  EXPECT_FALSE(await(e->declare_roles("reports", {"bad role"})).ok());
  // With every member that declared it gone, new roles replace the old.
  ASSERT_TRUE(await(a->stop()).ok());
  ASSERT_TRUE(await(e->stop()).ok());
  auto& b2 = make_node([&] {
    auto s = settings("node-b2");
    s.roles = {"gpu"};
    s.group_roles["workers"] = {"gpu", "worker"};
    return s;
  }());
  auto again = await(b2->start());
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  auto c = client();
  EXPECT_EQ(c->cmd({"HGET", keys.group_roles(), "workers"}).str, "gpu,worker node-b2");
  ASSERT_TRUE(await(b2->assign("workers", "w1", "")).ok());
}

// proves: W8
TEST_F(RolesTest, ABadRoleIsRefusedAtCreateNamingIt) {
  auto s = settings("node-a");
  s.roles = {"worker", "gp u"};
  auto r = Coordinator::create(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("'gp u'"), std::string::npos) << r.error().message();
  s.roles = {"worker"};
  s.group_roles["workers"] = {std::string(65, 'r')};
  r = Coordinator::create(s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("group_roles['workers']"), std::string::npos) << r.error().message();
  s.group_roles["workers"] = {""};
  EXPECT_FALSE(Coordinator::create(s).ok());
}

}  // namespace
}  // namespace troupe::test
