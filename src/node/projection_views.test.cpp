// The node's report of the projections an application watches: GET
// /projections, /metrics, /health and the overview, for a projection that
// runs and one that stopped on an event its handler keeps refusing; and
// sliced projections (serve_projection): all slices on a single node, one
// owner per slice across a cluster, moved on a drain without an event
// applied twice or missed.

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "../cluster/redis/redis_test_server.hpp"
#include "../persist/journal_test_support.hpp"
#include "troupe/node/node.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_read_model.hpp"

namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using troupe::EventSelector;
using troupe::Projection;
using troupe::ProjectionSettings;
using troupe::ProjectionStatus;
using troupe::SqliteReadModel;
using troupe::SqliteTransaction;
using troupe::StreamEvent;
using troupe::node::Node;
using troupe::node::NodeConfig;

// Keeps every (id, seq) once; refuses the event whose payload is `refuse`.
struct Rows {
  using ReadModel = SqliteReadModel;
  std::string refuse{};
  troupe::Result<void> setup(SqliteTransaction& tx) {
    return tx.exec("CREATE TABLE IF NOT EXISTS rows_seen (id TEXT, seq INTEGER, PRIMARY KEY (id, seq))");
  }
  troupe::Result<void> apply(SqliteTransaction& tx, const StreamEvent& e) {
    if (e.event.payload == refuse) return troupe::Error(troupe::ErrorCode::invalid_argument, "cannot take " + refuse);
    return tx.exec("INSERT INTO rows_seen (id, seq) VALUES (?1, ?2)",
                   {e.persistence_id, static_cast<std::int64_t>(e.event.seq)});
  }
};

class ProjectionViews : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cfg = NodeConfig::parse("[node]\nid = \"pv\"\ndata_dir = \"" + dir.path().string() +
                                     "\"\nthreads = 2\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n",
                                 "test.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto n = Node::start(std::move(*cfg));
    ASSERT_TRUE(n.ok()) << n.error().to_string();
    node = std::move(*n);
    model = SqliteReadModel::open({.path = dir.file("read.db")}).value();
    troupe::http::ClientSettings cs;
    cs.port = node->admin_port();
    client = troupe::http::Client::create(cs).value();
  }
  void TearDown() override {
    client.reset();
    node.reset();
  }
  void append(const std::string& id, std::uint64_t first, std::uint64_t last, std::string payload_of_last = {}) {
    auto b = troupe::test::batch(id, first, last);
    if (!payload_of_last.empty()) b.events.back().payload = payload_of_last;
    auto r = troupe::journal_sync::append(*node->journal(), b);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  Projection<Rows> start(std::string name, std::string type, std::string refuse = {}) {
    ProjectionSettings s;
    s.name = std::move(name);
    s.source = EventSelector::of_type(std::move(type));
    s.batch = 2;
    s.min_backoff = 1ms;
    s.max_backoff = 2ms;
    s.max_attempts = 3;
    s.poll_interval = 20ms;
    return Projection<Rows>::start(node->system(), node->journal(), model, s, Rows{std::move(refuse)}).value();
  }
  troupe::http::Response get(std::string target) {
    troupe::http::ClientRequest r;
    r.method = "GET";
    r.target = std::move(target);
    auto resp = client->request_sync(std::move(r));
    EXPECT_TRUE(resp.ok()) << resp.error().to_string();
    return resp.ok() ? *resp : troupe::http::Response{};
  }
  json projections() {
    auto r = get("/projections");
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body)["projections"];
  }

  troupe::test::TempDir dir;
  std::unique_ptr<Node> node;
  std::shared_ptr<SqliteReadModel> model;
  std::shared_ptr<troupe::http::Client> client;
};

TEST_F(ProjectionViews, ARunningAndAFailedProjectionShowWhatTheirStatusSays) {
  append("acct|a", 1, 3);
  append("bill|b", 1, 1);
  append("bill|c", 1, 2, "poison");  // bill|c seq 2 is refused every time
  auto good = start("ledger", "acct");
  auto bad = start("bills", "bill", "poison");
  node->watch_projection(good);
  node->watch_projection(bad);
  ASSERT_TRUE(good.wait_until([](const ProjectionStatus& s) { return s.caught_up && s.events_applied == 3; }, 10s));
  ASSERT_TRUE(bad.wait_until([](const ProjectionStatus& s) { return s.state == troupe::ProjectionState::failed; }, 10s));

  json list = projections();
  ASSERT_EQ(list.size(), 2u) << list.dump();
  const json& g = list[0];
  EXPECT_EQ(g["key"], "ledger/type:acct");
  EXPECT_EQ(g["name"], "ledger");
  EXPECT_EQ(g["source"], "type:acct");
  EXPECT_EQ(g["state"], "running");
  EXPECT_EQ(g["events_applied"], 3);
  EXPECT_EQ(g["caught_up"], true);
  EXPECT_EQ(g["lag_ms"], 0);
  EXPECT_EQ(g["offset"], good.status().offset->to_string());
  EXPECT_TRUE(g["failure"].is_null());
  const json& b = list[1];
  EXPECT_EQ(b["state"], "failed");
  ASSERT_TRUE(b["failure"].is_object()) << b.dump();
  EXPECT_EQ(b["failure"]["persistence_id"], "bill|c");
  EXPECT_EQ(b["failure"]["seq"], 2);
  EXPECT_EQ(b["failure"]["attempts"], 3);
  EXPECT_EQ(b["failure"]["code"], "invalid_argument");
  EXPECT_EQ(b["failure"]["offset"], bad.status().failure->offset.to_string());
  EXPECT_EQ(b["retries"], bad.status().retries);

  auto metrics = get("/metrics").body;
  const std::string g_labels = "{node=\"pv\",projection=\"ledger\",source=\"type:acct\"";
  const std::string b_labels = "{node=\"pv\",projection=\"bills\",source=\"type:bill\"";
  EXPECT_NE(metrics.find("troupe_projection_events_applied_total" + g_labels + "} 3"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("troupe_projection_lag_seconds" + g_labels + "} 0"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("troupe_projection_state" + g_labels + ",state=\"running\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("troupe_projection_state" + b_labels + ",state=\"failed\"} 1"), std::string::npos);
  EXPECT_NE(metrics.find("troupe_projection_state" + b_labels + ",state=\"running\"} 0"), std::string::npos);
  EXPECT_NE(metrics.find("troupe_projection_retries_total" + b_labels + "} " + std::to_string(bad.status().retries)),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("troupe_projection_conflicts_total" + g_labels + "} 0"), std::string::npos);

  // The failed one makes the node unhealthy, naming where it stopped.
  auto health = get("/health");
  EXPECT_EQ(health.status, 503);
  json h = json::parse(health.body)["services"];
  EXPECT_EQ(h["projection/ledger/type:acct"]["up"], true) << h.dump();
  EXPECT_EQ(h["projection/bills/type:bill"]["up"], false);
  EXPECT_NE(h["projection/bills/type:bill"]["message"].get<std::string>().find("bill|c seq 2"), std::string::npos);

  EXPECT_EQ(node->overview()["projections"], list);

  // Forgotten: gone from every view, and the node is healthy again.
  node->unwatch_projection("bills/type:bill");
  list = projections();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["key"], "ledger/type:acct");
  EXPECT_EQ(get("/metrics").body.find("projection=\"bills\""), std::string::npos);
  EXPECT_EQ(get("/health").status, 200);
}

TEST_F(ProjectionViews, WithoutProjectionsTheViewsAreEmpty) {
  EXPECT_EQ(projections(), json::array());
  EXPECT_EQ(get("/metrics").body.find("troupe_projection_"), std::string::npos);
  EXPECT_EQ(node->overview()["projections"], json::array());
}

// Appends events 1..n of `id`, tagged `tag`, to `j`.
void append_tagged(troupe::Journal& j, const std::string& id, std::uint64_t first, std::uint64_t last,
                   const std::string& tag) {
  auto b = troupe::test::batch(id, first, last);
  for (auto& e : b.events) e.tags = {tag};
  auto r = troupe::journal_sync::append(j, b);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
}

// The slices "s0".."s3" of projection "rows" over `journal` into `model`,
// started on `node`.
troupe::node::ProjectionSlices rows_slices(Node* node, std::shared_ptr<troupe::Journal> journal,
                                           std::shared_ptr<SqliteReadModel> model) {
  troupe::node::ProjectionSlices p;
  p.name = "rows";
  p.slices = {"s0", "s1", "s2", "s3"};
  p.start = [node, journal, model](const std::string& slice) -> troupe::Result<troupe::node::RunningSlice> {
    ProjectionSettings s;
    s.name = "rows";
    s.source = EventSelector::with_tag(slice);
    s.poll_interval = 20ms;
    auto pr = Projection<Rows>::start(node->system(), journal, model, s);
    if (!pr) return std::move(pr).error();
    return troupe::node::RunningSlice::of(*pr);
  };
  return p;
}

std::int64_t count_rows(SqliteReadModel& model) {
  auto r = model.query("SELECT count(*) FROM rows_seen");
  return r.ok() ? std::get<std::int64_t>((*r)[0][0]) : -1;
}

TEST_F(ProjectionViews, ASlicedProjectionRunsEverySliceOnASingleNodeAndRefusesBadSlices) {
  auto journal = std::make_shared<troupe::MemoryJournal>();
  for (int i = 0; i < 8; ++i) append_tagged(*journal, "acct|" + std::to_string(i), 1, 3, "s" + std::to_string(i % 4));
  ASSERT_TRUE(node->serve_projection(rows_slices(node.get(), journal, model)).ok());
  auto settled = [&] {
    json list = projections();
    std::uint64_t applied = 0;
    for (const auto& p : list) applied += p["events_applied"].get<std::uint64_t>();
    return list.size() == 4 && applied == 24;
  };
  for (int i = 0; i < 500 && !settled(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(settled()) << projections().dump();
  EXPECT_EQ(count_rows(*model), 24);

  auto again = node->serve_projection(rows_slices(node.get(), journal, model));
  EXPECT_EQ(again.error().code(), troupe::ErrorCode::invalid_argument) << again.error().to_string();
  auto bad = [&](auto change) {
    auto p = rows_slices(node.get(), journal, model);
    p.name = "other";
    change(p);
    return node->serve_projection(std::move(p)).error().code();
  };
  using P = troupe::node::ProjectionSlices;
  EXPECT_EQ(bad([](P& p) { p.name = ""; }), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(bad([](P& p) { p.name = "a/b"; }), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(bad([](P& p) { p.slices.clear(); }), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(bad([](P& p) { p.slices = {"s0", "s0"}; }), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(bad([](P& p) { p.slices = {"a b"}; }), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(bad([](P& p) { p.start = nullptr; }), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(projections().size(), 4u);
}

// A node of a cluster over `redis`, with a memory journal of its own (the
// projections read a journal the test shares between the nodes).
std::unique_ptr<Node> cluster_node(const std::string& id, const std::filesystem::path& dir, std::uint16_t redis) {
  auto cfg = NodeConfig::parse("[node]\nid = \"" + id + "\"\ndata_dir = \"" + (dir / id).string() +
                                   "\"\nthreads = 2\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n"
                                   "[cluster]\nredis = \"127.0.0.1:" + std::to_string(redis) +
                                   "\"\nlisten_port = 0\nheartbeat_ms = 200\nliveness_threshold_ms = 1000\n"
                                   "takeover_margin_ms = 200\ninsecure = true\n",
                               id + ".toml");
  EXPECT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto n = Node::start(std::move(*cfg));
  EXPECT_TRUE(n.ok()) << n.error().to_string();
  return n.ok() ? std::move(*n) : nullptr;
}

// Slice -> the nodes running it (by their GET /projections), and the
// events applied there.
std::map<std::string, std::vector<std::string>> owners(const std::vector<Node*>& nodes, std::uint64_t& applied,
                                                       bool& caught_up) {
  std::map<std::string, std::vector<std::string>> out;
  applied = 0;
  caught_up = true;
  for (Node* n : nodes) {
    json listed = n->overview()["projections"];
    for (const auto& p : listed) {
      out[p["key"].get<std::string>()].push_back(n->config().id);
      applied += p["events_applied"].get<std::uint64_t>();
      caught_up = caught_up && p["caught_up"].get<bool>();
    }
  }
  return out;
}

TEST(ProjectionSlicesCluster, EverySliceHasOneOwnerAndMovesOnADrainWithoutAnEventAppliedTwice) {
  troupe::test::RedisTestServer redis;
  troupe::test::TempDir dir;
  auto journal = std::make_shared<troupe::MemoryJournal>();
  auto model = SqliteReadModel::open({.path = dir.file("read.db")}).value();
  for (int i = 0; i < 40; ++i) append_tagged(*journal, "acct|" + std::to_string(i), 1, 2, "s" + std::to_string(i % 4));
  auto n1 = cluster_node("p1", dir.path(), redis.port());
  auto n2 = cluster_node("p2", dir.path(), redis.port());
  ASSERT_TRUE(n1 && n2);
  ASSERT_TRUE(n1->serve_projection(rows_slices(n1.get(), journal, model)).ok());
  ASSERT_TRUE(n2->serve_projection(rows_slices(n2.get(), journal, model)).ok());
  n1->mark_ready();
  n2->mark_ready();

  std::uint64_t applied = 0;
  bool caught_up = false;
  auto placed = [&](const std::vector<Node*>& nodes, std::uint64_t events) {
    auto o = owners(nodes, applied, caught_up);
    if (o.size() != 4 || !caught_up || count_rows(*model) != static_cast<std::int64_t>(events)) return false;
    for (const auto& [key, on] : o)
      if (on.size() != 1) return false;
    return true;
  };
  for (int i = 0; i < 1000 && !placed({n1.get(), n2.get()}, 80); ++i) std::this_thread::sleep_for(20ms);
  auto o = owners({n1.get(), n2.get()}, applied, caught_up);
  ASSERT_TRUE(placed({n1.get(), n2.get()}, 80)) << "rows " << count_rows(*model) << ", " << json(o).dump();
  // A rebalance spreads them: each node runs two.
  {
    troupe::http::ClientSettings cs;
    cs.port = n2->admin_port();
    auto c = troupe::http::Client::create(cs).value();
    troupe::http::ClientRequest req;
    req.method = "POST";
    req.target = "/rebalance";
    auto r = c->request_sync(std::move(req));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->status, 200) << r->body;
  }
  auto split = [&] {
    return n1->overview()["projections"].size() == 2 && n2->overview()["projections"].size() == 2;
  };
  for (int i = 0; i < 500 && !split(); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(split()) << json(owners({n1.get(), n2.get()}, applied, caught_up)).dump();

  // n1 drains: its slices move to n2, which goes on from their offsets.
  ASSERT_TRUE(n1->drain().ok());
  n1.reset();
  for (int i = 40; i < 60; ++i) append_tagged(*journal, "acct|" + std::to_string(i), 1, 2, "s" + std::to_string(i % 4));
  for (int i = 0; i < 1000 && !placed({n2.get()}, 120); ++i) std::this_thread::sleep_for(20ms);
  o = owners({n2.get()}, applied, caught_up);
  ASSERT_TRUE(placed({n2.get()}, 120)) << "rows " << count_rows(*model) << ", " << json(o).dump();
  // Every event once: the rows' primary key (id, seq) would refuse a
  // second application, and the count says none is missing.
  EXPECT_EQ(count_rows(*model), 120);
  json listed = n2->overview()["projections"];
  for (const auto& p : listed) EXPECT_EQ(p["state"], "running") << p.dump();
}

}  // namespace
