// The job service's watchdog: worker slots stuck in Active are reset.
// The watchdog's period and limit run on the manual clock.
//
// A worker function that blocks its thread keeps one of the system's two
// threads busy, so these tests cannot wait for the system to be idle
// (ManualClockTest::settle); they advance the clock themselves and wait, in
// bounded real time, for the answers the other thread produces.

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/core.hpp"
#include "job_test_support.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/testkit/gate.hpp"

namespace {

using namespace troupe::job_test;
using troupe::testkit::Gate;

// "block" holds its thread inside the worker call until `release` opens
// (on attempt 1 only, if `first_only`), then tries to complete the run;
// "echo" succeeds at once.
struct Blocker {
  Gate entered;
  Gate release;
  bool first_only = false;
  bool succeed_before_blocking = false;
  std::mutex mu;
  std::vector<bool> late_results;  // what succeed() returned after the thread came back
};

class JobWatchdog : public ::testing::Test {
 protected:
  JobWatchdog() : clock(std::make_shared<troupe::ManualClock>()), system(config(clock)) {}
  ~JobWatchdog() override {
    blocker->release.open();  // never leave a thread inside a worker
  }

  static troupe::SystemConfig config(std::shared_ptr<troupe::ManualClock> c) {
    troupe::SystemConfig cfg;
    cfg.threads = 2;
    cfg.clock = std::move(c);
    cfg.log_failures = false;
    cfg.log_dead_letters = false;
    return cfg;
  }

  JobService start(JobSettings s) {
    auto b = blocker;
    JobWorkers w;
    w["block"] = [b](JobRun r) {
      if (b->first_only && r.attempt() > 1) {
        r.succeed("attempt " + std::to_string(r.attempt()) + " on a fresh worker");
        return;
      }
      if (b->succeed_before_blocking) r.succeed("answered, then stuck");
      b->entered.open();
      (void)b->release.wait(30s);
      bool late = r.succeed("came back");
      std::lock_guard lk(b->mu);
      b->late_results.push_back(late);
    };
    w["echo"] = [](JobRun r) { r.succeed(r.detail() + "!"); };
    auto r = JobService::start(
        system, std::move(s), [](const Job& j) { return std::optional<JobWorkerCall>(JobWorkerCall{j.kind, j.payload}); },
        std::move(w));
    if (!r.ok()) throw std::runtime_error(r.error().to_string());
    // Every actor has started (the watchdog's timer is armed) before any
    // worker blocks a thread.
    EXPECT_TRUE(system.wait_idle(kBound));
    return std::move(r).value();
  }

  static JobSettings settings() {
    JobSettings s;
    s.name = "wd";
    s.workers = 1;
    s.default_timeout = 500ms;
    s.watchdog_limit = 1s;
    s.watchdog_interval = 100ms;
    s.log = false;
    return s;
  }

  // Waits (real time, bounded) until `pred` holds.
  template <class P>
  static bool eventually(P pred) {
    auto until = std::chrono::steady_clock::now() + kBound;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  std::shared_ptr<troupe::ManualClock> clock;
  troupe::ActorSystem system;
  std::shared_ptr<Blocker> blocker = std::make_shared<Blocker>();
};

// A blocked thread: the slot goes back to Idle with a fresh FSM.
// proves: J5
TEST_F(JobWatchdog, AWorkerThatBlocksItsThreadIsResetAndAFreshFsmServesTheNextJob) {
  auto jobs = start(settings());
  auto stuck = jobs.submit({"block", "b"});
  ASSERT_TRUE(blocker->entered.wait(kBound));
  auto next = jobs.submit({"echo", "next"});
  const auto live_with_stuck = system.stats().actors_live;

  // The attempt's own timeout (500 ms) cannot be handled: its FSM's thread
  // is inside the worker. Nothing changes before the watchdog limit.
  clock->advance(1000ms);
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(stuck.ready());
  EXPECT_FALSE(next.ready());

  clock->advance(100ms);  // the watchdog looks at 1100 ms: Active for 1100 ms > 1000 ms
  EXPECT_EQ(outcome(stuck), "timed out");
  EXPECT_EQ(outcome(next), "succeeded: next!");  // served by the fresh FSM
  auto st = jobs.stats();
  EXPECT_EQ(st.watchdog_resets, 1u);
  EXPECT_EQ(st.timed_out, 1u);
  EXPECT_TRUE(eventually([&] { return jobs.stats().idle == 1; }));
  auto dl = jobs.dead_letters();
  ASSERT_EQ(dl.size(), 1u);
  EXPECT_EQ(dl[0].reason, "attempt 1 timed out: its worker slot was stuck for 1100 ms and the watchdog reset it");
  // One more FSM than before, until the stuck one's thread comes back...
  EXPECT_EQ(system.stats().actors_live, live_with_stuck + 1);

  blocker->release.open();
  // ...then the stuck FSM stops, and its late completion is ignored.
  EXPECT_TRUE(eventually([&] { return system.stats().actors_live == live_with_stuck; }));
  EXPECT_TRUE(eventually([&] {
    std::lock_guard lk(blocker->mu);
    return blocker->late_results.size() == 1;
  }));
  {
    std::lock_guard lk(blocker->mu);
    EXPECT_FALSE(blocker->late_results[0]);
  }
  EXPECT_EQ(jobs.stats().late_completions, 1u);
  auto after = jobs.submit({"echo", "after"});
  EXPECT_EQ(outcome(after), "succeeded: after!");
}

// With retries: the reset attempt counts as timed out.
// proves: J5
TEST_F(JobWatchdog, AJobWhoseWorkerWasResetIsRetriedOnTheFreshFsm) {
  auto s = settings();
  s.max_attempts = 2;
  s.backoff_min = 0ms;
  s.backoff_max = 0ms;
  blocker->first_only = true;
  auto jobs = start(s);
  auto f = jobs.submit({"block", "b"});
  ASSERT_TRUE(blocker->entered.wait(kBound));
  clock->advance(1100ms);
  EXPECT_EQ(outcome(f), "succeeded: attempt 2 on a fresh worker");
  auto st = jobs.stats();
  EXPECT_EQ(st.watchdog_resets, 1u);
  EXPECT_EQ(st.retried, 1u);
  EXPECT_EQ(st.succeeded, 1u);
}

// The FSM is stuck in Active although its job has an outcome.
// proves: J5
TEST_F(JobWatchdog, AnFsmStuckAfterItsJobWasAnsweredIsResetToo) {
  blocker->succeed_before_blocking = true;
  auto jobs = start(settings());
  auto f = jobs.submit({"block", "b"});
  EXPECT_EQ(outcome(f), "succeeded: answered, then stuck");
  ASSERT_TRUE(blocker->entered.wait(kBound));
  auto next = jobs.submit({"echo", "next"});
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(next.ready());
  EXPECT_EQ(jobs.stats().active, 1u);
  clock->advance(1100ms);
  EXPECT_EQ(outcome(next), "succeeded: next!");
  auto st = jobs.stats();
  EXPECT_EQ(st.watchdog_resets, 1u);
  EXPECT_EQ(st.succeeded, 2u);
  EXPECT_EQ(st.timed_out, 0u);
  blocker->release.open();
}

// Only slots Active past the limit are reset.
// proves: J5
TEST_F(JobWatchdog, HealthyWorkersAreLeftAlone) {
  auto jobs = start(settings());
  std::vector<Future<JobOutcome>> fs;
  for (int i = 0; i < 20; ++i) {
    fs.push_back(jobs.submit({"echo", std::to_string(i)}));
    clock->advance(100ms);  // the watchdog looks every 100 ms throughout
  }
  for (auto& f : fs) EXPECT_EQ(outcome(f).substr(0, 9), "succeeded");
  EXPECT_EQ(jobs.stats().watchdog_resets, 0u);
}

// Stop: nothing waits for a blocked worker.
TEST_F(JobWatchdog, StoppingWithAWorkerStillBlockedAnswersItsJobAndDoesNotHang) {
  auto jobs = start(settings());
  auto stuck = jobs.submit({"block", "b"});
  ASSERT_TRUE(blocker->entered.wait(kBound));
  auto queued = jobs.submit({"echo", "q"});
  ASSERT_TRUE(jobs.stop().ok());
  for (auto* f : {&stuck, &queued}) {
    ASSERT_TRUE(f->wait_for(kBound));
    auto r = f->get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  }
  blocker->release.open();
}

}  // namespace
