// troupectl rolling-update in-process: the plan (order, admin URLs, the
// commands) and the bad inputs against a real node; the watch of one
// restart (old process, down, new process, rebalance, shards) against
// cluster members played by bare HTTP servers whose "process" starts anew
// when the restart command touches a file. The real thing, three payment
// nodes restarted by shell scripts, is examples/payment/rolling_update_test.py.

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "run_tool.test.hpp"
#include "troupe/net/http.hpp"
#include "troupe/node/node.hpp"

namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
namespace ctl = troupe::ctl;
namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

using troupe::ctl::test::Ran;
using troupe::ctl::test::troupectl;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// --- against a real (single) node -------------------------------------------------------

class RollingUpdateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fresh_dir("troupectl-roll-test");
    std::string text = "[node]\nid = \"n1\"\ndata_dir = \"" + dir_.string() +
                       "\"\nthreads = 2\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n";
    auto cfg = troupe::node::NodeConfig::parse(text, "roll-test.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto n = troupe::node::Node::start(std::move(*cfg));
    ASSERT_TRUE(n.ok()) << n.error().to_string();
    node_ = std::move(*n);
    node_->mark_ready();
    url_ = "http://127.0.0.1:" + std::to_string(node_->admin_port());
    // A process up less than a request's round trip longer than the restart
    // command has run looks like one the command started: let the node age.
    std::this_thread::sleep_for(300ms);
  }
  void TearDown() override {
    node_.reset();
    fs::remove_all(dir_);
  }
  Ran roll(std::vector<std::string> args) {
    args.insert(args.begin(), {"--node", url_, "rolling-update"});
    return troupectl(std::move(args));
  }
  // A restart command that leaves a file per node it ran for.
  std::string touch_command() const { return "touch " + dir_.string() + "/ran-{node}"; }
  bool ran_for(const std::string& node) const { return fs::exists(dir_ / ("ran-" + node)); }

  fs::path dir_;
  std::unique_ptr<troupe::node::Node> node_;
  std::string url_;
};

TEST(RollingUpdateParts, TheCommandGetsTheNodesIdAndAdminUrlAndKeepsOtherBraces) {
  EXPECT_EQ(ctl::detail::restart_command("systemctl restart troupe-node@{node}", "pay-1", "http://h:1"),
            "systemctl restart troupe-node@pay-1");
  EXPECT_EQ(ctl::detail::restart_command("x {node} {admin} {node}/${HOME} {nod}", "a", "http://h:1"),
            "x a http://h:1 a/${HOME} {nod}");
}

TEST_F(RollingUpdateTest, ADryRunPrintsTheOrderTheAdminUrlsAndTheCommandsAndRunsNothing) {
  auto r = roll({"--restart", touch_command(), "--dry-run"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "rolling update plan (dry run: nothing is restarted)\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "1      n1     " + url_ + "   touch " + dir_.string() + "/ran-n1\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "at most 120s")) << r.out;
  EXPECT_FALSE(ran_for("n1"));
}

TEST_F(RollingUpdateTest, BadInputsExitTwoOrOneBeforeAnythingRuns) {
  auto missing = roll({});
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "--restart")) << missing.err;

  auto same_for_all = roll({"--restart", "systemctl restart troupe-node"});
  EXPECT_EQ(same_for_all.code, 2);
  EXPECT_EQ(
      same_for_all.err,
      "troupectl: rolling-update: --restart must name the node with {node} (or {admin}): otherwise the same "
      "command would run for every node\n");

  auto empty = roll({"--restart", ""});
  EXPECT_EQ(empty.code, 2);
  EXPECT_TRUE(contains(empty.err, "must not be empty")) << empty.err;

  auto unknown = roll({"--restart", touch_command(), "--nodes", "n1,pay-9"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_EQ(unknown.err, "troupectl: 'pay-9' is not a member (n1 sees: n1)\n");

  auto twice = roll({"--restart", touch_command(), "--nodes", "n1,n1"});
  EXPECT_EQ(twice.code, 2);
  EXPECT_TRUE(contains(twice.err, "names 'n1' twice")) << twice.err;

  auto bad_admin = roll({"--restart", touch_command(), "--admin", "n1"});
  EXPECT_EQ(bad_admin.code, 2);
  EXPECT_TRUE(contains(bad_admin.err, "expected NODE=URL")) << bad_admin.err;

  auto stray_admin = roll({"--restart", touch_command(), "--admin", "n2=http://127.0.0.1:1"});
  EXPECT_EQ(stray_admin.code, 2);
  EXPECT_TRUE(contains(stray_admin.err, "'n2', which is not among the nodes to restart (n1)"))
      << stray_admin.err;

  auto zero = roll({"--restart", touch_command(), "--ready-timeout", "0"});
  EXPECT_EQ(zero.code, 2);

  EXPECT_FALSE(ran_for("n1"));
  EXPECT_FALSE(ran_for("pay-9"));
}

TEST_F(RollingUpdateTest, ARestartCommandThatFailsStopsTheUpdateNamingTheNodeAndTheStatus) {
  auto r = roll({"--restart", "echo restarting {node} >&2; exit 3"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "rolling update of 1 node: n1\nn1 (1/1): restarting: echo restarting n1 >&2; exit 3\n");
  EXPECT_EQ(r.err,
            "troupectl: rolling update stopped at n1 (1/1): the restart command exited with status 3\n");
}

TEST_F(RollingUpdateTest, ACommandThatLeavesTheOldProcessRunningIsNoRestart) {
  auto r = roll({"--restart", touch_command(), "--ready-timeout", "0.5"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(ran_for("n1"));
  EXPECT_TRUE(contains(r.out, "n1 (1/1): restart command done after ")) << r.out;
  EXPECT_TRUE(
      contains(r.err, "troupectl: rolling update stopped at n1 (1/1): it did not restart: the node at " +
                          url_ + " still runs the process from before the restart (up "))
      << r.err;
}

// Whether a process runs (a zombie waiting for its parent does not).
bool runs(const std::string& pid) {
  std::ifstream stat("/proc/" + pid + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

TEST_F(RollingUpdateTest, ACommandPastItsTimeIsKilledWithWhatItStarted) {
  auto t0 = SteadyClock::now();
  // The command's background child is in its process group: killed too.
  fs::path bg = dir_ / "bg.pid";
  auto r = roll(
      {"--restart", "sleep 30 & echo $! > " + bg.string() + "; sleep 30; : {node}", "--exit-timeout", "0.5"});
  EXPECT_LT(SteadyClock::now() - t0, 10s);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "troupectl: rolling update stopped at n1 (1/1): the restart command did not finish within 0.5s "
            "(--exit-timeout); it was stopped with SIGKILL\n");
  std::ifstream in(bg);
  std::string pid;
  ASSERT_TRUE(std::getline(in, pid)) << "the command wrote no pid";
  auto until = SteadyClock::now() + 5s;
  while (runs(pid) && SteadyClock::now() < until) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(runs(pid)) << "the command's background child " << pid << " still runs";
}

// --- against members played by bare servers -------------------------------------------------

// A cluster member: its "process" starts anew when the restart command
// creates `flag`, and is ready 300 ms later; it hosts no shards until a
// rebalance that moves `given` to it, then `hosted_after`. Its shard map
// has `placed` shards.
class FakeMember {
 public:
  FakeMember(std::string id, fs::path flag, int hosted_after) : id_(std::move(id)), flag_(std::move(flag)) {
    hosted_after_ = hosted_after;
    troupe::http::Router router;
    router.add("GET", "/ready", [this](troupe::http::Request&, troupe::http::Responder out) {
      std::lock_guard lk(mu_);
      tick();
      bool ok = ready_now();
      out.respond(troupe::http::Response::json(
          ok ? 200 : 503, json{{"ready", ok}, {"checks", {{"draining", false}}}}.dump()));
    });
    router.add("GET", "/api/overview", [this](troupe::http::Request&, troupe::http::Responder out) {
      std::lock_guard lk(mu_);
      tick();
      json doc = {{"node", id_},
                  {"mode", "cluster"},
                  {"ready", ready_now()},
                  {"draining", false},
                  {"uptime_s", std::chrono::duration<double>(SteadyClock::now() - started_).count()},
                  {"members", members},
                  {"entity_types", json::array({{{"type", "payment"}, {"shards_hosted", hosted_}}})}};
      out.respond(troupe::http::Response::json(200, doc.dump()));
    });
    router.add("GET", "/cluster", [this](troupe::http::Request&, troupe::http::Responder out) {
      std::lock_guard lk(mu_);
      json shards = json::array();
      for (int s = 0; s < placed; ++s) shards.push_back({{"type", "payment"}, {"shard", s}, {"owner", "x"}});
      out.respond(troupe::http::Response::json(200, json{{"members", members}, {"shards", shards}}.dump()));
    });
    router.add("POST", "/rebalance", [this](troupe::http::Request&, troupe::http::Responder out) {
      std::lock_guard lk(mu_);
      if (versions_mixed) {
        out.respond(troupe::http::Response::json(
            200, json{{"outcome", "versions_mixed"},
                      {"versions", {"1.0", "1.1"}},
                      {"message", "nothing moved: the live members run app versions 1.0 and 1.1; rebalancing "
                                  "waits until one version remains"},
                      {"moves", 0},
                      {"moved", json::array()}}
                     .dump()));
        return;
      }
      json moved = json::array();
      for (int s = 0; s < given; ++s)
        moved.push_back({{"type", "payment"}, {"shard", s}, {"from", "x"}, {"to", id_}, {"epoch", 9}});
      moved.push_back({{"type", "jobs/refunds"}, {"shard", 0}, {"from", "x"}, {"to", id_}, {"epoch", 9}});
      // A projection's slice (Node::serve_projection) moves too; it is no entity shard.
      moved.push_back({{"type", "projections/totals"}, {"shard", 0}, {"from", "x"}, {"to", id_}, {"epoch", 9}});
      moved.push_back({{"type", "payment"}, {"shard", 7}, {"from", id_}, {"to", "x"}, {"epoch", 9}});
      hosted_ = hosted_after_;
      out.respond(troupe::http::Response::json(200, json{{"moves", moved.size()}, {"moved", moved}}.dump()));
    });
    auto s = troupe::http::Server::start({}, std::move(router));
    if (s.ok()) server_ = std::move(*s);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_ ? server_->port() : 0); }
  json members = json::array();  // set before use
  int given = 3;
  int placed = 16;
  bool versions_mixed = false;  // POST /rebalance answers that it waits

 private:
  // A new process takes 300 ms to be ready: long enough to be seen starting.
  bool ready_now() const { return !restarted_ || SteadyClock::now() - started_ > 300ms; }
  void tick() {
    if (!restarted_ && fs::exists(flag_)) {
      restarted_ = true;
      started_ = SteadyClock::now();
      hosted_ = 0;
    }
  }
  std::string id_;
  fs::path flag_;
  std::mutex mu_;
  bool restarted_ = false;
  SteadyClock::time_point started_ = SteadyClock::now() - 1h;
  int hosted_ = 5;
  int hosted_after_ = 3;
  std::unique_ptr<troupe::http::Server> server_;
};

struct FakeCluster {
  explicit FakeCluster(std::vector<int> hosted_after) : dir(fresh_dir("troupectl-roll-fake")) {
    for (std::size_t i = 0; i < hosted_after.size(); ++i) {
      std::string id = "f" + std::to_string(i + 1);
      nodes.push_back(std::make_unique<FakeMember>(id, dir / id, hosted_after[i]));
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      json ms = json::array();
      for (std::size_t j = 0; j < nodes.size(); ++j)
        ms.push_back({{"id", "f" + std::to_string(j + 1)}, {"self", i == j}, {"admin", nodes[j]->url()}});
      nodes[i]->members = ms;
    }
  }
  ~FakeCluster() { fs::remove_all(dir); }
  Ran roll(std::vector<std::string> extra) {
    std::vector<std::string> args = {"--node", nodes[0]->url(), "rolling-update", "--restart",
                                     "touch " + dir.string() + "/{node}"};
    args.insert(args.end(), extra.begin(), extra.end());
    return troupectl(std::move(args));
  }
  fs::path dir;
  std::vector<std::unique_ptr<FakeMember>> nodes;
};

TEST(RollingUpdateWatch, EachNodeInTurnIsRestartedSeenReadyRebalancedAndHostingItsShards) {
  FakeCluster c({3, 3, 3});
  auto r = c.roll({});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  // The member --node points at goes last. Each line once, in this order,
  // but for the command's end and the first look at the new process, which
  // may come either way round.
  std::istringstream in(r.out);
  std::vector<std::string> got;
  for (std::string line; std::getline(in, line);) got.push_back(line);
  auto at = [&](const std::string& prefix) {
    std::size_t found = got.size(), n = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i].rfind(prefix, 0) == 0) found = i, ++n;
    EXPECT_EQ(n, 1u) << prefix << "\n" << r.out;
    return found;
  };
  EXPECT_EQ(at("rolling update of 3 nodes: f2, f3, f1"), 0u);
  std::size_t before = 0;
  for (std::string step : {"f2 (1/3)", "f3 (2/3)", "f1 (3/3)"}) {
    std::size_t start = at(step + ": restarting: touch " + c.dir.string() + "/" + step.substr(0, 2));
    std::size_t done = at(step + ": restart command done after");
    std::size_t up = at(step + ": started again, not ready yet after");
    std::size_t ready = at(step + ": ready after");
    std::size_t rebalanced =
        at(step + ": rebalanced: 3 entity shards moved to it (jobs/refunds 1, payment 3, projections/totals 1)");
    std::size_t owns = at(step + ": owns 3 shards after");
    EXPECT_LT(before, start);
    EXPECT_LT(start, std::min(done, up));
    EXPECT_LT(std::max(done, up), ready);
    EXPECT_LT(ready, rebalanced);
    EXPECT_LT(rebalanced, owns);
    before = owns;
  }
  EXPECT_EQ(at("rolling update done: 3 nodes restarted in"), got.size() - 1);
  EXPECT_EQ(got.size(), 20u) << r.out;
  for (const char* id : {"f1", "f2", "f3"}) EXPECT_TRUE(fs::exists(c.dir / id)) << id;
}

TEST(RollingUpdateWatch, ANodeThatDoesNotHostWhatItWasGivenStopsTheUpdateBeforeTheNext) {
  FakeCluster c({3, 1, 3});
  auto r = c.roll({"--nodes", "f1,f2,f3", "--shards-timeout", "0.5"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(
      r.err,
      "troupectl: rolling update stopped at f2 (2/3): it does not host the 3 shards it was given within "
      "0.5s (--shards-timeout): it hosts 1; not restarted: f3\n");
  EXPECT_TRUE(fs::exists(c.dir / "f1"));
  EXPECT_TRUE(fs::exists(c.dir / "f2"));
  EXPECT_FALSE(fs::exists(c.dir / "f3"));
}

TEST(RollingUpdateWatch, ANodeGivenNoShardsPassesOnlyWhereTooFewArePlacedForEveryMemberToHoldOne) {
  FakeCluster few({0, 0});
  few.nodes[1]->given = 0;
  few.nodes[1]->placed = 1;
  auto r = few.roll({"--nodes", "f2"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out,
                       "\nf2 (1/1): rebalanced: 0 entity shards moved to it (jobs/refunds 1, projections/totals 1)\n"
                       "f2 (1/1): owns no shards: the rebalance moved none to it (1 of payment placed over 2 "
                       "members)\n"))
      << r.out;

  FakeCluster many({0, 0});
  many.nodes[1]->given = 0;
  auto stuck = many.roll({"--nodes", "f2", "--shards-timeout", "0.5"});
  EXPECT_EQ(stuck.code, 1);
  EXPECT_EQ(stuck.err,
            "troupectl: rolling update stopped at f2 (1/1): it does not host any shard within 0.5s "
            "(--shards-timeout): it hosts 0, though 16 of payment placed over 2 members\n");
}

TEST(RollingUpdateWatch, WhileTwoAppVersionsAreLiveANodeGoesOnWithoutShardsAndSaysWhy) {
  FakeCluster c({0, 0});
  c.nodes[1]->versions_mixed = true;
  auto r = c.roll({"--nodes", "f2", "--shards-timeout", "0.5"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out,
                       "\nf2 (1/1): not rebalanced: nothing moved: the live members run app versions 1.0 and "
                       "1.1; rebalancing waits until one version remains; it takes the shards the old version's "
                       "nodes hand off\nrolling update done"))
      << r.out;
}

TEST(RollingUpdateWatch, AMemberWithoutAKnownAdminUrlNeedsTheMap) {
  FakeCluster c({3, 3});
  json ms = c.nodes[0]->members;
  ms[1]["admin"] = nullptr;
  c.nodes[0]->members = ms;
  auto r = c.roll({"--dry-run"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err,
            "troupectl: f1 does not know the admin URL of 'f2' (it has not heard from it yet): give it with "
            "--admin f2=URL\n");
  auto mapped = c.roll({"--dry-run", "--admin", "f2=" + c.nodes[1]->url()});
  EXPECT_EQ(mapped.code, 0) << mapped.err;
  EXPECT_TRUE(contains(mapped.out, "f2     " + c.nodes[1]->url())) << mapped.out;
}

}  // namespace
