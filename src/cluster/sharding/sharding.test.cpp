// Shard regions over real TCP between nodes in one process, placed by the
// in-memory directory (the Redis directory has its own tests; the
// multi-process tests run the whole cluster).

#include "troupe/cluster/sharding.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "in_process_nodes.hpp"
#include "sharding_test_support.hpp"
#include "troupe/cluster/static_directory.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using test::Account;

struct Node : test::InProcessNode {
  std::optional<ShardRegion<Account>> region;
};

class Sharding : public ::testing::Test {
 protected:
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::unique_ptr<StaticShardDirectory> placement;
  std::vector<std::unique_ptr<Node>> nodes;

  ShardRegionSettings settings(std::uint32_t shards = 16) {
    ShardRegionSettings s;
    s.entity.type_name = "account";
    s.entity.idle_timeout = Duration::zero();
    s.entity.stop_timeout = 10s;
    s.entity.log = false;
    // Bursts of one-way commands wait behind each append (E8 bounds that).
    s.entity.stash_capacity = 10'000;
    s.shard_count = shards;
    return s;
  }

  // `hold_while_settling` and `where` as in sharding_test_support.hpp.
  void boot(std::vector<std::string> ids, std::uint32_t shards = 16, Duration settle_timeout = 30s,
            bool hold_while_settling = false, MessageOptions where = {}) {
    placement = std::make_unique<StaticShardDirectory>(ids);
    test::start_in_process_nodes(ids, *placement, nodes);
    if (HasFatalFailure()) return;
    for (auto& n : nodes) {
      auto reg = ShardRegion<Account>::start(
          *n->system, journal, *n->remoting, *n->directory, settings(shards), test::account_events(),
          test::account_commands(where), [node = n->id, settle_timeout, hold_while_settling](const std::string&) {
            return Account{node, settle_timeout, hold_while_settling};
          });
      ASSERT_TRUE(reg.ok()) << reg.error().to_string();
      n->region.emplace(std::move(reg.value()));
    }
  }

  void TearDown() override {
    for (auto& n : nodes) {
      if (n->region) (void)n->region->stop(5s);
    }
    for (auto& n : nodes) n->remoting->stop();
    for (auto& n : nodes) n->system->shutdown();
  }

  Node& node(const std::string& id) {
    for (auto& n : nodes)
      if (n->id == id) return *n;
    throw std::logic_error("no node " + id);
  }

  static std::string where(Node& n, const std::string& entity) {
    auto r = n.region->ask<std::string>(entity, [](ReplyTo<std::string> rt) { return test::Where{std::move(rt)}; }, 10s).get();
    return r.ok() ? r.value() : "error: " + r.error().to_string();
  }

  // An entity whose shard `owner` holds (placed from n1).
  std::string entity_on(const std::string& owner, const std::string& prefix) {
    for (int i = 0;; ++i) {
      std::string id = prefix + std::to_string(i);
      (void)where(node("n1"), id);
      if (placement->placement("account", shard_of(id, 16))->owner == owner) return id;
    }
  }

  // Puts `id` in Settling and sends it, from n1, an idempotent Where and a
  // Deposit of 5 that the entity holds back until the episode ends; returns
  // once both reached `owner`.
  std::pair<Future<std::string>, Future<std::int64_t>> asks_held_by(const std::string& owner, const std::string& id,
                                                                     Duration timeout) {
    auto settling =
        node("n1").region->ask<std::string>(id, [](ReplyTo<std::string> r) { return test::StartSettle{std::move(r)}; }, 10s).get();
    EXPECT_TRUE(settling.ok()) << settling.error().to_string();
    auto arrived = node(owner).region->stats().received_remote;
    auto w = node("n1").region->ask<std::string>(id, [](ReplyTo<std::string> r) { return test::Where{std::move(r)}; }, timeout);
    auto d = node("n1").region->ask<std::int64_t>(id, [](ReplyTo<std::int64_t> r) { return test::Deposit{5, std::move(r)}; }, timeout);
    EXPECT_TRUE(test::eventually([&] { return node(owner).region->stats().received_remote >= arrived + 2; }));
    return {std::move(w), std::move(d)};
  }

  // What a node that dies looks like to the others, played in this
  // process: its connections drop at once (its remoting stops); later,
  // membership removes it from every address book (forget), then the
  // directory moves its shards.
  void drop_connections(const std::string& id) {
    node(id).remoting->stop();
  }
  void forget(const std::string& id) {
    for (auto& n : nodes)
      if (n->id != id) n->remoting->remove_peer(id);
    placement->remove_node(id);
  }
};

TEST_F(Sharding, AMessageSentFromAnyNodeReachesTheEntityOnItsShardsOwner) {
  boot({"n1", "n2", "n3"});
  for (int i = 0; i < 60; ++i) {
    std::string id = "acct-" + std::to_string(i);
    auto from = nodes[i % 3].get();
    auto dep = from->region->ask<std::int64_t>(
        id, [](ReplyTo<std::int64_t> r) { return test::Deposit{10, std::move(r)}; }, 10s);
    auto balance = dep.get();
    ASSERT_TRUE(balance.ok()) << balance.error().to_string();
    EXPECT_EQ(balance.value(), 10);
  }
  // Every node sees the same owner for each entity, and it is the shard's.
  for (int i = 0; i < 60; ++i) {
    std::string id = "acct-" + std::to_string(i);
    auto p = placement->placement("account", shard_of(id, 16));
    ASSERT_TRUE(p);
    for (auto& n : nodes) EXPECT_EQ(where(*n, id), p->owner + " " + id + " 10");
  }
  // Shards spread: each node owns some.
  for (auto& [node_id, count] : placement->counts("account")) EXPECT_GT(count, 0u) << node_id;
  std::uint64_t remote = 0;
  for (auto& n : nodes) remote += n->region->stats().sent_remote;
  EXPECT_GT(remote, 0u);
}

TEST_F(Sharding, MessagesFromOneSenderToOneEntityArriveInOrder) {
  boot({"n1", "n2"});
  // An entity owned by n2, told from n1.
  std::string id;
  for (int i = 0;; ++i) {
    id = "ordered-" + std::to_string(i);
    (void)where(node("n1"), id);
    if (placement->placement("account", shard_of(id, 16))->owner == "n2") break;
  }
  for (int i = 1; i <= 2000; ++i) ASSERT_TRUE(node("n1").region->tell(id, test::Mark{i}).ok());
  std::string expected;
  for (int i = 1; i <= 2000; ++i) expected += (i > 1 ? "," : "") + std::to_string(i);
  std::string got;
  for (int tries = 0; tries < 500 && got != expected; ++tries) {
    auto r = node("n1").region->ask<std::string>(id, [](ReplyTo<std::string> rt) { return test::Marks{std::move(rt)}; }, 10s).get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    got = r.value();
    if (got != expected) std::this_thread::sleep_for(10ms);
  }
  // (not EXPECT_EQ: a failure would print 2 x 9 kB)
  EXPECT_TRUE(got == expected) << "got " << got.size() << " bytes: " << got.substr(0, 200) << "...";
}

// proves: E6
TEST_F(Sharding, AHandOffWaitsForAProcessingEntityAndKeepsWhatArrivesMeanwhile) {
  // The settlement's episode ends by its own deadline (E3), 1.5 s after it
  // began; the hand-off must wait for that.
  boot({"n1", "n2"}, 16, 1500ms);
  std::string id = "settler";
  (void)where(node("n1"), id);
  auto shard = shard_of(id, 16);
  std::string from = placement->placement("account", shard)->owner;
  std::string to = from == "n1" ? "n2" : "n1";
  auto settling = node(to).region->ask<std::string>(id, [](ReplyTo<std::string> r) { return test::StartSettle{std::move(r)}; }, 10s).get();
  ASSERT_TRUE(settling.ok()) << settling.error().to_string();
  auto moved_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(placement->move("account", shard, to).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(placement->placement("account", shard)->handing_off);
  // Commands sent meanwhile, through either node, wait and are served by
  // the new owner once the old one released the shard.
  auto a = node(to).region->ask<std::int64_t>(id, [](ReplyTo<std::int64_t> r) { return test::Deposit{5, std::move(r)}; }, 20s);
  auto b = node(from).region->ask<std::int64_t>(id, [](ReplyTo<std::int64_t> r) { return test::Deposit{7, std::move(r)}; }, 20s);
  auto ra = a.get();
  auto rb = b.get();
  ASSERT_TRUE(ra.ok()) << ra.error().to_string();
  ASSERT_TRUE(rb.ok()) << rb.error().to_string();
  EXPECT_GE(std::chrono::steady_clock::now() - moved_at, 1s);
  EXPECT_EQ(std::max(ra.value(), rb.value()), 12);
  EXPECT_FALSE(placement->placement("account", shard)->handing_off);
  EXPECT_EQ(where(node(from), id), to + " settler 12");
  EXPECT_EQ(node(from).region->stats().shards_handed_off, 1u);
  EXPECT_EQ(node(from).region->stats().entities.processing_timeouts, 1u);
}

TEST_F(Sharding, AShardOfANodeStoppedWithoutHandOffIsServedByAnotherWithItsAcknowledgedEvents) {
  boot({"n1", "n2", "n3"});
  std::map<std::string, std::int64_t> balances;
  for (int i = 0; i < 40; ++i) {
    std::string id = "c-" + std::to_string(i);
    auto r = node("n1").region->ask<std::int64_t>(id, [i](ReplyTo<std::int64_t> rt) { return test::Deposit{i + 1, std::move(rt)}; }, 10s).get();
    ASSERT_TRUE(r.ok());
    balances[id] = r.value();
  }
  // n3 stops in this process and is dropped from the placement: its region
  // and remoting stop, no hand-off.
  auto& dead = node("n3");
  (void)dead.region->stop(5s);  // in-process stand-in for the process ending
  dead.region.reset();
  dead.remoting->stop();
  placement->remove_node("n3");
  for (auto& [id, balance] : balances) {
    auto w = where(node("n1"), id);
    EXPECT_EQ(w.substr(w.find(' ') + 1), id + " " + std::to_string(balance));
    EXPECT_NE(w.substr(0, 2), "n3");
  }
}


// An ask is "in flight" below while the owner holds it unanswered: the
// owner's connections then drop (as in a crash), and only later does
// membership say the node is gone (forget). The idempotent Where waits
// through both and is answered by the shard's next owner; the Deposit, not
// declared idempotent, gets the explicit error at once.
// proves: C1
TEST_F(Sharding, AnIdempotentAskOutToAnOwnerWhoseConnectionsDropIsAnsweredByTheNextOwnerAndOthersGetTheExplicitError) {
  boot({"n1", "n2", "n3"}, 16, 4s, true, MessageOptions{.idempotent = true});
  std::string id = entity_on("n3", "victim-");
  auto [where_f, deposit_f] = asks_held_by("n3", id, 20s);
  drop_connections("n3");
  auto dep = deposit_f.get();
  ASSERT_FALSE(dep.ok()) << "the Deposit was answered " << dep.value();
  EXPECT_EQ(dep.error().code(), ErrorCode::unreachable);
  EXPECT_NE(dep.error().message().find("may or may not have been handled"), std::string::npos) << dep.error().to_string();
  // The connection broke, but nothing says yet that n3 is gone: the Where
  // waits (re-sent towards the owner the directory still names).
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(where_f.ready());
  forget("n3");
  // The next owner recovered the entity in Settling; its episode ends.
  ASSERT_TRUE(node("n1").region->tell(id, test::Finish{}).ok());
  auto w = where_f.get();
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  std::string next = placement->placement("account", shard_of(id, 16))->owner;
  EXPECT_NE(next, "n3");
  EXPECT_EQ(w.value(), next + " " + id + " 0") << "the Deposit held by n3 was never stored";
  EXPECT_GE(node("n1").region->stats().resent, 1u);
}

// The same failure with an asker that stops waiting first: the re-sent ask
// ends with its own timeout and is never delivered afterwards.
// proves: C1
TEST_F(Sharding, AnIdempotentAskIsNotSentAgainAfterItsAskerStoppedWaiting) {
  boot({"n1", "n2"}, 16, 4s, true, MessageOptions{.idempotent = true});
  std::string id = entity_on("n2", "late-");
  auto [where_f, deposit_f] = asks_held_by("n2", id, 1500ms);
  drop_connections("n2");
  EXPECT_FALSE(deposit_f.get().ok());
  auto w = where_f.get();
  ASSERT_FALSE(w.ok()) << w.value();
  EXPECT_EQ(w.error().code(), ErrorCode::timeout) << w.error().to_string();
  auto resent = node("n1").region->stats().resent;
  EXPECT_EQ(resent, 1u);
  forget("n2");
  // n1 now hosts the shard; the Where is dropped, not delivered there.
  ASSERT_TRUE(node("n1").region->tell(id, test::Finish{}).ok());
  EXPECT_EQ(where(node("n1"), id), "n1 " + id + " 0");
  EXPECT_EQ(node("n1").region->stats().resent, resent);
  EXPECT_EQ(node("n1").region->stats().buffered, 0u);
}

// A sender may still name a shard's owner after that node left its address
// book: it looked the shard up just before the owner handed it off and
// left. Its ask was then never sent, so even one not declared idempotent
// waits for the next owner instead of failing.
// proves: C2
TEST_F(Sharding, AnAskToAnOwnerAlreadyGoneFromTheAddressBookWaitsForTheNextOwner) {
  boot({"n1", "n2", "n3"});
  std::string id = entity_on("n3", "gone-");
  node("n1").remoting->remove_peer("n3");  // n1 has heard that n3 left; its view of the shard not yet
  auto dep = node("n1").region->ask<std::int64_t>(
      id, [](ReplyTo<std::int64_t> r) { return test::Deposit{5, std::move(r)}; }, 10s);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(dep.ready()) << "answered while the directory still named the departed owner";
  ASSERT_TRUE(placement->move("account", shard_of(id, 16), "n2").ok());
  auto r = dep.get();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r.value(), 5);
  EXPECT_EQ(where(node("n2"), id), "n2 " + id + " 5");
}

// proves: X1
TEST_F(Sharding, BadSettingsAreRefusedWithTheReason) {
  boot({"n1"});
  auto s = settings();
  s.shard_count = 0;
  auto r = ShardRegion<Account>::start(*nodes[0]->system, journal, *nodes[0]->remoting, *nodes[0]->directory, s,
                                       test::account_events(), test::account_commands());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("shard_count"), std::string::npos);
  auto again = ShardRegion<Account>::start(*nodes[0]->system, journal, *nodes[0]->remoting, *nodes[0]->directory,
                                           settings(), test::account_events(), test::account_commands());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace troupe::cluster
