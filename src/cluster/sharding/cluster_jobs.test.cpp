// Durable jobs across nodes (SPEC J6 on a shared journal): nodes in one
// process over real TCP, one journal they all write, queue shards placed
// and moved by the in-memory directory. The kill -9 test with node
// processes, Redis and PostgreSQL is examples/payment/refunds_cluster_test.py.

#include "troupe/cluster/cluster_jobs.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "in_process_nodes.hpp"
#include "troupe/cluster/static_directory.hpp"
#include "troupe/persist/memory_journal.hpp"

namespace troupe::cluster {
namespace {

using namespace std::chrono_literals;

constexpr std::uint32_t kShards = 6;

struct JobNode : test::InProcessNode {
  std::optional<JobService> jobs;
};

// What the workers of every node did: runs per payload, and where.
struct Ledger {
  std::mutex mu;
  std::map<std::string, int> runs;
  std::map<std::string, std::string> ran_on;
  // Payloads whose runs are held (never completed) on a node, to be
  // "running" when that node goes.
  std::string hold_on;
  std::vector<JobRun> held;

  void ran(const std::string& node, const JobRun& run) {
    std::lock_guard lk(mu);
    if (node == hold_on) {
      held.push_back(run);
      return;
    }
    ++runs[run.detail()];
    ran_on[run.detail()] = node;
  }
  std::size_t distinct() {
    std::lock_guard lk(mu);
    return runs.size();
  }
};

class ClusterJobs : public ::testing::Test {
 protected:
  std::unique_ptr<StaticShardDirectory> placement;
  std::vector<std::unique_ptr<JobNode>> nodes;
  std::shared_ptr<MemoryJournal> journal = std::make_shared<MemoryJournal>();
  std::shared_ptr<Ledger> ledger = std::make_shared<Ledger>();

  JobSettings settings() const {
    JobSettings s;
    s.name = "refunds";
    s.workers = 2;
    s.journal = journal;
    s.log = false;
    return s;
  }

  void boot(std::vector<std::string> ids, JobSettings s, std::uint32_t shards = kShards) {
    placement = std::make_unique<StaticShardDirectory>(ids);
    test::start_in_process_nodes(ids, *placement, nodes);
    if (HasFatalFailure()) return;
    for (auto& n : nodes) start_service(*n, s, shards);
  }
  void start_service(JobNode& n, JobSettings s, std::uint32_t shards = kShards) {
    auto book = ledger;
    std::string id = n.id;
    auto started = start_job_service(
        *n.system, *n.remoting, *n.directory, s,
        [](const Job& j) -> std::optional<JobWorkerCall> { return JobWorkerCall{"w", j.payload}; },
        {{"w", [book, id](JobRun run) {
            book->ran(id, run);
            if (id != book->hold_on) run.succeed("ok");
          }}},
        {.shard_count = shards, .route_timeout = 10s, .stop_bound = 5s, .restart_delay = 100ms});
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    n.jobs.emplace(std::move(started.value()));
  }

  void TearDown() override {
    for (auto& n : nodes)
      if (n->jobs) (void)n->jobs->stop();
    for (auto& n : nodes) n->remoting->stop();
    for (auto& n : nodes) n->system->shutdown();
  }

  JobNode& node(const std::string& id) {
    for (auto& n : nodes)
      if (n->id == id) return *n;
    throw std::logic_error("no node " + id);
  }
  std::map<std::string, std::size_t> shards() { return placement->counts(job_queue_type("refunds")); }
  std::string owner_of(std::uint32_t shard) {
    auto p = placement->placement(job_queue_type("refunds"), shard);
    return p ? p->owner : std::string();
  }

  static bool eventually(const std::function<bool()>& f, Duration bound = 20s) { return test::eventually(f, bound); }
  // Waits until every shard has started on its owner.
  void wait_served(std::uint32_t count = kShards) {
    ASSERT_TRUE(eventually([&] {
      std::size_t n = 0;
      for (auto& [node, c] : shards()) n += c;
      if (n != count) return false;
      for (auto& nd : nodes)
        if (nd->jobs && nd->jobs->stats().idle != shards()[nd->id] * 2) return false;
      return true;
    })) << "queue shards did not start";
  }
  static JobId enqueue(JobNode& n, const std::string& payload) {
    auto r = n.jobs->enqueue(Job{"refund", payload}).get();
    if (!r.ok()) throw std::runtime_error(n.id + ": " + r.error().to_string());
    return r.value();
  }
};

// proves: J6
TEST_F(ClusterJobs, JobsEnqueuedThroughEveryNodeOfASharedJournalAllRunExactlyOnce) {
  boot({"a", "b", "c"}, settings());
  ASSERT_NO_FATAL_FAILURE(wait_served());
  std::set<JobId> ids;
  for (int i = 0; i < 300; ++i)
    for (auto& n : nodes) ids.insert(enqueue(*n, n->id + "-" + std::to_string(i)));
  EXPECT_EQ(ids.size(), 900u) << "job ids are unique across the cluster";
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 900; })) << ledger->distinct();
  std::this_thread::sleep_for(100ms);
  std::lock_guard lk(ledger->mu);
  for (auto& [payload, runs] : ledger->runs) EXPECT_EQ(runs, 1) << payload;
  std::uint64_t succeeded = 0;
  for (auto& n : nodes) {
    EXPECT_TRUE(n->jobs->health().ok()) << n->id << ": " << n->jobs->health().error().to_string();
    succeeded += n->jobs->stats().succeeded;
  }
  EXPECT_EQ(succeeded, 900u);
}

// proves: J6
TEST_F(ClusterJobs, TheAcceptedJobsOfANodeThatGoesRunOnTheNodesThatTakeItsShards) {
  ledger->hold_on = "c";  // c's workers take their jobs and never finish them
  boot({"a", "b", "c"}, settings());
  ASSERT_NO_FATAL_FAILURE(wait_served());
  ASSERT_GT(shards()["c"], 0u);
  std::vector<std::string> through_c;
  for (int i = 0; i < 60; ++i) {
    through_c.push_back("c-" + std::to_string(i));
    enqueue(node("c"), through_c.back());
  }
  // Some run (held) on c, the rest wait in c's queues: all are accepted.
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(ledger->mu);
    return !ledger->held.empty();
  }));
  // c goes: its system stops (nothing it decides reaches the journal after
  // this), and placement gives its shards to a and b without a hand-off.
  JobNode& c = node("c");
  c.remoting->stop();
  c.system->shutdown();
  c.jobs.reset();
  placement->remove_node("c");
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(ledger->mu);
    for (auto& p : through_c)
      if (!ledger->runs.count(p)) return false;
    return true;
  })) << "jobs accepted by c did not run after c went";
  std::lock_guard lk(ledger->mu);
  for (auto& p : through_c) {
    EXPECT_EQ(ledger->runs[p], 1) << p;
    EXPECT_NE(ledger->ran_on[p], "c") << p;
  }
}

TEST_F(ClusterJobs, AJobSentThroughANodeThatServesNoShardIsAcceptedOnTheOwner) {
  boot({"a", "b"}, settings(), /*shards=*/1);
  ASSERT_NO_FATAL_FAILURE(wait_served(1));
  std::string owner = owner_of(0);
  std::string other = owner == "a" ? "b" : "a";
  JobId id = enqueue(node(other), "remote-1");
  EXPECT_EQ(id >> 40, 0u) << "shard 0";
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 1; }));
  {
    std::lock_guard lk(ledger->mu);
    EXPECT_EQ(ledger->ran_on["remote-1"], owner);
  }
  auto local = node(owner).jobs->submit(Job{"refund", "local-2"}).get();
  ASSERT_TRUE(local.ok()) << local.error().to_string();
  // A submit over the network gets the outcome.
  auto out = node(other).jobs->submit(Job{"refund", "remote-2"}).get();
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_EQ(std::get<JobSucceeded>(out.value()).output, "ok");
}

// proves: C2
TEST_F(ClusterJobs, AJobForAnOwnerThatLeftTheAddressBookGoesToTheShardsNewOwner) {
  boot({"a", "b", "c"}, settings(), /*shards=*/1);
  ASSERT_NO_FATAL_FAILURE(wait_served(1));
  const std::string owner = owner_of(0);
  std::vector<std::string> others;
  for (const char* id : {"a", "b", "c"})
    if (id != owner) others.push_back(id);
  const std::string& sender = others[0];
  const std::string& heir = others[1];
  (void)enqueue(node(sender), "before");  // the sender learns the owner
  // The owner hands the shard off and leaves; the sender drops it from
  // its address book before it hears that the shard moved.
  ASSERT_TRUE(placement->move(job_queue_type("refunds"), 0, heir).ok());
  ASSERT_TRUE(eventually([&] { return node(heir).jobs->stats().idle == 2; }));
  node(sender).remoting->remove_peer(owner);
  auto id = node(sender).jobs->enqueue(Job{"refund", "after"}).get();
  ASSERT_TRUE(id.ok()) << id.error().to_string();
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 2; }));
  std::lock_guard lk(ledger->mu);
  EXPECT_EQ(ledger->ran_on["after"], heir);
}

TEST_F(ClusterJobs, AHandOffMovesTheQueuedJobsToTheNewOwner) {
  JobSettings s = settings();
  s.start_paused = true;  // jobs wait in the queue
  boot({"a", "b"}, s, /*shards=*/1);
  ASSERT_NO_FATAL_FAILURE(wait_served(1));
  std::string owner = owner_of(0);
  std::string other = owner == "a" ? "b" : "a";
  for (int i = 0; i < 20; ++i) enqueue(node(owner), "q-" + std::to_string(i));
  ASSERT_TRUE(eventually([&] { return node(owner).jobs->stats().queued == 20; }));
  node(other).jobs->resume();
  ASSERT_TRUE(placement->move(job_queue_type("refunds"), 0, other).ok());
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 20; })) << ledger->distinct();
  std::lock_guard lk(ledger->mu);
  for (auto& [p, runs] : ledger->runs) {
    EXPECT_EQ(runs, 1) << p;
    EXPECT_EQ(ledger->ran_on[p], other) << p;
  }
}

// proves: J6
TEST_F(ClusterJobs, AHandOffLetsTheRunningJobFinishSoTheNewOwnerDoesNotRunItAgain) {
  boot({"a", "b"}, settings(), /*shards=*/1);
  ASSERT_NO_FATAL_FAILURE(wait_served(1));
  std::string owner = owner_of(0);
  std::string other = owner == "a" ? "b" : "a";
  ledger->hold_on = owner;  // the owner's worker keeps its run going
  enqueue(node(owner), "running");
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lk(ledger->mu);
    return ledger->held.size() == 1;
  }));
  // Placement moves the shard while the job runs; the old owner finishes
  // it a little later, within stop_bound.
  std::thread finish([&] {
    std::this_thread::sleep_for(200ms);
    std::lock_guard lk(ledger->mu);
    ++ledger->runs["running"];
    ledger->ran_on["running"] = owner;
    EXPECT_TRUE(ledger->held[0].succeed("ok"));
  });
  ASSERT_TRUE(placement->move(job_queue_type("refunds"), 0, other).ok());
  finish.join();
  ASSERT_TRUE(eventually([&] { return node(other).jobs->stats().idle == 2; })) << "the new owner serves the shard";
  enqueue(node(other), "next");
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 2; }));
  std::this_thread::sleep_for(100ms);
  std::lock_guard lk(ledger->mu);
  EXPECT_EQ(ledger->runs["running"], 1) << "the job whose outcome was stored before the hand-off ran once";
  EXPECT_EQ(ledger->ran_on["running"], owner);
  EXPECT_EQ(ledger->ran_on["next"], other);
}

TEST_F(ClusterJobs, AShardWhoseLogAnotherWriterTookIsReadAgainAndNothingIsLost) {
  boot({"a"}, settings(), /*shards=*/1);
  ASSERT_NO_FATAL_FAILURE(wait_served(1));
  enqueue(node("a"), "before");
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 1; }));
  // A stale writer (a paused node's service of the same log) appends
  // behind the owner's back: a job, accepted into the shard's log.
  JobSettings stale = settings();
  stale.name = "refunds/0";
  stale.start_paused = true;
  auto other = JobService::start(*node("a").system, stale,
                                 [](const Job& j) -> std::optional<JobWorkerCall> { return JobWorkerCall{"w", j.payload}; },
                                 {{"w", [](JobRun run) { run.succeed("stale"); }}});
  ASSERT_TRUE(other.ok()) << other.error().to_string();
  ASSERT_TRUE(other->enqueue(Job{"refund", "from-the-stale-writer"}).get().ok());
  (void)other->stop();
  // The owner's next append conflicts: its service stops and says why, the
  // job that met the conflict is not accepted there and goes to the shard
  // again once it is read from its log again, with the stale writer's job.
  JobId id = enqueue(node("a"), "after");
  EXPECT_GT(id, 0u);
  ASSERT_TRUE(eventually([&] { return ledger->distinct() == 3; })) << ledger->distinct();
  std::lock_guard lk(ledger->mu);
  EXPECT_EQ(ledger->runs["from-the-stale-writer"], 1);
  EXPECT_EQ(ledger->runs["after"], 1);
  EXPECT_EQ(ledger->runs["before"], 1);
  EXPECT_TRUE(eventually([&] { return node("a").jobs->health().ok(); }));
}

TEST_F(ClusterJobs, BadSettingsAreRefusedWithAClearMessage) {
  placement = std::make_unique<StaticShardDirectory>(std::vector<std::string>{"a"});
  test::start_in_process_nodes({"a"}, *placement, nodes);
  ASSERT_FALSE(HasFatalFailure());
  auto& n = *nodes[0];
  auto translate = [](const Job&) -> std::optional<JobWorkerCall> { return std::nullopt; };
  JobWorkers w{{"w", [](JobRun run) { run.succeed(""); }}};
  JobSettings s = settings();
  s.journal = nullptr;
  auto r = start_job_service(*n.system, *n.remoting, *n.directory, s, translate, w);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("journal"), std::string::npos) << r.error().message();
  r = start_job_service(*n.system, *n.remoting, *n.directory, settings(), translate, w, {.shard_count = 0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("shard_count"), std::string::npos) << r.error().message();
  s = settings();
  s.workers = 0;
  r = start_job_service(*n.system, *n.remoting, *n.directory, s, translate, w);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("workers"), std::string::npos) << r.error().message();
  auto ok = start_job_service(*n.system, *n.remoting, *n.directory, settings(), translate, w);
  ASSERT_TRUE(ok.ok()) << ok.error().to_string();
  auto twice = start_job_service(*n.system, *n.remoting, *n.directory, settings(), translate, w);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message().find("already"), std::string::npos) << twice.error().message();
  (void)ok->stop();
}

}  // namespace
}  // namespace troupe::cluster
