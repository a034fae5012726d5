// The cluster singleton (SPEC R3) on nodes in one process, placed through a
// real redis-server: one instance on an eligible member, a proxy that routes
// to it from any node and buffers (bounded) while it moves, graceful hand-off
// on leave, takeover after a node dies, and its epoch as a fence.

#include "troupe/cluster/singleton.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../redis/redis_test_server.hpp"
#include "../sharding/in_process_nodes.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

struct Ping {
  std::uint64_t seq = 0;
};
// Asks how many pings it got, and on which node it runs.
struct Count {
  ReplyTo<std::string> reply_to;
};
using BeaconMsg = std::variant<Ping, Count>;

MessageCodecs<BeaconMsg> ping_codecs() {
  MessageCodecs<BeaconMsg> c;
  (void)c.add<Ping>("test.Ping", [](const Ping& p, ByteWriter& w) { w.u64(p.seq); },
                    [](ByteReader& r) -> Result<Ping> {
                      Ping p;
                      p.seq = r.u64();
                      return r.finish(p);
                    });
  (void)c.add<Count>(
      "test.Count", [](const Count&, ByteWriter&) {}, [](ByteReader& r) -> Result<Count> { return r.finish(Count{}); },
      [](const std::string& s, ByteWriter& w) { w.str(s); },
      [](ByteReader& r) -> Result<std::string> {
        std::string s = r.str();
        return r.finish(std::move(s));
      });
  return c;
}

// What the instances did, in order: starts, stops and the pings they got.
struct Record {
  struct Life {
    std::string node;
    std::uint64_t epoch = 0;
    Steady::time_point started{};
    std::optional<Steady::time_point> stopped;
    bool fence_raised = false;
  };
  std::mutex mu;
  std::vector<Life> lives;
  std::vector<std::uint64_t> pings;
  std::shared_ptr<Journal> journal = std::make_shared<MemoryJournal>();

  std::vector<Life> snapshot() {
    std::lock_guard lock(mu);
    return lives;
  }
  std::vector<std::uint64_t> received() {
    std::lock_guard lock(mu);
    return pings;
  }
  std::size_t running() {
    std::lock_guard lock(mu);
    std::size_t n = 0;
    for (auto& l : lives) n += l.stopped ? 0 : 1;
    return n;
  }
};

// The singleton: raises its epoch as the fence of what it writes.
class Beacon final : public Actor<BeaconMsg> {
 public:
  Beacon(SingletonStart s, std::shared_ptr<Record> rec) : s_(std::move(s)), rec_(std::move(rec)) {}
  void on_start() {
    auto raised = journal_sync::wait_for<void>(
        [&](auto cb) { rec_->journal->raise_fence("singleton/" + s_.name, s_.epoch, std::move(cb)); });
    std::lock_guard lock(rec_->mu);
    rec_->lives.push_back({s_.node, s_.epoch, Steady::now(), std::nullopt, raised.ok()});
  }
  void receive(BeaconMsg& m) {
    std::lock_guard lock(rec_->mu);
    if (auto* p = std::get_if<Ping>(&m)) rec_->pings.push_back(p->seq);
    if (auto* c = std::get_if<Count>(&m)) c->reply_to.reply(s_.node + " " + std::to_string(rec_->pings.size()));
  }
  // Stopping takes a while (it finishes its work): the next instance must
  // wait for it, not only for the request to stop.
  void on_stop() {
    std::this_thread::sleep_for(50ms);
    std::lock_guard lock(rec_->mu);
    for (auto& l : rec_->lives)
      if (l.node == s_.node && l.epoch == s_.epoch) l.stopped = Steady::now();
  }

 private:
  SingletonStart s_;
  std::shared_ptr<Record> rec_;
};

struct Node {
  std::string id;
  std::unique_ptr<ActorSystem> system;
  std::unique_ptr<Cluster> cluster;
  std::optional<ClusterSingleton<BeaconMsg>> singleton;
  std::optional<SingletonProxy<BeaconMsg>> proxy;
};

constexpr auto kThreshold = 600ms;
constexpr auto kMargin = 200ms;

class Singleton : public ::testing::Test {
 protected:
  troupe::test::RedisTestServer redis;
  std::shared_ptr<Record> rec = std::make_shared<Record>();
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<ClusterSingleton<BeaconMsg>> extra;  // more singletons

  // A node's own order: the cluster goes first, and stops the singleton's
  // side before it goes (Cluster::at_destroy).
  void TearDown() override {
    for (auto& n : nodes) n->cluster.reset();
    for (auto& n : nodes) n->system->shutdown();
  }

  Node& add(const std::string& id, std::vector<std::string> roles = {}) {
    auto n = std::make_unique<Node>();
    n->id = id;
    n->system = test::quiet_system();
    ClusterSettings cs;
    cs.security.insecure = true;
    cs.node_id = id;
    cs.roles = std::move(roles);
    cs.coordination.redis_port = static_cast<std::uint16_t>(redis.port());
    cs.coordination.key_prefix = "singleton-test";
    cs.coordination.heartbeat_interval = 100ms;
    cs.coordination.liveness_threshold = kThreshold;
    cs.coordination.takeover_margin = kMargin;
    cs.coordination.sync_interval = 500ms;
    cs.coordination.command_timeout = 2s;
    cs.coordination.log = [](CoordinatorLogLevel, std::string_view) {};
    auto c = Cluster::start(*n->system, cs);
    if (!c.ok()) throw std::runtime_error(c.error().to_string());
    n->cluster = std::move(c.value());
    nodes.push_back(std::move(n));
    return *nodes.back();
  }

  SingletonSettings settings(std::vector<std::string> roles = {}, std::size_t buffer = 10'000) {
    return SingletonSettings{.name = "beacon", .roles = std::move(roles), .buffer = buffer,
                             .resolve_interval = 20ms};
  }
  void host(Node& n, std::vector<std::string> roles = {}) {
    auto s = start_singleton<Beacon>(*n.system, *n.cluster, settings(std::move(roles)), ping_codecs(), rec);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    n.singleton.emplace(s.value());
  }
  SingletonProxy<BeaconMsg> proxy_of(Node& n) { return n.singleton ? n.singleton->proxy() : *n.proxy; }

  Node* running_node() {
    Node* found = nullptr;
    for (auto& n : nodes)
      if (n->cluster && n->singleton && n->singleton->running_here() != 0) found = n.get();
    return found;
  }
  std::size_t running_count() {
    std::size_t k = 0;
    for (auto& n : nodes) k += n->cluster && n->singleton && n->singleton->running_here() != 0 ? 1 : 0;
    return k;
  }
  // Tells `from` pings first..last and waits until the instance got `last`.
  void ping(Node& from, std::uint64_t first, std::uint64_t last) {
    auto p = proxy_of(from);
    for (auto i = first; i <= last; ++i) ASSERT_TRUE(p.tell(Ping{i}).ok()) << i;
    ASSERT_TRUE(test::eventually([&] {
      auto r = rec->received();
      return !r.empty() && r.back() == last;
    })) << "ping " << last << " never arrived";
  }
  static void expect_increasing(const std::vector<std::uint64_t>& v) {
    for (std::size_t i = 1; i < v.size(); ++i) ASSERT_LT(v[i - 1], v[i]) << "out of order at " << i;
  }
  // No two lives overlap; each later one has a larger epoch (or, when the
  // same owner runs it again after a fence, `same_owner_may_repeat`, the same).
  void expect_one_at_a_time(bool same_owner_may_repeat = false) {
    auto lives = rec->snapshot();
    for (std::size_t i = 1; i < lives.size(); ++i) {
      ASSERT_TRUE(lives[i - 1].stopped.has_value()) << lives[i - 1].node << " never stopped";
      EXPECT_LE(*lives[i - 1].stopped, lives[i].started) << lives[i - 1].node << " and " << lives[i].node;
      if (same_owner_may_repeat && lives[i].node == lives[i - 1].node)
        EXPECT_GE(lives[i].epoch, lives[i - 1].epoch);
      else
        EXPECT_GT(lives[i].epoch, lives[i - 1].epoch);
    }
  }
};

TEST_F(Singleton, BadSettingsAreRefusedNamingTheSetting) {
  auto& a = add("a");
  auto bad = [&](SingletonSettings s) {
    auto r = start_singleton<Beacon>(*a.system, *a.cluster, std::move(s), ping_codecs(), rec);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.error().message();
  };
  EXPECT_NE(bad({.name = ""}).find("name"), std::string::npos);
  EXPECT_NE(bad({.name = "has space"}).find("name"), std::string::npos);
  EXPECT_NE(bad({.name = "b", .roles = {"x y"}}).find("roles"), std::string::npos);
  EXPECT_NE(bad({.name = "b", .buffer = 0}).find("buffer"), std::string::npos);
  EXPECT_NE(bad({.name = "b", .resolve_interval = 0ms}).find("resolve_interval"), std::string::npos);
  host(a);
  EXPECT_NE(bad(settings()).find("in use"), std::string::npos);
}

TEST(SingletonWire, ControlMessagesRoundTripAndTruncatedOnesAreRefused) {
  using namespace detail::singleton;
  auto codecs = ctl_codecs<BeaconMsg>();
  AgentMsg<BeaconMsg> here = Here{"node-b", 42};
  ByteWriter w;
  auto id = codecs.encode(here, w);
  ASSERT_TRUE(id.ok());
  auto back = codecs.decode(id.value(), w.bytes(), nullptr);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_TRUE(std::holds_alternative<Here>(back.value()));
  EXPECT_EQ(std::get<Here>(back.value()).node, "node-b");
  EXPECT_EQ(std::get<Here>(back.value()).epoch, 42u);
  for (std::size_t cut = 0; cut < w.bytes().size(); ++cut) {
    auto bad = codecs.decode(id.value(), std::string_view(w.bytes()).substr(0, cut), nullptr);
    EXPECT_FALSE(bad.ok()) << "cut at " << cut;
  }
  // Only the three control messages cross: a Send or a Tick has no codec.
  AgentMsg<BeaconMsg> tick = Tick{};
  ByteWriter w2;
  EXPECT_FALSE(codecs.encode(tick, w2).ok());
}

// Destroying a cluster whose node runs the instance stops it first (the
// actor system lives on); stop() on a proxy-only handle refuses later tells.
TEST_F(Singleton, DestroyingTheClusterStopsTheInstanceAndTheProxyBeforeItGoes) {
  auto& a = add("a");
  host(a);
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }));
  auto p = proxy_of(a);
  a.cluster.reset();
  EXPECT_EQ(rec->running(), 0u);
  EXPECT_EQ(a.singleton->running_here(), 0u);
  std::this_thread::sleep_for(300ms);  // the system runs on: nothing touches the cluster
  auto r = p.tell(Ping{1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  p.stop();  // idempotent
}

// Redis goes away long enough for every node to fence itself: the
// instance stops everywhere, and once Redis is back it runs again (on the
// same node under the same epoch, or moved) and the proxies find it.
TEST_F(Singleton, AfterEveryNodeFencedItselfTheInstanceRunsAgainAndProxiesFindIt) {
  auto& a = add("a");
  auto& b = add("b");
  host(a);
  host(b);
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }));
  ping(a, 1, 5);
  ping(b, 6, 10);
  redis.stop();
  ASSERT_TRUE(test::eventually([&] { return rec->running() == 0; }, 5s)) << "a fenced node kept it running";
  redis.start();
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }, 15s));
  ping(a, 11, 15);
  ping(b, 16, 20);
  expect_one_at_a_time(true);
  expect_increasing(rec->received());
}

// Three hosts, one instance, on the one member holding the role; pings
// from every node (and a node that only proxies) arrive in order.
TEST_F(Singleton, RunsOnceOnAnEligibleMemberAndProxiesReachItFromEveryNode) {
  auto& a = add("a");
  auto& b = add("b", {"batch"});
  auto& c = add("c");
  for (Node* n : {&a, &b, &c}) host(*n, {"batch"});
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }));
  EXPECT_EQ(running_node(), &b);
  auto p = singleton_proxy<BeaconMsg>(*c.system, *c.cluster, settings(), ping_codecs());
  EXPECT_FALSE(p.ok()) << "a second proxy of one name on a node";
  auto& d = add("d");
  auto pd = singleton_proxy<BeaconMsg>(*d.system, *d.cluster, settings(), ping_codecs());
  ASSERT_TRUE(pd.ok()) << pd.error().to_string();
  d.proxy.emplace(pd.value());
  std::uint64_t seq = 0;
  for (Node* n : {&a, &b, &c, &d}) {
    ping(*n, seq + 1, seq + 50);
    seq += 50;
  }
  auto got = rec->received();
  EXPECT_EQ(got.size(), seq);
  expect_increasing(got);
  // Asks from the owner's node, other hosts and a proxy-only node.
  for (Node* n : {&a, &b, &c, &d}) {
    auto r = proxy_of(*n).ask<std::string>([](ReplyTo<std::string> rt) { return Count{std::move(rt)}; }, 5s).get();
    ASSERT_TRUE(r.ok()) << n->id << ": " << r.error().to_string();
    EXPECT_EQ(r.value(), "b " + std::to_string(seq)) << n->id;
  }
  EXPECT_EQ(rec->snapshot().size(), 1u);
  EXPECT_EQ(running_count(), 1u);
  EXPECT_EQ(proxy_of(d).stats().owner, "b");
  EXPECT_EQ(proxy_of(d).stats().delivered, 51u);  // 50 pings and the ask
}

// Nobody may host it yet: the proxy holds `buffer` messages, refuses the
// next one with a counted error, and flushes the held ones in order once
// an eligible member starts it.
// proves: R3
TEST_F(Singleton, TheProxyBuffersUpToItsBoundRefusesVisiblyAndFlushesInOrder) {
  auto& a = add("a");
  host(a, {"batch"});
  auto pa = proxy_of(a);
  // Nothing runs it: a holds no role of it.
  for (std::uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(pa.tell(Ping{i}).ok());
  auto small = start_singleton<Beacon>(*a.system, *a.cluster,
                                       SingletonSettings{.name = "small", .roles = {"batch"}, .buffer = 5},
                                       ping_codecs(), rec);
  ASSERT_TRUE(small.ok());
  extra.push_back(small.value());
  auto ps = small.value().proxy();
  for (std::uint64_t i = 1; i <= 5; ++i) ASSERT_TRUE(ps.tell(Ping{100 + i}).ok()) << i;
  auto refused = ps.tell(Ping{106});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::buffer_overflow);
  EXPECT_NE(refused.error().message().find("small"), std::string::npos) << refused.error().message();
  EXPECT_EQ(ps.stats().refused, 1u);
  EXPECT_EQ(ps.stats().waiting, 5u);
  // Asks wait like tells, within their timeout.
  auto count = [](ReplyTo<std::string> rt) { return Count{std::move(rt)}; };
  auto short_ask = pa.ask<std::string>(count, 100ms);
  auto held_ask = pa.ask<std::string>(count, 20s);
  auto refused_ask = ps.ask<std::string>(count, 20s).get();
  ASSERT_FALSE(refused_ask.ok());
  EXPECT_EQ(refused_ask.error().code(), ErrorCode::buffer_overflow);
  EXPECT_EQ(ps.stats().refused, 2u);
  auto timed_out = short_ask.get();
  ASSERT_FALSE(timed_out.ok());
  EXPECT_EQ(timed_out.error().code(), ErrorCode::timeout);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(rec->received().empty());
  EXPECT_EQ(running_count(), 0u);

  auto& b = add("b", {"batch"});
  host(b, {"batch"});
  auto sb = start_singleton<Beacon>(*b.system, *b.cluster,
                                    SingletonSettings{.name = "small", .roles = {"batch"}, .buffer = 5}, ping_codecs(),
                                    rec);
  ASSERT_TRUE(sb.ok());
  extra.push_back(sb.value());
  ASSERT_TRUE(test::eventually([&] { return rec->received().size() == 8; })) << rec->received().size();
  std::vector<std::uint64_t> got = rec->received();
  std::vector<std::uint64_t> small_got, beacon_got;
  for (auto s : got) (s > 100 ? small_got : beacon_got).push_back(s);
  EXPECT_EQ(beacon_got, (std::vector<std::uint64_t>{1, 2, 3}));
  EXPECT_EQ(small_got, (std::vector<std::uint64_t>{101, 102, 103, 104, 105}));
  EXPECT_EQ(ps.stats().waiting, 0u);
  EXPECT_EQ(ps.stats().owner, "b");
  auto held = held_ask.get();
  ASSERT_TRUE(held.ok()) << held.error().to_string();
  EXPECT_EQ(held.value().substr(0, 2), "b ");
}

// The owner leaves: its instance stops before the next starts (a larger
// epoch), the pings of a proxy on the leaving node are held meanwhile and
// all arrive, in order; the old epoch can no longer write.
// proves: R3
TEST_F(Singleton, LeaveHandsItOverStopFirstThenStartWithoutLosingTheLeaversPings) {
  auto& a = add("a");
  host(a);
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }));
  auto& b = add("b");
  host(b);
  Node* first = running_node();
  ASSERT_NE(first, nullptr);
  Node& other = first == &a ? b : a;
  ping(*first, 1, 20);
  std::uint64_t old_epoch = first->singleton->running_here();

  // The leaver's proxy pings all through the hand-off, until it sends to
  // the new instance (a node that has left can send nothing more).
  std::atomic<std::uint64_t> told{20};
  auto p = proxy_of(*first);
  std::thread pinger([&, until = Steady::now() + 20s] {
    while (p.stats().owner != other.id && Steady::now() < until) {
      if (p.tell(Ping{told + 1}).ok()) ++told;
      std::this_thread::sleep_for(1ms);
    }
  });
  std::this_thread::sleep_for(100ms);
  auto left = first->cluster->leave(10s);
  pinger.join();
  ASSERT_TRUE(left.ok()) << left.error().to_string();
  EXPECT_EQ(left.value().moved, left.value().units);
  ASSERT_TRUE(test::eventually([&] { return other.singleton->running_here() != 0; }));
  // What the leaver's proxy held went to the new instance.
  ASSERT_TRUE(test::eventually([&] { return rec->received().size() == told; }))
      << rec->received().size() << " of " << told.load() << "; stats: waiting " << p.stats().waiting;
  expect_increasing(rec->received());
  expect_one_at_a_time();
  auto lives = rec->snapshot();
  ASSERT_EQ(lives.size(), 2u);
  EXPECT_EQ(lives[1].node, other.id);
  EXPECT_TRUE(lives[1].fence_raised);
  // The old epoch is fenced out of the journal.
  AppendBatch stale{"settlement", {EventRecord{.seq = 1, .type = "t", .payload = "x"}}, {"singleton/beacon", old_epoch}};
  auto w = journal_sync::append(*rec->journal, stale);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.error().code(), ErrorCode::journal_conflict);
  AppendBatch current{"settlement", {EventRecord{.seq = 1, .type = "t", .payload = "x"}},
                      {"singleton/beacon", lives[1].epoch}};
  EXPECT_TRUE(journal_sync::append(*rec->journal, current).ok());
  // Pings from the remaining node reach it too.
  auto from = told.load();
  ping(other, from + 1, from + 10);
}

// The owner dies (no hand-off): another member starts it, with a larger
// epoch, no sooner than the failover rule allows and within its bound; a
// proxy elsewhere buffers and then reaches it. (The SIGKILL cycles of
// singleton_process.test.cpp prove the same with real processes.)
TEST_F(Singleton, ADeadOwnersSingletonRunsElsewhereWithinTheFailoverTime) {
  for (auto id : {"a", "b", "c"}) host(add(id));
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }));
  Node* first = running_node();
  Node* sender = first == nodes[0].get() ? nodes[1].get() : nodes[0].get();
  ping(*sender, 1, 10);
  auto killed_at = Steady::now();
  first->system->shutdown();  // the instance and the agents stop
  first->cluster.reset();     // as a crash looks to the others: no hand-off
  // Pings told meanwhile wait in the sender's proxy (some may go to the dead node first).
  auto p = proxy_of(*sender);
  ASSERT_TRUE(test::eventually([&] { return p.stats().owner != first->id; }, 5s));
  for (std::uint64_t i = 11; i <= 20; ++i) ASSERT_TRUE(p.tell(Ping{i}).ok());
  ASSERT_TRUE(test::eventually([&] { return running_count() == 1; }, 10s));
  std::this_thread::sleep_for(kThreshold);  // no second survivor starts it later
  EXPECT_EQ(running_count(), 1u);
  expect_one_at_a_time();
  auto lives = rec->snapshot();
  ASSERT_EQ(lives.size(), 2u);
  EXPECT_GT(lives[1].epoch, lives[0].epoch);
  EXPECT_GE(lives[1].started - killed_at, kThreshold) << "started while the dead owner could still run it";
  EXPECT_LT(lives[1].started - killed_at, kThreshold + kMargin + 3s);
  ASSERT_TRUE(test::eventually([&] {
    auto r = rec->received();
    return !r.empty() && r.back() == 20;
  }));
  auto got = rec->received();
  expect_increasing(got);
  EXPECT_EQ(std::count_if(got.begin(), got.end(), [](auto s) { return s > 10; }), 10);
}

}  // namespace
}  // namespace troupe::cluster
