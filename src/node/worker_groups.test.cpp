// Worker groups on nodes (SPEC W9): the [node] roles and [[workers]]
// settings and their bad inputs, and in-process nodes over a real
// redis-server running a group's workers from a file, a webhook and an
// HTTP source: each unit once, with its spec and epoch; spec updates;
// removals; busy workers that delay their stop; the admin routes.

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <variant>

#include "../cluster/redis/redis_test_server.hpp"
#include "troupe/node/node.hpp"
#include "troupe/node/workers.hpp"
#include "worker_groups.hpp"

namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using troupe::node::Node;
using troupe::node::NodeConfig;
using troupe::node::WorkerSpecChanged;
using troupe::node::WorkerStart;
using troupe::node::WorkerStop;

// --- config ---------------------------------------------------------------------

const char* kCluster = "[cluster]\nredis = \"127.0.0.1:6379\"\ninsecure = true\n";

TEST(WorkerGroupConfig, RolesAndGroupsAreRead) {
  auto c = NodeConfig::parse(
      std::string("[node]\nroles = [\"manager\", \"devices\"]\n") + kCluster +
          "[[workers]]\ngroup = \"devices\"\ntype = \"device\"\nsource = \"file:/tmp/d.txt\"\n"
          "sync_interval_ms = 500\nroles = [\"devices\"]\n"
          "[[workers]]\ngroup = \"feeds\"\ntype = \"feed\"\nsource = \"webhook\"\n"
          "max_body_bytes = 2048\n"
          "[[workers]]\ngroup = \"sensors\"\ntype = \"feed\"\nsource = \"http://h:81/u\"\n"
          "source_timeout_ms = 700\n",
      "n.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->roles, (std::vector<std::string>{"manager", "devices"}));
  ASSERT_EQ(c->workers.size(), 3u);
  EXPECT_EQ(c->workers[0].group, "devices");
  EXPECT_EQ(c->workers[0].type, "device");
  EXPECT_EQ(c->workers[0].source, "file:/tmp/d.txt");
  EXPECT_EQ(c->workers[0].sync_interval, 500ms);
  EXPECT_EQ(c->workers[0].roles, std::vector<std::string>{"devices"});
  EXPECT_EQ(c->workers[1].max_body_bytes, 2048u);
  EXPECT_TRUE(c->workers[1].roles.empty());
  EXPECT_EQ(c->workers[2].source_timeout, 700ms);
}

TEST(WorkerGroupConfig, BadInputIsRefusedNamingTheSetting) {
  const std::string group = "[[workers]]\ngroup = \"g\"\ntype = \"t\"\nsource = \"webhook\"\n";
  struct Case {
    std::string toml;
    std::string error;  // a part of the message
  } cases[] = {
      {"[node]\nroles = [\"ok\", \"no way\"]\n" + std::string(kCluster),
       "node.roles: \"no way\" is not a role name"},
      {"[node]\nroles = [\"\"]\n" + std::string(kCluster), "node.roles: \"\" is not a role name"},
      {"[node]\nroles = [\"" + std::string(65, 'r') + "\"]\n" + kCluster, "node.roles: \"rrrr"},
      {"[node]\nroles = [\"a\", \"a\"]\n" + std::string(kCluster), "node.roles: \"a\" is named twice"},
      {"[node]\nroles = \"manager\"\n" + std::string(kCluster), "node.roles: expected an array of strings"},
      {"[node]\nroles = [1]\n" + std::string(kCluster), "node.roles: expected an array of strings"},
      {kCluster + group + "colour = \"red\"\n", "workers[group=g].colour: unknown setting"},
      {kCluster + group + group, "workers[1].group: \"g\" is declared twice"},
      {kCluster + std::string("[[workers]]\ngroup = \"g\"\ntype = \"t\"\nsource = \"ftp://h/u\"\n"),
       "workers[group=g].source: \"ftp://h/u\" is not a source"},
      {kCluster + std::string("[[workers]]\ngroup = \"g\"\ntype = \"t\"\nsource = \"https://h/u\"\n"),
       "workers[group=g].source: \"https://h/u\": https is not supported"},
      {kCluster + std::string("[[workers]]\ngroup = \"g\"\ntype = \"t\"\nsource = \"file:\"\n"),
       "workers[group=g].source: \"file:\" needs a path"},
      {kCluster + std::string("[[workers]]\ngroup = \"g\"\ntype = \"t\"\n"),
       "workers[group=g].source: missing"},
      {kCluster + std::string("[[workers]]\ngroup = \"g\"\nsource = \"webhook\"\n"),
       "workers[group=g].type: missing"},
      {kCluster + std::string("[[workers]]\ntype = \"t\"\nsource = \"webhook\"\n"),
       "workers[0].group: missing"},
      {kCluster + std::string("[[workers]]\ngroup = \"a b\"\ntype = \"t\"\nsource = \"webhook\"\n"),
       "workers[0].group: "},
      {kCluster + group + "roles = [\"de vices\"]\n",
       "workers[group=g].roles: \"de vices\" is not a role name"},
      {kCluster + group + "sync_interval_ms = 1\n", "workers[group=g].sync_interval_ms: 1 is out of range"},
      {kCluster + group + "max_body_bytes = 0\n", "workers[group=g].max_body_bytes: 0 is out of range"},
      {"workers = \"x\"\n" + std::string(kCluster), "workers: expected tables"},
      {group, "workers: worker groups are placed through Redis and need a [cluster] table"},
  };
  for (const auto& c : cases) {
    auto r = NodeConfig::parse(c.toml, "n.toml");
    ASSERT_FALSE(r.ok()) << c.toml;
    EXPECT_EQ(r.error().code(), troupe::ErrorCode::invalid_argument);
    EXPECT_NE(r.error().message().find(c.error), std::string::npos) << r.error().message() << "\nfor:\n"
                                                                    << c.toml;
    EXPECT_EQ(r.error().message().rfind("n.toml: ", 0), 0u) << r.error().message();
  }
}

// The config takes a group name exactly when the coordinator does.
TEST(WorkerGroupConfig, GroupNamesFollowTheCoordinatorsRule) {
  for (const std::string& name :
       std::vector<std::string>{"g", "devices/eu", "a.b_c-d", "a b", "x|y", "", std::string(128, 'g'),
                                std::string(129, 'g'), "caf\xc3\xa9", "tab\t"}) {
    auto c = NodeConfig::parse(
        std::string(kCluster) + "[[workers]]\ngroup = \"" + name + "\"\ntype = \"t\"\nsource = \"webhook\"\n",
        "n.toml");
    bool coordinator = troupe::cluster::validate_group(name).ok();
    EXPECT_EQ(c.ok(), coordinator) << "\"" << name << "\": " << (c.ok() ? "" : c.error().message());
  }
  // The coordinator's name for an entity type's shards is no worker group.
  auto c = NodeConfig::parse(
      std::string(kCluster) + "[[workers]]\ngroup = \"shards/payment\"\ntype = \"t\"\nsource = \"webhook\"\n",
      "n.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message().find("names under \"shards/\" are the entity types'"), std::string::npos)
      << c.error().message();
}

// Which groups a node serves and whether it syncs, by its roles and theirs.
TEST(WorkerGroupRoles, ANodeServesTheGroupsOfItsRolesAndSyncsWhenItIsAManager) {
  const std::string groups =
      std::string(kCluster) +
      "[[workers]]\ngroup = \"any\"\ntype = \"t\"\nsource = \"webhook\"\n"
      "[[workers]]\ngroup = \"dev\"\ntype = \"t\"\nsource = \"webhook\"\nroles = [\"devices\"]\n"
      "[[workers]]\ngroup = \"feed\"\ntype = \"t\"\nsource = \"webhook\"\nroles = [\"feeds\", \"x\"]\n";
  struct Case {
    std::string roles;
    bool manager;
    bool any, dev, feed;  // served
  } cases[] = {
      {"", true, true, false, false},
      {"roles = [\"devices\"]", false, true, true, false},
      {"roles = [\"manager\"]", true, true, false, false},
      {"roles = [\"x\", \"devices\", \"manager\"]", true, true, true, true},
  };
  for (const auto& c : cases) {
    auto cfg = NodeConfig::parse("[node]\n" + c.roles + "\n" + groups, "n.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    troupe::node::detail::WorkerGroups wg(*cfg, {});
    auto v = wg.view(nullptr);
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ((*v)["manager"], c.manager) << c.roles;
    EXPECT_EQ((*v)["groups"][0]["served_here"], c.any) << c.roles;
    EXPECT_EQ((*v)["groups"][1]["served_here"], c.dev) << c.roles;
    EXPECT_EQ((*v)["groups"][2]["served_here"], c.feed) << c.roles;
    EXPECT_EQ((*v)["groups"][2]["synced_here"], c.manager) << c.roles;
    EXPECT_EQ((*v)["is_first_manager"], "not_ready") << "no coordinator yet";
    EXPECT_EQ((*v)["started"], false);
  }
}

// --- a worker type that keeps a ledger -------------------------------------------

struct DevSpec {
  std::string text;
};

// Specs containing "bad" do not decode.
troupe::Result<DevSpec> decode_dev(std::string_view s) {
  if (s.find("bad") != std::string_view::npos)
    return troupe::Error(troupe::ErrorCode::invalid_argument, "'bad' is not a spec");
  return DevSpec{std::string(s)};
}

// What every worker of every in-process node did. Thread-safe.
struct Ledger {
  struct Unit {
    int running = 0;
    std::string node;
    std::string spec;
    std::uint64_t epoch = 0;
    int starts = 0;
    std::chrono::steady_clock::time_point started, stop_asked, stopped;
  };
  mutable std::mutex mu;
  std::map<std::string, Unit> units;
  int doubles = 0;  // moments a unit ran twice

  std::map<std::string, Unit> snapshot() const {
    std::lock_guard lk(mu);
    return units;
  }
  int live() const {
    std::lock_guard lk(mu);
    int n = 0;
    for (const auto& [u, x] : units) n += x.running;
    return n;
  }
};

struct Finish {};
using DevMsg = std::variant<WorkerSpecChanged<DevSpec>, WorkerStop, Finish>;

// A worker whose spec "busy <ms>" takes that long to stop; "stubborn" never
// stops by itself.
class DevWorker final : public troupe::Actor<DevMsg> {
 public:
  DevWorker(WorkerStart<DevSpec> s, std::shared_ptr<Ledger> ledger, std::string node)
      : s_(std::move(s)), ledger_(std::move(ledger)), node_(std::move(node)) {}
  void on_start() {
    std::lock_guard lk(ledger_->mu);
    auto& u = ledger_->units[s_.unit];
    if (++u.running > 1) ++ledger_->doubles;
    u.node = node_;
    u.spec = s_.spec.text;
    u.epoch = s_.epoch;
    ++u.starts;
    u.started = std::chrono::steady_clock::now();
  }
  void on_stop() {
    std::lock_guard lk(ledger_->mu);
    auto& u = ledger_->units[s_.unit];
    --u.running;
    u.stopped = std::chrono::steady_clock::now();
  }
  void receive(DevMsg& m) {
    troupe::match(
        m,
        [&](WorkerSpecChanged<DevSpec>& c) {
          s_.spec = c.spec;
          std::lock_guard lk(ledger_->mu);
          ledger_->units[s_.unit].spec = c.spec.text;
        },
        [&](WorkerStop&) {
          {
            std::lock_guard lk(ledger_->mu);
            ledger_->units[s_.unit].stop_asked = std::chrono::steady_clock::now();
          }
          if (s_.spec.text.rfind("busy ", 0) == 0) {
            start_timer("finish", std::chrono::milliseconds(std::stoi(s_.spec.text.substr(5))), Finish{});
          } else if (s_.spec.text != "stubborn") {
            stop();
          }
        },
        [&](Finish&) { stop(); });
  }

 private:
  WorkerStart<DevSpec> s_;
  std::shared_ptr<Ledger> ledger_;
  std::string node_;
};

troupe::node::WorkerTypes dev_types(const std::shared_ptr<Ledger>& ledger, const std::string& node) {
  troupe::node::WorkerTypes t;
  auto r = t.add<DevWorker, DevSpec>("dev", decode_dev, ledger, node);
  EXPECT_TRUE(r.ok()) << r.error().to_string();
  return t;
}

// Waits up to `limit` for `done`.
template <class F>
bool within(std::chrono::milliseconds limit, F&& done) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

// A request to a node's admin API: the status and the JSON body.
std::pair<int, json> call(std::uint16_t port, const std::string& method, const std::string& target,
                          std::string body = {}) {
  troupe::http::ClientSettings cs;
  cs.port = port;
  auto c = troupe::http::Client::create(cs);
  troupe::http::ClientRequest r;
  r.method = method;
  r.target = target;
  r.body = std::move(body);
  r.content_type = "text/plain";
  r.timeout = 20s;
  auto resp = (*c)->request_sync(std::move(r));
  if (!resp.ok()) return {0, json()};
  return {resp->status, json::parse(resp->body, nullptr, false)};
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  auto tmp = p;
  tmp += ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, p);  // a reader never sees half a file
}

// A scratch directory, a redis-server and the ledger the nodes share.
struct Fleet {
  explicit Fleet(const std::string& name)
      : dir(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Fleet() {
    nodes.clear();
    std::filesystem::remove_all(dir);
  }
  // Starts node `id` with [[workers]] `workers` and `node_extra` in [node].
  Node& start(const std::string& id, const std::string& workers, const std::string& node_extra = "",
              int stop_timeout_ms = 3000) {
    auto c = NodeConfig::parse("[node]\nid = \"" + id + "\"\ndata_dir = \"" + (dir / id).string() +
                                   "\"\nthreads = 2\n" + node_extra +
                                   "\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n"
                                   "[cluster]\nredis = \"127.0.0.1:" +
                                   std::to_string(redis.port()) +
                                   "\"\nlisten_port = 0\ninsecure = true\nheartbeat_ms = 200\nliveness_threshold_ms = 1000\n"
                                   "takeover_margin_ms = 200\n[entities]\nstop_timeout_ms = " +
                                   std::to_string(stop_timeout_ms) + "\n" + workers,
                               id + ".toml");
    EXPECT_TRUE(c.ok()) << c.error().to_string();
    auto n = Node::start(std::move(*c), dev_types(ledger, id));
    EXPECT_TRUE(n.ok()) << n.error().to_string();
    nodes.push_back(std::move(*n));
    return *nodes.back();
  }
  // Each unit's epoch on the node that runs it, from the coordinators.
  std::map<std::string, std::uint64_t> running(const std::string& group) {
    std::map<std::string, std::uint64_t> all;
    for (auto& n : nodes)
      for (const auto& [u, e] : n->cluster()->coordinator().running(group)) all[u] = e;
    return all;
  }

  std::filesystem::path dir;
  troupe::test::RedisTestServer redis;
  std::shared_ptr<Ledger> ledger = std::make_shared<Ledger>();
  std::vector<std::unique_ptr<Node>> nodes;
};

std::string file_group(const std::filesystem::path& file, int interval_ms = 200) {
  return "[[workers]]\ngroup = \"dev\"\ntype = \"dev\"\nsource = \"file:" + file.string() +
         "\"\nsync_interval_ms = " + std::to_string(interval_ms) + "\n";
}

TEST(WorkerGroupNode, StartRefusesAGroupOfAnUnregisteredType) {
  auto c = NodeConfig::parse(
      std::string(kCluster) + "[[workers]]\ngroup = \"g\"\ntype = \"nope\"\nsource = \"webhook\"\n",
      "n.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  auto ledger = std::make_shared<Ledger>();
  auto n = Node::start(std::move(*c), dev_types(ledger, "n"));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().code(), troupe::ErrorCode::invalid_argument);
  EXPECT_NE(n.error().message().find(
                "workers[group=g].type: no worker type \"nope\" is registered (registered: dev)"),
            std::string::npos)
      << n.error().message();
}

TEST(WorkerTypes, NamesAreCheckedOnce) {
  auto ledger = std::make_shared<Ledger>();
  troupe::node::WorkerTypes t;
  EXPECT_TRUE((t.add<DevWorker, DevSpec>("dev", decode_dev, ledger, std::string("n"))).ok());
  EXPECT_FALSE((t.add<DevWorker, DevSpec>("dev", decode_dev, ledger, std::string("n"))).ok());
  EXPECT_FALSE((t.add<DevWorker, DevSpec>("a b", decode_dev, ledger, std::string("n"))).ok());
  EXPECT_FALSE((t.add<DevWorker, DevSpec>("x", {}, ledger, std::string("n"))).ok());
  EXPECT_EQ(t.names(), std::vector<std::string>{"dev"});
}

// proves: W9
// Three nodes serve a group read from a file: after a rebalance each unit
// runs on exactly one node, with the spec the file gives and the epoch
// Redis placed it under; a changed spec reaches the running worker, a
// removed unit's worker stops, an added one starts, a bad spec starts none.
TEST(WorkerGroupNode, AFileGroupRunsEachUnitOnceAcrossThreeNodes) {
  Fleet f("troupe-wg-file");
  auto file = f.dir / "units.txt";
  std::string units;
  for (int i = 0; i < 12; ++i) units += "u" + std::to_string(i) + " spec-" + std::to_string(i) + "\n";
  write_file(file, units + "broken bad\n");
  Node& n1 = f.start("w1", file_group(file));
  f.start("w2", file_group(file));
  f.start("w3", file_group(file));
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 12; })) << f.ledger->live();
  auto moved = n1.cluster()->coordinator().rebalance("dev").get();
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  ASSERT_TRUE(within(10s, [&] {
    std::map<std::string, int> per_node;
    for (const auto& [u, x] : f.ledger->snapshot()) per_node[x.node] += x.running;
    // 13 placed (the bad spec too, which runs nowhere): 5, 4 and 4.
    return f.ledger->live() == 12 && per_node["w1"] >= 3 && per_node["w2"] >= 3 && per_node["w3"] >= 3;
  }));
  auto placed = f.running("dev");
  auto seen = f.ledger->snapshot();
  ASSERT_EQ(placed.size(), 13u);
  for (int i = 0; i < 12; ++i) {
    const std::string u = "u" + std::to_string(i);
    EXPECT_EQ(seen[u].running, 1) << u;
    EXPECT_EQ(seen[u].spec, "spec-" + std::to_string(i)) << u;
    EXPECT_EQ(seen[u].epoch, placed[u]) << u;
  }
  EXPECT_EQ(seen.count("broken"), 0u) << "a spec that does not decode starts no worker";
  EXPECT_EQ(f.ledger->doubles, 0);

  // The next sync rounds (200 ms) bring the file's changes.
  const auto u1_starts = seen["u1"].starts;
  write_file(file, "u0 spec-0\nu1 spec-1b\n" + units.substr(units.find("u3 ")) + "u12 spec-12\n");
  ASSERT_TRUE(within(5s, [&] {
    auto s = f.ledger->snapshot();
    return s["u1"].spec == "spec-1b" && s["u2"].running == 0 && s["u12"].running == 1;
  }));
  auto after = f.ledger->snapshot();
  EXPECT_EQ(after["u1"].starts, u1_starts)
      << "a spec change is a message to the running worker, not a restart";
  EXPECT_EQ(after["u1"].running, 1);
  EXPECT_EQ(f.running("dev").count("u2"), 0u);
  EXPECT_EQ(f.ledger->doubles, 0);

  auto [status, view] = call(n1.admin_port(), "GET", "/workers");
  ASSERT_EQ(status, 200) << view.dump();
  EXPECT_EQ(view["manager"], true);
  EXPECT_EQ(view["is_first_manager"], true);
  EXPECT_EQ(view["started"], true);
  ASSERT_EQ(view["groups"].size(), 1u);
  EXPECT_EQ(view["groups"][0]["group"], "dev");
  EXPECT_EQ(view["groups"][0]["source"], "file:" + file.string());
  EXPECT_EQ(view["groups"][0]["sync_interval_ms"], 200);
  EXPECT_GE(view["groups"][0]["worker_errors"].get<int>(), 1) << "the bad spec was logged as an error";
  EXPECT_EQ(view["groups"][0]["last_sync"]["report"]["failed"].size(), 0u);
  auto [s2, v2] = call(f.nodes[1]->admin_port(), "GET", "/workers/dev");
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(v2["is_first_manager"], false);
  EXPECT_EQ(v2["units"].size(), v2["running_here"].get<std::size_t>());
  EXPECT_EQ(call(n1.admin_port(), "GET", "/workers/nope").first, 404);
}

// proves: W9
// A busy worker delays its stop, E6-style: a node that leaves hands its units
// to the other, and the busy unit starts there only after it has stopped
// here, no earlier than its work took.
TEST(WorkerGroupNode, ABusyWorkerDelaysItsStopAndItsHandOff) {
  Fleet f("troupe-wg-busy");
  auto file = f.dir / "units.txt";
  write_file(file, "idle plain\nslow busy 800\n");
  Node& n1 = f.start("b1", file_group(file, 5000));
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 2; }));
  f.start("b2", file_group(file, 5000));
  ASSERT_TRUE(n1.drain().ok());
  ASSERT_TRUE(within(10s, [&] {
    auto s = f.ledger->snapshot();
    return s["slow"].node == "b2" && s["slow"].running == 1 && s["idle"].node == "b2";
  }));
  auto s = f.ledger->snapshot();
  EXPECT_EQ(f.ledger->doubles, 0);
  EXPECT_GE(s["slow"].starts, 2);
  // On b1: asked, then stopped 800 ms later; on b2: started after that.
  const auto& slow = s["slow"];
  ASSERT_NE(slow.stop_asked, std::chrono::steady_clock::time_point{}) << "the worker was told WorkerStop";
  EXPECT_GE(slow.stopped - slow.stop_asked, 750ms) << "the busy worker finished its work first";
  EXPECT_GE(slow.started, slow.stopped) << "the new owner waited for the busy worker to stop";
}

// proves: W9
// A worker that never stops by itself is stopped at the node's stop timeout.
TEST(WorkerGroupNode, AWorkerThatIgnoresItsStopIsStoppedAtTheStopTimeout) {
  Fleet f("troupe-wg-stubborn");
  auto file = f.dir / "units.txt";
  write_file(file, "mule stubborn\n");
  Node& n1 = f.start("s1", file_group(file, 100), "", /*stop_timeout_ms=*/600);
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 1; }));
  write_file(file, "");
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 0; }));
  auto s = f.ledger->snapshot();
  EXPECT_GE(s["mule"].stopped - s["mule"].stop_asked, 550ms);
  EXPECT_LT(s["mule"].stopped - s["mule"].stop_asked, 3s);
  EXPECT_TRUE(within(5s, [&] { return n1.cluster()->coordinator().running("dev").empty(); }));
}

// proves: W9
// A node that loses its lease while a worker is being stopped stops that
// worker at once, not at the end of its stop timeout: its unit may go to
// another node threshold + margin after the lease ran out.
TEST(WorkerGroupNode, AWorkerBeingStoppedStopsAtOnceWhenItsNodeIsFenced) {
  Fleet f("troupe-wg-fenced");
  auto file = f.dir / "units.txt";
  write_file(file, "mule stubborn\n");
  f.start("x1", file_group(file, 100), "", /*stop_timeout_ms=*/30000);
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 1; }));
  write_file(file, "");  // the unit is removed: its worker is told to stop, and ignores it
  ASSERT_TRUE(within(10s, [&] {
    return f.ledger->snapshot()["mule"].stop_asked != std::chrono::steady_clock::time_point{};
  }));
  // Redis answers nobody for 4 s: the node's lease (1 s) runs out.
  troupe::test::RedisTestClient admin(f.redis.port());
  admin.cmd({"CLIENT", "PAUSE", "4000", "ALL"});
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 0; })) << "the worker outlived its node's lease";
  auto s = f.ledger->snapshot();
  EXPECT_LT(s["mule"].stopped - s["mule"].stop_asked, 6s);
}

// proves: W8, W9
// A group that names a role runs only on nodes holding it: with none live
// the sync reports NO_ACCEPTABLE_WORKER for every unit; once one is, every
// unit goes to it and stays there through a rebalance, while the manager
// that lacks the role syncs it and runs none.
TEST(WorkerGroupNode, AGroupsUnitsGoOnlyToNodesWithItsRole) {
  Fleet f("troupe-wg-roles");
  auto file = f.dir / "units.txt";
  write_file(file, "r1 a\nr2 b\nr3 c\nr4 d\n");
  const std::string group = file_group(file, 3'600'000) + "roles = [\"devices\"]\n";
  Node& m = f.start("m1", group, "roles = [\"manager\"]");
  auto [s0, r0] = call(m.admin_port(), "POST", "/workers/dev/sync");
  ASSERT_EQ(s0, 200) << r0.dump();
  ASSERT_EQ(r0["report"]["failed"].size(), 4u) << r0.dump();
  EXPECT_NE(r0["report"]["failed"][0]["message"].get<std::string>().find("NO_ACCEPTABLE_WORKER"), std::string::npos)
      << r0.dump();
  EXPECT_EQ(f.ledger->live(), 0);

  Node& d = f.start("d1", group, "roles = [\"devices\"]");
  auto [s1, r1] = call(m.admin_port(), "POST", "/workers/dev/sync");
  ASSERT_EQ(s1, 200) << r1.dump();
  EXPECT_EQ(r1["report"]["assigned"], 4) << r1.dump();
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 4; }));
  ASSERT_TRUE(m.cluster()->coordinator().rebalance("dev").get().ok());
  std::this_thread::sleep_for(300ms);
  for (const auto& [u, x] : f.ledger->snapshot()) {
    EXPECT_EQ(x.node, "d1") << u;
    EXPECT_EQ(x.running, 1) << u;
  }
  EXPECT_EQ(d.cluster()->coordinator().running("dev").size(), 4u);
  EXPECT_TRUE(m.cluster()->coordinator().running("dev").empty());
  auto [s2, v2] = call(m.admin_port(), "GET", "/workers/dev");
  EXPECT_EQ(v2["served_here"], false);
  EXPECT_EQ(v2["synced_here"], true);
}

std::string webhook_group(const std::string& extra = "") {
  return "[[workers]]\ngroup = \"hooks\"\ntype = \"dev\"\nsource = \"webhook\"\nmax_body_bytes = 1024\n"
         "roles = [\"devices\"]\n" +
         extra;
}

// proves: W9
// A webhook group's set is what a manager is POSTed; a node without the
// manager role serves the group but refuses to sync it; a body over the
// limit is refused with 413, one that does not parse with 400, and neither
// changes anything.
TEST(WorkerGroupNode, AWebhookPostChangesTheSetOnManagersOnly) {
  Fleet f("troupe-wg-hook");
  Node& m = f.start("m1", webhook_group(), "roles = [\"manager\", \"devices\"]");
  Node& d = f.start("d1", webhook_group(), "roles = [\"devices\"]");
  auto [s0, v0] = call(d.admin_port(), "GET", "/workers");
  EXPECT_EQ(v0["manager"], false);
  EXPECT_EQ(v0["groups"][0]["served_here"], true);
  EXPECT_EQ(v0["groups"][0]["synced_here"], false);

  auto [s1, r1] = call(m.admin_port(), "POST", "/workers/hooks/sync", "a one\nb two\nc three\n");
  ASSERT_EQ(s1, 200) << r1.dump();
  EXPECT_EQ(r1["report"]["desired"], 3);
  EXPECT_EQ(r1["report"]["assigned"], 3);
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 3; }));

  auto [s2, r2] = call(m.admin_port(), "POST", "/workers/hooks/sync", "a one\nc three-b\n");
  ASSERT_EQ(s2, 200) << r2.dump();
  EXPECT_EQ(r2["report"]["unassigned"], 1);
  EXPECT_EQ(r2["report"]["updated"], 1);
  ASSERT_TRUE(within(10s, [&] {
    auto s = f.ledger->snapshot();
    return s["b"].running == 0 && s["c"].spec == "three-b" && f.ledger->live() == 2;
  }));

  auto [s3, r3] = call(d.admin_port(), "POST", "/workers/hooks/sync", "z zed\n");
  EXPECT_EQ(s3, 409) << r3.dump();
  EXPECT_EQ(r3["error"]["code"], "not_manager");
  std::string big;
  while (big.size() <= 1024) big += "unit" + std::to_string(big.size()) + " x\n";
  auto [s4, r4] = call(m.admin_port(), "POST", "/workers/hooks/sync", big);
  EXPECT_EQ(s4, 413) << r4.dump();
  auto [s5, r5] = call(m.admin_port(), "POST", "/workers/hooks/sync", "a one\na again\n");
  EXPECT_EQ(s5, 400) << r5.dump();
  EXPECT_EQ(call(m.admin_port(), "POST", "/workers/nope/sync", "").first, 404);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(f.ledger->live(), 2) << "refused posts change nothing";
  EXPECT_EQ(f.running("hooks").size(), 2u);
  EXPECT_EQ(f.ledger->doubles, 0);
}

// proves: W9
// An HTTP source that answers 500 or too late gives an error in the sync's
// answer and changes nothing; an empty POST re-reads it at once.
TEST(WorkerGroupNode, AFailingHttpSourceChangesNothing) {
  Fleet f("troupe-wg-http");
  std::atomic<int> mode{0};  // 0: the set; 1: 500; 2: too slow
  std::atomic<int> version{0};
  troupe::http::Router router;
  router.add("GET", "/units", [&](troupe::http::Request&, troupe::http::Responder out) {
    if (mode == 1) return out.respond(troupe::http::Response::text(500, "boom"));
    if (mode == 2) std::this_thread::sleep_for(700ms);
    out.respond(troupe::http::Response::text(200, version == 0 ? "p one\nq two\n" : "p one\n"));
  });
  auto server = troupe::http::Server::start({}, std::move(router));
  ASSERT_TRUE(server.ok());
  const std::string url = "http://127.0.0.1:" + std::to_string((*server)->port()) + "/units";
  Node& n = f.start("h1", "[[workers]]\ngroup = \"web\"\ntype = \"dev\"\nsource = \"" + url +
                              "\"\nsync_interval_ms = 3600000\nsource_timeout_ms = 300\n");
  ASSERT_TRUE(within(10s, [&] { return f.ledger->live() == 2; }));

  version = 1;
  mode = 1;
  auto [s1, r1] = call(n.admin_port(), "POST", "/workers/web/sync");
  EXPECT_EQ(s1, 502) << r1.dump();
  EXPECT_EQ(r1["error"]["code"], "unreachable");
  EXPECT_NE(r1["error"]["message"].get<std::string>().find("500"), std::string::npos) << r1.dump();
  mode = 2;
  auto [s2, r2] = call(n.admin_port(), "POST", "/workers/web/sync");
  std::this_thread::sleep_for(500ms);  // the slow answer holds the test server's one thread
  EXPECT_EQ(s2, 504) << r2.dump();
  EXPECT_EQ(r2["error"]["code"], "timeout");
  auto [s3, v3] = call(n.admin_port(), "GET", "/workers/web");
  EXPECT_EQ(v3["last_sync"]["error"]["code"], "timeout") << v3.dump();
  EXPECT_EQ(f.ledger->live(), 2) << "a failed read changes nothing";
  EXPECT_EQ(f.running("web").size(), 2u);
  auto [s4, r4] = call(n.admin_port(), "POST", "/workers/web/sync", "p one\n");
  EXPECT_EQ(s4, 400) << "a body is for webhook groups: " << r4.dump();

  mode = 0;
  auto [s5, r5] = call(n.admin_port(), "POST", "/workers/web/sync");
  ASSERT_EQ(s5, 200) << r5.dump();
  EXPECT_EQ(r5["report"]["unassigned"], 1);
  EXPECT_TRUE(within(5s, [&] { return f.ledger->live() == 1; }));
  f.nodes.clear();
  (*server)->stop();
}

}  // namespace
