// The coordinator's bulk reads (groups, placements) against a real
// redis-server: what they return is what the placement scripts stored,
// 10,000 units come back in one round trip, and entries that do not read
// are skipped rather than trusted.

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

// What the bulk read shows is, unit for unit, what the placement scripts
// stored: owner, epoch, update time and a hand-off in progress.
// proves: W9
TEST_F(RedisCoordinatorTest, PlacementsShowEveryUnitWithTheOwnerAndEpochTheScriptsStored) {
  auto& a = add_node("node-a", {});
  auto& b = add_node("node-b", {});
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 2; }));
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(await(a->assign("devices", "d" + std::to_string(i), "spec")).ok());
  ASSERT_TRUE(await(b->assign("other", "x", "")).ok());
  // A forced move while the old owner is live leaves a hand-off for the
  // new owner to wait on (nobody runs "devices", so it stays).
  auto moved = await(a->relocate("devices", "d3", true));
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();

  auto groups = await(b->groups());
  ASSERT_TRUE(groups.ok()) << groups.error().to_string();
  EXPECT_EQ(*groups, (std::vector<std::string>{"devices", "other"}));

  auto all = await(b->placements("devices"));
  ASSERT_TRUE(all.ok()) << all.error().to_string();
  ASSERT_EQ(all->size(), 12u);
  std::map<std::string, int> per_owner;
  for (const auto& p : *all) {
    auto one = await(a->assignment("devices", p.unit));
    ASSERT_TRUE(one.ok() && one->has_value()) << p.unit;
    EXPECT_EQ(p.group, "devices");
    EXPECT_EQ(p.owner, (*one)->owner) << p.unit;
    EXPECT_EQ(p.epoch, (*one)->epoch) << p.unit;
    EXPECT_EQ(p.updated, (*one)->updated) << p.unit;
    EXPECT_EQ(p.handing_off_from, (*one)->handing_off_from) << p.unit;
    EXPECT_EQ(p.handoff_epoch, (*one)->handoff_epoch) << p.unit;
    EXPECT_TRUE(p.spec.empty()) << "the bulk read leaves specs out";
    ++per_owner[p.owner];
  }
  // Six each, then d3 moved from one to the other.
  EXPECT_EQ(per_owner.size(), 2u);
  EXPECT_EQ(std::abs(per_owner["node-a"] - per_owner["node-b"]), 2);
  auto d3 = std::find_if(all->begin(), all->end(), [](const auto& p) { return p.unit == "d3"; });
  EXPECT_EQ(d3->owner, moved->assignment.owner);
  EXPECT_EQ(d3->epoch, moved->assignment.epoch);
  EXPECT_FALSE(d3->handing_off_from.empty()) << "d3's hand-off shows";
  EXPECT_NE(d3->handing_off_from, d3->owner);
  EXPECT_TRUE(std::is_sorted(all->begin(), all->end(),
                             [](const auto& x, const auto& y) { return x.unit < y.unit; }));

  auto none = await(b->placements("nothing-here"));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

// 10,000 units in one group: one MULTI/EXEC of two HGETALLs, whatever the
// count (no script runs HGETALL, so INFO's count is the read's own).
// proves: W9
TEST_F(RedisCoordinatorTest, TenThousandUnitsAreReadInOneRoundTripInBoundedTime) {
  auto& a = add_node("node-a", {});
  auto c = client();
  fake_assignments(*c, "fleet", "node-a", "dev-", 0, 10000);
  const long long hgetall = calls_of(*c, "hgetall"), exec = calls_of(*c, "exec"), hscan = calls_of(*c, "hscan");
  const auto began = Clock::now();
  auto all = await(a->placements("fleet"));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began);
  ASSERT_TRUE(all.ok()) << all.error().to_string();
  ASSERT_EQ(all->size(), 10000u);
  EXPECT_EQ(all->front().unit, "dev-0");
  EXPECT_EQ(all->back().owner, "node-a");
  EXPECT_LT(took, 2000ms) << "10,000 units took " << took.count() << " ms";
  std::printf("placements of 10,000 units: %lld ms\n", static_cast<long long>(took.count()));
  EXPECT_EQ(calls_of(*c, "hgetall") - hgetall, 2);
  EXPECT_EQ(calls_of(*c, "exec") - exec, 1);
  EXPECT_EQ(calls_of(*c, "hscan") - hscan, 0);
}

// Entries written by someone else are skipped with one warning each; a
// group name no group may have is no group.
TEST_F(RedisCoordinatorTest, PlacementsSkipEntriesThatDoNotReadAndSayWhichOnce) {
  auto& a = add_node("node-a", {});
  auto c = client();
  fake_assignment(*c, "fleet", "good", "node-a", 7);
  c->cmd({"HSET", keys.group("fleet", "assign"), "words", "7 node-a"});
  c->cmd({"HSET", keys.group("fleet", "assign"), "epoch", "x node-a 1"});
  c->cmd({"HSET", keys.group("fleet", "assign"), "owner", "7 bad/owner 1"});
  c->cmd({"HSET", keys.group("fleet", "assign"), "when", "7 node-a 99999999999999999999"});
  c->cmd({"HSET", keys.group("fleet", "assign"), "blank unit", "7 node-a 1"});
  c->cmd({"HSET", keys.group("fleet", "assign"), "hand", "7 node-a 1"});
  c->cmd({"HSET", keys.group("fleet", "handoff"), "hand", "node-b"});
  c->cmd({"SADD", keys.groups(), "bad group!"});
  for (int round = 0; round < 2; ++round) {
    auto all = await(a->placements("fleet"));
    ASSERT_TRUE(all.ok()) << all.error().to_string();
    ASSERT_EQ(all->size(), 1u);
    EXPECT_EQ(all->front().unit, "good");
    EXPECT_EQ(all->front().epoch, 7u);
  }
  std::lock_guard lk(a.rec->mu);
  EXPECT_EQ(std::count_if(a.rec->log.begin(), a.rec->log.end(),
                          [](const std::string& l) { return l.find("skipping unit 'epoch'") != std::string::npos; }),
            1)
      << "one warning per entry, however often it is read";
  auto groups = await(a->groups());
  ASSERT_TRUE(groups.ok());
  EXPECT_EQ(*groups, std::vector<std::string>{"fleet"});
}

TEST_F(RedisCoordinatorTest, BulkReadsRefuseBadNamesAndSayWhenRedisIsAway) {
  auto& idle = make_node(settings("node-idle"), {});
  auto early = await(idle->placements("fleet"));
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code(), ErrorCode::not_ready);
  EXPECT_EQ(await(idle->groups()).error().code(), ErrorCode::not_ready);

  auto& a = add_node("node-a", {});
  for (const std::string& bad : std::vector<std::string>{"", "has space", std::string(200, 'g')}) {
    auto r = await(a->placements(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << bad;
  }
  redis->stop();
  auto away = await(a->placements("fleet"));
  ASSERT_FALSE(away.ok());
  EXPECT_EQ(away.error().code(), ErrorCode::coordination_failed) << away.error().to_string();
  EXPECT_NE(away.error().message().find("127.0.0.1:" + std::to_string(redis->port())), std::string::npos)
      << away.error().message();
  auto g = await(a->groups());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code(), ErrorCode::coordination_failed);
  redis->start();
}

}  // namespace
}  // namespace troupe::test
