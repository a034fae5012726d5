// Rebalance all: max - min <= 1 over live members with the fewest moves,
// every move handed off from its live owner.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "coordinator_test_support.hpp"

namespace troupe::test {
namespace {

// Where seed 001's greedy algorithm leaves [10,0,0,0,0,0] at [5,1,1,1,1,1],
// this ends at [2,2,2,2,1,1] in 8 moves (the surplus over the targets).
// proves: W6
TEST_F(RedisCoordinatorTest, TenUnitsAllOnOneOfSixMembersTakeEightMovesToEvenOut) {
  auto& a = add_node("node-a", {"workers"}, 50ms);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(await(a->assign("workers", "w" + std::to_string(i), "")).ok());
  ASSERT_TRUE(wait_until([&] { return a.rec->running_now().size() == 10; }));
  std::vector<TestNode*> all{&a};
  for (const char* id : {"node-b", "node-c", "node-d", "node-e", "node-f"}) all.push_back(&add_node(id));
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 6; }));
  auto moves = await(a->rebalance_all("workers"));
  ASSERT_TRUE(moves.ok()) << moves.error().to_string();
  EXPECT_EQ(moves->size(), 8u);
  std::set<std::uint64_t> epochs;
  for (const auto& m : *moves) {
    EXPECT_EQ(m.from, "node-a");
    EXPECT_NE(m.to, "node-a");
    epochs.insert(m.epoch);
  }
  EXPECT_EQ(epochs.size(), 8u);
  auto c = client();
  std::vector<long long> counts;
  for (auto* n : all) counts.push_back(count_of(*c, "workers", n->id));
  std::sort(counts.rbegin(), counts.rend());
  EXPECT_EQ(counts, (std::vector<long long>{2, 2, 2, 2, 1, 1}));
  // Every node ends up running exactly its share; each moved unit started on
  // its new owner only after node-a had stopped it.
  ASSERT_TRUE(wait_until([&] {
    std::size_t total = 0;
    for (auto* n : all) total += n->rec->running_now().size();
    return total == 10 && a.rec->running_now().size() == 2;
  }));
  for (const auto& m : *moves) {
    Clock::time_point stopped = Clock::time_point::max(), started = Clock::time_point::min();
    for (const auto& e : fleet.events()) {
      if (e.unit == m.unit && e.node == "node-a" && e.kind == "stopped") stopped = std::min(stopped, e.at);
      if (e.unit == m.unit && e.node == m.to && e.kind == "start") started = e.at;
    }
    EXPECT_LT(stopped, started) << m.unit;
  }
  // Balanced already: nothing moves.
  auto again = await(a->rebalance_all("workers"));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->empty());
}

// Seed 001's per-call cap: at most max_moves units move in one call, the
// report counts the rest, and calls until none is left end where one
// uncapped call would.
// proves: W6
TEST_F(RedisCoordinatorTest, ARebalanceWithAMoveCapMovesAtMostThatManyAndSaysHowManyAreLeft) {
  auto& a = add_node("node-a");
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(await(a->assign("workers", "w" + std::to_string(i), "")).ok());
  add_node("node-b");
  ASSERT_TRUE(wait_until([&] { return a->members().size() == 2; }));
  auto first = await(a->rebalance("workers", 2));
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_EQ(first->moves.size(), 2u);
  EXPECT_EQ(first->moves_left, 3u);  // 10/0 needs 5 moves in all
  auto second = await(a->rebalance("workers", 2));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->moves.size(), 2u);
  EXPECT_EQ(second->moves_left, 1u);
  auto rest = await(a->rebalance("workers"));
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->moves.size(), 1u);
  EXPECT_EQ(rest->moves_left, 0u);
  auto c = client();
  EXPECT_EQ(count_of(*c, "workers", "node-a"), 5);
  EXPECT_EQ(count_of(*c, "workers", "node-b"), 5);
  auto none = await(a->rebalance("workers", 2));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->moves.empty());
  EXPECT_EQ(none->moves_left, 0u);
}

// For random placements over live and non-live members: the moves equal the
// total surplus over the targets (q + 1 for the r members holding the most,
// q for the rest), the result has max - min <= 1 over live members, and
// units of members that are not live stay where they are.
// proves: W6, W7
TEST_F(RedisCoordinatorTest, RebalanceMovesExactlyTheSurplusOverTargetsForRandomPlacements) {
  auto s = settings("node-a");
  s.heartbeat_interval = 500ms;
  s.liveness_threshold = 30s;
  s.takeover_margin = 30s;
  auto& a = start_node(make_node(s, {}));
  auto c = client();
  std::mt19937 rng(20240521);
  std::uint64_t last_epoch = 0;
  std::vector<std::string> previous;
  for (int round = 0; round < 200; ++round) {
    for (const auto& id : previous) {
      c->cmd({"ZREM", keys.members(), id});
      c->cmd({"HDEL", keys.member_info(), id});
    }
    previous.clear();
    std::string group = "prop/" + std::to_string(round);
    int live = std::uniform_int_distribution<int>(0, 7)(rng);
    int dead = std::uniform_int_distribution<int>(0, 2)(rng);
    std::map<std::string, long long> before;  // live members, node-a included
    before["node-a"] = 0;
    int unit_no = 0;
    auto place = [&](const std::string& owner, int n) {
      fake_assignments(*c, group, owner, "u", unit_no, n);
      unit_no += n;
    };
    for (int i = 0; i < live; ++i) {
      std::string id = "live-" + std::to_string(i);
      fake_member(*c, id, 0);
      previous.push_back(id);
      int n = std::uniform_int_distribution<int>(0, 12)(rng);
      place(id, n);
      before[id] = n;
    }
    int a_units = std::uniform_int_distribution<int>(0, 5)(rng);
    place("node-a", a_units);
    before["node-a"] = a_units;
    std::map<std::string, long long> dead_counts;
    for (int i = 0; i < dead; ++i) {
      std::string id = "gone-" + std::to_string(i);
      fake_member(*c, id, 31000);  // past the threshold
      previous.push_back(id);
      int n = std::uniform_int_distribution<int>(1, 4)(rng);
      place(id, n);
      dead_counts[id] = n;
    }
    // Expected moves: the surplus over the targets.
    long long n = 0;
    std::vector<std::pair<long long, std::string>> rows;
    for (const auto& [id, cnt] : before) {
      n += cnt;
      rows.emplace_back(cnt, id);
    }
    std::sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    long long k = static_cast<long long>(rows.size()), q = n / k, r = n % k, surplus = 0;
    for (long long i = 0; i < k; ++i)
      surplus += std::max(0LL, rows[static_cast<std::size_t>(i)].first - (i < r ? q + 1 : q));

    auto moves = await(a->rebalance_all(group));
    ASSERT_TRUE(moves.ok()) << moves.error().to_string();
    EXPECT_EQ(static_cast<long long>(moves->size()), surplus) << "round " << round;
    long long lo = 1 << 30, hi = -1, total = 0;
    for (const auto& [id, cnt] : before) {
      long long now = count_of(*c, group, id);
      lo = std::min(lo, now);
      hi = std::max(hi, now);
      total += now;
    }
    EXPECT_LE(hi - lo, 1) << "round " << round;
    EXPECT_EQ(total, n);
    for (const auto& [id, cnt] : dead_counts) EXPECT_EQ(count_of(*c, group, id), cnt) << "round " << round;
    std::set<std::string> moved;
    for (const auto& m : *moves) {
      EXPECT_TRUE(moved.insert(m.unit).second) << "a unit moved twice";
      EXPECT_GT(m.epoch, last_epoch);
      last_epoch = m.epoch;
      EXPECT_EQ(owner_in_redis(*c, group, m.unit), m.to);
      EXPECT_GT(before[m.from], before[m.to]);
    }
  }
}

// How many of a node's log lines hold `needle`.
std::size_t lines_with(TestNode& n, const std::string& needle) {
  std::lock_guard lk(n.rec->mu);
  return static_cast<std::size_t>(
      std::count_if(n.rec->log.begin(), n.rec->log.end(),
                    [&](const std::string& l) { return l.find(needle) != std::string::npos; }));
}

// A rolling update runs two versions side by side: what rebalance would
// move onto an old member moves again when that member is updated, so it
// waits until one version remains, and says which versions it waits on.
TEST_F(RedisCoordinatorTest, WhileTwoAppVersionsAreLiveRebalanceMovesNothingUntilTheOldOneLeaves) {
  auto versioned = [&](const std::string& id, const std::string& version) -> TestNode& {
    auto s = settings(id);
    s.app_version = version;
    return start_node(make_node(std::move(s)));
  };
  auto& b = versioned("node-b", "1.10.0");
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(await(b->assign("workers", "w" + std::to_string(i), "")).ok());
  auto& a = versioned("node-a", "1.9.0");
  versioned("node-c", "1.10.0");
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 3; }));
  auto c = client();
  for (int round = 0; round < 2; ++round) {
    auto r = await(b->rebalance("workers"));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r->outcome, cluster::RebalanceOutcome::versions_mixed);
    EXPECT_TRUE(r->moves.empty());
    EXPECT_EQ(r->live_versions, (std::vector<std::string>{"1.9.0", "1.10.0"}));  // oldest first
  }
  auto plain = await(b->rebalance_all("workers"));
  ASSERT_TRUE(plain.ok()) << plain.error().to_string();
  EXPECT_TRUE(plain->empty());
  EXPECT_EQ(count_of(*c, "workers", "node-b"), 6);
  EXPECT_EQ(count_of(*c, "workers", "node-c"), 0);
  // Three calls, one state: one line.
  EXPECT_EQ(lines_with(b,
                       "rebalancing waits until one app version remains: the live members run app versions "
                       "1.9.0 and 1.10.0"),
            1u);

  // The old member leaves: one version remains and the units spread.
  ASSERT_TRUE(await(a->stop()).ok());
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 2; }));
  auto r = await(b->rebalance("workers"));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->outcome, cluster::RebalanceOutcome::rebalanced);
  EXPECT_TRUE(r->live_versions.empty());
  ASSERT_EQ(r->moves.size(), 3u);
  for (const auto& m : r->moves) EXPECT_EQ(m.to, "node-c");
  EXPECT_EQ(count_of(*c, "workers", "node-b"), 3);
  EXPECT_EQ(count_of(*c, "workers", "node-c"), 3);
  EXPECT_EQ(lines_with(b, "rebalancing resumes"), 1u);
  ASSERT_TRUE(await(b->rebalance("workers")).ok());
  EXPECT_EQ(lines_with(b, "rebalancing resumes"), 1u);
  EXPECT_EQ(lines_with(b, "rebalancing waits"), 1u);
}

// A member that declares no version is not of any declared one: next to a
// member of version 2.0 the versions are mixed. Once it comes back as 2.0
// rebalance spreads the units again.
TEST_F(RedisCoordinatorTest, AMemberWithoutAVersionAndOneWithAVersionAreMixedForRebalance) {
  auto s = settings("node-b");
  s.app_version = "2.0";
  auto& b = start_node(make_node(std::move(s)));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(await(b->assign("workers", "w" + std::to_string(i), "")).ok());
  auto& d = add_node("node-d");
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 2; }));
  auto r = await(b->rebalance("workers"));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->outcome, cluster::RebalanceOutcome::versions_mixed);
  EXPECT_EQ(r->live_versions, (std::vector<std::string>{"", "2.0"}));
  EXPECT_TRUE(r->moves.empty());
  EXPECT_EQ(lines_with(b, "app versions (none) and 2.0"), 1u);

  ASSERT_TRUE(await(d->stop()).ok());
  auto again = settings("node-d");
  again.app_version = "2.0";
  start_node(make_node(std::move(again)));
  ASSERT_TRUE(wait_until([&] { return b->members().size() == 2; }));
  auto moved = await(b->rebalance("workers"));
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  EXPECT_EQ(moved->outcome, cluster::RebalanceOutcome::rebalanced);
  EXPECT_EQ(moved->moves.size(), 2u);
  auto c = client();
  EXPECT_EQ(count_of(*c, "workers", "node-d"), 2);
}

}  // namespace
}  // namespace troupe::test
