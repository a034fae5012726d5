// Acknowledged means durable, shown by order (SPEC V3). Each durable back
// end is wrapped in a journal that writes "commit returned ..." to a log
// the moment the real append's callback reports success; the clients write
// to the same log the moment a reply or an acceptance reaches them (a
// continuation on the thread that completes it). Every reply whose command
// stored events, and every durable job acceptance and reported outcome,
// must come after the commit that stored it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "entity_test_support.hpp"
#include "journal_test_support.hpp"
#include "postgres/postgres_test_server.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/persist/forwarding_journal.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "troupe/testkit/gate.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::test;

// Lines in the order they were written, from any thread. Thread-safe.
class OrderLog {
 public:
  void add(std::string line) {
    std::lock_guard lk(mu_);
    lines_.push_back(std::move(line));
  }
  std::vector<std::string> lines() const {
    std::lock_guard lk(mu_);
    return lines_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

// The rows of the job service's "job.accepted" / "job.finished" events:
// a u32 count, then per job its id first (doc/jobs.md, "Journal format").
std::vector<std::uint64_t> job_ids(const EventRecord& e) {
  std::vector<std::uint64_t> ids;
  ByteReader r(e.payload);
  std::uint32_t n = r.u32();
  for (std::uint32_t i = 0; i < n && !r.failed(); ++i) {
    ids.push_back(r.u64());
    if (e.type == "job.accepted") {
      (void)r.i64(), (void)r.i64(), (void)r.str(), (void)r.str();
    } else {
      (void)r.u8(), (void)r.str();
    }
  }
  return ids;
}

// A journal that forwards every operation to `inner` and, when an append's
// commit has returned successfully, logs one line per stored event (and per
// job a job-service event holds) before the caller's callback runs. Owns a
// share of the inner journal; thread-safe as the inner one is.
class RecordingJournal final : public ForwardingJournal {
 public:
  RecordingJournal(std::shared_ptr<Journal> inner, std::shared_ptr<OrderLog> log)
      : ForwardingJournal(std::move(inner)), log_(std::move(log)) {}

  void append(AppendBatch batch, Callback<void> done) override {
    std::vector<std::string> lines;
    for (const auto& e : batch.events) {
      lines.push_back("commit returned for " + batch.persistence_id + " seq " + std::to_string(e.seq));
      if (e.type == "job.accepted" || e.type == "job.finished") {
        std::string what = e.type == "job.accepted" ? " accepted" : " outcome";
        for (auto id : job_ids(e)) lines.push_back("commit returned for job " + std::to_string(id) + what);
      }
    }
    inner().append(std::move(batch), [log = log_, lines = std::move(lines), done = std::move(done)](Result<void> r) {
      if (r.ok())
        for (const auto& l : lines) log->add(l);
      done(std::move(r));
    });
  }

 private:
  std::shared_ptr<OrderLog> log_;
};

// Fails the test unless `after` is in the log, behind `before`.
void expect_in_order(const std::vector<std::string>& log, const std::string& before, const std::string& after) {
  auto a = std::find(log.begin(), log.end(), after);
  ASSERT_NE(a, log.end()) << "'" << after << "' is not in the log";
  auto b = std::find(log.begin(), log.end(), before);
  ASSERT_NE(b, log.end()) << "'" << before << "' is not in the log";
  EXPECT_LT(b - log.begin(), a - log.begin()) << "'" << after << "' came before '" << before << "'";
}

class AcknowledgedOrder : public ::testing::TestWithParam<std::string> {
 protected:
  AcknowledgedOrder() {
    if (GetParam() == "sqlite") {
      SqliteJournalOptions o;
      o.path = dir_.file("journal.db");
      auto j = SqliteJournal::open(o);
      if (!j.ok()) throw std::runtime_error(j.error().to_string());
      inner_ = std::move(*j);
    } else {
      PostgresJournalOptions o;
      o.conninfo = shared_postgres_conninfo();
      o.schema = fresh_schema();
      auto j = PostgresJournal::open(o);
      if (!j.ok()) throw std::runtime_error(j.error().to_string());
      inner_ = std::move(*j);
    }
    journal_ = std::make_shared<RecordingJournal>(inner_, log_);
  }
  ~AcknowledgedOrder() override { system_.shutdown(); }

  TempDir dir_;
  std::shared_ptr<OrderLog> log_ = std::make_shared<OrderLog>();
  std::shared_ptr<Journal> inner_;
  std::shared_ptr<Journal> journal_;
  ActorSystem system_{SystemConfig{.threads = 2, .log_dead_letters = false, .log_failures = false}};
};

// proves: V3, E7
TEST_P(AcknowledgedOrder, NoEntityReplyLeavesBeforeTheCommitStoringItsEventsReturned) {
  testkit::TestProbe<GatewayRequest> gateway(system_, "gateway");
  EntitySettings s;
  s.type_name = "pay";
  s.log = false;
  auto gw = gateway.ref();
  auto reg = EntityRegistry<Pay>::start(system_, journal_, s, pay_codecs(), [gw](const std::string&) { return Pay{gw}; });
  ASSERT_TRUE(reg.ok()) << reg.error().to_string();
  constexpr int n = 8;
  auto all_in = std::make_shared<testkit::Gate>();
  auto answered = std::make_shared<std::atomic<int>>(0);
  auto on_reply = [&](std::string line) {
    return [log = log_, line = std::move(line), all_in, answered](Result<std::string> r) {
      log->add(r.ok() ? line : line + " failed: " + r.error().to_string());
      if (++*answered == 2 * n) all_in->open();
    };
  };
  // Settle stores Accepted (seq 1) and then answers; Cancel stores Cancelled
  // (seq 1) and then answers. All in flight at once, over 16 entities.
  for (int i = 0; i < n; ++i) {
    std::string p = "p" + std::to_string(i), q = "q" + std::to_string(i);
    reg->ask<std::string>(p, [i](ReplyTo<std::string> t) { return Settle{100 + i, std::move(t)}; }, 10s)
        .then(on_reply("reply for pay|" + p));
    reg->ask<std::string>(q, [](ReplyTo<std::string> t) { return Cancel{std::move(t)}; }, 10s)
        .then(on_reply("reply for pay|" + q));
  }
  ASSERT_TRUE(all_in->wait(30s));
  for (int i = 0; i < n; ++i) gateway.expect_message().reply_to.reply(true);
  ASSERT_TRUE(reg->stop(10s).ok());  // every append has returned: the log is complete
  auto log = log_->lines();
  for (int i = 0; i < n; ++i) {
    for (std::string id : {"pay|p" + std::to_string(i), "pay|q" + std::to_string(i)})
      expect_in_order(log, "commit returned for " + id + " seq 1", "reply for " + id);
  }
}

// proves: V3, J6
TEST_P(AcknowledgedOrder, NoDurableJobIsAcceptedOrReportedBeforeTheCommitStoringItReturned) {
  JobSettings s;
  s.name = "orders";
  s.workers = 2;
  s.default_timeout = 5s;
  s.watchdog_limit = 30s;
  s.journal = journal_;
  s.log = false;
  constexpr int n = 40;
  auto all_out = std::make_shared<testkit::Gate>();
  auto outcomes = std::make_shared<std::atomic<int>>(0);
  s.on_outcome = [log = log_, all_out, outcomes](JobId id, const Job&, const JobOutcome&) {
    log->add("outcome reported for job " + std::to_string(id));
    if (++*outcomes == n) all_out->open();
  };
  JobWorkers workers;
  workers["echo"] = [](JobRun run) { run.succeed(std::string(run.detail())); };
  auto jobs = JobService::start(
      system_, s, [](const Job& j) { return std::optional<JobWorkerCall>(JobWorkerCall{"echo", j.payload}); },
      workers);
  ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
  for (int i = 0; i < n; ++i) {
    jobs->enqueue({"echo", std::to_string(i)}).then([log = log_](Result<JobId> id) {
      log->add(id.ok() ? "accepted job " + std::to_string(*id) : "refused: " + id.error().to_string());
    });
  }
  ASSERT_TRUE(all_out->wait(30s));
  ASSERT_TRUE(jobs->stop().ok());
  auto log = log_->lines();
  for (int id = 1; id <= n; ++id) {
    std::string job = "job " + std::to_string(id);
    expect_in_order(log, "commit returned for " + job + " accepted", "accepted " + job);
    expect_in_order(log, "commit returned for " + job + " outcome", "outcome reported for " + job);
  }
}

INSTANTIATE_TEST_SUITE_P(Journals, AcknowledgedOrder, ::testing::Values("sqlite", "postgres"),
                         [](const auto& p) { return p.param; });

}  // namespace
