// troupe::node::Node on one machine: brought up from a config, its admin
// API answered over real HTTP, bad configs refused naming the setting.
// Malformed admin requests get a 4xx with a reason; bad configs exit with a
// message that names the setting.

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "../cluster/redis/redis_test_server.hpp"
#include "../cluster/tcp/tls_test_support.hpp"
#include "../persist/postgres/postgres_test_server.hpp"
#include "tally_test_entity.hpp"
#include "troupe/node/node.hpp"
#include "troupe/patterns/keyed_lock.hpp"
#include "troupe/patterns/process_manager.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using troupe::node::Node;
using troupe::node::NodeConfig;
using namespace troupe::node::test;

// Waits (up to 10 s) for `done`; true if it came.
template <class F>
bool eventually(F&& done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

// A job service whose one worker kind "send" succeeds at once with
// "sent <payload>".
troupe::JobTranslator send_translator() {
  return [](const troupe::Job& j) { return troupe::JobWorkerCall{"send", j.payload}; };
}
troupe::JobWorkers send_workers() {
  return {{"send", [](troupe::JobRun run) { run.succeed("sent " + run.detail()); }}};
}

// promtool (Debian's prometheus package), when installed, accepts `body`.
void expect_promtool_accepts(const std::string& body, const std::filesystem::path& dir) {
  if (::access("/usr/bin/promtool", X_OK) != 0) return;
  auto file = dir / "metrics.txt";
  std::ofstream(file) << body;
  std::string cmd = "/usr/bin/promtool check metrics < " + file.string() + " >/dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << body;
}

// A process that completes at once with twice its argument.
struct DoublerMsg {};
struct Doubler : troupe::Actor<DoublerMsg> {
  using result_type = int;
  Doubler(troupe::ProcessHandle<int> h, int v) : handle(std::move(h)), value(v) {}
  void on_start() { handle.complete(2 * value); }
  void receive(DoublerMsg&) {}
  troupe::ProcessHandle<int> handle;
  int value;
};

// --- fixture -----------------------------------------------------------------------

class NodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("troupe-node-test-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override {
    client_.reset();
    node_.reset();
    std::filesystem::remove_all(dir_);
  }

  // `extra`: TOML appended after the fixed tables; `node_extra`: settings
  // added to [node].
  void start(const std::string& extra = "", const std::string& node_extra = "") {
    std::string text = "[node]\nid = \"n1\"\ndata_dir = \"" + dir_.string() +
                       "\"\nthreads = 2\n" + node_extra + "[admin]\nport = 0\n[journal]\nbackend = \"sqlite\"\n"
                       // A held tally would keep a graceful stop waiting for its episode (E6).
                       "[entities]\nstop_timeout_ms = 300\n" + extra;
    auto cfg = NodeConfig::parse(text, "test.toml");
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto n = Node::start(std::move(*cfg));
    ASSERT_TRUE(n.ok()) << n.error().to_string();
    node_ = std::move(*n);
    troupe::node::EntityTypeOptions<Tally> opts;
    opts.type = "tally";
    opts.events = tally_codecs();
    auto t = node_->serve_entities<Tally>(std::move(opts), [this](const std::string& id, auto done) {
      auto f = tallies_->ask<std::int64_t>(id, [](troupe::ReplyTo<std::int64_t> r) { return Get{std::move(r)}; }, 5s);
      std::move(f).then([done = std::move(done)](troupe::Result<std::int64_t> r) {
        if (!r.ok()) return done(std::move(r).error());
        done(json{{"total", *r}});
      });
    });
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    tallies_.emplace(std::move(*t));
    troupe::http::ClientSettings cs;
    cs.port = node_->admin_port();
    auto c = troupe::http::Client::create(cs);
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
  }

  troupe::http::Response call(std::string method, std::string target, std::string body = "") {
    troupe::http::ClientRequest r;
    r.method = std::move(method);
    r.target = std::move(target);
    r.body = std::move(body);
    auto resp = client_->request_sync(std::move(r));
    EXPECT_TRUE(resp.ok()) << resp.error().to_string();
    return resp.ok() ? *resp : troupe::http::Response{};
  }
  json call_json(std::string method, std::string target, int expect_status) {
    auto r = call(std::move(method), std::move(target));
    EXPECT_EQ(r.status, expect_status) << r.body;
    return json::parse(r.body, nullptr, false);
  }

  std::filesystem::path dir_;
  std::unique_ptr<Node> node_;
  std::optional<troupe::node::Entities<Tally>> tallies_;
  std::unique_ptr<troupe::http::Client> client_;
};

TEST_F(NodeTest, HealthAnswersAtOnceAndReadyOnlyOnceTheApplicationSaysSo) {
  start();
  auto health = call_json("GET", "/health", 200);
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["node"], "n1");
  EXPECT_EQ(health["services"], json::object()) << "nothing is watched yet";
  auto not_yet = call_json("GET", "/ready", 503);
  EXPECT_EQ(not_yet["ready"], false);
  EXPECT_EQ(not_yet["checks"]["started"], "starting");
  node_->mark_ready();
  EXPECT_EQ(call_json("GET", "/ready", 200)["ready"], true);
}

TEST_F(NodeTest, TheOverviewAndMetricsShowEntitiesTheJournalAndProcessingEntities) {
  start();
  node_->mark_ready();
  for (int i = 0; i < 10; ++i) {
    auto r = tallies_->ask<std::int64_t>("t" + std::to_string(i),
                                          [](troupe::ReplyTo<std::int64_t> rt) { return Add{5, std::move(rt)}; }, 5s)
                 .get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  auto held = tallies_->ask<std::int64_t>("t3", [](troupe::ReplyTo<std::int64_t> rt) { return Hold{std::move(rt)}; }, 5s)
                  .get();
  ASSERT_TRUE(held.ok());

  auto o = call_json("GET", "/api/overview", 200);
  EXPECT_EQ(o["node"], "n1");
  EXPECT_EQ(o["mode"], "single");
  ASSERT_EQ(o["members"].size(), 1u);
  EXPECT_EQ(o["members"][0]["self"], true);
  ASSERT_EQ(o["entity_types"].size(), 1u);
  EXPECT_EQ(o["entity_types"][0]["type"], "tally");
  EXPECT_EQ(o["entity_types"][0]["active"], 10);
  EXPECT_EQ(o["entity_types"][0]["events_persisted"], 11);
  ASSERT_EQ(o["processing"].size(), 1u);
  EXPECT_EQ(o["processing"][0]["id"], "t3");
  EXPECT_EQ(o["processing"][0]["deadline_ms"].get<std::int64_t>() - o["processing"][0]["since_ms"].get<std::int64_t>(),
            3'600'000);
  EXPECT_TRUE(o["series"]["rates"].is_object());

  auto m = call("GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_EQ(m.content_type.rfind("text/plain; version=0.0.4", 0), 0u) << m.content_type;
  EXPECT_NE(m.body.find("troupe_entities_active{node=\"n1\",type=\"tally\"} 10\n"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("troupe_entities_processing{node=\"n1\",type=\"tally\"} 1\n"), std::string::npos);
  EXPECT_NE(m.body.find("troupe_journal_append_seconds_count 11\n"), std::string::npos);
  EXPECT_NE(m.body.find("troupe_mailbox_depth{node=\"n1\"}"), std::string::npos);

  expect_promtool_accepts(m.body, dir_);
}

// Every family SPEC X2 names is in /metrics with the value the component
// counts: mailboxes, entities, the journal, a keyed lock, a process
// manager, a job service and the cluster view.
// proves: X2
TEST_F(NodeTest, MetricsCountMailboxesEntitiesTheJournalLocksProcessesJobsAndTheCluster) {
  start();
  auto& system = node_->system();
  for (int i = 0; i < 3; ++i) {
    auto r = tallies_->ask<std::int64_t>("m" + std::to_string(i),
                                          [](troupe::ReplyTo<std::int64_t> rt) { return Add{1, std::move(rt)}; }, 5s)
                 .get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  // A lock: two grants, one waiter that gives up.
  troupe::KeyedLockSettings ls;
  ls.name = "accounts";
  ls.wait_timeout = 50ms;
  auto lock = troupe::KeyedLock::start(system, ls);
  ASSERT_TRUE(lock.ok()) << lock.error().to_string();
  auto release = std::make_shared<troupe::Promise<int>>();
  auto held = lock->lock("k", [release](const troupe::LockLease&) { return release->future(); });
  auto waiter = lock->lock("k", [](const troupe::LockLease&) { return 2; }).get();
  ASSERT_FALSE(waiter.ok());
  EXPECT_EQ(waiter.error().code(), troupe::ErrorCode::acquire_timeout);
  release->set_value(1);
  ASSERT_TRUE(std::move(held).get().ok());
  ASSERT_TRUE(lock->lock("k", [](const troupe::LockLease&) { return 3; }).get().ok());
  node_->watch_lock("accounts", *lock);
  // A process manager: three processes completed.
  auto pm = troupe::ProcessManager<Doubler>::start(system, {.name = "doublers", .max_running = 2});
  ASSERT_TRUE(pm.ok()) << pm.error().to_string();
  for (int i = 1; i <= 3; ++i) {
    auto r = pm->submit(i).get();
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(*r, 2 * i);
  }
  node_->watch_process_manager("doublers", [pm = *pm] { return pm.stats(); });
  // A durable job service: one job succeeded.
  troupe::JobSettings js;
  js.name = "mail";
  js.workers = 1;
  auto jobs = node_->start_jobs(js, send_translator(), send_workers());
  ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
  ASSERT_TRUE(jobs->enqueue(troupe::Job{"mail", "hello"}).get().ok());
  ASSERT_TRUE(eventually([&] { return jobs->stats().succeeded == 1; }));

  auto m = call("GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  for (const char* line : {
           "troupe_mailbox_depth{node=\"n1\"}",
           "troupe_entities_active{node=\"n1\",type=\"tally\"} 3\n",
           "troupe_journal_appends_total{node=\"n1\",backend=\"sqlite\"}",
           "troupe_lock_grants_total{node=\"n1\",lock=\"accounts\"} 2\n",
           "troupe_lock_acquire_timeouts_total{node=\"n1\",lock=\"accounts\"} 1\n",
           "troupe_process_completed_total{node=\"n1\",manager=\"doublers\"} 3\n",
           "troupe_process_running{node=\"n1\",manager=\"doublers\"} 0\n",
           "troupe_jobs_outcomes_total{node=\"n1\",service=\"mail\",outcome=\"succeeded\"} 1\n",
           "troupe_cluster_members{node=\"n1\"} 1\n",
       })
    EXPECT_NE(m.body.find(line), std::string::npos) << "missing: " << line << "\n" << m.body;
  expect_promtool_accepts(m.body, dir_);
}

// proves: A1
TEST_F(NodeTest, TheOutboxRunsTheSideEffectsStoredInTheNodesJournalAndShowsInMetrics) {
  start();
  std::atomic<int> sent{0};
  troupe::OutboxSettings os;
  os.poll_interval = 20ms;
  os.count_interval = 20ms;
  auto outbox = node_->start_outbox({{"mail", [&sent](const troupe::OutboxEntry&) {
                                       ++sent;
                                       troupe::Promise<void> p;
                                       p.set_value();
                                       return p.future();
                                     }}},
                                    os);
  ASSERT_TRUE(outbox.ok()) << outbox.error().to_string();
  EXPECT_EQ(outbox->settings().owner, "n1");  // the node's id
  troupe::AppendBatch b;
  b.persistence_id = "mailer|m1";
  b.events.push_back(troupe::EventRecord{1, 1, "Mailed", 1, "x"});
  b.outbox.push_back(troupe::OutboxRecord{"mailer|m1/1/0", "mail", "hello"});
  ASSERT_TRUE(troupe::journal_sync::append(*node_->journal(), std::move(b)).ok());
  ASSERT_TRUE(eventually([&] { return outbox->stats().sent == 1 && outbox->stats().pending == 0u; }));
  EXPECT_EQ(sent.load(), 1);
  auto again = node_->start_outbox({{"mail", [](const troupe::OutboxEntry&) { return troupe::Promise<void>().future(); }}});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), troupe::ErrorCode::invalid_argument);
  auto m = call("GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  for (const char* line : {"troupe_outbox_sent_total{node=\"n1\"} 1\n", "troupe_outbox_pending{node=\"n1\"} 0\n",
                           "troupe_outbox_failed{node=\"n1\"} 0\n", "troupe_outbox_retries_total{node=\"n1\"} 0\n",
                           "troupe_outbox_failures_total{node=\"n1\"} 0\n"})
    EXPECT_NE(m.body.find(line), std::string::npos) << "missing: " << line << "\n" << m.body;
  expect_promtool_accepts(m.body, dir_);
}

// Issue 22: a durable job service stopped by a journal conflict used to
// leave the node healthy and its queue looking idle. Two services of one
// name on one journal: B writes the log first, so A's first append meets a
// journal_conflict and A stops for good.
TEST_F(NodeTest, AJobServiceStoppedByAJournalConflictMakesHealth503AndShowsInMetricsAndTheOverview) {
  start();
  auto journal = std::make_shared<troupe::MemoryJournal>();
  troupe::JobSettings js;
  js.name = "refunds";
  js.workers = 1;
  js.journal = journal;
  js.log = false;
  auto a = troupe::JobService::start(node_->system(), js, send_translator(), send_workers());
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  auto b = troupe::JobService::start(node_->system(), js, send_translator(), send_workers());
  ASSERT_TRUE(b.ok()) << b.error().to_string();
  auto accepted = b->enqueue(troupe::Job{"refund", "r1"}).get();
  ASSERT_TRUE(accepted.ok()) << accepted.error().to_string();
  auto refused = a->enqueue(troupe::Job{"refund", "r2"}).get();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), troupe::ErrorCode::journal_conflict) << refused.error().to_string();
  ASSERT_TRUE(eventually([&] { return !a->health().ok(); }));
  EXPECT_EQ(a->health().error().code(), troupe::ErrorCode::journal_conflict);
  node_->watch_jobs("refunds", *a);

  auto health = call_json("GET", "/health", 503);
  EXPECT_EQ(health["status"], "unhealthy");
  EXPECT_EQ(health["node"], "n1");
  ASSERT_TRUE(health["services"].contains("jobs/refunds")) << health.dump();
  const auto& refunds = health["services"]["jobs/refunds"];
  EXPECT_EQ(refunds["up"], false);
  EXPECT_EQ(refunds["code"], "journal_conflict");
  EXPECT_EQ(refunds["message"], a->health().error().message());
  EXPECT_NE(refunds["message"].get<std::string>().find("another writer"), std::string::npos) << refunds.dump();

  auto m = call("GET", "/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("troupe_service_up{node=\"n1\",service=\"jobs/refunds\"} 0\n"), std::string::npos) << m.body;
  expect_promtool_accepts(m.body, dir_);

  auto o = call_json("GET", "/api/overview", 200);
  EXPECT_EQ(o["health"]["status"], "unhealthy") << o["health"].dump();
  EXPECT_EQ(o["health"]["services"]["jobs/refunds"], refunds);
  // Still serving: the other endpoints answer as before.
  EXPECT_EQ(o["node"], "n1");
  node_->mark_ready();
  EXPECT_EQ(call_json("GET", "/ready", 200)["ready"], true);
}

TEST_F(NodeTest, StartJobsOnASingleNodeGivesADurableServiceOnTheNodesJournalThatRunsJobsAndShowsAsUp) {
  start();
  auto outputs = std::make_shared<std::atomic<int>>(0);
  troupe::JobSettings js;
  js.name = "mail";
  js.workers = 2;
  js.on_outcome = [outputs](troupe::JobId, const troupe::Job&, const troupe::JobOutcome& out) {
    if (auto* ok = std::get_if<troupe::JobSucceeded>(&out); ok && ok->output == "sent hello") outputs->fetch_add(1);
  };
  auto jobs = node_->start_jobs(js, send_translator(), send_workers());
  ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
  EXPECT_EQ(jobs->settings().journal, node_->journal());
  auto id = jobs->enqueue(troupe::Job{"mail", "hello"}).get();
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  ASSERT_TRUE(eventually([&] { return outputs->load() == 1; }));
  EXPECT_EQ(jobs->stats().succeeded, 1u);
  EXPECT_TRUE(jobs->health().ok());

  auto health = call_json("GET", "/health", 200);
  EXPECT_EQ(health["status"], "ok");
  EXPECT_EQ(health["services"], json({{"jobs/mail", {{"up", true}}}}));
  auto m = call("GET", "/metrics");
  EXPECT_NE(m.body.find("troupe_service_up{node=\"n1\",service=\"jobs/mail\"} 1\n"), std::string::npos) << m.body;
  EXPECT_NE(m.body.find("troupe_jobs_outcomes_total{node=\"n1\",service=\"mail\",outcome=\"succeeded\"} 1\n"),
            std::string::npos);
  expect_promtool_accepts(m.body, dir_);
  auto o = call_json("GET", "/api/overview", 200);
  EXPECT_EQ(o["health"]["status"], "ok");
  EXPECT_EQ(o["health"]["services"]["jobs/mail"]["up"], true);
  EXPECT_EQ(o["patterns"]["jobs"]["succeeded"], 1);
}

TEST_F(NodeTest, StartJobsRefusesAJournalOtherThanTheNodesAndBadSettings) {
  start();
  troupe::JobSettings js;
  js.name = "mail";
  js.journal = std::make_shared<troupe::MemoryJournal>();
  auto other = node_->start_jobs(js, send_translator(), send_workers());
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().code(), troupe::ErrorCode::invalid_argument);
  EXPECT_NE(other.error().message().find("settings.journal"), std::string::npos) << other.error().message();
  js.name = "";
  js.journal = nullptr;
  auto unnamed = node_->start_jobs(js, send_translator(), send_workers());
  ASSERT_FALSE(unnamed.ok());
  EXPECT_EQ(unnamed.error().code(), troupe::ErrorCode::invalid_argument);
  // Neither is watched; the node's own journal is accepted.
  EXPECT_EQ(call_json("GET", "/health", 200)["services"], json::object());
  js.name = "mail";
  js.journal = node_->journal();
  EXPECT_TRUE(node_->start_jobs(js, send_translator(), send_workers()).ok());
}

TEST_F(NodeTest, AnyWatchedCheckTurnsHealthTo503WhileItFailsAndAThrowingCheckCountsAsFailing) {
  start();
  auto failing = std::make_shared<std::atomic<bool>>(false);
  node_->watch_health("gateway", [failing]() -> troupe::Result<void> {
    if (failing->load()) return troupe::Error(troupe::ErrorCode::unreachable, "the settlement gateway does not answer");
    return {};
  });
  EXPECT_EQ(call_json("GET", "/health", 200)["services"]["gateway"]["up"], true);
  failing->store(true);
  auto down = call_json("GET", "/health", 503);
  EXPECT_EQ(down["services"]["gateway"],
            json({{"up", false}, {"code", "unreachable"}, {"message", "the settlement gateway does not answer"}}));
  EXPECT_NE(call("GET", "/metrics").body.find("troupe_service_up{node=\"n1\",service=\"gateway\"} 0\n"),
            std::string::npos);
  failing->store(false);
  EXPECT_EQ(call_json("GET", "/health", 200)["status"], "ok");

  node_->watch_health("broken", []() -> troupe::Result<void> { throw std::runtime_error("boom"); });
  auto thrown = call_json("GET", "/health", 503);
  EXPECT_EQ(thrown["services"]["broken"]["code"], "handler_failed");
  EXPECT_NE(thrown["services"]["broken"]["message"].get<std::string>().find("boom"), std::string::npos);
  EXPECT_EQ(thrown["services"]["gateway"]["up"], true);
  // Watching a name again replaces its check.
  node_->watch_health("broken", [] { return troupe::Result<void>{}; });
  EXPECT_EQ(call_json("GET", "/health", 200)["services"].size(), 2u);
}

TEST_F(NodeTest, AnEntityPageShowsItsStateAndItsProcessingDeadline) {
  start();
  ASSERT_TRUE(tallies_->ask<std::int64_t>("a b/c", [](troupe::ReplyTo<std::int64_t> rt) { return Add{7, std::move(rt)}; }, 5s)
                  .get()
                  .ok());
  auto e = call_json("GET", "/entities/tally/a%20b%2Fc", 200);
  EXPECT_EQ(e["id"], "a b/c");
  EXPECT_EQ(e["state"]["total"], 7);
  EXPECT_TRUE(e["processing"].is_null());
  ASSERT_TRUE(tallies_->ask<std::int64_t>("a b/c", [](troupe::ReplyTo<std::int64_t> rt) { return Hold{std::move(rt)}; }, 5s)
                  .get()
                  .ok());
  auto h = call_json("GET", "/entities/tally/a%20b%2Fc", 200);
  EXPECT_TRUE(h["processing"].is_object());
  EXPECT_GE(h["processing"]["age_ms"].get<std::int64_t>(), 0);
}

// proves: X1
TEST_F(NodeTest, MalformedAndMisdirectedAdminRequestsGetA4xxWithAReason) {
  start();
  auto unknown_type = call_json("GET", "/entities/nope/x", 404);
  EXPECT_EQ(unknown_type["error"]["message"], "no entity type 'nope' on this node");
  auto alone = call_json("POST", "/rebalance", 409);
  EXPECT_EQ(alone["error"]["code"], "not_clustered");
  EXPECT_EQ(call("GET", "/rebalance").status, 405);
  EXPECT_EQ(call("POST", "/metrics").status, 405);
  EXPECT_EQ(call("GET", "/no/such/thing").status, 404);
  EXPECT_EQ(call("GET", "/entities/tally").status, 404);
  // The node still answers.
  EXPECT_EQ(call("GET", "/health").status, 200);
}

TEST_F(NodeTest, TheDashboardIsServedFromTheBinary) {
  start();
  auto page = call("GET", "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type.rfind("text/html", 0), 0u);
  EXPECT_NE(page.body.find("app.js"), std::string::npos);
  EXPECT_EQ(call("GET", "/app.js").status, 200);
  EXPECT_EQ(call("GET", "/style.css").status, 200);
  // app.js is a module: every script it imports (and they import) is served too.
  std::vector<std::string> scripts{"app.js"};
  for (std::size_t i = 0; i < scripts.size(); ++i) {
    auto js = call("GET", "/" + scripts[i]);
    ASSERT_EQ(js.status, 200) << scripts[i];
    EXPECT_EQ(js.content_type.rfind("text/javascript", 0), 0u) << scripts[i];
    for (std::size_t at = js.body.find("from \"./"); at != std::string::npos; at = js.body.find("from \"./", at + 1)) {
      auto start = at + 8;
      auto name = js.body.substr(start, js.body.find('"', start) - start);
      if (std::find(scripts.begin(), scripts.end(), name) == scripts.end()) scripts.push_back(name);
    }
  }
  EXPECT_GE(scripts.size(), 2u) << "app.js imports its parts";
}

TEST_F(NodeTest, DrainTurnsReadyOffAndStopsTheEntityTypes) {
  start();
  node_->mark_ready();
  auto d = call_json("POST", "/drain", 202);
  EXPECT_EQ(d["draining"], true);
  EXPECT_EQ(call_json("GET", "/ready", 503)["ready"], false);
  ASSERT_TRUE(node_->drain().ok());
  auto after = tallies_->ask<std::int64_t>("x", [](troupe::ReplyTo<std::int64_t> rt) { return Get{std::move(rt)}; }, 5s).get();
  EXPECT_FALSE(after.ok());
}

TEST_F(NodeTest, AnOperatorsDrainTurnsReadyOffAtOnceAndServesThroughTheGraceBeforeHandingOff) {
  start("", "drain_grace_ms = 1500\n");
  node_->mark_ready();
  std::thread operator_wait([this] { node_->wait_for_stop_signal(); });
  const auto asked = std::chrono::steady_clock::now();
  call_json("POST", "/drain", 202);
  EXPECT_EQ(call_json("GET", "/ready", 503)["ready"], false) << "balancers are told at once";
  // Both the admin API and the entity types still serve during the grace.
  EXPECT_EQ(call("GET", "/health").status, 200);
  auto during = tallies_->ask<std::int64_t>("x", [](troupe::ReplyTo<std::int64_t> rt) { return Get{std::move(rt)}; }, 5s).get();
  EXPECT_TRUE(during.ok()) << during.error().to_string();
  const bool checked_within_grace = std::chrono::steady_clock::now() - asked < 1200ms;
  operator_wait.join();
  EXPECT_TRUE(checked_within_grace) << "the checks above must run inside the grace to mean anything";
  EXPECT_GE(std::chrono::steady_clock::now() - asked, 1500ms) << "nothing is handed off before the grace ends";
  auto after = tallies_->ask<std::int64_t>("x", [](troupe::ReplyTo<std::int64_t> rt) { return Get{std::move(rt)}; }, 5s).get();
  EXPECT_FALSE(after.ok()) << "then the drain stops the entity types";
}

TEST(NodeConfigDrain, TheGraceIsReadInMillisecondsAndBounded) {
  auto dflt = NodeConfig::parse("", "a.toml");
  ASSERT_TRUE(dflt.ok());
  EXPECT_EQ(dflt->drain_grace, std::chrono::milliseconds(3000));
  auto zero = NodeConfig::parse("[node]\ndrain_grace_ms = 0\n", "a.toml");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->drain_grace, std::chrono::milliseconds(0));
  auto negative = NodeConfig::parse("[node]\ndrain_grace_ms = -1\n", "a.toml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.error().message().find("node.drain_grace_ms"), std::string::npos) << negative.error().message();
  EXPECT_FALSE(NodeConfig::parse("[node]\ndrain_grace_ms = 600001\n", "a.toml").ok());
}

TEST(NodeStart, AnUnreachablePostgresIsNamedBySetting) {
  auto cfg = NodeConfig::parse(
      "[admin]\nport = 0\n[journal]\nbackend = \"postgres\"\npostgres = \"host=127.0.0.1 port=1 connect_timeout=2\"\n",
      "bad.toml");
  ASSERT_TRUE(cfg.ok());
  auto n = Node::start(std::move(*cfg));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().message().rfind("journal.postgres: ", 0), 0u) << n.error().message();
}

TEST(NodeStart, AnUnreachableRedisIsNamedBySetting) {
  auto dir = std::filesystem::temp_directory_path() / ("troupe-node-redis-" + std::to_string(::getpid()));
  auto cfg = NodeConfig::parse("[node]\ndata_dir = \"" + dir.string() +
                                   "\"\n[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n[cluster]\nredis = "
                                   "\"127.0.0.1:1\"\nlisten_port = 0\ninsecure = true\nheartbeat_ms = 100\nliveness_threshold_ms = 300\n"
                                   "takeover_margin_ms = 100\n",
                               "bad.toml");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  auto n = Node::start(std::move(*cfg));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.error().message().rfind("cluster.redis (127.0.0.1:1): ", 0), 0u) << n.error().message();
  std::filesystem::remove_all(dir);
}

TEST(NodeStart, AnAdminPortInUseIsNamedBySetting) {
  auto first = Node::start(*NodeConfig::parse("[admin]\nport = 0\n[journal]\nbackend = \"memory\"\n", "a.toml"));
  ASSERT_TRUE(first.ok());
  auto port = (*first)->admin_port();
  auto second = Node::start(
      *NodeConfig::parse("[admin]\nport = " + std::to_string(port) + "\n[journal]\nbackend = \"memory\"\n", "b.toml"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().message().rfind("admin.port: ", 0), 0u) << second.error().message();
}

// The config of cluster node `id` under `dir`: Redis at `redis_port`, one
// PostgreSQL schema as the journal every node shares, fast liveness.
// `security`: the cluster port's TLS lines, or plain TCP.
NodeConfig cluster_node_config(const std::string& id, const std::filesystem::path& dir, std::uint16_t redis_port,
                               const std::string& schema, const std::string& extra = "",
                               const std::string& security = "insecure = true\n") {
  auto c = NodeConfig::parse("[node]\nid = \"" + id + "\"\ndata_dir = \"" + (dir / id).string() +
                                 "\"\nthreads = 2\n[admin]\nport = 0\n"
                                 // One journal for all: the cluster shares PostgreSQL.
                                 "[journal]\nbackend = \"postgres\"\npostgres = \"" +
                                 troupe::test::shared_postgres_conninfo() + "\"\nschema = \"" + schema + "\"\n"
                                 "[cluster]\nredis = \"127.0.0.1:" + std::to_string(redis_port) +
                                 "\"\nlisten_port = 0\nheartbeat_ms = 200\nliveness_threshold_ms = 1000\n"
                                 "takeover_margin_ms = 200\n" + security +
                                 "[entities]\nshard_count = 16\nstop_timeout_ms = 500\n" + extra,
                             id + ".toml");
  EXPECT_TRUE(c.ok()) << c.error().to_string();
  return *c;
}

// What a cluster test's nodes share: a redis-server, a fresh PostgreSQL
// schema as their journal, and a scratch directory (removed at the end).
struct ClusterScratch {
  explicit ClusterScratch(const std::string& name)
      : schema(troupe::test::fresh_schema()),
        dir(std::filesystem::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~ClusterScratch() { std::filesystem::remove_all(dir); }
  NodeConfig config(const std::string& id, const std::string& extra = "", const std::string& security = "insecure = true\n") {
    return cluster_node_config(id, dir, redis.port(), schema, extra, security);
  }

  troupe::test::RedisTestServer redis;
  std::string schema;
  std::filesystem::path dir;
};

// A GET or POST to a node's admin API: the status and the JSON body.
std::pair<int, json> admin_call(std::uint16_t port, std::string method, std::string target) {
  troupe::http::ClientSettings cs;
  cs.port = port;
  auto c = troupe::http::Client::create(cs);
  troupe::http::ClientRequest r;
  r.method = std::move(method);
  r.target = std::move(target);
  r.timeout = std::chrono::seconds(30);
  auto resp = (*c)->request_sync(std::move(r));
  EXPECT_TRUE(resp.ok());
  if (!resp.ok()) return {0, json()};
  return {resp->status, json::parse(resp->body, nullptr, false)};
}

// A node of the cluster serving the tally type, marked ready: the node and
// the type's handle.
auto start_tally_node(NodeConfig config) {
  auto n = Node::start(std::move(config));
  EXPECT_TRUE(n.ok()) << n.error().to_string();
  troupe::node::EntityTypeOptions<Tally> opts;
  opts.type = "tally";
  opts.events = tally_codecs();
  opts.commands = tally_commands();
  auto t = (*n)->serve_entities<Tally>(std::move(opts));
  EXPECT_TRUE(t.ok()) << t.error().to_string();
  (*n)->mark_ready();
  return std::pair{std::move(*n), std::move(*t)};
}

// Two nodes over a real redis-server: the admin API of either shows the
// cluster, the other member's load, a rebalance that moves shards, and a
// drain that hands its shards over.
// Two nodes over mutual TLS ([cluster.tls]): commands cross from one to
// the other; a stranger speaking plain TCP to the cluster port is refused
// and counted in /metrics; a reload keeps the connection up.
TEST(NodeCluster, TwoNodesOverMutualTlsServeEachOtherAndCountRefusedPeersInMetrics) {
  ClusterScratch scratch("troupe-node-tls");
  troupe::cluster::testing::TestPki pki;
  pki.ca("ca");
  auto tls = [&](const std::string& id) {
    const auto f = pki.node("ca", id);
    return "[cluster.tls]\ncert = \"" + f.cert_file + "\"\nkey = \"" + f.key_file + "\"\nca = \"" + f.ca_file + "\"\n";
  };
  auto [n1, t1] = start_tally_node(scratch.config("t1", "", tls("t1")));
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(t1.ask<std::int64_t>("k" + std::to_string(i), [](troupe::ReplyTo<std::int64_t> r) { return Add{1, std::move(r)}; }, 10s)
                    .get()
                    .ok());
  auto [n2, t2] = start_tally_node(scratch.config("t2", "", tls("t2")));
  // t1 owns every shard: t2's asks cross to it over TLS.
  for (int i = 0; i < 20; ++i) {
    auto v = t2.ask<std::int64_t>("k" + std::to_string(i), [](troupe::ReplyTo<std::int64_t> r) { return Get{std::move(r)}; }, 20s).get();
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(*v, 1);
  }
  auto& transport = n1->cluster()->remoting().transport();
  EXPECT_TRUE(transport.connected("t2"));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(transport.port());
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  std::string hello;
  troupe::cluster::append_data_frame(hello, 1, "plain bytes");
  ASSERT_GT(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL), 0);
  for (int i = 0; i < 200 && transport.stats().refused_peers.tls_handshake == 0; ++i) std::this_thread::sleep_for(50ms);
  ::close(fd);
  troupe::http::ClientSettings cs;
  cs.port = n1->admin_port();
  auto c = troupe::http::Client::create(cs);
  troupe::http::ClientRequest r;
  r.target = "/metrics";
  auto m = (*c)->request_sync(std::move(r));
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("troupe_cluster_peers_refused_total{node=\"t1\",reason=\"tls_handshake\"} 1\n"), std::string::npos)
      << m->body;
  EXPECT_NE(m->body.find("troupe_cluster_peers_refused_total{node=\"t1\",reason=\"name_mismatch\"} 0\n"), std::string::npos);
  ASSERT_TRUE(n1->reload_tls().ok());
  EXPECT_EQ(transport.stats().tls_reloads, 1u);
  EXPECT_TRUE(transport.connected("t2"));
  EXPECT_EQ(transport.stats().handshakes, 1u);
}

TEST(NodeCluster, TwoNodesShowEachOtherRebalanceAndDrainOverTheAdminApi) {
  ClusterScratch scratch("troupe-node-cluster");
  auto start = [&](const std::string& id) { return start_tally_node(scratch.config(id)); };
  auto [n1, t1] = start("a1");
  auto get = admin_call;
  // Alone, a1 holds every shard once something asks for them.
  for (int i = 0; i < 40; ++i)
    ASSERT_TRUE(t1.ask<std::int64_t>("k" + std::to_string(i), [](troupe::ReplyTo<std::int64_t> r) { return Add{1, std::move(r)}; }, 10s)
                    .get()
                    .ok());
  auto [n2, t2] = start("a2");
  // Until the shard map and both members' load reports are in: a few seconds.
  json o;
  for (int i = 0; i < 100; ++i) {
    o = get(n1->admin_port(), "GET", "/api/overview").second;
    bool both = o["members"].size() == 2;
    for (const auto& m : o["members"]) both = both && !m["entities_active"].is_null();
    if (both && o["shards"].size() == 16u) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(o["mode"], "cluster");
  ASSERT_EQ(o["members"].size(), 2u) << o.dump();
  for (const auto& m : o["members"]) {
    EXPECT_TRUE(m["admin"].is_string()) << m.dump();
    EXPECT_FALSE(m["entities_active"].is_null()) << "every member's load is known: " << m.dump();
  }
  ASSERT_EQ(o["shards"].size(), 16u);

  auto [status, moved] = get(n2->admin_port(), "POST", "/rebalance");
  EXPECT_EQ(status, 200) << moved.dump();
  EXPECT_EQ(moved["moves"], 8) << "a2 takes half of a1's 16 shards: " << moved.dump();

  // Every tally still answers from whichever node, with its value.
  for (int i = 0; i < 40; ++i) {
    auto v = t2.ask<std::int64_t>("k" + std::to_string(i), [](troupe::ReplyTo<std::int64_t> r) { return Get{std::move(r)}; }, 10s).get();
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(*v, 1);
  }

  // Draining a2 hands its shards back to a1.
  auto [drain_status, drained] = get(n2->admin_port(), "POST", "/drain");
  EXPECT_EQ(drain_status, 202);
  ASSERT_TRUE(n2->drain().ok());
  for (int i = 0; i < 40; ++i) {
    auto v = t1.ask<std::int64_t>("k" + std::to_string(i), [](troupe::ReplyTo<std::int64_t> r) { return Get{std::move(r)}; }, 10s).get();
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(*v, 1);
  }
  n2.reset();
  n1.reset();
}

// An entity type that names a role is hosted only by nodes holding it: a
// node without the role owns none of its shards, even after a rebalance,
// and its asks are answered by the node that has it.
// proves: W8
TEST(NodeCluster, AnEntityTypeNamingARoleIsHostedOnlyByNodesHoldingIt) {
  ClusterScratch scratch("troupe-node-roles");
  auto start = [&](const std::string& id, std::vector<std::string> roles) {
    auto c = scratch.config(id);
    c.roles = std::move(roles);
    auto n = Node::start(std::move(c));
    EXPECT_TRUE(n.ok()) << n.error().to_string();
    troupe::node::EntityTypeOptions<Tally> opts;
    opts.type = "tally";
    opts.events = tally_codecs();
    opts.commands = tally_commands();
    opts.roles = {"ledger"};
    auto t = (*n)->serve_entities<Tally>(std::move(opts));
    EXPECT_TRUE(t.ok()) << t.error().to_string();
    (*n)->mark_ready();
    return std::pair{std::move(*n), std::move(*t)};
  };
  auto [n1, t1] = start("r1", {"ledger"});
  auto [n2, t2] = start("r2", {"web"});
  for (int i = 0; i < 40; ++i) {
    auto v = t2.ask<std::int64_t>("k" + std::to_string(i), [](troupe::ReplyTo<std::int64_t> r) { return Add{1, std::move(r)}; }, 10s).get();
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(*v, 1);
  }
  auto [status, moved] = admin_call(n2->admin_port(), "POST", "/rebalance");
  EXPECT_EQ(status, 200) << moved.dump();
  EXPECT_EQ(moved["moves"], 0) << "r2 may host no tally shard: " << moved.dump();
  json o;
  for (int i = 0; i < 100 && o["shards"].size() != 16u; ++i) {
    o = admin_call(n2->admin_port(), "GET", "/cluster").second;
    if (o["shards"].size() != 16u) std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(o["shards"].size(), 16u) << o.dump();
  for (const auto& sh : o["shards"]) EXPECT_EQ(sh["owner"], "r1") << sh.dump();
  n2.reset();
  n1.reset();
}

// During a rolling update (two app versions live) POST /rebalance moves
// nothing and says why, naming the versions; the shards stay where they are.
TEST(NodeCluster, RebalanceWhileTwoAppVersionsAreLiveAnswersThatItWaits) {
  ClusterScratch scratch("troupe-node-rebalance-versions");
  auto start = [&](const std::string& id, const std::string& version) {
    auto config = scratch.config(id);
    config.app_version = version;
    return start_tally_node(std::move(config));
  };
  auto [n1, t1] = start("v1", "1.9.0");
  for (int i = 0; i < 40; ++i)
    ASSERT_TRUE(t1.ask<std::int64_t>(
                      "k" + std::to_string(i),
                      [](troupe::ReplyTo<std::int64_t> r) {
                        return Add{1, std::move(r)};
                      },
                      10s)
                    .get()
                    .ok());
  auto [n2, t2] = start("v2", "1.10.0");
  auto [status, answer] = admin_call(n2->admin_port(), "POST", "/rebalance");
  EXPECT_EQ(status, 200) << answer.dump();
  EXPECT_EQ(answer["outcome"], "versions_mixed") << answer.dump();
  EXPECT_EQ(answer["versions"], json({"1.9.0", "1.10.0"})) << answer.dump();
  EXPECT_EQ(answer["moves"], 0) << answer.dump();
  EXPECT_EQ(answer["message"],
            "nothing moved: the live members run app versions 1.9.0 and 1.10.0; rebalancing waits until one "
            "version remains");
  // Every shard is still v1's (the map the node shows is refreshed in the
  // background: wait until it has all 16).
  json o;
  for (int i = 0; i < 100 && o["shards"].size() != 16u; ++i) {
    o = admin_call(n2->admin_port(), "GET", "/cluster").second;
    std::this_thread::sleep_for(100ms);
  }
  ASSERT_EQ(o["shards"].size(), 16u) << o.dump();
  for (const auto& s : o["shards"]) EXPECT_EQ(s["owner"], "v1") << s.dump();
  n2.reset();
  n1.reset();
}

// A node that takes POST /rebalance on while Redis holds writes back (CLIENT
// PAUSE): the request waits on Redis in the rebalance worker. Whichever of
// two concurrent requests the node takes first, the other is answered 409
// at once, and no thread is started for it.
struct HeldRebalance {
  explicit HeldRebalance(const std::string& name) : scratch(name), redis(scratch.redis.port()) {
    auto n = Node::start(scratch.config("r1"));
    EXPECT_TRUE(n.ok()) << n.error().to_string();
    if (!n.ok()) return;
    node = std::move(*n);
    // Something to rebalance: an entity type's shard group.
    troupe::node::EntityTypeOptions<Tally> opts;
    opts.type = "tally";
    opts.events = tally_codecs();
    opts.commands = tally_commands();
    auto t = node->serve_entities<Tally>(std::move(opts));
    EXPECT_TRUE(t.ok()) << t.error().to_string();
    if (t.ok()) tallies.emplace(std::move(*t));
  }
  // A test that stops half way still lets the node leave the cluster.
  ~HeldRebalance() {
    try {
      release();
    } catch (const std::exception&) {
      // Redis is gone: the node's stop finds out on its own.
    }
  }
  HeldRebalance(const HeldRebalance&) = delete;
  HeldRebalance& operator=(const HeldRebalance&) = delete;

  // Redis postpones every script (the rebalance is one) until release().
  void hold() { redis.cmd({"CLIENT", "PAUSE", "60000", "WRITE"}); }
  void release() { redis.cmd({"CLIENT", "UNPAUSE"}); }

  ClusterScratch scratch;
  troupe::test::RedisTestClient redis;
  std::unique_ptr<Node> node;
  std::optional<troupe::node::Entities<Tally>> tallies;  // goes before its node
};

TEST(NodeCluster, ASecondRebalanceWhileOneWaitsOnRedisGets409) {
  HeldRebalance h("troupe-node-rebalance-busy");
  ASSERT_TRUE(h.node);
  auto port = h.node->admin_port();
  h.hold();
  auto post = [port] { return admin_call(port, "POST", "/rebalance"); };
  auto a = std::async(std::launch::async, post);
  auto b = std::async(std::launch::async, post);
  // The one the node refused answers at once; the one it runs cannot
  // answer while Redis holds its script.
  std::future<std::pair<int, json>>* refused = nullptr;
  std::future<std::pair<int, json>>* running = nullptr;
  ASSERT_TRUE(eventually([&] {
    if (a.wait_for(0s) == std::future_status::ready) refused = &a, running = &b;
    if (b.wait_for(0s) == std::future_status::ready) refused = &b, running = &a;
    return refused != nullptr;
  }));
  EXPECT_EQ(running->wait_for(200ms), std::future_status::timeout) << "the running rebalance waits on Redis";
  auto [status, body] = refused->get();
  EXPECT_EQ(status, 409) << body.dump();
  EXPECT_EQ(body["error"]["code"], "rebalance_running") << body.dump();
  EXPECT_FALSE(body["error"]["message"].get<std::string>().empty());
  h.release();
  auto [done_status, done] = running->get();
  EXPECT_EQ(done_status, 200) << done.dump();
  EXPECT_EQ(done["moves"], 0) << "one member holds every shard already: " << done.dump();
}

TEST(NodeCluster, ARebalanceAfterTheLastOneAnsweredRunsAgain) {
  HeldRebalance h("troupe-node-rebalance-again");
  ASSERT_TRUE(h.node);
  auto port = h.node->admin_port();
  h.hold();
  auto first = std::async(std::launch::async, [port] { return admin_call(port, "POST", "/rebalance"); });
  EXPECT_EQ(first.wait_for(200ms), std::future_status::timeout) << "the rebalance waits on Redis";
  h.release();
  EXPECT_EQ(first.get().first, 200);
  for (int i = 0; i < 3; ++i) {
    auto [status, body] = admin_call(port, "POST", "/rebalance");
    EXPECT_EQ(status, 200) << "rebalance " << i + 2 << ": " << body.dump();
    EXPECT_EQ(body["moves"], 0) << body.dump();
  }
}

// Issue 22 in a cluster: start_jobs on every node of one shared journal
// gives one sharded queue, not one service per node fighting over one log.
// Jobs enqueued on either node run, both nodes stay healthy, and a drain
// hands the leaving node's queue shards to the other, which runs the jobs
// that come next.
TEST(NodeCluster, StartJobsOnEveryNodeOfASharedJournalShardsTheQueueAndEveryNodeStaysHealthy) {
  ClusterScratch scratch("troupe-node-cluster-jobs");
  auto done = std::make_shared<std::atomic<int>>(0);
  auto start = [&](const std::string& id) {
    auto n = Node::start(scratch.config(id, "[jobs]\nshard_count = 4\n"));
    EXPECT_TRUE(n.ok()) << n.error().to_string();
    troupe::JobSettings js;
    js.name = "refunds";
    js.workers = 2;
    js.on_outcome = [done](troupe::JobId, const troupe::Job&, const troupe::JobOutcome& out) {
      if (std::holds_alternative<troupe::JobSucceeded>(out)) done->fetch_add(1);
    };
    auto jobs = (*n)->start_jobs(js, send_translator(), send_workers());
    EXPECT_TRUE(jobs.ok()) << jobs.error().to_string();
    return std::pair{std::move(*n), std::optional<troupe::JobService>(std::move(*jobs))};
  };
  // Handles first, so they go before their nodes.
  std::optional<troupe::JobService> j1, j2;
  std::unique_ptr<Node> n1, n2;
  std::tie(n1, j1) = start("b1");
  std::tie(n2, j2) = start("b2");
  // b1 placed every queue shard on itself; b2 takes its share as it starts:
  // two shards of two workers each.
  ASSERT_TRUE(eventually([&] { return j1->stats().idle == 4 && j2->stats().idle == 4; }))
      << "b1 " << j1->stats().idle << " and b2 " << j2->stats().idle << " idle workers";
  for (int i = 0; i < 10; ++i) {
    for (auto* jobs : {&*j1, &*j2}) {
      auto id = jobs->enqueue(troupe::Job{"refund", "r" + std::to_string(i)}).get();
      ASSERT_TRUE(id.ok()) << id.error().to_string();
    }
  }
  // At least once: a job may run again after a move, never fewer times.
  ASSERT_TRUE(eventually([&] { return done->load() >= 20; })) << done->load() << " of 20 jobs ran";
  EXPECT_EQ(j1->stats().succeeded, 10u) << "each node runs what it enqueued, on its own shards";
  EXPECT_EQ(j2->stats().succeeded, 10u);
  for (auto* n : {n1.get(), n2.get()}) {
    auto [status, health] = admin_call(n->admin_port(), "GET", "/health");
    EXPECT_EQ(status, 200) << health.dump();
    EXPECT_EQ(health["services"]["jobs/refunds"]["up"], true) << health.dump();
    auto o = admin_call(n->admin_port(), "GET", "/api/overview").second;
    EXPECT_EQ(o["health"]["status"], "ok") << o["health"].dump();
  }

  // b1 leaves: its shards move to b2, which runs what is enqueued from now on.
  ASSERT_TRUE(n1->drain().ok());
  for (int i = 0; i < 4; ++i) {
    auto id = j2->enqueue(troupe::Job{"refund", "after-" + std::to_string(i)}).get();
    ASSERT_TRUE(id.ok()) << id.error().to_string();
  }
  ASSERT_TRUE(eventually([&] { return done->load() >= 24; })) << done->load() << " of 24 jobs ran";
  EXPECT_GE(j2->stats().succeeded, 14u) << "b2 ran them";
  EXPECT_EQ(j2->stats().idle, 8u) << "on the four shards, two of them taken over";
  EXPECT_TRUE(j2->health().ok()) << j2->health().error().to_string();
  EXPECT_EQ(admin_call(n2->admin_port(), "GET", "/health").first, 200);
  // The queue's shards are shard groups ("shards/jobs/refunds"), shown under
  // "shards"; the worker map has no worker group to show. The job service's
  // slots are job workers, all on this node.
  auto view = admin_call(n2->admin_port(), "GET", "/cluster").second;
  EXPECT_EQ(view["workers"], json::array()) << view.dump();
  ASSERT_EQ(view["job_workers"].size(), 8u) << view.dump();
  for (const auto& w : view["job_workers"]) {
    EXPECT_EQ(w["service"], "refunds");
    EXPECT_EQ(w["owner"], "b2");
  }
  j2.reset();
  n2.reset();
  j1.reset();
  n1.reset();
}

// The worker map is the placement in Redis: units a real coordinator placed
// in two worker groups show on either node with the owner and epoch Redis
// holds, the shard groups do not, and a move shows once the one-second
// cache has passed. The overview carries the first 500 units and the total.
// proves: W9
TEST(NodeCluster, TheWorkerMapShowsTheUnitsACoordinatorPlacedWithTheirOwnersAndEpochs) {
  ClusterScratch scratch("troupe-node-worker-map");
  auto [n1, t1] = start_tally_node(scratch.config("m1"));
  auto [n2, t2] = start_tally_node(scratch.config("m2"));
  auto& coord = n1->cluster()->coordinator();
  ASSERT_TRUE(eventually([&] { return coord.members().size() == 2; }));
  // Shards of the tally type exist too: they must not show as workers.
  ASSERT_TRUE(t1.ask<std::int64_t>("k", [](troupe::ReplyTo<std::int64_t> r) { return Add{1, std::move(r)}; }, 10s)
                  .get()
                  .ok());
  std::vector<troupe::Future<troupe::cluster::Placement>> placing;
  for (int i = 0; i < 10; ++i) placing.push_back(coord.assign("devices", "dev-" + std::to_string(i), "{}"));
  for (int i = 0; i < 600; ++i) placing.push_back(coord.assign("sensors", "s" + std::to_string(1000 + i), ""));
  for (auto& f : placing) ASSERT_TRUE(f.get().ok());

  auto [status, view] = admin_call(n2->admin_port(), "GET", "/cluster");
  ASSERT_EQ(status, 200);
  ASSERT_EQ(view["workers"].size(), 610u) << view["workers_error"];
  EXPECT_EQ(view["workers_total"], 610);
  EXPECT_FALSE(view.contains("workers_error")) << view["workers_error"];
  std::map<std::string, int> owners;
  for (const auto& w : view["workers"]) {
    const std::string group = w["group"];
    ASSERT_TRUE(group == "devices" || group == "sensors") << w.dump();
    auto a = coord.assignment(group, w["unit"]).get();
    ASSERT_TRUE(a.ok() && a->has_value()) << w.dump();
    EXPECT_EQ(w["owner"], (*a)->owner) << w.dump();
    EXPECT_EQ(w["epoch"], (*a)->epoch) << w.dump();
    EXPECT_EQ(w["since"], std::chrono::duration_cast<std::chrono::milliseconds>((*a)->updated.time_since_epoch()).count());
    ++owners[w["owner"]];
  }
  EXPECT_EQ(owners.size(), 2u) << "placed on both members";
  EXPECT_EQ(view["workers"][0]["unit"], "dev-0") << "by group, then unit";

  auto overview = admin_call(n2->admin_port(), "GET", "/api/overview").second;
  EXPECT_EQ(overview["workers"].size(), 500u);
  EXPECT_EQ(overview["workers_total"], 610);

  // A move shows, once the cached read is over a second old.
  auto moved = coord.relocate("devices", "dev-3", true).get();
  ASSERT_TRUE(moved.ok()) << moved.error().to_string();
  ASSERT_TRUE(coord.unassign("devices", "dev-4").get().ok());
  json dev3;
  ASSERT_TRUE(eventually([&] {
    auto v = admin_call(n2->admin_port(), "GET", "/cluster").second;
    dev3 = json();
    for (const auto& w : v["workers"])
      if (w["unit"] == "dev-3") dev3 = w;
    return v["workers"].size() == 609u && dev3["epoch"] == moved->assignment.epoch;
  })) << dev3.dump();
  EXPECT_EQ(dev3["owner"], moved->assignment.owner);
  EXPECT_TRUE(dev3["handing_off_from"].is_string()) << "the old owner is live: a hand-off shows";

  // Members: alive from the coordinator's view, with their heartbeat age.
  for (const auto& m : view["members"]) {
    EXPECT_EQ(m["alive"], true) << m.dump();
    EXPECT_LE(m["heartbeat_age_ms"].get<std::int64_t>(), 1000) << m.dump();
  }
  n2.reset();
  n1.reset();
}

// Alone, a node has no worker map; its job service's slots are job
// workers, and the version is the build's (project() in CMakeLists.txt).
// proves: W9
TEST_F(NodeTest, AloneTheWorkerMapIsEmptyTheJobWorkersAreListedAndTheVersionIsTheBuilds) {
  start();
  troupe::JobSettings js;
  js.name = "mail";
  js.workers = 3;
  auto jobs = node_->start_jobs(js, send_translator(), send_workers());
  ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
  auto view = call_json("GET", "/cluster", 200);
  EXPECT_EQ(view["workers"], json::array());
  EXPECT_EQ(view["workers_total"], 0);
  ASSERT_EQ(view["job_workers"].size(), 3u) << view.dump();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(view["job_workers"][i], (json{{"service", "mail"}, {"slot", "worker-" + std::to_string(i)},
                                            {"state", "idle"}, {"owner", "n1"}}));

  std::ifstream cmake(std::string(TROUPE_SOURCE_DIR) + "/CMakeLists.txt");
  std::string text((std::istreambuf_iterator<char>(cmake)), std::istreambuf_iterator<char>());
  const std::string key = "project(troupe VERSION ";
  auto at = text.find(key);
  ASSERT_NE(at, std::string::npos);
  const std::string built = text.substr(at + key.size(), text.find(' ', at + key.size()) - at - key.size());
  EXPECT_EQ(Node::version(), built);
  EXPECT_EQ(call_json("GET", "/api/overview", 200)["version"], built);
}

}  // namespace
