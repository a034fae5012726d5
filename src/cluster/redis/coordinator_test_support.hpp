#pragma once
// Test support for the Redis coordinator: a fixture with its own Redis,
// nodes whose Reconcilers record what they run, and a fleet-wide record
// that catches any moment two nodes run the same unit.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "redis_test_server.hpp"
#include "scripts.hpp"
#include "troupe/cluster/coordinator.hpp"

namespace troupe::test {

using namespace std::chrono_literals;
using cluster::Coordinator;
using cluster::CoordinatorLogLevel;
using cluster::CoordinatorSettings;

using Clock = std::chrono::steady_clock;

// Polls `pred` every 10 ms until it holds or `timeout` passes.
template <class P>
bool wait_until(P pred, std::chrono::milliseconds timeout = 10s) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

// Waits for a future with a bound, so a hang fails the test instead of
// stalling it.
template <class T>
Result<T> await(Future<T> f, std::chrono::milliseconds timeout = 15s) {
  if (!f.wait_for(timeout)) return Error(ErrorCode::timeout, "the test gave up waiting");
  return f.get();
}

// Runs functions after a delay, on its own thread (a Reconciler's graceful
// stop that takes a while). Owns the thread; after() is thread-safe; the
// destructor runs what is still queued, at once, then joins.
class Delayer {
 public:
  Delayer() : thread_([this] { run(); }) {}
  ~Delayer() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void after(std::chrono::milliseconds d, std::function<void()> f) {
    {
      std::lock_guard lk(mu_);
      q_.push(Item{Clock::now() + d, seq_++, std::move(f)});
    }
    cv_.notify_one();
  }

 private:
  struct Item {
    Clock::time_point at;
    std::uint64_t seq;
    std::function<void()> f;
    bool operator>(const Item& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  void run() {
    std::unique_lock lk(mu_);
    while (true) {
      if (q_.empty()) {
        if (stop_) return;
        cv_.wait(lk);
        continue;
      }
      auto at = q_.top().at;
      if (Clock::now() < at && !stop_) {
        cv_.wait_until(lk, at);
        continue;
      }
      auto f = q_.top().f;
      q_.pop();
      lk.unlock();
      f();
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> q_;
  std::uint64_t seq_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

// Who runs what, across every node of a test: a start of a unit that another
// node still runs is recorded as an overlap (the fixture fails the test on
// any). Thread-safe (one mutex).
class Fleet {
 public:
  struct Event {
    std::string node;
    std::string kind;  // start, update, stop-begin, stopped
    std::string unit;
    std::uint64_t epoch;
    Clock::time_point at;
  };
  void started(const std::string& node, const std::string& unit, std::uint64_t epoch) {
    std::lock_guard lk(mu_);
    if (auto it = runner_.find(unit); it != runner_.end())
      overlaps_.push_back(unit + " started on " + node + " while running on " + it->second);
    runner_[unit] = node;
    events_.push_back({node, "start", unit, epoch, Clock::now()});
  }
  void updated(const std::string& node, const std::string& unit, std::uint64_t epoch) {
    std::lock_guard lk(mu_);
    events_.push_back({node, "update", unit, epoch, Clock::now()});
  }
  void stop_begun(const std::string& node, const std::string& unit) {
    std::lock_guard lk(mu_);
    events_.push_back({node, "stop-begin", unit, 0, Clock::now()});
  }
  void stopped(const std::string& node, const std::string& unit) {
    std::lock_guard lk(mu_);
    if (auto it = runner_.find(unit); it != runner_.end() && it->second == node) runner_.erase(it);
    events_.push_back({node, "stopped", unit, 0, Clock::now()});
  }
  // A node that crashed stops running everything at once.
  void crashed(const std::string& node) {
    std::lock_guard lk(mu_);
    for (auto it = runner_.begin(); it != runner_.end();)
      it = it->second == node ? runner_.erase(it) : std::next(it);
  }
  std::vector<std::string> overlaps() const {
    std::lock_guard lk(mu_);
    return overlaps_;
  }
  std::vector<Event> events() const {
    std::lock_guard lk(mu_);
    return events_;
  }
  std::size_t starts(const std::string& unit, const std::string& node = "") const {
    std::lock_guard lk(mu_);
    return static_cast<std::size_t>(std::count_if(events_.begin(), events_.end(), [&](const Event& e) {
      return e.kind == "start" && e.unit == unit && (node.empty() || e.node == node);
    }));
  }
  std::string runner(const std::string& unit) const {
    std::lock_guard lk(mu_);
    auto it = runner_.find(unit);
    return it == runner_.end() ? "" : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> runner_;
  std::vector<std::string> overlaps_;
  std::vector<Event> events_;
};

// What one node was told, and its log. Written by the node's callbacks on
// its coordinator thread, read by the test: every field under `mu` (the
// accessors lock it).
struct NodeRecord {
  std::mutex mu;
  std::map<std::string, std::uint64_t> running;  // unit -> epoch (started, stop not completed)
  std::map<std::string, std::string> specs;
  std::vector<std::string> log;
  std::vector<CoordinatorLogLevel> levels;  // of each line of `log`
  int fenced = 0;
  int unfenced = 0;
  Clock::time_point fenced_at{};
  Clock::time_point unfenced_at{};
  int members_changes = 0;
  std::vector<std::string> last_members;
  // Graceful stops still running; a fenced node cuts them short, as the
  // layer above must when on_fenced is called.
  std::vector<std::function<void()>> pending_stops;

  bool log_has(const std::string& needle) {
    std::lock_guard lk(mu);
    return std::any_of(log.begin(), log.end(),
                       [&](const std::string& l) { return l.find(needle) != std::string::npos; });
  }
  // The level of the first line that contains `needle`, if any.
  std::optional<CoordinatorLogLevel> level_of(const std::string& needle) {
    std::lock_guard lk(mu);
    for (std::size_t i = 0; i < log.size(); ++i)
      if (log[i].find(needle) != std::string::npos) return levels[i];
    return std::nullopt;
  }
  Clock::time_point fenced_time() {
    std::lock_guard lk(mu);
    return fenced_at;
  }
  int fenced_count() {
    std::lock_guard lk(mu);
    return fenced;
  }
  int unfenced_count() {
    std::lock_guard lk(mu);
    return unfenced;
  }
  std::map<std::string, std::uint64_t> running_now() {
    std::lock_guard lk(mu);
    return running;
  }
  bool is_fenced_now() {
    std::lock_guard lk(mu);
    return fenced > unfenced;
  }
};

struct TestNode {
  std::string id;
  std::unique_ptr<Coordinator> c;
  std::shared_ptr<NodeRecord> rec;
  Coordinator* operator->() const { return c.get(); }
};

// How many times Redis has run `command` (INFO commandstats; commands run
// by scripts count too), 0 if never.
inline long long calls_of(RedisTestClient& c, const std::string& command) {
  auto info = c.cmd({"INFO", "commandstats"});
  const std::string needle = "cmdstat_" + command + ":calls=";
  auto at = info.str.find(needle);
  if (at == std::string::npos) return 0;
  return std::stoll(info.str.substr(at + needle.size()));
}

// A test with its own redis-server, nodes made by make_node()/add_node()
// (destroyed before Redis at the end) and a Fleet that fails the test if two
// nodes ever ran one unit at once.
class RedisCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { redis = std::make_unique<RedisTestServer>(); }
  void TearDown() override {
    nodes.clear();  // coordinators go before Redis and the delayer
    EXPECT_TRUE(fleet.overlaps().empty()) << "two nodes ran one unit: " << fleet.overlaps().front();
  }

  // Short intervals keep the tests fast; the bounds in the tests are
  // generous multiples of these.
  CoordinatorSettings settings(const std::string& id, int port = 0) {
    CoordinatorSettings s;
    s.node_id = id;
    s.address = {"10.0.0." + std::to_string(1 + nodes.size()),
                 static_cast<std::uint16_t>(7100 + nodes.size())};
    s.redis_port = static_cast<std::uint16_t>(port != 0 ? port : redis->port());
    s.heartbeat_interval = 100ms;
    s.liveness_threshold = 1000ms;
    s.takeover_margin = 500ms;
    s.sync_interval = 1s;
    s.command_timeout = 800ms;
    s.reconnect_min_backoff = 50ms;
    s.reconnect_max_backoff = 300ms;
    return s;
  }

  // Creates a node serving `groups`, without starting it.
  TestNode& make_node(CoordinatorSettings s, const std::vector<std::string>& groups = {"workers"},
                      std::chrono::milliseconds stop_delay = 0ms) {
    auto rec = std::make_shared<NodeRecord>();
    std::string id = s.node_id;
    bool verbose = std::getenv("TROUPE_TEST_VERBOSE") != nullptr;
    s.log = [rec, verbose](CoordinatorLogLevel level, std::string_view line) {
      if (verbose)
        std::fprintf(stderr, "[%d] %.*s\n", static_cast<int>(level), static_cast<int>(line.size()),
                     line.data());
      std::lock_guard lk(rec->mu);
      rec->log.emplace_back(line);
      rec->levels.push_back(level);
    };
    s.on_fenced = [rec] {
      std::vector<std::function<void()>> cut_short;
      {
        std::lock_guard lk(rec->mu);
        ++rec->fenced;
        rec->fenced_at = Clock::now();
        cut_short.swap(rec->pending_stops);
      }
      for (auto& f : cut_short) f();
    };
    s.on_unfenced = [rec] {
      std::lock_guard lk(rec->mu);
      ++rec->unfenced;
      rec->unfenced_at = Clock::now();
    };
    s.on_members_changed = [rec](const std::vector<cluster::Member>& ms) {
      std::lock_guard lk(rec->mu);
      ++rec->members_changes;
      rec->last_members.clear();
      for (const auto& m : ms) rec->last_members.push_back(m.id);
    };
    auto created = Coordinator::create(std::move(s));
    if (!created.ok()) throw std::runtime_error(created.error().to_string());
    TestNode node{id, std::move(created).value(), rec};
    for (const auto& g : groups) {
      auto served = node.c->serve(g, reconciler(id, rec, stop_delay));
      if (!served.ok()) throw std::runtime_error(served.error().to_string());
    }
    nodes.push_back(std::make_unique<TestNode>(std::move(node)));
    return *nodes.back();
  }

  // Creates and starts a node; fails the test if it does not start.
  TestNode& add_node(const std::string& id, const std::vector<std::string>& groups = {"workers"},
                     std::chrono::milliseconds stop_delay = 0ms) {
    return start_node(make_node(settings(id), groups, stop_delay));
  }
  TestNode& start_node(TestNode& n) {
    auto r = await(n->start());
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return n;
  }

  cluster::Reconciler reconciler(const std::string& id, std::shared_ptr<NodeRecord> rec,
                                 std::chrono::milliseconds stop_delay) {
    cluster::Reconciler r;
    r.start = [this, id, rec](const std::string& unit, const std::string& spec, std::uint64_t epoch) {
      {
        std::lock_guard lk(rec->mu);
        rec->running[unit] = epoch;
        rec->specs[unit] = spec;
      }
      fleet.started(id, unit, epoch);
    };
    r.update = [this, id, rec](const std::string& unit, const std::string& spec, std::uint64_t epoch) {
      {
        std::lock_guard lk(rec->mu);
        rec->specs[unit] = spec;
      }
      fleet.updated(id, unit, epoch);
    };
    r.stop = [this, id, rec, stop_delay](const std::string& unit) -> Future<void> {
      fleet.stop_begun(id, unit);
      auto p = std::make_shared<Promise<void>>();
      Future<void> f = p->future();
      auto once = std::make_shared<std::atomic<bool>>(false);
      // The record keeps pending stops, so they may hold it only weakly.
      auto finish = [this, id, weak = std::weak_ptr<NodeRecord>(rec), unit, p, once] {
        if (once->exchange(true)) return;
        if (auto held = weak.lock()) {
          std::lock_guard lk(held->mu);
          held->running.erase(unit);
        }
        fleet.stopped(id, unit);
        p->set_value();
      };
      if (stop_delay.count() == 0) {
        finish();
      } else {
        {
          std::lock_guard lk(rec->mu);
          rec->pending_stops.push_back(finish);
        }
        delayer.after(stop_delay, finish);
      }
      return f;
    };
    return r;
  }

  // Crashes a node: the coordinator is destroyed without leaving; what it
  // ran is gone with it.
  void crash(TestNode& n) {
    n.c.reset();
    fleet.crashed(n.id);
  }

  std::unique_ptr<RedisTestClient> client() {
    return std::make_unique<RedisTestClient>(redis->port(), redis->admin_password(), redis->admin_user());
  }
  cluster::detail::KeyNames keys{"troupe"};

  // Makes a member entry by hand: id, heartbeat `age_ms` ago (Redis time).
  // `k` picks another prefix (a cluster no coordinator of the test belongs to).
  void fake_member(RedisTestClient& c, const std::string& id, long long age_ms,
                   const std::string& session = "f00d", const cluster::detail::KeyNames* k = nullptr) {
    const auto& kk = k != nullptr ? *k : keys;
    long long now = c.time_ms();
    c.cmd({"ZADD", kk.members(), std::to_string(now - age_ms), id});
    c.cmd({"HSET", kk.member_info(), id, std::to_string(now - 60000) + " " + session + " 10.9.9.9 7999"});
  }
  // Places a unit by hand (as the scripts would) on `owner`.
  // Atomically, as the scripts do: a reader never sees half of it.
  void fake_assignment(RedisTestClient& c, const std::string& group, const std::string& unit,
                       const std::string& owner, long long epoch,
                       const cluster::detail::KeyNames* k = nullptr) {
    const auto& kk = k != nullptr ? *k : keys;
    c.cmd({"EVAL", R"lua(
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      redis.call('SADD', KEYS[1], ARGV[1])
      redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ' ' .. ARGV[2] .. ' ' .. string.format('%d', now))
      redis.call('HSET', KEYS[3], ARGV[1], 'spec-' .. ARGV[1])
      redis.call('SADD', KEYS[4], ARGV[4])
      return 1)lua",
           "4", kk.units_of(group, owner), kk.group(group, "assign"), kk.group(group, "spec"), kk.groups(),
           unit, owner, std::to_string(epoch), group});
  }
  // Places units[0..n) named prefix + i on `owner` in one round trip.
  void fake_assignments(RedisTestClient& c, const std::string& group, const std::string& owner,
                        const std::string& prefix, int from, int n,
                        const cluster::detail::KeyNames* k = nullptr) {
    if (n <= 0) return;
    const auto& kk = k != nullptr ? *k : keys;
    c.cmd({"EVAL", R"lua(
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      for i = tonumber(ARGV[3]), tonumber(ARGV[3]) + tonumber(ARGV[4]) - 1 do
        local unit = ARGV[2] .. i
        redis.call('SADD', KEYS[1], unit)
        redis.call('HSET', KEYS[2], unit, '1 ' .. ARGV[1] .. ' ' .. string.format('%d', now))
        redis.call('HSET', KEYS[3], unit, 'spec-' .. unit)
      end
      redis.call('SADD', KEYS[4], ARGV[5])
      return 1)lua",
           "4", kk.units_of(group, owner), kk.group(group, "assign"), kk.group(group, "spec"), kk.groups(),
           owner, prefix, std::to_string(from), std::to_string(n), group});
  }
  // Runs one script directly, as a coordinator would.
  cluster::detail::RedisReply run_script(RedisTestClient& c, cluster::detail::Script script,
                                         const std::vector<std::string>& args,
                                         const cluster::detail::KeyNames* k = nullptr) {
    const auto& kk = k != nullptr ? *k : keys;
    std::vector<std::string> argv{"EVAL", cluster::detail::script_text(script), "5"};
    for (const auto& key : kk.script_keys()) argv.push_back(key);
    argv.push_back(kk.base());
    argv.insert(argv.end(), args.begin(), args.end());
    return c.cmd(argv);
  }
  std::string owner_in_redis(RedisTestClient& c, const std::string& group, const std::string& unit) {
    auto r = c.cmd({"HGET", keys.group(group, "assign"), unit});
    if (r.type != cluster::detail::RedisReply::Type::string) return "";
    auto a = r.str.find(' ');
    auto b = r.str.find(' ', a + 1);
    return r.str.substr(a + 1, b - a - 1);
  }
  long long count_of(RedisTestClient& c, const std::string& group, const std::string& member,
                     const cluster::detail::KeyNames* k = nullptr) {
    const auto& kk = k != nullptr ? *k : keys;
    return c.cmd({"SCARD", kk.units_of(group, member)}).integer;
  }

  std::unique_ptr<RedisTestServer> redis;
  Fleet fleet;
  Delayer delayer;
  std::vector<std::unique_ptr<TestNode>> nodes;
};

}  // namespace troupe::test
