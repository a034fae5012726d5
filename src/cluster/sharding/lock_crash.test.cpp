// The cluster lock (SPEC L6) when a node dies holding a key: this process
// is one node of a Redis-coordinated cluster, a crash_test_node process is
// the other; that process takes the key, reports its hold, and is killed
// with SIGKILL mid-hold. A waiter here must not get the key while the dead
// holder's lease could still be valid, and must get it after.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "../redis/redis_test_server.hpp"
#include "crash_test_protocol.hpp"
#include "node_process.hpp"
#include "troupe/cluster/cluster.hpp"
#include "troupe/cluster/cluster_lock.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using namespace troupe::cluster::crash;
using Steady = std::chrono::steady_clock;

constexpr auto kLeaseMargin = 500ms;

// The hold the node process reported.
struct ReportedHold {
  std::uint64_t token = 0;
  Steady::time_point started{};  // its block started; its lease ends no later than started + lease
};

// What the waiter's block saw when it ran.
struct Waiter {
  std::atomic<bool> ran{false};
  std::atomic<std::uint64_t> token{0};
  std::atomic<Steady::rep> at{0};
};

class ClusterLockCrash : public ::testing::Test {
 protected:
  troupe::test::RedisTestServer redis;
  std::filesystem::path dir;
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<Cluster> cluster;
  std::optional<KeyedLock> lock;
  std::unique_ptr<proc::NodeProcess> child;

  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-lock-crash-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir = pattern;
  }
  void TearDown() override {
    child.reset();
    if (lock) lock->stop();
    cluster.reset();
    if (system) system->shutdown();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // This process's node "p1" and the node process "c1", both running the
  // lock with `lease`.
  void boot(Duration lease) {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_dead_letters = false;
    cfg.log_failures = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    ClusterSettings cs;
    cs.security.insecure = true;
    cs.node_id = "p1";
    cs.coordination.redis_port = redis.port();
    cs.coordination.key_prefix = kLockClusterPrefix;
    cs.coordination.heartbeat_interval = 200ms;
    cs.coordination.liveness_threshold = 1000ms;
    cs.coordination.takeover_margin = 300ms;
    cs.coordination.sync_interval = 1s;
    cs.coordination.command_timeout = 500ms;
    auto c = Cluster::start(*system, cs);
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    cluster = std::move(c.value());
    auto l = start_keyed_lock(*system, cluster->remoting(), cluster->directory(),
                              {.name = kLockName, .wait_timeout = 20s, .lease = lease},
                              {.shard_count = kLockShards, .lease_margin = kLeaseMargin});
    ASSERT_TRUE(l.ok()) << l.error().to_string();
    lock.emplace(std::move(l.value()));

    auto lease_ms = std::chrono::duration_cast<std::chrono::milliseconds>(lease).count();
    child = std::make_unique<proc::NodeProcess>(
        kCrashTestNode, "c1",
        std::vector<std::string>{"--role", "lock", "--redis-port", std::to_string(redis.port()), "--marker", marker(),
                                 "--lease-ms", std::to_string(lease_ms), "--lease-margin-ms",
                                 std::to_string(kLeaseMargin.count())});
    auto until = Steady::now() + 20s;
    while (cluster->coordinator().members().size() < 2) {
      ASSERT_LT(Steady::now(), until) << "c1 never became a member";
      std::this_thread::sleep_for(10ms);
    }
  }

  std::string marker() const { return (dir / "c1.hold").string(); }
  static std::string group() { return detail::shard_group(lock_type(kLockName)); }

  std::string owner_of_shard(std::uint32_t shard) {
    auto p = cluster->coordinator().assign(group(), std::to_string(shard), "").get();
    return p.ok() ? p.value().assignment.owner : std::string();
  }
  // A key whose lock shard is placed on `node` (placing shards as it goes).
  std::string key_owned_by(const std::string& node) {
    for (int i = 0; i < 200; ++i) {
      std::string key = "acct-" + std::to_string(i);
      if (owner_of_shard(shard_of(key, kLockShards)) == node) return key;
    }
    return {};
  }

  // Tells c1 to take `key` and waits for its report.
  ReportedHold child_holds(const std::string& key) {
    std::ofstream(key_file(marker())) << key << "\n" << std::flush;
    ReportedHold h;
    auto until = Steady::now() + 20s + kSlowBuildSlack;
    while (Steady::now() < until) {
      std::ifstream in(marker());
      long long ns = 0;
      if (in >> h.token >> ns) {
        h.started = Steady::time_point(std::chrono::nanoseconds(ns));
        return h;
      }
      std::this_thread::sleep_for(2ms);
    }
    ADD_FAILURE() << "c1 never reported holding " << key;
    return h;
  }

  // c1 takes `key`; a waiter here queues for it; c1 is killed mid-hold.
  struct Killed {
    ReportedHold held;
    std::shared_ptr<Waiter> waiter = std::make_shared<Waiter>();
    std::optional<Future<std::monostate>> waiting;
    Steady::time_point at{};
  };
  Killed kill_holder_with_a_waiter(const std::string& key) {
    Killed k;
    k.held = child_holds(key);
    if (k.held.token == 0) return k;
    k.waiting.emplace(lock->lock(key, [w = k.waiter](const LockLease& l) {
      w->at = Steady::now().time_since_epoch().count();
      w->token = l.token();
      w->ran = true;
    }));
    std::this_thread::sleep_for(50ms);  // queued at the key's owner
    child->kill9();
    k.at = Steady::now();
    return k;
  }
  static Steady::time_point ran_at(const Waiter& w) { return Steady::time_point(Steady::duration(w.at.load())); }
  // How the waiter's grant came, in ms after the dead holder's block started.
  static std::string timeline(const Waiter& w, const ReportedHold& held, Steady::time_point killed_at) {
    auto ms = [&](Steady::time_point t) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(t - held.started).count());
    };
    return "holder's block started at 0 ms, killed at " + ms(killed_at) + " ms, waiter granted at " + ms(ran_at(w)) + " ms";
  }
};

// c1 holds a key whose shard this node owns, and dies. The owner keeps the
// key for the dead holder until its lease (+ margin) is over, then grants
// it to the waiter here.
// proves: L6, L3
TEST_F(ClusterLockCrash, AHolderKilledMidHoldKeepsItsKeyUntilItsLeaseEndsThenTheWaiterGetsIt) {
  constexpr auto kLease = 2500ms;
  boot(kLease);
  if (HasFatalFailure()) return;
  std::string key = key_owned_by("p1");
  ASSERT_FALSE(key.empty());
  auto [held, w, waiting, killed_at] = kill_holder_with_a_waiter(key);
  ASSERT_NE(held.token, 0u);

  auto r = waiting->get();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(w->ran.load());
  EXPECT_GE(ran_at(*w), held.started + kLease) << "granted while the dead holder's lease could still be valid: " << timeline(*w, held, killed_at);
  EXPECT_LT(ran_at(*w) - killed_at, kLease + kLeaseMargin + 3s + kSlowBuildSlack) << "the dead holder's key stayed held: " << timeline(*w, held, killed_at);
  EXPECT_GT(w->token.load(), held.token);
  // The dead node left the membership; the key's shard never moved.
  EXPECT_EQ(owner_of_shard(shard_of(key, kLockShards)), "p1");
}

// c1 owns the key's shard and holds the key itself, and dies. The shard is
// taken over by this node, which serves it again, but grants the key only
// once the dead holder's lease is over; its tokens are above the dead
// owner's.
// proves: L6
TEST_F(ClusterLockCrash, AnOwnerKilledHoldingAKeyIsTakenOverAndTheKeyStaysHeldUntilTheDeadHoldersLeaseEnds) {
  constexpr auto kLease = 4000ms;
  boot(kLease);
  if (HasFatalFailure()) return;
  std::string key = key_owned_by("c1");
  ASSERT_FALSE(key.empty());
  auto [held, w, waiting, killed_at] = kill_holder_with_a_waiter(key);  // the waiter queued at c1
  ASSERT_NE(held.token, 0u);

  // Takeover after the liveness threshold + margin.
  auto until = Steady::now() + 10s + kSlowBuildSlack;
  while (owner_of_shard(shard_of(key, kLockShards)) != "p1") {
    ASSERT_LT(Steady::now(), until) << "the dead owner's lock shard was never taken over";
    std::this_thread::sleep_for(20ms);
  }
  auto r = waiting->get();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(w->ran.load());
  EXPECT_GE(ran_at(*w), held.started + kLease) << "granted while the dead holder's lease could still be valid: " << timeline(*w, held, killed_at);
  EXPECT_LT(ran_at(*w) - killed_at, kLease + kLeaseMargin + 3s + kSlowBuildSlack) << timeline(*w, held, killed_at);
  EXPECT_GT(w->token.load() >> 40, held.token >> 40) << "the new owner's tokens carry a later epoch";

  // The shard's other keys are served by the new owner.
  std::string sibling;
  for (int i = 0; sibling.empty(); ++i)
    if (std::string k = "other-" + std::to_string(i); shard_of(k, kLockShards) == shard_of(key, kLockShards)) sibling = k;
  auto t = lock->lock(sibling, [](const LockLease& l) { return l.token(); }).get();
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_GT(t.value(), w->token.load());
}

}  // namespace
}  // namespace troupe::cluster
