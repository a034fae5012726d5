// The cluster singleton (SPEC R3) across real processes: three node
// processes (singleton_test_node) and a redis-server; the process running
// the singleton is killed with SIGKILL twenty times (and started again).
// Every instance logs its life to a file outside the processes' memory;
// the checker (singleton_log.hpp) must find no two lives at once, and a new
// instance after each kill within the failover bound. Also: the checker
// itself names an overlap and a slow failover.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../redis/redis_test_server.hpp"
#include "../sharding/node_process.hpp"
#include "singleton_log.hpp"

namespace troupe::cluster::singleton_test {
namespace {

using namespace std::chrono_literals;

constexpr auto kHeartbeat = 100ms;
constexpr auto kThreshold = 600ms;
constexpr auto kMargin = 200ms;
// Takeover is due threshold + margin after the dead node's last heartbeat
// stamp; a survivor acts at its next heartbeat. Slack for a machine
// whose cores are shared with builds.
constexpr auto kFailoverBound = kThreshold + kMargin + kHeartbeat + 2000ms;

std::string text(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += "  " + s + "\n";
  return out;
}

TEST(SingletonLog, TheCheckerNamesTwoInstancesAtOnceAndASlowFailover) {
  // n1 runs epoch 3 until 1000 (stop line); n2 starts epoch 5 at 900.
  std::istringstream overlap(
      "start n1 11 3 100\nalive n1 11 3 500\nstop n1 11 3 1000\n"
      "start n2 22 5 900\nalive n2 22 5 1200\n");
  auto lives = read_lives(overlap);
  ASSERT_EQ(lives.size(), 2u);
  auto v = check_lives(lives, {}, 2000);
  ASSERT_FALSE(v.empty());
  EXPECT_NE(v[0].find("two instances at once"), std::string::npos) << text(v);

  // Killed (no stop line): its last alive line after the next start is an overlap too.
  std::istringstream killed("start n1 11 3 100\nalive n1 11 3 950\nstart n2 22 5 900\n");
  EXPECT_FALSE(check_lives(read_lives(killed), {}, 2000).empty());
  // Killed, and the driver's kill time lies after the next start.
  std::istringstream late_kill("start n1 11 3 100\nalive n1 11 3 500\nstart n2 22 5 900\n");
  std::vector<NodeSignal> kill_at_950{{NodeSignal::Kind::kill, "n1", 11, 950}};
  EXPECT_FALSE(check_lives(read_lives(late_kill), kill_at_950, 2000).empty());

  // An epoch that does not grow.
  std::istringstream stale("start n1 11 5 100\nstop n1 11 5 200\nstart n2 22 4 300\n");
  auto sv = check_lives(read_lives(stale), {}, 1000);
  ASSERT_EQ(sv.size(), 1u) << text(sv);
  EXPECT_NE(sv[0].find("epoch not above"), std::string::npos);

  // One at a time: clean.
  std::istringstream clean(
      "start n1 11 3 100\nalive n1 11 3 500\n"
      "start n2 22 5 1500\nalive n2 22 5 1600\nstop n2 22 5 1700\nstart n3 33 6 1800\n");
  auto cl = read_lives(clean);
  std::vector<NodeSignal> kill_at_600{{NodeSignal::Kind::kill, "n1", 11, 600}};
  EXPECT_TRUE(check_lives(cl, kill_at_600, 2000).empty()) << text(check_lives(cl, kill_at_600, 2000));
  // Failover: 900 us after the kill, within 1 ms; not within 0.5 ms.
  EXPECT_TRUE(check_failover(cl, kill_at_600, 1ms).empty());
  std::vector<NodeSignal> kill_at_200{{NodeSignal::Kind::kill, "n1", 11, 200}};
  auto slow = check_failover(cl, kill_at_200, std::chrono::milliseconds(1));
  ASSERT_EQ(slow.size(), 1u);
  EXPECT_NE(slow[0].find("past the failover bound"), std::string::npos) << slow[0];
}

class SingletonProcesses : public ::testing::Test {
 protected:
  troupe::test::RedisTestServer redis;
  std::filesystem::path dir;
  std::map<std::string, std::unique_ptr<proc::NodeProcess>> nodes;
  std::vector<NodeSignal> signals;

  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-singleton-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir = pattern;
  }
  void TearDown() override {
    nodes.clear();
    std::error_code ec;
    if (!HasFailure()) std::filesystem::remove_all(dir, ec);
  }
  std::string log_path() const { return (dir / "activations.log").string(); }

  void start(const std::string& id) {
    nodes[id] = std::make_unique<proc::NodeProcess>(
        TROUPE_SINGLETON_TEST_NODE, id,
        std::vector<std::string>{"--redis-port", std::to_string(redis.port()), "--log", log_path(), "--heartbeat-ms",
                                 std::to_string(kHeartbeat.count()), "--threshold-ms",
                                 std::to_string(kThreshold.count()), "--margin-ms", std::to_string(kMargin.count())});
  }
  void kill(const std::string& id) {
    auto& n = nodes.at(id);
    n->kill9();
    for (const auto& s : n->signals()) signals.push_back(s);
  }
  std::vector<Life> lives() {
    std::ifstream in(log_path());
    return read_lives(in);
  }
  // The life running now (the latest start without a stop line), once there is one.
  std::optional<Life> running(std::chrono::milliseconds bound, WallUs started_after) {
    auto until = std::chrono::steady_clock::now() + bound;
    do {
      auto ls = lives();
      if (!ls.empty() && ls.back().started > started_after && !ls.back().stopped) return ls.back();
      std::this_thread::sleep_for(5ms);
    } while (std::chrono::steady_clock::now() < until);
    return std::nullopt;
  }
};

// proves: R3
TEST_F(SingletonProcesses, NeverRunsTwiceAcrossTwentyKillNineCyclesAndMovesWithinTheFailoverTime) {
  for (auto id : {"n1", "n2", "n3"}) start(id);
  auto current = running(15s, 0);
  ASSERT_TRUE(current) << "the singleton never started";
  for (int cycle = 0; cycle < 20; ++cycle) {
    // Killed as soon as it is seen to start, or after it ran a while.
    const std::chrono::milliseconds delays[] = {0ms, 40ms, 150ms, 400ms};
    std::this_thread::sleep_for(delays[cycle % 4]);
    const std::string victim = current->node;
    if (nodes.at(victim)->pid() != current->pid) {
      ADD_FAILURE() << "cycle " << cycle << ": the latest instance, " << describe(*current)
                    << ", is not in the running process of its node";
      break;
    }
    kill(victim);
    WallUs killed_at = signals.back().at;
    current = running(kFailoverBound + 5s, killed_at);
    start(victim);
    if (!current) {
      // The checks below say what happened instead.
      ADD_FAILURE() << "cycle " << cycle << ": no instance started alone after " << victim << " was killed";
      break;
    }
    EXPECT_NE(current->node, victim);
  }
  std::this_thread::sleep_for(200ms);
  auto ls = lives();
  WallUs taken = proc::wall_now_us();
  EXPECT_GE(ls.size(), 21u);
  auto overlaps = check_lives(ls, signals, taken);
  EXPECT_TRUE(overlaps.empty()) << text(overlaps) << "log: " << log_path();
  auto slow = check_failover(ls, signals, std::chrono::duration_cast<std::chrono::milliseconds>(kFailoverBound));
  EXPECT_TRUE(slow.empty()) << text(slow);
  // How long each failover took, for the record.
  std::int64_t worst = 0, sum = 0, n = 0;
  for (const auto& k : signals) {
    for (const auto& l : ls)
      if (l.started > k.at) {
        worst = std::max<std::int64_t>(worst, l.started - k.at);
        sum += l.started - k.at;
        ++n;
        break;
      }
  }
  std::printf("singleton failover after SIGKILL: %lld kills, mean %lld ms, worst %lld ms (bound %lld ms)\n",
              static_cast<long long>(n), static_cast<long long>(n ? sum / n / 1000 : 0),
              static_cast<long long>(worst / 1000), static_cast<long long>(kFailoverBound.count()));
}

// SIGTERM: the owner leaves gracefully; its instance's stop line comes
// before the next instance's start, with a larger epoch.
// proves: R3
TEST_F(SingletonProcesses, ALeavingOwnerStopsItBeforeAnotherStartsIt) {
  for (auto id : {"n1", "n2", "n3"}) start(id);
  auto current = running(15s, 0);
  ASSERT_TRUE(current);
  for (int round = 0; round < 3; ++round) {
    std::string leaver = current->node;
    WallUs before = proc::wall_now_us();
    ASSERT_TRUE(nodes.at(leaver)->terminate(15s)) << leaver << " did not leave cleanly";
    auto next = running(10s, before);
    ASSERT_TRUE(next) << "round " << round;
    auto ls = lives();
    auto old = std::find_if(ls.begin(), ls.end(), [&](const Life& l) { return l.pid == current->pid; });
    ASSERT_NE(old, ls.end());
    ASSERT_TRUE(old->stopped) << describe(*old) << " has no stop line";
    EXPECT_LT(*old->stopped, next->started);
    EXPECT_GT(next->epoch, current->epoch);
    current = next;
    start(leaver);
  }
  auto ls = lives();
  auto v = check_lives(ls, signals, proc::wall_now_us());
  EXPECT_TRUE(v.empty()) << text(v);
}

}  // namespace
}  // namespace troupe::cluster::singleton_test
