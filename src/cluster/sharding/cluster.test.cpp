// Shard regions on nodes placed through a real redis-server (started by the
// test on its own port), in one process: routing, rebalance with hand-off,
// graceful leave, and self-fencing while Redis is away.

#include "troupe/cluster/cluster.hpp"

#include <atomic>
#include <functional>
#include <mutex>
#include <set>

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../redis/redis_test_server.hpp"
#include "in_process_nodes.hpp"
#include "sharding_test_support.hpp"
#include "troupe/cluster/cluster_jobs.hpp"
#include "troupe/cluster/cluster_lock.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using test::Account;

struct ClusterNode {
  std::string id;
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<Cluster> cluster;
  std::optional<ShardRegion<Account>> region;
  std::optional<KeyedLock> lock;
};

class ClusterSharding : public ::testing::Test {
 protected:
  troupe::test::RedisTestServer redis;
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::vector<std::unique_ptr<ClusterNode>> nodes;
  std::uint32_t shard_count = 12;

  CoordinatorSettings coordination() {
    CoordinatorSettings c;
    c.redis_port = static_cast<std::uint16_t>(redis.port());
    c.key_prefix = "sharding-test";
    c.heartbeat_interval = 100ms;
    c.liveness_threshold = 600ms;
    c.takeover_margin = 200ms;
    c.sync_interval = 500ms;
    c.command_timeout = 500ms;
    c.reconnect_min_backoff = 50ms;
    c.reconnect_max_backoff = 200ms;
    c.log = [](CoordinatorLogLevel, std::string_view) {};
    return c;
  }

  // A node holding `roles` whose "account" region names `region_roles`.
  ClusterNode& add(const std::string& id, Duration settle_timeout = 30s, std::vector<std::string> roles = {},
                   std::vector<std::string> region_roles = {}) {
    auto n = std::make_unique<ClusterNode>();
    n->id = id;
    n->system = test::quiet_system();
    ClusterSettings cs;
  cs.security.insecure = true;
    cs.security.insecure = true;
    cs.node_id = id;
    cs.roles = std::move(roles);
    cs.coordination = coordination();
    auto c = Cluster::start(*n->system, cs);
    if (!c.ok()) throw std::runtime_error(c.error().to_string());
    n->cluster = std::move(c.value());
    auto reg = start_region(*n, settle_timeout, std::move(region_roles));
    if (!reg.ok()) throw std::runtime_error(reg.error().to_string());
    n->region.emplace(std::move(reg.value()));
    nodes.push_back(std::move(n));
    return *nodes.back();
  }

  Result<ShardRegion<Account>> start_region(ClusterNode& n, Duration settle_timeout,
                                            std::vector<std::string> region_roles) {
    ShardRegionSettings s;
    s.roles = std::move(region_roles);
    s.entity.type_name = "account";
    s.entity.idle_timeout = Duration::zero();
    s.entity.stop_timeout = 10s;
    s.entity.stash_capacity = 10'000;
    s.entity.log = false;
    s.shard_count = shard_count;
    return ShardRegion<Account>::start(
        *n.system, journal, n.cluster->remoting(), n.cluster->directory(), s, test::account_events(),
        test::account_commands(), [node = n.id, settle_timeout](const std::string&) { return Account{node, settle_timeout}; });
  }

  void TearDown() override {
    for (auto& n : nodes) {
      if (n->lock) n->lock->stop();
      if (n->region) (void)n->region->stop(5s);
    }
    for (auto& n : nodes) n->cluster.reset();
    for (auto& n : nodes) n->system->shutdown();
  }

  ClusterNode& node(const std::string& id) {
    for (auto& n : nodes)
      if (n->id == id) return *n;
    throw std::logic_error("no node " + id);
  }

  // Waits until every node sees `count` live members.
  void await_members(std::size_t count) {
    auto until = std::chrono::steady_clock::now() + 10s;
    for (;;) {
      bool all = true;
      for (auto& n : nodes) all = all && n->cluster && n->cluster->coordinator().members().size() == count;
      if (all) return;
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "members never converged";
      std::this_thread::sleep_for(20ms);
    }
  }

  static Result<std::string> where(ClusterNode& n, const std::string& entity, Duration t = 10s) {
    return n.region->ask<std::string>(entity, [](ReplyTo<std::string> rt) { return test::Where{std::move(rt)}; }, t).get();
  }
  static Result<std::int64_t> deposit(ClusterNode& n, const std::string& entity, std::int64_t amount) {
    return n.region->ask<std::int64_t>(entity, [amount](ReplyTo<std::int64_t> rt) { return test::Deposit{amount, std::move(rt)}; }, 10s).get();
  }
  static std::string owner_in(const std::string& where_reply) { return where_reply.substr(0, where_reply.find(' ')); }

  std::map<std::string, std::size_t> shards_per_node() {
    std::map<std::string, std::size_t> out;
    for (auto& n : nodes)
      if (n->cluster) out[n->id] = n->cluster->coordinator().running(detail::shard_group("account")).size();
    return out;
  }
};

// proves: W3
TEST_F(ClusterSharding, ThreeNodesServeEveryEntityFromAnyNodeOnTheShardsOneOwner) {
  add("a");
  add("b");
  add("c");
  await_members(3);
  std::map<std::string, std::string> owner;
  for (int i = 0; i < 300; ++i) {
    std::string id = "e" + std::to_string(i);
    auto& from = *nodes[i % 3];
    auto b = deposit(from, id, 1);
    ASSERT_TRUE(b.ok()) << id << ": " << b.error().to_string();
    EXPECT_EQ(b.value(), 1);
  }
  for (int i = 0; i < 300; ++i) {
    std::string id = "e" + std::to_string(i);
    std::set<std::string> seen;
    for (auto& n : nodes) {
      auto w = where(*n, id);
      ASSERT_TRUE(w.ok()) << w.error().to_string();
      EXPECT_EQ(w.value().substr(w.value().find(' ') + 1), id + " 1");
      seen.insert(owner_in(w.value()));
    }
    EXPECT_EQ(seen.size(), 1u) << id << " answered from two nodes";
  }
  auto per = shards_per_node();
  std::size_t total = 0;
  for (auto& [n, k] : per) {
    EXPECT_GT(k, 0u) << n;
    total += k;
  }
  EXPECT_EQ(total, shard_count);
}

// proves: W6, E6
TEST_F(ClusterSharding, RebalanceMovesShardsWithAHandOffAndLosesNothing) {
  add("a");
  add("b");
  await_members(2);
  // All shards end up on a and b; then c joins and a rebalance evens them.
  std::map<std::string, std::int64_t> expected;
  for (int i = 0; i < 120; ++i) {
    std::string id = "r" + std::to_string(i);
    auto b = deposit(*nodes[i % 2], id, i + 1);
    ASSERT_TRUE(b.ok()) << b.error().to_string();
    expected[id] = i + 1;
  }
  add("c");
  await_members(3);
  auto moves = node("a").cluster->coordinator().rebalance_all(detail::shard_group("account")).get();
  ASSERT_TRUE(moves.ok()) << moves.error().to_string();
  EXPECT_EQ(moves.value().size(), 4u);  // 12 shards: 6/6/0 -> 4/4/4
  // Traffic during and after the move is served; nothing acknowledged is
  // lost; the moved shards end on c.
  for (auto& [id, amount] : expected) {
    auto b = deposit(node("b"), id, 1);
    ASSERT_TRUE(b.ok()) << id << ": " << b.error().to_string();
    EXPECT_EQ(b.value(), amount + 1) << id;
  }
  auto until = std::chrono::steady_clock::now() + 10s;
  while (shards_per_node()["c"] != 4 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(20ms);
  auto per = shards_per_node();
  EXPECT_EQ(per["a"], 4u);
  EXPECT_EQ(per["b"], 4u);
  EXPECT_EQ(per["c"], 4u);
  std::uint64_t handed_off = 0;
  for (auto& n : nodes) handed_off += n->region->stats().shards_handed_off;
  EXPECT_EQ(handed_off, 4u);
}

// A region whose roles only two of three nodes hold: the third owns no
// shard, yet what it sends to the type is answered by the owners.
// proves: W8
TEST_F(ClusterSharding, ANodeWithoutTheRegionsRoleOwnsNoShardYetItsAsksAreAnswered) {
  add("a", 30s, {"accounts"}, {"accounts"});
  add("b", 30s, {"accounts", "web"}, {"accounts"});
  add("c", 30s, {"web"}, {"accounts"});
  await_members(3);
  for (int i = 0; i < 60; ++i) {
    std::string id = "role-" + std::to_string(i);
    auto b = deposit(node("c"), id, 2);
    ASSERT_TRUE(b.ok()) << id << ": " << b.error().to_string();
    EXPECT_EQ(b.value(), 2);
    auto w = where(node("c"), id);
    ASSERT_TRUE(w.ok()) << w.error().to_string();
    EXPECT_NE(owner_in(w.value()), "c") << id;
  }
  auto moves = node("c").cluster->coordinator().rebalance_all(detail::shard_group("account")).get();
  ASSERT_TRUE(moves.ok()) << moves.error().to_string();
  for (const auto& m : moves.value()) EXPECT_NE(m.to, "c");
  auto per = shards_per_node();
  EXPECT_EQ(per["c"], 0u);
  EXPECT_EQ(per["a"] + per["b"], shard_count);
  EXPECT_EQ(node("c").region->stats().shards_started, 0u);
  EXPECT_GT(node("c").region->stats().sent_remote, 0u);
  // A node whose region names other roles for the type is refused.
  auto d = std::make_unique<ClusterNode>();
  d->id = "d";
  d->system = test::quiet_system();
  ClusterSettings cs;
  cs.security.insecure = true;
  cs.node_id = "d";
  cs.coordination = coordination();
  auto cl = Cluster::start(*d->system, cs);
  ASSERT_TRUE(cl.ok()) << cl.error().to_string();
  d->cluster = std::move(cl.value());
  auto refused = start_region(*d, 30s, {"web"});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(refused.error().message().find("account"), std::string::npos) << refused.error().message();
  EXPECT_NE(refused.error().message().find("roles accounts"), std::string::npos) << refused.error().message();
  nodes.push_back(std::move(d));
}

// A job queue naming a role: its shards run only on nodes holding it, and
// a node without it still enqueues, each job going to a shard's owner.
// proves: W8
TEST_F(ClusterSharding, JobQueueShardsRunOnlyOnNodesHoldingTheQueuesRole) {
  add("a", 30s, {"jobs"});
  add("b", 30s, {"jobs"});
  add("c", 30s, {});
  await_members(3);
  struct Ran {
    std::mutex mu;
    std::map<std::string, int> by_node;
    int total() {
      std::lock_guard lk(mu);
      int n = 0;
      for (auto& [node, k] : by_node) n += k;
      return n;
    }
  };
  auto ran = std::make_shared<Ran>();
  std::vector<JobService> services;
  for (auto& n : nodes) {
    JobSettings s;
    s.name = "refunds";
    s.workers = 2;
    s.journal = journal;
    s.log = false;
    ClusterJobSettings cj;
    cj.shard_count = 6;
    cj.roles = {"jobs"};
    auto started = start_job_service(
        *n->system, n->cluster->remoting(), n->cluster->directory(), s,
        [](const Job& j) -> std::optional<JobWorkerCall> { return JobWorkerCall{"w", j.payload}; },
        {{"w", [ran, id = n->id](JobRun run) {
            {
              std::lock_guard lk(ran->mu);
              ++ran->by_node[id];
            }
            run.succeed("ok");
          }}},
        cj);
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    services.push_back(std::move(started.value()));
  }
  for (int i = 0; i < 30; ++i) {
    auto r = services[2].enqueue(Job{"refund", "j" + std::to_string(i)}).get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  EXPECT_TRUE(test::eventually([&] { return ran->total() == 30; }, 20s)) << ran->total();
  {
    std::lock_guard lk(ran->mu);
    EXPECT_EQ(ran->by_node["c"], 0);
  }
  const std::string group = detail::shard_group(job_queue_type("refunds"));
  EXPECT_TRUE(node("c").cluster->coordinator().running(group).empty());
  EXPECT_EQ(node("a").cluster->coordinator().running(group).size() +
                node("b").cluster->coordinator().running(group).size(),
            6u);
  for (auto& svc : services) (void)svc.stop();
}

// proves: E6
TEST_F(ClusterSharding, AGracefulLeaveHandsItsShardsToTheOthersAfterProcessingEntitiesFinish) {
  add("a", 1500ms);
  add("b", 1500ms);
  await_members(2);
  // An entity on b enters processing; b leaves.
  std::string id;
  for (int i = 0;; ++i) {
    id = "leave-" + std::to_string(i);
    auto w = where(node("a"), id);
    ASSERT_TRUE(w.ok());
    if (owner_in(w.value()) == "b") break;
  }
  auto s = node("a").region->ask<std::string>(id, [](ReplyTo<std::string> r) { return test::StartSettle{std::move(r)}; }, 10s).get();
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  auto began = std::chrono::steady_clock::now();
  auto left = node("b").cluster->leave(20s);
  ASSERT_TRUE(left.ok()) << left.error().to_string();
  EXPECT_EQ(node("b").region->stats().shards_hosted, 0u);
  EXPECT_GE(node("b").region->stats().entities.processing_timeouts, 1u);
  // The episode (1.5 s) ended by its deadline before b let the shard go.
  EXPECT_GE(std::chrono::steady_clock::now() - began, 1s);
  auto w = where(node("a"), id);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  EXPECT_EQ(owner_in(w.value()), "a");
}

// proves: C2
TEST_F(ClusterSharding, ANodeThatLeavesUnderLoadHandsItsShardsOffWithoutRefusingAnyCommand) {
  add("a");
  add("b");
  add("c");
  await_members(3);
  for (int i = 0; i < 30; ++i) ASSERT_TRUE(deposit(node("a"), "acct-" + std::to_string(i), 0).ok());
  auto before = shards_per_node();
  ASSERT_GT(before["b"], 0u);

  // Clients on every node, b included until it has left, deposit 1 at a
  // time into 30 accounts spread over every shard.
  std::atomic<bool> stop{false}, b_left{false};
  std::mutex mu;
  std::map<std::string, std::int64_t> paid;
  std::vector<std::string> failures;
  auto client = [&](ClusterNode& n, int t, const std::atomic<bool>& until) {
    for (int i = 0; !until.load(); ++i) {
      std::string id = "acct-" + std::to_string((i * 7 + t) % 30);
      auto r = deposit(n, id, 1);
      std::lock_guard lk(mu);
      if (r.ok()) {
        ++paid[id];
      } else {
        failures.push_back(n.id + " " + id + ": " + r.error().to_string());
      }
    }
  };
  std::vector<std::thread> clients;
  clients.emplace_back(client, std::ref(node("a")), 0, std::cref(stop));
  clients.emplace_back(client, std::ref(node("c")), 1, std::cref(stop));
  // b's own client stops once b hosts no shard: what it sent by then is
  // answered before b's remoting stops.
  clients.emplace_back(client, std::ref(node("b")), 2, std::cref(b_left));
  std::thread watch([&] {
    while (!stop.load() && node("b").region->stats().shards_hosted > 0) std::this_thread::sleep_for(1ms);
    b_left = true;
  });
  std::this_thread::sleep_for(300ms);
  auto left = node("b").cluster->leave(20s);
  std::this_thread::sleep_for(300ms);
  stop = true;
  watch.join();
  for (auto& t : clients) t.join();

  ASSERT_TRUE(left.ok()) << left.error().to_string();
  EXPECT_EQ(left->units, before["b"]);
  EXPECT_EQ(left->moved, before["b"]);
  EXPECT_TRUE(failures.empty()) << failures.size() << " commands refused, the first: " << failures.front();
  EXPECT_EQ(node("b").region->stats().shards_hosted, 0u);
  // Nothing acknowledged was lost: each balance is the deposits answered.
  ASSERT_FALSE(paid.empty());
  for (auto& [id, n] : paid) {
    auto now = deposit(node("a"), id, 0);
    ASSERT_TRUE(now.ok()) << id << ": " << now.error().to_string();
    EXPECT_EQ(now.value(), n) << id;
  }
}

// proves: L6
TEST_F(ClusterSharding, TheKeyedLockStaysExclusiveAndItsTokensGrowThroughARebalanceOverRedis) {
  auto start_lock = [&](ClusterNode& n) {
    auto l = start_keyed_lock(*n.system, n.cluster->remoting(), n.cluster->directory(), {.name = "accounts"},
                              {.shard_count = 8});
    ASSERT_TRUE(l.ok()) << l.error().to_string();
    n.lock.emplace(std::move(l.value()));
  };
  auto token = [](ClusterNode& n, const std::string& key) -> std::uint64_t {
    auto r = n.lock->lock(key, [](const LockLease& l) { return l.token(); }).get();
    EXPECT_TRUE(r.ok()) << key << ": " << r.error().to_string();
    return r.ok() ? r.value() : 0;
  };
  start_lock(add("a"));
  start_lock(add("b"));
  await_members(2);
  std::map<std::string, std::uint64_t> last;
  for (int i = 0; i < 24; ++i) {
    std::string key = "key-" + std::to_string(i);
    last[key] = token(*nodes[i % 2], key);
  }
  start_lock(add("c"));
  await_members(3);

  // Callers on every node hammer one key while the lock's shards move.
  std::atomic<int> inside{0}, overlaps{0};
  std::atomic<bool> failed{false};
  std::vector<std::thread> callers;
  for (auto& n : nodes) {
    callers.emplace_back([&, lock = *n->lock] {
      for (int i = 0; i < 60; ++i) {
        auto r = lock.lock("hot", [&](const LockLease&) {
                       if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
                       std::this_thread::sleep_for(300us);
                       inside.fetch_sub(1);
                     })
                     .get();
        if (!r.ok()) failed = true;
      }
    });
  }
  auto moves = node("a").cluster->coordinator().rebalance_all(detail::shard_group(lock_type("accounts"))).get();
  for (auto& t : callers) t.join();
  ASSERT_TRUE(moves.ok()) << moves.error().to_string();
  EXPECT_FALSE(moves.value().empty());
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_FALSE(failed.load());

  // Every key's next token is larger than its last, from any node; keys
  // whose shard moved jump to the new owner's epoch.
  std::set<std::uint32_t> moved;
  for (const auto& m : moves.value()) moved.insert(static_cast<std::uint32_t>(std::stoul(m.unit)));
  std::size_t jumped = 0;
  for (auto& [key, before] : last) {
    std::uint64_t now = token(node("c"), key);
    EXPECT_GT(now, before) << key;
    if (moved.count(shard_of(key, 8))) {
      EXPECT_GT(now >> 40, before >> 40) << key;
      ++jumped;
    }
  }
  EXPECT_GT(jumped, 0u);
}

}  // namespace
}  // namespace troupe::cluster
