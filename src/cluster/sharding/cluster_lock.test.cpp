// The keyed lock across nodes (SPEC L6): nodes in one process over real TCP,
// shards placed and moved by the in-memory directory.

#include "troupe/cluster/cluster_lock.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "in_process_nodes.hpp"
#include "troupe/cluster/static_directory.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kShards = 8;

struct LockNode : test::InProcessNode {
  std::optional<KeyedLock> lock;
};

// An asynchronous block's hold that the test ends.
struct Hold {
  Promise<int> done;
  std::optional<LockLease> lease;
  std::atomic<bool> granted{false};
};

class ClusterLock : public ::testing::Test {
 protected:
  std::unique_ptr<StaticShardDirectory> placement;
  std::vector<std::unique_ptr<LockNode>> nodes;

  void boot(std::vector<std::string> ids, KeyedLockSettings s = {}) {
    if (s.name == "lock") s.name = "accounts";
    placement = std::make_unique<StaticShardDirectory>(ids);
    test::start_in_process_nodes(ids, *placement, nodes);
    if (HasFatalFailure()) return;
    for (auto& n : nodes) {
      auto l = start_keyed_lock(*n->system, *n->remoting, *n->directory, s,
                                {.shard_count = kShards, .reply_timeout = 2s, .query_timeout = 2s});
      ASSERT_TRUE(l.ok()) << l.error().to_string();
      n->lock.emplace(std::move(l.value()));
    }
  }

  void TearDown() override {
    for (auto& n : nodes)
      if (n->lock) n->lock->stop();
    for (auto& n : nodes) n->remoting->stop();
    for (auto& n : nodes) n->system->shutdown();
  }

  LockNode& node(const std::string& id) {
    for (auto& n : nodes)
      if (n->id == id) return *n;
    throw std::logic_error("no node " + id);
  }

  std::string owner_of(const std::string& key) {
    auto p = placement->placement(lock_type("accounts"), shard_of(key, kShards));
    return p ? p->owner : std::string();
  }
  Result<void> move_key(const std::string& key, const std::string& to) {
    return placement->move(lock_type("accounts"), shard_of(key, kShards), to);
  }

  static Future<int> hold(LockNode& n, const std::string& key, const std::shared_ptr<Hold>& h) {
    return n.lock->lock(key, [h](const LockLease& l) {
      h->lease = l;
      h->granted = true;
      return h->done.future();
    });
  }
  static std::uint64_t token(LockNode& n, const std::string& key) {
    auto r = n.lock->lock(key, [](const LockLease& l) { return l.token(); }).get();
    if (!r.ok()) throw std::runtime_error(r.error().to_string());
    return r.value();
  }
  static bool eventually(const std::function<bool()>& f, Duration bound = 10s) { return test::eventually(f, bound); }
};

// proves: L6
TEST_F(ClusterLock, CallersOnThreeNodesNeverHoldOneKeyAtOnceAndTokensGrowInGrantOrder) {
  boot({"n1", "n2", "n3"});
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::mutex mu;
  std::vector<std::uint64_t> order;
  std::vector<Future<std::monostate>> all;
  for (int round = 0; round < 40; ++round) {
    for (auto& n : nodes) {
      all.push_back(n->lock->lock("shared-key", [&](const LockLease& l) {
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        {
          std::lock_guard lk(mu);
          order.push_back(l.token());
        }
        std::this_thread::sleep_for(200us);
        inside.fetch_sub(1);
      }));
    }
  }
  for (auto& f : all) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  EXPECT_EQ(overlaps.load(), 0);
  ASSERT_EQ(order.size(), 120u);
  for (std::size_t i = 1; i < order.size(); ++i) EXPECT_GT(order[i], order[i - 1]);
  // Blocks ran on their callers' nodes: every node granted some.
  for (auto& n : nodes) EXPECT_EQ(n->lock->stats().grants, 40u) << n->id;
}

// proves: L6
TEST_F(ClusterLock, TokensGrowAcrossMovesOfTheKeysShard) {
  boot({"n1", "n2", "n3"});
  std::uint64_t before = token(node("n1"), "acct-7");
  std::string first = owner_of("acct-7");
  ASSERT_FALSE(first.empty());
  std::vector<std::uint64_t> tokens{before};
  for (const std::string to : {"n1", "n2", "n3", "n1"}) {
    if (to == owner_of("acct-7")) continue;
    ASSERT_TRUE(move_key("acct-7", to).ok());
    ASSERT_TRUE(eventually([&] { return owner_of("acct-7") == to; }));
    for (auto& n : nodes) tokens.push_back(token(*n, "acct-7"));
  }
  ASSERT_GE(tokens.size(), 7u);
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_GT(tokens[i], tokens[i - 1]) << i;
  // The owner's epoch is the high part: every move made a jump.
  EXPECT_GT(tokens.back() >> 40, before >> 40);
}

// proves: L6
TEST_F(ClusterLock, AKeyHeldWhileItsShardMovesIsNotGrantedToAnotherCallerUntilReleased) {
  boot({"n1", "n2", "n3"});
  (void)token(node("n1"), "k");  // allocates its shard
  std::string owner = owner_of("k");
  std::string holder_id = owner == "n1" ? "n2" : "n1";
  auto& holder = node(holder_id);
  auto held = std::make_shared<Hold>();
  auto first = hold(holder, "k", held);
  ASSERT_TRUE(eventually([&] { return held->granted.load(); }));
  std::uint64_t held_token = held->lease->token();

  // The shard goes to another node while the key is held there.
  std::string to = owner == "n2" ? "n3" : "n2";
  ASSERT_TRUE(move_key("k", to).ok());
  ASSERT_TRUE(eventually([&] { return owner_of("k") == to; }));

  // Someone else asks: the new owner learnt of the hold and keeps the key.
  std::atomic<std::uint64_t> second_token{0};
  auto second = node(to).lock->lock("k", [&](const LockLease& l) { second_token = l.token(); });
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(second_token.load(), 0u);
  EXPECT_TRUE(held->lease->is_current());

  held->done.set_value(1);
  auto r1 = first.get();
  ASSERT_TRUE(r1.ok()) << r1.error().to_string();
  EXPECT_EQ(r1.value(), 1);
  auto r2 = second.get();
  ASSERT_TRUE(r2.ok()) << r2.error().to_string();
  EXPECT_GT(second_token.load(), held_token);
  EXPECT_FALSE(held->lease->is_current());
}

// The owner stops its lock and remoting in this process and is dropped
// from the placement, with no hand-off (a crash, a SIGKILL of a real node,
// is lock_crash.test.cpp). The new owner cannot ask it what its callers
// hold, so it grants nothing of the shard until one lease after it started.
// proves: L6
TEST_F(ClusterLock, WhenTheOwnerIsDroppedWithoutHandOffAHoldElsewhereStaysExclusiveAndItsShardIsServedByAnother) {
  boot({"n1", "n2", "n3"}, {.wait_timeout = 10s, .lease = 1500ms});
  (void)token(node("n1"), "k");
  if (owner_of("k") != "n3") {
    ASSERT_TRUE(move_key("k", "n3").ok());
    ASSERT_TRUE(eventually([&] { return owner_of("k") == "n3"; }));
  }
  auto held = std::make_shared<Hold>();
  auto first = hold(node("n1"), "k", held);
  ASSERT_TRUE(eventually([&] { return held->granted.load(); }));
  // A waiter on the doomed owner.
  std::atomic<std::uint64_t> waiter_token{0};
  auto waiter = node("n2").lock->lock("k", [&](const LockLease& l) { waiter_token = l.token(); });

  // n3 stops: no hand-off; the others forget it as members do.
  auto& dead = node("n3");
  dead.lock->stop();
  dead.remoting->stop();
  for (auto& n : nodes)
    if (n->id != "n3") n->remoting->remove_peer("n3");
  placement->remove_node("n3");
  auto dropped_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(eventually([&] { return !owner_of("k").empty() && owner_of("k") != "n3"; }));

  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(waiter_token.load(), 0u) << "granted while n1 still holds the key";
  EXPECT_TRUE(held->lease->is_current());
  held->done.set_value(2);
  ASSERT_TRUE(first.get().ok());
  auto w = waiter.get();
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  EXPECT_GT(waiter_token.load(), held->lease->token());
  // Another key of the same shard is served by the new owner, once a lease
  // of n3's callers would be over.
  std::string sibling;
  for (int i = 0; sibling.empty(); ++i)
    if (std::string k = "s" + std::to_string(i); k != "k" && shard_of(k, kShards) == shard_of("k", kShards)) sibling = k;
  auto sibling_at = node("n2").lock->lock(sibling, [&](const LockLease& l) {
    EXPECT_GT(l.token(), held->lease->token());
    return std::chrono::steady_clock::now();
  }).get();
  ASSERT_TRUE(sibling_at.ok()) << sibling_at.error().to_string();
  EXPECT_GE(sibling_at.value() - dropped_at, 1500ms) << "granted while a grant of n3's could still be within its lease";
}

// proves: L6, L3
TEST_F(ClusterLock, ALeaseEndsOnTheCallersNodeBeforeTheOwnerPassesTheKeyOn) {
  boot({"n1", "n2"}, {.wait_timeout = 5s, .lease = 600ms});
  (void)token(node("n1"), "k");
  std::string caller = owner_of("k") == "n1" ? "n2" : "n1";  // the block runs away from the owner
  auto held = std::make_shared<Hold>();
  auto first = hold(node(caller), "k", held);
  ASSERT_TRUE(eventually([&] { return held->granted.load(); }));
  std::atomic<bool> stale_seen_current{false};
  auto next = node(owner_of("k")).lock->lock("k", [&](const LockLease& l) {
    // The expired holder's view must already be over when the next one runs.
    if (held->lease->is_current()) stale_seen_current = true;
    return l.token();
  });
  auto r1 = first.get();
  ASSERT_FALSE(r1.ok());
  EXPECT_EQ(r1.error().code(), ErrorCode::lease_expired);
  EXPECT_FALSE(held->lease->is_current());
  auto r2 = next.get();
  ASSERT_TRUE(r2.ok()) << r2.error().to_string();
  EXPECT_GT(r2.value(), held->lease->token());
  EXPECT_FALSE(stale_seen_current.load());
  held->done.set_value(0);  // the late result is dropped
  EXPECT_EQ(node(caller).lock->stats().lease_expiries, 1u);
}

// proves: L6, L2, L4
TEST_F(ClusterLock, WaitTimeoutsTypedResultsAndExceptionsCrossNodes) {
  boot({"n1", "n2"}, {.wait_timeout = 300ms, .lease = 10s});
  (void)token(node("n1"), "k");
  std::string owner = owner_of("k");
  std::string away = owner == "n1" ? "n2" : "n1";
  auto held = std::make_shared<Hold>();
  auto first = hold(node(owner), "k", held);
  ASSERT_TRUE(eventually([&] { return held->granted.load(); }));

  std::atomic<bool> ran{false};
  auto timed_out = node(away).lock->lock("k", [&](const LockLease&) { ran = true; }).get();
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.error().code(), ErrorCode::acquire_timeout);
  EXPECT_FALSE(ran.load());
  held->done.set_value(3);
  ASSERT_TRUE(first.get().ok());

  // The block's own type comes back across the network unchanged: it ran here.
  Future<std::string> typed = node(away).lock->lock("k", [](const LockLease& l) { return "held " + l.key(); });
  auto t = typed.get();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t.value(), "held k");
  auto thrown = node(away).lock->lock("k", [](const LockLease&) -> int { throw std::out_of_range("no such account"); }).get();
  ASSERT_FALSE(thrown.ok());
  EXPECT_THROW(thrown.error().rethrow_if_exception(), std::out_of_range);
  // The key is free again after the throw.
  EXPECT_GT(token(node(owner), "k"), 0u);
}

// proves: X1
TEST_F(ClusterLock, BadSettingsAndMalformedLockMessagesAreRefusedAndTheNodeKeepsServing) {
  boot({"n1", "n2"});
  auto& n1 = node("n1");
  auto zero = start_keyed_lock(*n1.system, *n1.remoting, *n1.directory, {.name = "other"}, {.shard_count = 0});
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(zero.error().message().find("shard_count"), std::string::npos);
  auto twice = start_keyed_lock(*n1.system, *n1.remoting, *n1.directory, {.name = "accounts"});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.error().code(), ErrorCode::invalid_argument);
  auto lease = start_keyed_lock(*n1.system, *n1.remoting, *n1.directory, {.name = "x", .lease = 0s});
  ASSERT_FALSE(lease.ok());
  EXPECT_NE(lease.error().message().find("lease"), std::string::npos);

  // Bytes that are not a lock message, under the lock's own message names.
  struct Junk {
    std::string bytes;
  };
  for (const char* name : {"troupe.lock.Acquire", "troupe.lock.QueryReply", "troupe.lock.Release"}) {
    MessageCodecs<Junk> one;
    (void)one.add<Junk>(
        name, [](const Junk& j, ByteWriter& w) { w.bytes() += j.bytes; },
        [](ByteReader& r) -> Result<Junk> { return r.finish(Junk{}); });
    auto codecs = std::make_shared<const MessageCodecs<Junk>>(std::move(one));
    auto ref = node("n2").remoting->remote<Junk>("n1", lock_type("accounts"), codecs);
    ASSERT_TRUE(ref.tell(Junk{"\x01\x02"}).ok());
    ASSERT_TRUE(ref.tell(Junk{std::string("\0\0\0\0\0\0\0\0\xff\xff\xff\xff", 12)}).ok());
  }
  // Both nodes still serve locks, from either side.
  for (int i = 0; i < 20; ++i) {
    std::string key = "after-" + std::to_string(i);
    EXPECT_GT(token(*nodes[i % 2], key), 0u);
  }
}

}  // namespace
}  // namespace troupe::cluster
