// The job service with a journal: acceptance, group commit, restart,
// compaction and bad rows.
// Unreadable journal rows stop the service from starting, with a clear
// error.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/core.hpp"
#include "job_test_support.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/persist/codec.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace troupe::job_test;

template <class P>
bool eventually(P pred) {
  auto until = std::chrono::steady_clock::now() + kBound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// Outcomes reported through on_outcome, by job id.
struct Reports {
  std::mutex mu;
  std::map<JobId, std::string> by_id;
  std::size_t size() {
    std::lock_guard lk(mu);
    return by_id.size();
  }
  std::map<JobId, std::string> all() {
    std::lock_guard lk(mu);
    return by_id;
  }
};

// "echo" succeeds with the payload; "hang" keeps its run (in `held`) and
// never completes it while `hang` is set, else succeeds.
struct Workers {
  std::atomic<bool> hang{true};
  std::mutex mu;
  std::vector<JobRun> held;
  std::vector<std::string> ran;

  JobWorkers make() {
    JobWorkers w;
    w["echo"] = [this](JobRun r) {
      note(r);
      r.succeed(r.detail());
    };
    w["hang"] = [this](JobRun r) {
      note(r);
      if (hang.load()) {
        std::lock_guard lk(mu);
        held.push_back(r);
      } else {
        r.succeed("ran again: " + r.detail());
      }
    };
    return w;
  }
  void note(const JobRun& r) {
    std::lock_guard lk(mu);
    ran.push_back(std::to_string(r.job_id()) + ":" + r.detail());
  }
  std::size_t held_count() {
    std::lock_guard lk(mu);
    return held.size();
  }
  std::vector<std::string> ran_jobs() {
    std::lock_guard lk(mu);
    return ran;
  }
};

troupe::JobTranslator translator() {
  return [](const Job& j) { return std::optional<JobWorkerCall>(JobWorkerCall{j.kind, j.payload}); };
}

JobSettings durable_settings(std::shared_ptr<troupe::Journal> journal, std::shared_ptr<Reports> reports) {
  JobSettings s;
  s.name = "orders";
  s.workers = 2;
  s.default_timeout = 5s;
  s.watchdog_limit = 30s;
  s.journal = std::move(journal);
  s.log = false;
  s.on_outcome = [reports](JobId id, const Job& j, const JobOutcome& o) {
    std::lock_guard lk(reports->mu);
    reports->by_id[id] = j.kind + " " + describe(o);
  };
  return s;
}

class JobDurable : public troupe::testkit::ManualClockTest {
 protected:
  // The worker functions point into `workers`: stop the system (and with it
  // every service a test started) before the members go.
  ~JobDurable() override { system.shutdown(); }

  JobService start(JobSettings s) {
    auto r = JobService::start(system, std::move(s), translator(), workers.make());
    if (!r.ok()) throw std::runtime_error(r.error().to_string());
    settle();
    return std::move(r).value();
  }
  std::shared_ptr<troupe::MemoryJournal> journal = std::make_shared<troupe::MemoryJournal>();
  std::shared_ptr<Reports> reports = std::make_shared<Reports>();
  Workers workers;
};

// Journaled before the acceptance is acknowledged.
// proves: J6
TEST_F(JobDurable, AJobIsAcceptedOnlyOnceItIsJournaled) {
  auto jobs = start(durable_settings(journal, reports));
  journal->hold();
  auto id = jobs.enqueue({"echo", "a"});
  settle();
  EXPECT_FALSE(id.ready());
  EXPECT_EQ(jobs.stats().accepted, 0u);
  EXPECT_TRUE(workers.ran_jobs().empty());  // not queued either
  journal->release_held();
  auto r = await(id);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r.value(), 1u);
  settle();
  EXPECT_EQ(reports->all(), (std::map<JobId, std::string>{{1, "echo succeeded: a"}}));
}

// Group commit.
// proves: J6
TEST_F(JobDurable, JobsArrivingDuringAnAppendShareTheNextOne) {
  auto s = durable_settings(journal, reports);
  s.start_paused = true;
  auto jobs = start(s);
  journal->hold();
  std::vector<Future<JobId>> ids;
  ids.push_back(jobs.enqueue({"echo", "first"}));
  settle();  // the first append is in flight (held)
  for (int i = 0; i < 500; ++i) ids.push_back(jobs.enqueue({"echo", std::to_string(i)}));
  settle();
  EXPECT_EQ(jobs.stats().journal_appends, 1u);
  journal->release_held();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto r = await(ids[i]);
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(r.value(), i + 1);
  }
  settle();
  auto st = jobs.stats();
  EXPECT_EQ(st.journal_appends, 2u);  // 1 job, then the other 500 together
  EXPECT_EQ(st.accepted, 501u);
  EXPECT_EQ(st.queued, 501u);
}

// Outcomes are journaled before anyone is told.
// proves: J6
TEST_F(JobDurable, AnOutcomeIsReportedOnlyOnceItIsJournaled) {
  auto s = durable_settings(journal, reports);
  s.start_paused = true;
  auto jobs = start(s);
  auto f = jobs.submit({"echo", "x"});
  settle();
  EXPECT_EQ(jobs.stats().accepted, 1u);
  journal->hold();
  jobs.resume();
  settle();
  EXPECT_EQ(workers.ran_jobs(), std::vector<std::string>{"1:x"});
  EXPECT_FALSE(f.ready());
  journal->release_held();
  EXPECT_EQ(describe(await(f)), "succeeded: x");
}

// Nothing is acknowledged that is not journaled.
// proves: J6
TEST_F(JobDurable, AFailedAppendAnswersTheJobsInItWithJournalFailed) {
  auto jobs = start(durable_settings(journal, reports));
  journal->fail_next_appends(1, troupe::Error(ErrorCode::journal_failed, "disk full"));
  auto f = jobs.submit({"echo", "lost"});
  auto r = await(f);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_failed);
  EXPECT_EQ(r.error().message(), "job not accepted: the journal append failed: disk full");
  EXPECT_TRUE(workers.ran_jobs().empty());
  auto next = jobs.submit({"echo", "kept"});
  EXPECT_EQ(describe(await(next)), "succeeded: kept");
  auto st = jobs.stats();
  EXPECT_EQ(st.journal_failures, 1u);
  EXPECT_EQ(st.accepted, 1u);
}

// The journal holds unfinished work, not history.
TEST_F(JobDurable, RowsWhoseJobsHaveAllFinishedAreDeleted) {
  auto jobs = start(durable_settings(journal, reports));
  for (int i = 0; i < 20; ++i) {
    auto f = jobs.submit({"echo", std::to_string(i)});
    ASSERT_EQ(describe(await(f)), "succeeded: " + std::to_string(i));
  }
  settle();
  auto hi = troupe::journal_sync::highest_seq(*journal, "jobs|orders");
  ASSERT_TRUE(hi.ok());
  EXPECT_EQ(hi.value(), 40u);  // 20 accepted rows, 20 outcome rows
  // Only the newest accepted row (it carries the highest id) and what follows it stay.
  EXPECT_LE(journal->size(), 3u);
}

// At least once; outcomes of recovered jobs go to on_outcome.
// proves: J6
TEST_F(JobDurable, AcceptedButUnfinishedJobsRunAgainAfterARestartOnTheSameJournal) {
  {
    auto s = durable_settings(journal, reports);
    s.workers = 1;
    auto jobs = start(s);
    auto done = jobs.submit({"echo", "finished before"});
    ASSERT_EQ(describe(await(done)), "succeeded: finished before");
    auto running = jobs.submit({"hang", "r"}, 1);
    settle();
    ASSERT_EQ(workers.held_count(), 1u);
    auto queued = jobs.submit({"echo", "q"}, 7);
    settle();
    ASSERT_TRUE(jobs.stop().ok());
    EXPECT_EQ(await(running).error().code(), ErrorCode::shutting_down);
    EXPECT_EQ(await(queued).error().code(), ErrorCode::shutting_down);
  }
  workers.hang = false;
  auto jobs = start(durable_settings(journal, reports));
  EXPECT_TRUE(eventually([&] { return reports->size() == 2; }));
  EXPECT_EQ(reports->all(),
            (std::map<JobId, std::string>{{2, "hang succeeded: ran again: r"}, {3, "echo succeeded: q"}}));
  auto st = jobs.stats();
  EXPECT_EQ(st.recovered, 2u);
  auto next = jobs.enqueue({"echo", "new"});
  EXPECT_EQ(await(next).value(), 4u);  // ids continue after the restart
}

// Nothing is accepted that could not be stored; the fault is reported.
// proves: J6
TEST_F(JobDurable, ASecondWriterInItsLogStopsTheServiceForGoodAndHealthAndSubmitSayWhy) {
  auto first = start(durable_settings(journal, reports));
  // A second service of the same name on the same journal (a second node
  // on a shared database) recovers the same log and appends to it.
  auto second = start(durable_settings(journal, reports));
  auto taken = second.enqueue({"echo", "taken by the second"});
  ASSERT_TRUE(await(taken).ok());
  EXPECT_TRUE(first.health().ok());
  // The first one's next append meets the second's row.
  auto never = first.enqueue({"echo", "never stored"});
  auto refused = await(never);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::journal_conflict);
  settle();
  auto health = first.health();
  ASSERT_FALSE(health.ok()) << "the service says it stopped";
  EXPECT_EQ(health.error().code(), ErrorCode::journal_conflict);
  EXPECT_NE(health.error().message().find("jobs|orders"), std::string::npos) << health.error().message();
  // Every later job is refused at once with the reason, not accepted and lost.
  auto after = first.submit({"echo", "after"});
  auto later = await(after);
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.error().code(), ErrorCode::journal_conflict);
  EXPECT_NE(later.error().message().find("has stopped"), std::string::npos) << later.error().message();
  EXPECT_TRUE(second.health().ok());
  EXPECT_TRUE(eventually([&] { return reports->size() == 1; })) << "the second service ran its job";
}

// Writes rows under the service's persistence id as if another program had.
void append_raw(troupe::Journal& j, std::string type, std::uint32_t version, std::string payload) {
  auto hi = troupe::journal_sync::highest_seq(j, "jobs|orders");
  ASSERT_TRUE(hi.ok());
  troupe::AppendBatch b;
  b.persistence_id = "jobs|orders";
  b.events.push_back(troupe::EventRecord{hi.value() + 1, 0, std::move(type), version, std::move(payload)});
  ASSERT_TRUE(troupe::journal_sync::append(j, std::move(b)).ok());
}

std::string accepted_payload(JobId id, std::string kind) {
  troupe::ByteWriter w;
  w.u32(1).u64(id).i64(0).i64(std::chrono::nanoseconds(1s).count()).str(kind).str("p");
  return w.take();
}

// proves: X1
TEST_F(JobDurable, UnreadableRowsKeepTheServiceFromStartingWithAClearError) {
  struct Case {
    std::string type;
    std::uint32_t version;
    std::string payload;
    std::string message;
  };
  std::vector<Case> cases = {
      {"job.accepted", 1, "\x01\x02",
       "job journal 'jobs|orders', row 1: 'job.accepted' without a job count; the service did not start"},
      {"job.accepted", 1, accepted_payload(1, "echo").substr(0, 20),
       "job journal 'jobs|orders', row 1: 'job.accepted': bytes end before the value is complete; the service did "
       "not start"},
      {"job.accepted", 1, accepted_payload(1, "echo") + "zz",
       "job journal 'jobs|orders', row 1: 'job.accepted': 2 unexpected trailing byte(s); the service did not start"},
      {"job.accepted", 2, accepted_payload(1, "echo"),
       "job journal 'jobs|orders', row 1: unsupported version 2 of 'job.accepted'; the service did not start"},
      {"job.cancelled", 1, accepted_payload(1, "echo"),
       "job journal 'jobs|orders', row 1: unknown event type 'job.cancelled'; the service did not start"},
      {"job.accepted", 1, accepted_payload(0, "echo"),
       "job journal 'jobs|orders', row 1: job id 0; the service did not start"},
  };
  for (auto& c : cases) {
    auto j = std::make_shared<troupe::MemoryJournal>();
    append_raw(*j, c.type, c.version, c.payload);
    auto r = JobService::start(system, durable_settings(j, reports), translator(), workers.make());
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.error().code(), ErrorCode::corrupt_record);
    EXPECT_EQ(r.error().message(), c.message);
  }
  // The same job accepted twice.
  auto j = std::make_shared<troupe::MemoryJournal>();
  append_raw(*j, "job.accepted", 1, accepted_payload(5, "echo"));
  append_raw(*j, "job.accepted", 1, accepted_payload(5, "echo"));
  auto r = JobService::start(system, durable_settings(j, reports), translator(), workers.make());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "job journal 'jobs|orders', row 2: job 5 accepted twice; the service did not start");
  EXPECT_EQ(system.stats().actors_live, 0u);
}

// A journal whose reads fail, as a broken disk's would.
class UnreadableJournal final : public troupe::Journal {
 public:
  void append(troupe::AppendBatch, Callback<void> done) override { done({}); }
  void replay(std::string, std::uint64_t, std::uint64_t, Callback<std::vector<troupe::EventRecord>> done) override {
    done(troupe::Error(ErrorCode::journal_failed, "I/O error"));
  }
  void highest_seq(std::string, Callback<std::uint64_t> done) override {
    done(troupe::Error(ErrorCode::journal_failed, "I/O error"));
  }
  void delete_up_to(std::string, std::uint64_t, Callback<void> done) override { done({}); }
  void save_snapshot(std::string, troupe::SnapshotRecord, Callback<void> done) override { done({}); }
  void load_snapshot(std::string, Callback<std::optional<troupe::SnapshotRecord>> done) override {
    done(troupe::Error(ErrorCode::journal_failed, "I/O error"));
  }
  void raise_fence(std::string, std::uint64_t, Callback<void> done) override { done({}); }
  void highest_fence(Callback<std::uint64_t> done) override { done(std::uint64_t{0}); }
  std::string_view name() const noexcept override { return "unreadable"; }
  troupe::JournalStats journal_stats() const override { return {}; }
};

// proves: X1
TEST_F(JobDurable, AJournalThatCannotBeReadIsARecoveryFailure) {
  auto r = JobService::start(system, durable_settings(std::make_shared<UnreadableJournal>(), reports), translator(),
                             workers.make());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::recovery_failed);
  EXPECT_NE(r.error().message().find("job journal 'jobs|orders' could not be read: journal_failed: I/O error"),
            std::string::npos)
      << r.error().message();
}

// --- the same on SQLite, across actor systems ------------------------------------

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-jobs-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::filesystem::path file(const char* name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::shared_ptr<troupe::SqliteJournal> open_sqlite(const std::filesystem::path& file) {
  troupe::SqliteJournalOptions o;
  o.path = file.string();
  o.durability = troupe::Durability::process_crash;
  auto j = troupe::SqliteJournal::open(o);
  if (!j.ok()) throw std::runtime_error(j.error().to_string());
  return std::move(j).value();
}

troupe::SystemConfig quiet_config() {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  cfg.log_failures = false;
  cfg.clock = std::make_shared<troupe::ManualClock>();
  return cfg;
}

// proves: J6
TEST(JobDurableSqlite, ADurableJobSurvivesARestartOfTheSystemAndRunsAgain) {
  TempDir dir;
  const auto file = dir.file("jobs.db");
  auto reports = std::make_shared<Reports>();
  Workers workers;
  std::vector<Future<JobOutcome>> lost;
  {
    troupe::ActorSystem sys(quiet_config());
    auto jobs = JobService::start(sys, durable_settings(open_sqlite(file), reports), translator(), workers.make());
    ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
    auto done = jobs->submit({"echo", "before the restart"});
    ASSERT_EQ(describe(await(done)), "succeeded: before the restart");
    lost.push_back(jobs->submit({"hang", "slow"}));
    lost.push_back(jobs->submit({"hang", "slower"}));
    ASSERT_TRUE(eventually([&] { return workers.held_count() == 2; }));
    lost.push_back(jobs->submit({"echo", "queued"}, 3));  // both workers busy: it waits
    ASSERT_TRUE(eventually([&] { return jobs->stats().accepted == 4; }));
  }  // the system shuts down with three jobs unfinished; the journal closes
  for (auto& f : lost) EXPECT_EQ(await(f).error().code(), ErrorCode::shutting_down);

  workers.hang = false;
  {
    troupe::ActorSystem sys(quiet_config());
    auto jobs = JobService::start(sys, durable_settings(open_sqlite(file), reports), translator(), workers.make());
    ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
    EXPECT_EQ(jobs->stats().recovered, 3u);
    ASSERT_TRUE(eventually([&] { return reports->size() == 3; }));
    EXPECT_EQ(reports->all(), (std::map<JobId, std::string>{{2, "hang succeeded: ran again: slow"},
                                                            {3, "hang succeeded: ran again: slower"},
                                                            {4, "echo succeeded: queued"}}));
    ASSERT_TRUE(jobs->stop().ok());
  }

  // Their outcomes were journaled: a third start has nothing to run again.
  {
    troupe::ActorSystem sys(quiet_config());
    auto jobs = JobService::start(sys, durable_settings(open_sqlite(file), reports), translator(), workers.make());
    ASSERT_TRUE(jobs.ok()) << jobs.error().to_string();
    EXPECT_EQ(jobs->stats().recovered, 0u);
    auto next = jobs->enqueue({"echo", "new"});
    auto id = await(next);
    ASSERT_TRUE(id.ok()) << id.error().to_string();
    EXPECT_EQ(id.value(), 5u);
  }
  std::lock_guard lk(workers.mu);
  for (auto& r : workers.held) EXPECT_FALSE(r.succeed("the old system is gone"));
}

// proves: X1
TEST(JobDurableSqlite, BadRowsInTheSqliteFileAreReportedNotCrashedOn) {
  TempDir dir;
  const auto file = dir.file("jobs.db");
  {
    auto j = open_sqlite(file);
    append_raw(*j, "job.accepted", 1, "not a job");
  }
  troupe::ActorSystem sys(quiet_config());
  auto reports = std::make_shared<Reports>();
  Workers workers;
  auto jobs = JobService::start(sys, durable_settings(open_sqlite(file), reports), translator(), workers.make());
  ASSERT_FALSE(jobs.ok());
  EXPECT_EQ(jobs.error().code(), ErrorCode::corrupt_record);
  EXPECT_NE(jobs.error().message().find("row 1"), std::string::npos) << jobs.error().message();
}

}  // namespace
