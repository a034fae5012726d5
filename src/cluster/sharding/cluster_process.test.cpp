// The cluster as it runs: node processes (cluster_test_node) on 127.0.0.1
// with a real redis-server and PostgreSQL, driven from this process over
// the nodes' own transport. After each run a history checker reads every
// node's log of stored events: no seq stored twice, no two incarnations of
// one entity interleaved (never active on two nodes at once), and every
// deposit a client saw acknowledged is in the journal.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../persist/postgres/postgres_test_server.hpp"
#include "../redis/redis_test_server.hpp"
#include "cluster_test_protocol.hpp"
#include "node_process.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/sharding.hpp"
#include "troupe/persist/postgres_journal.hpp"

#ifndef TROUPE_CLUSTER_TEST_NODE
#error "TROUPE_CLUSTER_TEST_NODE (the cluster_test_node binary) must be defined"
#endif

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using namespace troupe::cluster::proc;

// Real-time bounds of these tests. A sanitizer build runs the nodes several
// times slower, so its bounds get slack; what they bound stays the same.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr std::chrono::milliseconds kSlowBuildSlack{3000};
#else
constexpr std::chrono::milliseconds kSlowBuildSlack{0};
#endif

struct HistoryLine {
  std::string entity, node;
  std::uint64_t incarnation = 0, seq = 0;
  std::int64_t amount = 0;
};

class ClusterProcesses : public ::testing::Test {
 protected:
  troupe::test::RedisTestServer redis;
  std::string conninfo = troupe::test::shared_postgres_conninfo();
  std::string schema = troupe::test::fresh_schema();
  std::filesystem::path dir;
  std::map<std::string, std::unique_ptr<NodeProcess>> nodes;
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<Remoting> driver;
  std::shared_ptr<const MessageCodecs<CtlMsg>> codecs = std::make_shared<const MessageCodecs<CtlMsg>>(ctl_codecs());
  int threshold_ms = 1000;
  int margin_ms = 300;

  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-cluster-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir = pattern;
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_dead_letters = false;
    system = std::make_unique<ActorSystem>(std::move(cfg));
    Remoting::Settings rs;
    rs.node_id = "driver";
    auto r = Remoting::start(*system, rs);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    driver = std::move(r.value());
  }
  void TearDown() override {
    nodes.clear();
    driver->stop();
    system->shutdown();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  NodeProcess& start_node(const std::string& id, int settle_ms = 30000) {
    std::vector<std::string> args = {"--redis-port", std::to_string(redis.port()), "--postgres", conninfo,
                                     "--schema", schema, "--history", (dir / (id + ".log")).string(),
                                     "--shards", "30", "--heartbeat-ms", "200",
                                     "--threshold-ms", std::to_string(threshold_ms), "--margin-ms", std::to_string(margin_ms),
                                     "--sync-ms", "1000", "--command-timeout-ms", "500",
                                     "--settle-ms", std::to_string(settle_ms)};
    auto n = std::make_unique<NodeProcess>(TROUPE_CLUSTER_TEST_NODE, id, args);
    driver->set_peer(id, "127.0.0.1", n->port());
    auto& ref = *n;
    nodes[id] = std::move(n);
    return ref;
  }

  RemoteRef<CtlMsg> ctl(const std::string& node) { return driver->remote<CtlMsg>(node, "ctl", codecs); }

  std::string stats(const std::string& node) {
    auto st = ctl(node).ask<std::string>([](ReplyTo<std::string> r) { return CtlStats{std::move(r)}; }, 10s).get();
    return st.ok() ? st.value() : "error: " + st.error().to_string();
  }
  // Until every running node sees every running node as a member.
  void await_members() {
    std::size_t n = 0;
    for (auto& [id, p] : nodes) n += p->running() ? 1 : 0;
    auto until = std::chrono::steady_clock::now() + 20s;
    for (auto& [id, p] : nodes) {
      if (!p->running()) continue;
      while (stats(id).find("members=" + std::to_string(n)) == std::string::npos) {
        ASSERT_LT(std::chrono::steady_clock::now(), until) << id << " never saw " << n << " members: " << stats(id);
        std::this_thread::sleep_for(20ms);
      }
    }
  }

  Result<std::int64_t> deposit(const std::string& via, const std::string& entity, Duration t = 25s) {
    return ctl(via).ask<std::int64_t>([&](ReplyTo<std::int64_t> r) { return CtlDeposit{entity, 1, std::move(r)}; }, t).get();
  }
  Result<std::int64_t> credit(const std::string& via, const std::string& entity, const std::string& op, Duration t = 25s) {
    return ctl(via)
        .ask<std::int64_t>([&](ReplyTo<std::int64_t> r) { return CtlCredit{entity, op, 1, std::move(r)}; }, t)
        .get();
  }
  Result<std::string> where(const std::string& via, const std::string& entity, Duration t = 25s) {
    return ctl(via).ask<std::string>([&](ReplyTo<std::string> r) { return CtlWhere{entity, std::move(r)}; }, t).get();
  }

  std::vector<HistoryLine> history() {
    std::vector<HistoryLine> out;
    for (auto& f : std::filesystem::directory_iterator(dir)) {
      std::ifstream in(f.path());
      std::string line;
      while (std::getline(in, line)) {
        std::istringstream ss(line);
        HistoryLine h;
        ss >> h.entity >> h.node >> h.incarnation >> h.seq >> h.amount;
        if (!ss.fail()) out.push_back(h);
      }
    }
    return out;
  }

  // No seq stored twice; each incarnation's seqs contiguous and not
  // interleaved with another's: one entity was never active on two nodes.
  void check_history(std::size_t* incarnations_seen = nullptr) {
    std::map<std::string, std::vector<HistoryLine>> by_entity;
    for (auto& h : history()) by_entity[h.entity].push_back(h);
    std::size_t incarnations = 0;
    for (auto& [entity, lines] : by_entity) {
      std::set<std::uint64_t> seqs;
      for (auto& l : lines) EXPECT_TRUE(seqs.insert(l.seq).second) << entity << " seq " << l.seq << " stored twice";
      std::map<std::uint64_t, std::pair<std::uint64_t, std::uint64_t>> range;  // incarnation -> [min, max]
      std::map<std::uint64_t, std::string> node_of;
      for (auto& l : lines) {
        auto [it, fresh] = range.try_emplace(l.incarnation, l.seq, l.seq);
        if (!fresh) {
          it->second.first = std::min(it->second.first, l.seq);
          it->second.second = std::max(it->second.second, l.seq);
        }
        node_of[l.incarnation] = l.node;
      }
      std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
      for (auto& [inc, r] : range) spans.push_back(r);
      std::sort(spans.begin(), spans.end());
      for (std::size_t i = 1; i < spans.size(); ++i)
        EXPECT_GT(spans[i].first, spans[i - 1].second) << entity << ": two incarnations interleaved";
      incarnations += range.size();
    }
    if (incarnations_seen) *incarnations_seen = incarnations;
  }

  // Every acknowledged deposit (the balance it answered, each deposit being
  // 1) is in the journal.
  void check_acknowledged(const std::map<std::string, std::int64_t>& highest_acked) {
    PostgresJournalOptions jo;
    jo.conninfo = conninfo;
    jo.schema = schema;
    auto j = PostgresJournal::open(jo);
    ASSERT_TRUE(j.ok()) << j.error().to_string();
    for (auto& [entity, balance] : highest_acked) {
      std::promise<Result<std::uint64_t>> p;
      j.value()->highest_seq(std::string(kLedgerType) + "|" + entity,
                             [&](Result<std::uint64_t> r) { p.set_value(std::move(r)); });
      auto h = p.get_future().get();
      ASSERT_TRUE(h.ok()) << h.error().to_string();
      EXPECT_GE(static_cast<std::int64_t>(h.value()), balance) << entity << ": an acknowledged deposit is missing";
    }
  }

  // One cycle of the kill tests: n3 gets its share back (a rebalance:
  // hand-offs from live owners), serves under load for a moment, dies by
  // SIGKILL and starts again. Whether it hosted shards when it died.
  bool kill_and_restart_n3() {
    auto moved = ctl("n1").ask<std::int64_t>([](ReplyTo<std::int64_t> r) { return CtlRebalance{std::move(r)}; }, 10s).get();
    EXPECT_TRUE(moved.ok()) << moved.error().to_string();
    std::this_thread::sleep_for(400ms);
    bool hosted = stats("n3").find("hosted=0 ") == std::string::npos;
    nodes["n3"]->kill9();
    nodes.erase("n3");
    std::this_thread::sleep_for(300ms);
    start_node("n3");
    await_members();
    return hosted;
  }

  static std::string owner(const std::string& where_reply) { return where_reply.substr(0, where_reply.find(' ')); }
};

// proves: E5, W3
TEST_F(ClusterProcesses, ThreeNodesTenThousandEntitiesReachedFromEveryNode) {
  for (auto id : {"n1", "n2", "n3"}) start_node(id);
  await_members();
  std::vector<std::string> via = {"n1", "n2", "n3"};
  // 10,000 entities, each deposited once through a different node than the
  // one it is read back through; many asks in flight at once.
  constexpr int kEntities = 10'000;
  std::vector<Future<std::int64_t>> pending;
  std::map<std::string, std::int64_t> acked;
  for (int i = 0; i < kEntities; ++i) {
    std::string e = "acct-" + std::to_string(i);
    pending.push_back(ctl(via[i % 3]).ask<std::int64_t>([e](ReplyTo<std::int64_t> r) { return CtlDeposit{e, 1, std::move(r)}; }, 60s));
    if (pending.size() == 500 || i == kEntities - 1) {
      for (auto& f : pending) {
        auto r = f.get();
        ASSERT_TRUE(r.ok()) << r.error().to_string();
        EXPECT_EQ(r.value(), 1);
      }
      pending.clear();
    }
    acked[e] = 1;
  }
  std::map<std::string, int> per_owner;
  for (int i = 0; i < kEntities; i += 7) {
    std::string e = "acct-" + std::to_string(i);
    std::set<std::string> owners;
    for (auto& v : via) {
      auto w = where(v, e);
      ASSERT_TRUE(w.ok()) << w.error().to_string();
      EXPECT_EQ(w.value().substr(w.value().find(' ') + 1), "1");
      owners.insert(owner(w.value()));
    }
    EXPECT_EQ(owners.size(), 1u) << e;
    ++per_owner[*owners.begin()];
  }
  EXPECT_EQ(per_owner.size(), 3u);
  check_history();
  check_acknowledged(acked);
}

// proves: E7, W2
TEST_F(ClusterProcesses, KillNineUnderLoadFailsOverWithinTheThresholdAndLosesNothingAcknowledged) {
  for (auto id : {"n1", "n2", "n3"}) start_node(id);
  await_members();
  constexpr int kEntities = 300;
  std::map<std::string, std::int64_t> acked;
  std::mutex acked_mu;
  // Find entities owned by n3 (the victim).
  std::vector<std::string> on_victim;
  for (int i = 0; i < kEntities; ++i) {
    std::string e = "k-" + std::to_string(i);
    auto d = deposit("n1", e);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    acked[e] = d.value();
    auto w = where("n1", e);
    ASSERT_TRUE(w.ok());
    if (owner(w.value()) == "n3") on_victim.push_back(e);
  }
  ASSERT_FALSE(on_victim.empty());
  // Load from two client threads through the survivors.
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  auto load = [&](std::string via, unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load()) {
      std::string e = "k-" + std::to_string(rng() % kEntities);
      auto d = deposit(via, e, 10s);
      if (d.ok()) {
        std::lock_guard lk(acked_mu);
        acked[e] = std::max(acked[e], d.value());
      } else {
        ++failures;
      }
    }
  };
  std::thread l1(load, "n1", 1), l2(load, "n2", 2);
  std::this_thread::sleep_for(1s);
  auto killed_at = std::chrono::steady_clock::now();
  nodes["n3"]->kill9();
  // Every entity of the dead node answers again, from a survivor.
  for (auto& e : on_victim) {
    for (;;) {
      auto w = where("n1", e, 1s);
      if (w.ok() && owner(w.value()) != "n3") break;
      if (std::chrono::steady_clock::now() - killed_at > 30s) {
        stop = true;
        l1.join();
        l2.join();
        FAIL() << e << " never came back: " << (w.ok() ? w.value() : w.error().to_string()) << "; n1: " << stats("n1");
      }
    }
  }
  auto failover = std::chrono::steady_clock::now() - killed_at;
  std::this_thread::sleep_for(500ms);
  stop = true;
  l1.join();
  l2.join();
  RecordProperty("failover_ms", static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(failover).count()));
  std::fprintf(stderr, "failover: %lld ms\n", static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(failover).count()));
  EXPECT_LT(failover, std::chrono::milliseconds(threshold_ms + 2000) + kSlowBuildSlack)
      << "failover took " << std::chrono::duration_cast<std::chrono::milliseconds>(failover).count() << " ms";
  check_history();
  check_acknowledged(acked);
}

// proves: E7, W2
TEST_F(ClusterProcesses, TwentyKillRestartCyclesLoseNothingAcknowledgedAndNeverActivateTwice) {
  for (auto id : {"n1", "n2", "n3"}) start_node(id);
  await_members();
  constexpr int kEntities = 60;
  std::map<std::string, std::int64_t> acked;
  std::mutex acked_mu;
  std::atomic<bool> stop{false};
  auto load = [&](std::string via, unsigned seed) {
    std::mt19937 rng(seed);
    while (!stop.load()) {
      std::string e = "c-" + std::to_string(rng() % kEntities);
      auto d = deposit(via, e, 5s);
      if (d.ok()) {
        std::lock_guard lk(acked_mu);
        acked[e] = std::max(acked[e], d.value());
      }
    }
  };
  std::thread l1(load, "n1", 7), l2(load, "n2", 8);
  int cycles_with_shards = 0;
  for (int cycle = 0; cycle < 20; ++cycle) cycles_with_shards += kill_and_restart_n3() ? 1 : 0;
  EXPECT_GE(cycles_with_shards, 15) << "n3 seldom hosted shards when it was killed";
  std::this_thread::sleep_for(1s);
  stop = true;
  l1.join();
  l2.join();
  std::size_t incarnations = 0;
  check_history(&incarnations);
  check_acknowledged(acked);
  EXPECT_GT(incarnations, static_cast<std::size_t>(kEntities)) << "the kills moved no entity";
}

// Idempotent commands (ledger Credit, one op id per request) under load
// from four clients through the survivors while n3, which holds a third of
// the shards each time, is killed with SIGKILL twenty times. Every Credit
// in flight to n3 when it dies is re-sent to the shard's next owner: no
// client sees an error, no op is stored twice (each entity's balance is
// the number of distinct ops acknowledged to it), nothing acknowledged is
// lost, and no entity is ever active on two nodes.
// proves: C1
TEST_F(ClusterProcesses, TwentyKillNineCyclesUnderLoadIdempotentCommandsSeeNoErrorAndApplyOnce) {
  for (auto id : {"n1", "n2", "n3"}) start_node(id);
  await_members();
  constexpr int kEntities = 60;
  std::mutex mu;
  std::map<std::string, std::int64_t> acked;            // entity -> highest balance answered
  std::map<std::string, std::set<std::string>> ops_of;  // entity -> ops acknowledged
  std::vector<std::string> errors;
  std::atomic<long> answered{0};
  std::atomic<bool> stop{false};
  auto load = [&](std::string via, std::string client, unsigned seed) {
    std::mt19937 rng(seed);
    for (long n = 0; !stop.load(); ++n) {
      std::string e = "i-" + std::to_string(rng() % kEntities);
      std::string op = client + "-" + std::to_string(n);
      // Generous: a failover takes threshold + margin + a heartbeat; the
      // node's own ask to the region times out after 20 s.
      auto r = credit(via, e, op, 30s);
      std::lock_guard lk(mu);
      if (r.ok()) {
        ++answered;
        acked[e] = std::max(acked[e], r.value());
        ops_of[e].insert(op);
      } else {
        errors.push_back(e + " " + op + ": " + r.error().to_string());
      }
    }
  };
  std::vector<std::thread> clients;
  clients.emplace_back(load, "n1", "a", 11);
  clients.emplace_back(load, "n1", "b", 12);
  clients.emplace_back(load, "n2", "c", 13);
  clients.emplace_back(load, "n2", "d", 14);
  int cycles_with_shards = 0;
  long resent = 0;
  auto resent_of = [&](const std::string& node) {
    auto st = stats(node);
    auto at = st.find("resent=");
    return at == std::string::npos ? 0L : std::atol(st.c_str() + at + 7);
  };
  for (int cycle = 0; cycle < 20; ++cycle) cycles_with_shards += kill_and_restart_n3() ? 1 : 0;
  std::this_thread::sleep_for(1s);
  stop = true;
  for (auto& c : clients) c.join();
  resent = resent_of("n1") + resent_of("n2");
  std::fprintf(stderr, "C1: %ld credits answered, %zu errors, %ld re-sent by n1 and n2\n", answered.load(),
               errors.size(), resent);
  RecordProperty("answered", static_cast<int>(answered.load()));
  RecordProperty("resent", static_cast<int>(resent));
  EXPECT_GE(cycles_with_shards, 15) << "n3 seldom hosted shards when it was killed";
  EXPECT_GT(resent, 0) << "no kill caught a Credit in flight: the test proved nothing";
  EXPECT_TRUE(errors.empty()) << errors.size() << " idempotent commands failed; first: " << errors.front();
  std::size_t incarnations = 0;
  check_history(&incarnations);
  check_acknowledged(acked);
  EXPECT_GT(incarnations, static_cast<std::size_t>(kEntities)) << "the kills moved no entity";
  // Applied once: each balance is the number of distinct ops acknowledged
  // to the entity (every op was acknowledged, so none is in doubt).
  if (errors.empty()) {
    for (auto& [e, ops] : ops_of) {
      auto w = where("n1", e);
      ASSERT_TRUE(w.ok()) << w.error().to_string();
      std::string balance = w.value().substr(w.value().find(' ') + 1);
      EXPECT_EQ(balance, std::to_string(ops.size())) << e << ": an op was stored twice or lost";
    }
  }
}

// E9 with real processes: an owner frozen (SIGSTOP) in the middle of a
// command, past the liveness threshold, wakes up (SIGCONT) after its shard
// was taken over and written to, and appends: the journal refuses the
// append by its placement epoch, and the new owner's history is intact.
// proves: E9
TEST_F(ClusterProcesses, AnOwnerFrozenPastTheThresholdStoresNothingAfterItWakesUp) {
  for (auto id : {"n1", "n2", "n3"}) start_node(id);
  await_members();
  // Two entities of one shard that n2 owns, both active there.
  std::vector<std::string> mine;
  std::uint32_t shard = 0;
  for (int i = 0; i < 2000 && mine.size() < 2; ++i) {
    std::string e = "f-" + std::to_string(i);
    if (!mine.empty() && shard_of(e, 30) != shard) continue;
    auto d = deposit("n1", e, 10s);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    auto w = where("n1", e, 10s);
    ASSERT_TRUE(w.ok()) << w.error().to_string();
    if (owner(w.value()) != "n2") continue;
    if (mine.empty()) shard = shard_of(e, 30);
    mine.push_back(e);
  }
  ASSERT_EQ(mine.size(), 2u) << "n2 owns no shard with two of the entities tried";
  const std::string& written = mine[0];  // the new owner appends to it
  const std::string& stale = mine[1];    // the frozen owner appends to it
  ASSERT_TRUE(deposit("n2", stale, 10s).ok());  // balance 2, active on n2

  // n2 takes a deposit to `stale` and freezes between deciding it and
  // appending it: the handler marks the entity as held, then sleeps.
  const auto marker = dir / "n2.log.holding";
  auto held = ctl("n2").ask<std::int64_t>(
      [&](ReplyTo<std::int64_t> r) { return CtlDeposit{stale, 1, std::move(r), 1500}; }, 60s);
  const auto asked_at = std::chrono::steady_clock::now();
  for (;;) {
    std::string line;
    std::ifstream(marker) >> line;
    if (line == stale) break;
    ASSERT_LT(std::chrono::steady_clock::now() - asked_at, 20s) << "n2 never started the held deposit";
    std::this_thread::sleep_for(2ms);
  }
  nodes["n2"]->pause();
  const auto paused_at = std::chrono::steady_clock::now();
  // More deposits to `stale` through n2, waiting in its socket meanwhile.
  std::vector<Future<std::int64_t>> flood;
  for (int i = 0; i < 50; ++i)
    flood.push_back(ctl("n2").ask<std::int64_t>([&](ReplyTo<std::int64_t> r) { return CtlDeposit{stale, 1, std::move(r)}; }, 60s));
  // The shard is taken over and written to.
  for (;;) {
    auto w = where("n1", written, 1s);
    if (w.ok() && owner(w.value()) != "n2") break;
    ASSERT_LT(std::chrono::steady_clock::now() - paused_at, 30s) << "the shard was never taken over";
  }
  auto d = deposit("n1", written, 10s);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_EQ(d.value(), 2);
  // The new owner recovers `stale` too, without writing to it.
  auto w = where("n1", stale, 10s);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  EXPECT_NE(owner(w.value()), "n2");

  // n2 wakes up, none the wiser, and appends the held deposit under the
  // placement epoch it held: the journal refuses it.
  nodes["n2"]->resume();
  auto h = held.get();
  ASSERT_FALSE(h.ok()) << "the frozen owner's deposit was stored (balance " << h.value() << ")";
  EXPECT_EQ(h.error().code(), ErrorCode::journal_conflict) << h.error().to_string();
  EXPECT_NE(h.error().message().find("a newer owner has taken over"), std::string::npos) << h.error().to_string();
  // The deposits that waited behind it were never n2's to store: each is
  // answered by the new owner or fails, none stored under n2's old epoch.
  int answered = 0, other = 0;
  std::int64_t highest = 2;
  for (auto& f : flood) {
    auto r = f.get();
    if (r.ok()) {
      ++answered;
      highest = std::max(highest, r.value());
    } else {
      ++other;
    }
  }
  std::fprintf(stderr, "deposits queued behind the held one: %d answered, %d failed\n", answered, other);
  // The new owner's history of `stale` goes on unbroken: its next deposit
  // lands on top of every acknowledged one, and nothing of n2's old
  // incarnation was stored after the takeover (no incarnations interleaved).
  auto next = deposit("n1", stale, 10s);
  ASSERT_TRUE(next.ok()) << next.error().to_string();
  EXPECT_GE(next.value(), highest + 1);
  EXPECT_LE(next.value(), highest + 1 + other) << "an unacknowledged deposit was stored";
  auto where_now = where("n1", stale, 10s);
  ASSERT_TRUE(where_now.ok());
  EXPECT_NE(owner(where_now.value()), "n2");
  check_history();
  std::map<std::string, std::int64_t> acked{{written, 2}, {stale, next.value()}};
  check_acknowledged(acked);
}

// proves: E6
TEST_F(ClusterProcesses, AGracefulShutdownWaitsForSettlingEntitiesBeforeHandingThemOff) {
  start_node("n1", 2000);
  start_node("n2", 2000);
  await_members();
  // An entity on n2 in Settling (its episode ends by deadline after 2 s).
  std::string e;
  for (int i = 0;; ++i) {
    e = "g-" + std::to_string(i);
    auto w = where("n1", e);
    ASSERT_TRUE(w.ok()) << w.error().to_string();
    if (owner(w.value()) == "n2") break;
  }
  auto s = ctl("n1").ask<std::string>([&](ReplyTo<std::string> r) { return CtlSettle{e, std::move(r)}; }, 10s).get();
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(nodes["n2"]->terminate(60s));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 1500ms) << "the hand-off did not wait for the episode";
  auto w = where("n1", e);
  ASSERT_TRUE(w.ok()) << w.error().to_string();
  EXPECT_EQ(w.value(), "n1 0") << "the episode ended (deadline) before the shard moved";
  check_history();
}

// proves: W2, W7, E7
TEST_F(ClusterProcesses, RedisAwayForTenSecondsFencesTheNodesThenTheyResumeWithNothingLost) {
  for (auto id : {"n1", "n2", "n3"}) start_node(id);
  await_members();
  std::map<std::string, std::int64_t> acked;
  for (int i = 0; i < 100; ++i) {
    std::string e = "r-" + std::to_string(i);
    auto d = deposit("n1", e);
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    acked[e] = d.value();
  }
  redis.stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(threshold_ms + 500));
  // Every node fenced itself: no shard is hosted anywhere.
  for (auto id : {"n1", "n2", "n3"}) {
    auto st = stats(id);
    EXPECT_NE(st.find("hosted=0"), std::string::npos) << id << ": " << st;
    EXPECT_NE(st.find("fenced=1"), std::string::npos) << id << ": " << st;
  }
  std::this_thread::sleep_for(10s - std::chrono::milliseconds(threshold_ms + 500));
  redis.start();
  // They resume: every entity answers with its balance.
  auto until = std::chrono::steady_clock::now() + 30s;
  for (auto& [e, balance] : acked) {
    // An attempt that timed out may still have been stored: each adds at
    // most one.
    for (int attempts = 1;; ++attempts) {
      auto d = deposit("n2", e, 5s);
      if (d.ok()) {
        EXPECT_GE(d.value(), balance + 1) << e;
        EXPECT_LE(d.value(), balance + attempts) << e;
        balance = d.value();
        break;
      }
      ASSERT_LT(std::chrono::steady_clock::now(), until) << e << ": " << d.error().to_string();
    }
  }
  check_history();
  check_acknowledged(acked);
}

}  // namespace
}  // namespace troupe::cluster
