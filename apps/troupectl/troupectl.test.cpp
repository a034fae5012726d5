// troupectl against a real node, in-process: each command's table and JSON
// checked against what the node serves; the exit codes (0 ok, 1 the node
// said no, 2 unreachable or bad usage) and the one-line errors; the
// building blocks (URLs, ranges, tables) and the cluster-shaped views from
// canned documents, since a cluster needs Redis and more than one node.

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "../../src/cluster/redis/redis_test_server.hpp"
#include "../../src/net/http/test_pki.hpp"
#include "../../src/node/tally_test_entity.hpp"
#include "commands.hpp"
#include "run_tool.test.hpp"
#include "troupe/node/node.hpp"

namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using troupe::node::Node;
using troupe::node::NodeConfig;
namespace ctl = troupe::ctl;
using namespace troupe::node::test;


// --- helpers -----------------------------------------------------------------------

using troupe::ctl::test::Ran;
using troupe::ctl::test::troupectl;

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// The printed line whose blank-separated words are exactly `expected`.
bool has_row(const std::string& text, const std::vector<std::string>& expected) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (words(line) == expected) return true;
  return false;
}

std::vector<std::string> lines(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// Characters (not bytes: "—" counts as one) before byte `at` of a line.
std::size_t chars_before(const std::string& line, std::size_t at) {
  if (at == std::string::npos) return std::string::npos;
  std::size_t n = 0;
  for (std::size_t i = 0; i < at; ++i)
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80) ++n;
  return n;
}

// Where a word first starts on a line, in characters.
std::size_t column_of(const std::string& line, const std::string& word) {
  return chars_before(line, line.find(word));
}

// --- fixture: one node, one entity type, one job service, one counter ----------------

class TroupectlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("troupectl-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::string text = "[node]\nid = \"n1\"\ndata_dir = \"" + dir_.string() +
                       "\"\nthreads = 2\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n"
                       // A held tally would keep the node's stop waiting for its episode (E6).
                       "[entities]\nstop_timeout_ms = 300\n";
    auto cfg = NodeConfig::parse(text, "troupectl-test.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto n = Node::start(std::move(*cfg));
    ASSERT_TRUE(n.ok()) << n.error().to_string();
    node_ = std::move(*n);
    url_ = "http://127.0.0.1:" + std::to_string(node_->admin_port());

    troupe::node::EntityTypeOptions<Tally> opts;
    opts.type = "tally";
    opts.events = tally_codecs();
    auto t = node_->serve_entities<Tally>(std::move(opts), [this](const std::string& id, auto done) {
      auto f = tallies_->ask<std::int64_t>(
          id, [](troupe::ReplyTo<std::int64_t> r) { return Get{std::move(r)}; }, 5s);
      std::move(f).then([done = std::move(done)](troupe::Result<std::int64_t> r) {
        if (!r.ok()) return done(std::move(r).error());
        done(json{{"total", *r}});
      });
    });
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    tallies_.emplace(std::move(*t));

    troupe::JobSettings js;
    js.name = "mail";
    js.workers = 2;
    auto jobs = troupe::JobService::start(
        node_->system(), js,
        [](const troupe::Job& j) {
          return troupe::JobWorkerCall{"send", j.payload};
        },
        troupe::JobWorkers{{"send", [](troupe::JobRun run) { run.succeed("sent"); }}});
    ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
    ASSERT_TRUE(jobs->submit(troupe::Job{"mail", "hello"}).get().ok());
    node_->watch_jobs("mail", *jobs);
    node_->add_counter("orders_failed", [] { return std::uint64_t{3}; });
    node_->mark_ready();
  }

  void TearDown() override {
    node_.reset();
    std::filesystem::remove_all(dir_);
  }

  void add(const std::string& id, std::int64_t n) {
    auto r = tallies_
                 ->ask<std::int64_t>(
                     id,
                     [n](troupe::ReplyTo<std::int64_t> rt) {
                       return Add{n, std::move(rt)};
                     },
                     5s)
                 .get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  void hold(const std::string& id) {
    auto r = tallies_
                 ->ask<std::int64_t>(
                     id, [](troupe::ReplyTo<std::int64_t> rt) { return Hold{std::move(rt)}; }, 5s)
                 .get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }

  // Runs troupectl against this node.
  Ran ctl_here(std::vector<std::string> args) {
    args.insert(args.begin(), {"--node", url_});
    return troupectl(std::move(args));
  }

  int http_status(const std::string& target) {
    troupe::http::ClientSettings cs;
    cs.port = node_->admin_port();
    auto c = troupe::http::Client::create(cs);
    if (!c.ok()) return -1;
    auto r = (*c)->request_sync("GET", target);
    return r.ok() ? r->status : -1;
  }

  std::filesystem::path dir_;
  std::unique_ptr<Node> node_;
  std::string url_;
  std::optional<troupe::node::Entities<Tally>> tallies_;
};

// --- status and members -----------------------------------------------------------------

TEST_F(TroupectlTest, StatusShowsTheNodeItsEntityTypesCountersAndPatterns) {
  for (int i = 0; i < 4; ++i) add("t" + std::to_string(i), 5);
  hold("t3");
  auto r = ctl_here({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(has_row(r.out, {"node", "n1"})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"mode", "single"})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"state", "ready"})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"version", std::string(Node::version())})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"members", "1", "(1", "alive)"})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"TYPE", "ACTIVE", "PROCESSING", "PASSIVATIONS", "SHARDS", "EVENTS"})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"tally", "4", "1", "0", "1", "5"})) << r.out;
  // The held tally, with an hour to its deadline.
  EXPECT_NE(r.out.find("processing, longest first"), std::string::npos) << r.out;
  bool found = false;
  for (const auto& l : lines(r.out)) {
    auto w = words(l);
    if (w.size() >= 4 && w[0] == "tally" && w[1] == "t3") {
      found = true;
      EXPECT_TRUE(l.find("59m 5") != std::string::npos || l.find("1h 00m") != std::string::npos) << l;
    }
  }
  EXPECT_TRUE(found) << r.out;
  EXPECT_TRUE(has_row(r.out, {"orders_failed", "3"})) << r.out;
  EXPECT_NE(r.out.find("jobs "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("succeeded=1"), std::string::npos) << r.out;
}

TEST(TroupectlViews, StatusShowsTheHealthAndNamesEveryFailingService) {
  json overview = {{"node", "n1"},
                   {"mode", "cluster"},
                   {"members", json::array()},
                   {"health",
                    {{"status", "unhealthy"},
                     {"services",
                      {{"jobs/refunds", {{"up", false}, {"code", "journal_conflict"}, {"message", "another writer"}}},
                       {"jobs/mail", {{"up", true}}}}}}}};
  std::string out = ctl::detail::render_status(overview);
  EXPECT_TRUE(has_row(out, {"health", "unhealthy", "(1", "service)"})) << out;
  EXPECT_TRUE(has_row(out, {"SERVICE", "CODE", "WHY"})) << out;
  EXPECT_TRUE(has_row(out, {"jobs/refunds", "journal_conflict", "another", "writer"})) << out;
  EXPECT_EQ(out.find("jobs/mail"), std::string::npos) << "only failing services are listed: " << out;
  overview["health"] = {{"status", "ok"}, {"services", {{"jobs/mail", {{"up", true}}}}}};
  out = ctl::detail::render_status(overview);
  EXPECT_TRUE(has_row(out, {"health", "ok"})) << out;
  EXPECT_EQ(out.find("failing"), std::string::npos) << out;
}

TEST_F(TroupectlTest, StatusAsJsonIsTheOverviewTheNodeServes) {
  add("a", 1);
  auto r = ctl_here({"status", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  json doc = json::parse(r.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  EXPECT_EQ(doc["node"], "n1");
  EXPECT_EQ(doc["mode"], "single");
  EXPECT_EQ(doc["ready"], true);
  EXPECT_EQ(doc["entity_types"][0]["type"], "tally");
  EXPECT_EQ(doc["entity_types"][0]["active"], 1);
  EXPECT_EQ(doc["counters"]["orders_failed"], 3);
  EXPECT_TRUE(doc["series"].is_object());  // the whole document, not an excerpt
  // --json may come before the command too.
  auto before = troupectl({"--json", "--node", url_, "status"});
  ASSERT_EQ(before.code, 0) << before.err;
  EXPECT_EQ(json::parse(before.out, nullptr, false)["node"], "n1");
}

TEST_F(TroupectlTest, MembersShowsEachMemberWithItsLoadAndADashForWhatIsUnknown) {
  add("a", 1);
  add("b", 1);
  auto r = ctl_here({"members"});
  ASSERT_EQ(r.code, 0) << r.err;
  auto ls = lines(r.out);
  ASSERT_EQ(ls.size(), 2u) << r.out;
  EXPECT_EQ(words(ls[0]), (std::vector<std::string>{"ID", "ADDRESS", "VERSION", "ALIVE", "SELF", "DRAINING",
                                                    "SHARDS", "ENTITIES", "MAILBOX", "MSG/S"}));
  auto row = words(ls[1]);
  ASSERT_EQ(row.size(), 10u) << ls[1];
  EXPECT_EQ(row[0], "n1");
  EXPECT_EQ(row[1], "—");  // a single node has no cluster address
  EXPECT_EQ(row[2], "—");  // nor, here, an app version
  EXPECT_EQ(row[3], "yes");
  EXPECT_EQ(row[4], "yes");
  EXPECT_EQ(row[5], "no");
  EXPECT_EQ(row[6], "1");
  EXPECT_EQ(row[7], "2");
  // Columns line up by characters, the dash included.
  EXPECT_EQ(column_of(ls[0], "ALIVE"), column_of(ls[1], "yes"));
  EXPECT_EQ(column_of(ls[0], "MSG/S"), chars_before(ls[1], ls[1].rfind(row[9])));
}

TEST_F(TroupectlTest, MembersAsJsonListsTheMembersAsTheNodeReportsThem) {
  auto r = ctl_here({"members", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  json doc = json::parse(r.out, nullptr, false);
  EXPECT_EQ(doc["node"], "n1");
  ASSERT_EQ(doc["members"].size(), 1u) << r.out;
  EXPECT_EQ(doc["members"][0]["id"], "n1");
  EXPECT_EQ(doc["members"][0]["admin"], url_);
  EXPECT_TRUE(doc["members"][0]["address"].is_null());
  EXPECT_EQ(doc["members"][0]["self"], true);
}

// --- shards and workers -----------------------------------------------------------------

TEST_F(TroupectlTest, ShardsCountsAndListsTheShardsOfEachTypePerOwner) {
  auto r = ctl_here({"shards"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(lines(r.out).size(), 2u) << r.out;
  EXPECT_TRUE(has_row(r.out, {"TYPE", "OWNER", "SHARDS", "LIST"})) << r.out;
  EXPECT_TRUE(has_row(r.out, {"tally", "n1", "1", "0"})) << r.out;

  auto j = ctl_here({"shards", "--type", "tally", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  json doc = json::parse(j.out, nullptr, false);
  ASSERT_EQ(doc["types"].size(), 1u) << j.out;
  EXPECT_EQ(doc["types"][0]["type"], "tally");
  EXPECT_EQ(doc["types"][0]["shards"], 1);
  EXPECT_EQ(doc["types"][0]["owners"][0]["owner"], "n1");
  EXPECT_EQ(doc["types"][0]["owners"][0]["member"], true);
  EXPECT_EQ(doc["types"][0]["owners"][0]["shards"], json::array({0}));
  EXPECT_EQ(doc["types"][0]["owners"][0]["ranges"], "0");
}

TEST_F(TroupectlTest, ShardsOfATypeNoShardHasExitsOneNamingTheTypesThereAre) {
  auto r = ctl_here({"shards", "--type", "nope"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "troupectl: no shards of type 'nope' in the shard map of n1 (types: tally)\n");
}

// Alone, the node has no worker map; its job service's slots are job
// workers, shown by their own command.
TEST_F(TroupectlTest, WorkersAloneShowNoUnitsAndJobWorkersListTheJobServicesSlots) {
  auto r = ctl_here({"workers"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "no worker units: this node runs alone (no [cluster] in its config)\n");
  auto j = ctl_here({"workers", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  json doc = json::parse(j.out, nullptr, false);
  EXPECT_EQ(doc["node"], "n1");
  EXPECT_EQ(doc["workers"], json::array());

  auto jw = ctl_here({"job-workers"});
  ASSERT_EQ(jw.code, 0) << jw.err;
  EXPECT_EQ(jw.out, "SERVICE   SLOT       STATE   OWNER\nmail      worker-0   idle    n1\nmail      worker-1   idle    n1\n");
  auto jj = ctl_here({"job-workers", "--json"});
  ASSERT_EQ(jj.code, 0) << jj.err;
  json jdoc = json::parse(jj.out, nullptr, false);
  ASSERT_EQ(jdoc["job_workers"].size(), 2u);
  EXPECT_EQ(jdoc["job_workers"][1],
            (json{{"service", "mail"}, {"slot", "worker-1"}, {"state", "idle"}, {"owner", "n1"}}));
}

TEST(TroupectlViews, WorkersShowGroupUnitOwnerEpochAndAgeAndSayWhenTheReadFailed) {
  json c = {{"node", "a"},
            {"time_ms", 1'000'000},
            {"workers",
             {{{"group", "devices"}, {"unit", "d1"}, {"owner", "a"}, {"epoch", 7}, {"since", 1'000'000 - 65'000}},
              {{"group", "devices"}, {"unit", "d2"}, {"owner", "b"}, {"epoch", 9}, {"since", 1'000'000 - 1'500},
               {"handing_off_from", "a"}},
              {{"group", "sensors"}, {"unit", "s1"}, {"owner", "b"}, {"epoch", 3}}}}};
  const std::string table = ctl::detail::render_workers(c);
  EXPECT_TRUE(has_row(table, {"GROUP", "UNIT", "OWNER", "EPOCH", "AGE"})) << table;
  EXPECT_TRUE(has_row(table, {"devices", "d1", "a", "7", "1m", "05s"})) << table;
  EXPECT_TRUE(has_row(table, {"devices", "d2", "b", "(from", "a)", "9", "1.5s"})) << table;
  EXPECT_TRUE(has_row(table, {"sensors", "s1", "b", "3", "—"})) << table;
  EXPECT_TRUE(has_row(table, {"3", "units", "in", "2", "groups"})) << table;
  EXPECT_EQ(table.find("not current"), std::string::npos);
  c["workers_error"] = "coordination_failed: not connected to Redis at 127.0.0.1:6379 (reconnecting)";
  EXPECT_NE(ctl::detail::render_workers(c).find("not current: coordination_failed: not connected to Redis"),
            std::string::npos);
}

// A node of a real cluster (Redis) shows the units a coordinator placed,
// each with the owner and epoch Redis holds.
// proves: W9
TEST(TroupectlCluster, WorkersPrintTheUnitsPlacedInRedisWithTheirOwnersAndEpochs) {
  troupe::test::RedisTestServer redis;
  auto dir = std::filesystem::temp_directory_path() / ("troupectl-cluster-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  auto cfg = NodeConfig::parse("[node]\nid = \"c1\"\ndata_dir = \"" + dir.string() +
                                   "\"\nthreads = 2\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n"
                                   "[cluster]\nredis = \"127.0.0.1:" + std::to_string(redis.port()) +
                                   "\"\nlisten_port = 0\ninsecure = true\nheartbeat_ms = 200\nliveness_threshold_ms = 1000\n"
                                   "takeover_margin_ms = 200\n",
                               "c1.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto n = Node::start(std::move(*cfg));
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  auto& coord = (*n)->cluster()->coordinator();
  std::map<std::string, std::uint64_t> epochs;
  for (const std::string unit : {"dev-a", "dev-b", "dev-c"}) {
    auto p = coord.assign("devices", unit, "").get();
    ASSERT_TRUE(p.ok()) << p.error().to_string();
    epochs[unit] = p->assignment.epoch;
  }
  const std::string url = "http://127.0.0.1:" + std::to_string((*n)->admin_port());
  auto r = troupectl({"--node", url, "workers"});
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_EQ(lines(r.out).size(), 5u) << r.out;
  EXPECT_TRUE(has_row(r.out, {"GROUP", "UNIT", "OWNER", "EPOCH", "AGE"})) << r.out;
  for (const auto& [unit, epoch] : epochs) {
    bool found = false;
    for (const auto& l : lines(r.out)) {
      auto w = words(l);
      if (w.size() == 5 && w[1] == unit) {
        found = true;
        EXPECT_EQ(w[0], "devices") << l;
        EXPECT_EQ(w[2], "c1") << l;
        EXPECT_EQ(w[3], std::to_string(epoch)) << l;
      }
    }
    EXPECT_TRUE(found) << unit << " in\n" << r.out;
  }
  EXPECT_EQ(lines(r.out).back(), "3 units in 1 group");
  auto j = troupectl({"--node", url, "workers", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  json doc = json::parse(j.out, nullptr, false);
  ASSERT_EQ(doc["workers"].size(), 3u) << j.out;
  EXPECT_EQ(doc["workers"][0]["unit"], "dev-a");
  EXPECT_EQ(doc["workers"][0]["owner"], "c1");
  EXPECT_EQ(doc["workers"][0]["epoch"], epochs["dev-a"]);
  EXPECT_TRUE(doc["workers"][0]["since"].is_number_integer());
  n->reset();
  std::filesystem::remove_all(dir);
}

// --- rebalance and entity ---------------------------------------------------------------

TEST_F(TroupectlTest, RebalanceOnASingleNodeExitsOneWithTheNodesReason) {
  auto r = ctl_here({"rebalance"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "troupectl: this node runs alone (no [cluster] in its config): there is nothing to rebalance "
            "(not_clustered, HTTP 409)\n");
}

TEST_F(TroupectlTest, AnEntityShowsItsStateAndItsProcessingEpisode) {
  add("a b/c", 7);
  auto idle = ctl_here({"entity", "tally", "a b/c"});
  ASSERT_EQ(idle.code, 0) << idle.err;
  EXPECT_EQ(idle.out,
            "type         tally\nid           a b/c\nprocessing   no\nstate\n{\n  \"total\": 7\n}\n");

  hold("a b/c");
  auto busy = ctl_here({"entity", "tally", "a b/c"});
  ASSERT_EQ(busy.code, 0) << busy.err;
  auto ls = lines(busy.out);
  ASSERT_GE(ls.size(), 3u) << busy.out;
  EXPECT_EQ(ls[2].rfind("processing   yes, since 20", 0), 0u) << busy.out;
  EXPECT_NE(ls[2].find("ago), deadline 20"), std::string::npos) << busy.out;
  // An hour to go: "(in 59m 59s)", or "(in 1h 00m)" within the first millisecond.
  EXPECT_TRUE(ls[2].find("(in 59m") != std::string::npos || ls[2].find("(in 1h 00m)") != std::string::npos)
      << busy.out;
}

TEST_F(TroupectlTest, AnEntityAsJsonIsTheNodesDocument) {
  add("x", 2);
  auto r = ctl_here({"entity", "tally", "x", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out, nullptr, false),
            (json{{"type", "tally"}, {"id", "x"}, {"processing", nullptr}, {"state", {{"total", 2}}}}));
}

TEST_F(TroupectlTest, AnEntityOfAnUnknownTypeExitsOne) {
  auto r = ctl_here({"entity", "nope", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "troupectl: no entity type 'nope' on this node (not_found, HTTP 404)\n");
}

// --- drain --------------------------------------------------------------------------

TEST_F(TroupectlTest, DrainingANodeThatIsNotAMemberExitsOneNamingTheMembers) {
  auto r = ctl_here({"drain", "n9"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "troupectl: 'n9' is not a member (n1 sees: n1)\n");
  EXPECT_FALSE(node_->draining());
  EXPECT_EQ(http_status("/ready"), 200);
}

TEST_F(TroupectlTest, DrainingTheNodeByItsIdTurnsItsReadinessOff) {
  ASSERT_EQ(http_status("/ready"), 200);
  auto r = ctl_here({"drain", "n1", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out, nullptr, false),
            (json{{"node", "n1"}, {"draining", true}, {"already", false}}));
  EXPECT_TRUE(node_->draining());
  EXPECT_EQ(http_status("/ready"), 503);
  auto members = ctl_here({"members"});
  ASSERT_EQ(lines(members.out).size(), 2u) << members.out;
  EXPECT_EQ(words(lines(members.out)[1])[4], "yes") << members.out;  // DRAINING
  EXPECT_TRUE(has_row(ctl_here({"status"}).out, {"state", "draining"}));
}

TEST_F(TroupectlTest, DrainWithoutAnIdDrainsTheNodeAtTheUrlAndSaysSoWhenItAlreadyIs) {
  auto first = ctl_here({"drain"});
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_EQ(first.out.rfind("node n1 is draining", 0), 0u) << first.out;
  EXPECT_EQ(http_status("/ready"), 503);
  auto again = ctl_here({"drain"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_EQ(again.out, "node n1 was already draining\n");
}

TEST_F(TroupectlTest, DrainingAnotherMemberGoesToTheAdminUrlItAdvertises) {
  // A stand-in for the node asked: it knows n1 as a member listening on
  // every interface (admin 0.0.0.0) at the cluster address 127.0.0.1, and a
  // member "n3" whose admin URL it has not heard.
  json overview = {
      {"node", "n2"},
      {"members",
       {{{"id", "n2"}, {"address", "127.0.0.1:7002"}, {"self", true}, {"admin", "http://127.0.0.1:1"}},
        {{"id", "n1"},
         {"address", "127.0.0.1:7001"},
         {"self", false},
         {"admin", "http://0.0.0.0:" + std::to_string(node_->admin_port())}},
        {{"id", "n3"}, {"address", "127.0.0.1:7003"}, {"self", false}, {"admin", nullptr}}}}};
  troupe::http::Router router;
  router.add("GET", "/api/overview", [&](troupe::http::Request&, troupe::http::Responder out) {
    out.respond(troupe::http::Response::json(200, overview.dump()));
  });
  auto server = troupe::http::Server::start({}, std::move(router));
  ASSERT_TRUE(server.ok());
  std::string other = "http://127.0.0.1:" + std::to_string((*server)->port());

  auto unknown_admin = troupectl({"--node", other, "drain", "n3"});
  EXPECT_EQ(unknown_admin.code, 1);
  EXPECT_EQ(
      unknown_admin.err,
      "troupectl: n2 does not know the admin URL of 'n3': run troupectl --node <its admin URL> drain\n");

  auto r = troupectl({"--node", other, "drain", "n1"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("node n1 is draining", 0), 0u) << r.out;
  EXPECT_TRUE(node_->draining());
  EXPECT_EQ(http_status("/ready"), 503);
  (*server)->stop();
}

// --- errors and usage -------------------------------------------------------------------

TEST(TroupectlErrors, AnUnreachableNodeExitsTwoNamingTheUrl) {
  // A port that was just listened on and closed is refused.
  auto server = troupe::http::Server::start({}, troupe::http::Router{});
  ASSERT_TRUE(server.ok());
  auto port = (*server)->port();
  (*server)->stop();
  server->reset();
  std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto r = troupectl({"--node", url, "status"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "troupectl: cannot reach the node at " + url + " (connection refused)\n");
}

TEST(TroupectlErrors, ANodeThatDoesNotAnswerInTimeExitsTwo) {
  std::mutex mu;
  std::vector<troupe::http::Responder> parked;
  troupe::http::Router router;
  router.add("GET", "/api/overview", [&](troupe::http::Request&, troupe::http::Responder out) {
    std::lock_guard lk(mu);
    parked.push_back(std::move(out));
  });
  auto server = troupe::http::Server::start({}, std::move(router));
  ASSERT_TRUE(server.ok());
  std::string url = "http://127.0.0.1:" + std::to_string((*server)->port());
  auto r = troupectl({"--node", url, "--timeout-s", "0.3", "status"});
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "troupectl: the node at " + url + " did not answer within 0.3s\n");
  {
    // Answered, so the server's stop does not wait out its drain timeout.
    std::lock_guard lk(mu);
    for (auto& p : parked) p.respond(troupe::http::Response::json(200, "{}"));
  }
  (*server)->stop();
}

TEST(TroupectlErrors, AnErrorAnswerThatIsNotTheNodesShowsItsStatusAndBody) {
  troupe::http::Router router;
  router.add("GET", "/cluster", [](troupe::http::Request&, troupe::http::Responder out) {
    out.respond(troupe::http::Response::text(502, "upstream\nis down"));
  });
  router.add("GET", "/api/overview", [](troupe::http::Request&, troupe::http::Responder out) {
    out.respond(troupe::http::Response::text(200, "<html>"));
  });
  auto server = troupe::http::Server::start({}, std::move(router));
  ASSERT_TRUE(server.ok());
  std::string url = "http://127.0.0.1:" + std::to_string((*server)->port());
  auto bad_gateway = troupectl({"--node", url, "shards"});
  EXPECT_EQ(bad_gateway.code, 1);
  EXPECT_EQ(bad_gateway.err,
            "troupectl: the node at " + url + " answered HTTP 502 Bad Gateway: upstream is down\n");
  auto not_json = troupectl({"--node", url, "members"});
  EXPECT_EQ(not_json.code, 1);
  EXPECT_EQ(not_json.err.rfind(
                "troupectl: the node at " + url + " answered HTTP 200 with a body that is not JSON", 0),
            0u)
      << not_json.err;
}

TEST_F(TroupectlTest, TheNodeUrlComesFromTroupeNodeUnlessTheFlagGivesOne) {
  ASSERT_EQ(::setenv("TROUPE_NODE", url_.c_str(), 1), 0);
  auto from_env = troupectl({"members", "--json"});
  ::unsetenv("TROUPE_NODE");
  ASSERT_EQ(from_env.code, 0) << from_env.err;
  EXPECT_EQ(json::parse(from_env.out, nullptr, false)["node"], "n1");

  ASSERT_EQ(::setenv("TROUPE_NODE", "http://127.0.0.1:1", 1), 0);
  auto flag_wins = ctl_here({"members", "--json"});
  ::unsetenv("TROUPE_NODE");
  EXPECT_EQ(flag_wins.code, 0) << flag_wins.err;
}

TEST(TroupectlToken, ANodeWantingATokenGetsItFromTheFileOrTroupeTokenAndA401ExitsThree) {
  auto dir = std::filesystem::temp_directory_path() / ("troupectl-token-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto token = dir / "token";
  std::ofstream(token) << "sesame-42\n";
  const auto wrong = dir / "wrong";
  std::ofstream(wrong) << "sesame-41\n";
  auto cfg = NodeConfig::parse("[node]\nid = \"n1\"\ndata_dir = \"" + dir.string() + "\"\n[admin]\nport = 0\ntoken_file = \"" +
                                   token.string() + "\"\n[journal]\nbackend = \"memory\"\n",
                               "t.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto n = Node::start(std::move(*cfg));
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  const std::string url = "http://127.0.0.1:" + std::to_string((*n)->admin_port());

  auto none = troupectl({"--node", url, "drain"});
  EXPECT_EQ(none.code, ctl::exit_unauthorized);
  EXPECT_EQ(none.err, "troupectl: the node at " + url +
                          " needs an admin token: give --token-file FILE or set TROUPE_TOKEN\n");
  auto refused = troupectl({"--node", url, "--token-file", wrong.string(), "status"});
  EXPECT_EQ(refused.code, ctl::exit_unauthorized);
  EXPECT_NE(refused.err.find("refused the admin token"), std::string::npos) << refused.err;
  auto missing = troupectl({"--node", url, "--token-file", (dir / "absent").string(), "status"});
  EXPECT_EQ(missing.code, ctl::exit_unreachable_or_usage);
  EXPECT_EQ(missing.err, "troupectl: --token-file: cannot read " + (dir / "absent").string() + "\n");
  EXPECT_FALSE((*n)->draining()) << "nothing was done without the token";

  ASSERT_EQ(::setenv("TROUPE_TOKEN", "sesame-42", 1), 0);
  auto from_env = troupectl({"--node", url, "status", "--json"});
  auto file_wins = troupectl({"--node", url, "--token-file", wrong.string(), "status"});
  ::unsetenv("TROUPE_TOKEN");
  EXPECT_EQ(from_env.code, 0) << from_env.err;
  EXPECT_EQ(file_wins.code, ctl::exit_unauthorized) << "--token-file wins over TROUPE_TOKEN";

  auto drained = troupectl({"--node", url, "--token-file", token.string(), "drain"});
  EXPECT_EQ(drained.code, 0) << drained.err;
  EXPECT_TRUE((*n)->draining());
  n->reset();
  std::filesystem::remove_all(dir);
}

TEST(TroupectlToken, AnHttpsNodeIsReachedWithItsCaAndRefusedWithoutIt) {
  const auto& pki = troupe::http::testing::Pki::get();
  ASSERT_TRUE(pki.ok) << "openssl could not make the test certificates";
  auto dir = std::filesystem::temp_directory_path() / ("troupectl-tls-" + std::to_string(::getpid()));
  auto cfg = NodeConfig::parse("[node]\nid = \"n1\"\ndata_dir = \"" + dir.string() + "\"\n[admin]\nport = 0\n" +
                                   "[admin.tls]\ncert = \"" + (pki / "server.crt").string() + "\"\nkey = \"" +
                                   (pki / "server.key").string() + "\"\n[journal]\nbackend = \"memory\"\n",
                               "t.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto n = Node::start(std::move(*cfg));
  ASSERT_TRUE(n.ok()) << n.error().to_string();
  const std::string port = std::to_string((*n)->admin_port());
  auto ok = troupectl({"--node", "https://127.0.0.1:" + port, "--ca", (pki / "ca-a.crt").string(), "members", "--json"});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_EQ(json::parse(ok.out, nullptr, false)["node"], "n1");
  auto by_name = troupectl({"--node", "https://localhost:" + port, "--ca", (pki / "ca-a.crt").string(), "status"});
  EXPECT_EQ(by_name.code, 0) << by_name.err;
  auto other_ca = troupectl({"--node", "https://127.0.0.1:" + port, "--ca", (pki / "ca-b.crt").string(), "status"});
  EXPECT_EQ(other_ca.code, ctl::exit_unreachable_or_usage);
  EXPECT_NE(other_ca.err.find("certificate verify failed"), std::string::npos) << other_ca.err;
  auto plain = troupectl({"--node", "http://127.0.0.1:" + port, "status"});
  EXPECT_NE(plain.code, 0) << "plain HTTP to the HTTPS port";
  n->reset();
  std::filesystem::remove_all(dir);
}

TEST(TroupectlUsage, BadUsageExitsTwoWithTheParsersMessage) {
  auto none = troupectl({});
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("subcommand"), std::string::npos) << none.err;

  auto unknown = troupectl({"reboot"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_EQ(unknown.err.rfind("troupectl: unknown command 'reboot' (commands: status, members,", 0), 0u)
      << unknown.err;

  auto missing = troupectl({"entity", "tally"});
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.err.find("ID"), std::string::npos) << missing.err;

  auto negative = troupectl({"--timeout-s", "-1", "status"});
  EXPECT_EQ(negative.code, 2);
  EXPECT_NE(negative.err.find("timeout-s"), std::string::npos) << negative.err;

  auto ftp = troupectl({"--node", "ftp://n1:8081", "status"});
  EXPECT_EQ(ftp.code, 2);
  EXPECT_EQ(ftp.err, "troupectl: --node 'ftp://n1:8081': only http:// and https:// are supported\n");
}

TEST(TroupectlUsage, HelpAndVersionExitZero) {
  auto help = troupectl({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("rebalance"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("TROUPE_NODE"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("Exit codes"), std::string::npos) << help.out;
  auto version = troupectl({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_EQ(version.out, "troupectl " + std::string(Node::version()) + "\n");
}

// --- building blocks ----------------------------------------------------------------------

TEST(TroupectlParts, CompactRangesJoinRunsOfConsecutiveNumbers) {
  using ctl::detail::compact_ranges;
  EXPECT_EQ(compact_ranges({}), "");
  EXPECT_EQ(compact_ranges({5}), "5");
  EXPECT_EQ(compact_ranges({7, 0, 2, 1, 3}), "0-3,7");
  EXPECT_EQ(compact_ranges({1, 2, 4, 5, 6, 9, 9}), "1-2,4-6,9");
}

TEST(TroupectlParts, NodeUrlsGiveHostPortAndPrefix) {
  using ctl::detail::parse_node_url;
  auto plain = parse_node_url("http://127.0.0.1:8081");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->host, "127.0.0.1");
  EXPECT_EQ(plain->port, 8081);
  EXPECT_EQ(plain->prefix, "");
  auto behind_proxy = parse_node_url("http://ops.example:80/troupe/n1/");
  ASSERT_TRUE(behind_proxy.ok());
  EXPECT_EQ(behind_proxy->host, "ops.example");
  EXPECT_EQ(behind_proxy->prefix, "/troupe/n1");
  auto v6 = parse_node_url("http://[::1]:9000");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9000);
  auto default_port = parse_node_url("http://node-a");
  ASSERT_TRUE(default_port.ok());
  EXPECT_EQ(default_port->port, 80);
  EXPECT_FALSE(default_port->tls);
  auto secure = parse_node_url("https://node-a");
  ASSERT_TRUE(secure.ok());
  EXPECT_TRUE(secure->tls);
  EXPECT_EQ(secure->port, 443);
  auto secure_port = parse_node_url("https://node-a:8443/p");
  ASSERT_TRUE(secure_port.ok());
  EXPECT_EQ(secure_port->port, 8443);
  EXPECT_EQ(secure_port->prefix, "/p");
  EXPECT_FALSE(parse_node_url("127.0.0.1:8081").ok());
  EXPECT_FALSE(parse_node_url("http://:8081").ok());
  EXPECT_FALSE(parse_node_url("http://h:0").ok());
  EXPECT_FALSE(parse_node_url("http://h:70000").ok());
  EXPECT_FALSE(parse_node_url("http://h:x").ok());
}

TEST(TroupectlParts, TablesAlignColumnsByCharactersAndDropTrailingBlanks) {
  auto t =
      ctl::detail::format_table({"ID", "ADDRESS", "X"}, {{"n1", "—", ""}, {"node-22", "10.0.0.2:7000", "1"}});
  EXPECT_EQ(t,
            "ID        ADDRESS         X\n"
            "n1        —\n"
            "node-22   10.0.0.2:7000   1\n");
}

TEST(TroupectlParts, DurationsAreShortAndReadable) {
  using ctl::detail::format_duration;
  EXPECT_EQ(format_duration(0.04), "0.0s");
  EXPECT_EQ(format_duration(12.34), "12.3s");
  EXPECT_EQ(format_duration(245), "4m 05s");
  EXPECT_EQ(format_duration(7620), "2h 07m");
  EXPECT_EQ(format_duration(3 * 86400 + 4 * 3600 + 59), "3d 04h");
  EXPECT_EQ(format_duration(-1), "0.0s");
}

// --- cluster-shaped documents ---------------------------------------------------------------

TEST(TroupectlViews, AClusterOverviewShowsEveryMemberAndADashForLoadOnlyItsOwnNodeKnows) {
  json overview = {{"node", "n1"},
                   {"mode", "cluster"},
                   {"members",
                    {{{"id", "n1"},
                      {"address", "10.0.0.1:7000"},
                      {"app_version", "2.3.1"},
                      {"alive", true},
                      {"self", true},
                      {"admin", "http://10.0.0.1:8081"},
                      {"shards", 32},
                      {"entities_active", 1200},
                      {"mailbox_depth", 4},
                      {"messages_per_s", 812.5},
                      {"draining", false}},
                     {{"id", "n2"}, {"address", "10.0.0.2:7000"}, {"alive", true}, {"self", false}}}}};
  EXPECT_EQ(ctl::detail::render_members(overview),
            "ID   ADDRESS         VERSION   ALIVE   SELF   DRAINING   SHARDS   ENTITIES   MAILBOX   MSG/S\n"
            "n1   10.0.0.1:7000   2.3.1     yes     yes    no         32       1200       4         812.5\n"
            "n2   10.0.0.2:7000   —         yes     no     —          —        —          —         —\n");
}

TEST(TroupectlViews, ShardsAreGroupedByTypeAndOwnerAndAGoneOwnerIsFlagged) {
  json cluster = {{"node", "n1"},
                  {"members", {{{"id", "n1"}, {"alive", true}}, {{"id", "n2"}, {"alive", true}}}},
                  {"shards", json::array()}};
  for (int s = 0; s < 8; ++s) {
    std::string owner = s < 4 || s == 7 ? "n1" : s == 6 ? "n3" : "n2";
    cluster["shards"].push_back({{"type", "account"}, {"shard", s}, {"owner", owner}, {"epoch", 1}});
  }
  cluster["shards"].push_back({{"type", "order"}, {"shard", 0}, {"owner", "n2"}, {"epoch", 3}});
  auto summary = ctl::detail::summarize_shards(cluster, "");
  EXPECT_EQ(ctl::detail::render_shards(summary),
            "TYPE      OWNER                    SHARDS   LIST\n"
            "account   n1                       5        0-3,7\n"
            "account   n2                       2        4-5\n"
            "account   n3 (not a live member)   1        6\n"
            "order     n2                       1        0\n");
  EXPECT_EQ(summary["types"][0]["shards"], 8);
  EXPECT_EQ(ctl::detail::summarize_shards(cluster, "order")["types"].size(), 1u);
}

TEST(TroupectlViews, RebalanceListsOneRowPerMovedShardOrSaysNothingMoved) {
  json moves = {{"moves", 2},
                {"moved",
                 {{{"type", "account"}, {"shard", 4}, {"from", "n1"}, {"to", "n2"}, {"epoch", 5}},
                  {{"type", "account"}, {"shard", 9}, {"from", ""}, {"to", "n2"}, {"epoch", 1}}}}};
  EXPECT_EQ(ctl::detail::render_rebalance(moves),
            "moved 2 shards\n"
            "TYPE      SHARD   FROM   TO   EPOCH\n"
            "account   4       n1     n2   5\n"
            "account   9       —      n2   1\n");
  EXPECT_EQ(ctl::detail::render_rebalance({{"moves", 0}, {"moved", json::array()}}),
            "nothing moved: the shards are already balanced\n");
}

TEST(TroupectlViews, ARebalanceThatWaitsOnMixedVersionsSaysSoInsteadOfBalanced) {
  const std::string why =
      "the live members run app versions 1.9.0 and 1.10.0; rebalancing waits until one version remains";
  json waiting = {{"outcome", "versions_mixed"},
                  {"versions", {"1.9.0", "1.10.0"}},
                  {"message", "nothing moved: " + why},
                  {"moves", 0},
                  {"moved", json::array()}};
  EXPECT_EQ(ctl::detail::render_rebalance(waiting), "nothing moved: " + why + "\n");
  // Moves made before the versions were found mixed are listed first.
  waiting["message"] = "the rest did not move: " + why;
  waiting["moves"] = 1;
  waiting["moved"] = {{{"type", "account"}, {"shard", 4}, {"from", "n1"}, {"to", "n2"}, {"epoch", 5}}};
  const std::string table =
      "moved 1 shard\n"
      "TYPE      SHARD   FROM   TO   EPOCH\n"
      "account   4       n1     n2   5\n";
  EXPECT_EQ(ctl::detail::render_rebalance(waiting), table + "the rest did not move: " + why + "\n");
}

}  // namespace
