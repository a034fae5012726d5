// The job service on the manual clock: the flow, timeouts, failures,
// priorities, retries, back-pressure and stopping.
// Bad settings and bad per-job timeouts are refused with a clear error;
// every timeout and back-off here is driven by advance(), nothing sleeps.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "troupe/core.hpp"
#include "job_test_support.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace troupe::job_test;

// What the workers saw, in order, and the runs they keep for later.
struct Recorder {
  std::mutex mu;
  std::vector<std::string> started;  // "<detail>#<attempt>"
  std::vector<JobRun> held;
  std::vector<troupe::JobId> ids;

  void note(const JobRun& r) {
    std::lock_guard lk(mu);
    started.push_back(r.detail() + "#" + std::to_string(r.attempt()));
    ids.push_back(r.job_id());
  }
  void hold(const JobRun& r) {
    std::lock_guard lk(mu);
    held.push_back(r);
  }
  std::vector<std::string> order() {
    std::lock_guard lk(mu);
    return started;
  }
  JobRun held_at(std::size_t i) {
    std::lock_guard lk(mu);
    return held.at(i);
  }
  std::size_t held_count() {
    std::lock_guard lk(mu);
    return held.size();
  }
};

// Job kinds: "echo" (succeeds with payload + "!"), "hang" (keeps the run,
// never completes it), "boom" (throws), "refuse" (fails with the payload),
// "flaky" (fails on attempt 1, then succeeds), "ghost" (maps to a worker
// kind nobody registered), "bad-translation" (the translator throws);
// anything else is unknown to the translator.
troupe::JobTranslator translator() {
  return [](const Job& j) -> std::optional<JobWorkerCall> {
    if (j.kind == "bad-translation") throw std::runtime_error("cannot parse payload");
    if (j.kind == "ghost") return JobWorkerCall{"nobody", j.payload};
    if (j.kind == "echo" || j.kind == "hang" || j.kind == "boom" || j.kind == "refuse" || j.kind == "flaky")
      return JobWorkerCall{j.kind, j.payload};
    return std::nullopt;
  };
}

JobWorkers workers(std::shared_ptr<Recorder> rec) {
  JobWorkers w;
  w["echo"] = [rec](JobRun r) {
    rec->note(r);
    r.succeed(r.detail() + "!");
  };
  w["hang"] = [rec](JobRun r) {
    rec->note(r);
    rec->hold(r);
  };
  w["boom"] = [rec](JobRun r) {
    rec->note(r);
    throw std::runtime_error("worker exploded on " + r.detail());
  };
  w["refuse"] = [rec](JobRun r) {
    rec->note(r);
    r.fail("refused: " + r.detail());
  };
  w["flaky"] = [rec](JobRun r) {
    rec->note(r);
    if (r.attempt() == 1) {
      r.fail("first attempt always fails");
    } else {
      r.succeed("ok on attempt " + std::to_string(r.attempt()));
    }
  };
  return w;
}

JobSettings base_settings() {
  JobSettings s;
  s.name = "jobs";
  s.workers = 1;
  s.default_timeout = 100ms;
  s.watchdog_limit = 10s;
  s.watchdog_interval = 1s;
  s.log = false;
  return s;
}

class JobServiceTest : public troupe::testkit::ManualClockTest {
 protected:
  JobService start(JobSettings s) {
    auto r = JobService::start(system, std::move(s), translator(), workers(rec));
    if (!r.ok()) throw std::runtime_error("start failed: " + r.error().to_string());
    settle();
    return std::move(r).value();
  }
  std::shared_ptr<Recorder> rec = std::make_shared<Recorder>();
};

// --- J1: the flow ------------------------------------------------------------

// proves: J1
TEST_F(JobServiceTest, AJobFlowsFromProxyThroughQueueAndFsmToItsRequester) {
  auto s = base_settings();
  s.workers = 2;
  auto jobs = start(s);
  auto f = jobs.submit({"echo", "hello"});
  EXPECT_EQ(outcome(f), "succeeded: hello!");
  settle();
  EXPECT_EQ(rec->order(), std::vector<std::string>{"hello#1"});  // the translator's detail, attempt 1
  EXPECT_EQ(rec->ids, std::vector<troupe::JobId>{1});
  auto st = jobs.stats();
  EXPECT_EQ(st.submitted, 1u);
  EXPECT_EQ(st.accepted, 1u);
  EXPECT_EQ(st.succeeded, 1u);
  EXPECT_EQ(st.queued, 0u);
  EXPECT_EQ(st.active, 0u);  // the FSM is back in Idle
  EXPECT_EQ(st.idle, 2u);
}

// Pull, never push.
// proves: J1
TEST_F(JobServiceTest, AnIdleFsmPullsOneJobAndBusyFsmsAreNeverPushedMore) {
  auto jobs = start(base_settings());
  auto a = jobs.submit({"hang", "a"});
  auto b = jobs.submit({"echo", "b"});
  auto c = jobs.submit({"echo", "c"});
  settle();
  // The only FSM is Active with "a"; the others wait in the queue.
  EXPECT_EQ(rec->order(), std::vector<std::string>{"a#1"});
  auto st = jobs.stats();
  EXPECT_EQ(st.active, 1u);
  EXPECT_EQ(st.queued, 2u);
  ASSERT_EQ(rec->held_count(), 1u);
  EXPECT_TRUE(rec->held_at(0).succeed("done a"));
  EXPECT_EQ(outcome(a), "succeeded: done a");
  EXPECT_EQ(outcome(b), "succeeded: b!");
  EXPECT_EQ(outcome(c), "succeeded: c!");
  settle();
  EXPECT_EQ(rec->order(), (std::vector<std::string>{"a#1", "b#1", "c#1"}));
  EXPECT_EQ(jobs.stats().idle, 1u);
}

// Asynchronous workers; no thread waits for them.
// proves: J1, J2
TEST_F(JobServiceTest, AWorkerMayCompleteItsRunLaterFromAnotherThread) {
  auto s = base_settings();
  s.default_timeout = 5s;
  auto jobs = start(s);
  auto a = jobs.submit({"hang", "async"});
  auto b = jobs.submit({"echo", "next"});
  settle();
  ASSERT_EQ(rec->held_count(), 1u);
  std::thread t([run = rec->held_at(0)] { run.succeed("from another thread"); });
  t.join();
  EXPECT_EQ(outcome(a), "succeeded: from another thread");
  EXPECT_EQ(outcome(b), "succeeded: next!");
}

// The outcome reaches its requester: here the on_outcome hook.
// proves: J1
TEST_F(JobServiceTest, EnqueueAnswersOnAcceptanceAndReportsTheOutcomeToOnOutcome) {
  auto got = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  auto s = base_settings();
  s.on_outcome = [got, mu](troupe::JobId id, const Job& j, const JobOutcome& o) {
    std::lock_guard lk(*mu);
    got->push_back(std::to_string(id) + " " + j.kind + " " + describe(o));
  };
  auto jobs = start(s);
  auto id = jobs.enqueue({"echo", "x"});
  auto r = await(id);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r.value(), 1u);
  settle();
  std::lock_guard lk(*mu);
  EXPECT_EQ(*got, std::vector<std::string>{"1 echo succeeded: x!"});
}

// --- J2: timeouts --------------------------------------------------------------

// proves: J2
TEST_F(JobServiceTest, AHungJobTimesOutAndItsWorkerThenServesTheNextJob) {
  auto jobs = start(base_settings());
  auto hung = jobs.submit({"hang", "h"});
  auto next = jobs.submit({"echo", "n"});
  settle();
  advance(99ms);
  EXPECT_FALSE(hung.ready());
  EXPECT_EQ(jobs.stats().active, 1u);
  advance(1ms);
  EXPECT_EQ(outcome(hung), "timed out");
  EXPECT_EQ(outcome(next), "succeeded: n!");
  settle();
  auto st = jobs.stats();
  EXPECT_EQ(st.timed_out, 1u);
  EXPECT_EQ(st.succeeded, 1u);
  EXPECT_EQ(st.active, 0u);
  EXPECT_EQ(st.idle, 1u);
  EXPECT_EQ(st.watchdog_resets, 0u);  // the FSM's own timer did it
}

// Fenced by attempt.
// proves: J2
TEST_F(JobServiceTest, ACompletionAfterTheTimeoutIsIgnored) {
  auto jobs = start(base_settings());
  auto hung = jobs.submit({"hang", "h"});
  settle();
  advance(100ms);
  EXPECT_EQ(outcome(hung), "timed out");
  ASSERT_EQ(rec->held_count(), 1u);
  JobRun late = rec->held_at(0);
  EXPECT_FALSE(late.pending());
  EXPECT_FALSE(late.succeed("too late"));
  EXPECT_FALSE(late.fail("too late"));
  settle();
  auto st = jobs.stats();
  EXPECT_EQ(st.late_completions, 2u);
  EXPECT_EQ(st.succeeded, 0u);
  EXPECT_EQ(st.timed_out, 1u);
}

// Per attempt, from its start, not from the submit.
// proves: J2
TEST_F(JobServiceTest, TheTimeoutCountsFromWhenAWorkerStartsTheAttempt) {
  auto jobs = start(base_settings());
  auto first = jobs.submit({"hang", "1"}, 0, 100ms);
  auto second = jobs.submit({"hang", "2"}, 0, 50ms);  // waits 100 ms in the queue first
  settle();
  advance(100ms);
  EXPECT_EQ(outcome(first), "timed out");
  settle();
  advance(49ms);
  EXPECT_FALSE(second.ready());
  advance(1ms);
  EXPECT_EQ(outcome(second), "timed out");
}

// One timer per FSM, re-armed for an earlier deadline.
// proves: J2
TEST_F(JobServiceTest, AShortJobAfterALongOneStillTimesOutAtItsOwnDeadline) {
  auto jobs = start(base_settings());
  auto quick = jobs.submit({"echo", "q"}, 0, 5s);  // arms the FSM's timer at 5 s
  EXPECT_EQ(outcome(quick), "succeeded: q!");
  auto hung = jobs.submit({"hang", "h"}, 0, 20ms);
  settle();
  advance(20ms);
  EXPECT_EQ(outcome(hung), "timed out");
}

// --- J3: failures ----------------------------------------------------------------

// proves: J3
TEST_F(JobServiceTest, AWorkerThatThrowsFailsTheJobWithWhatItThrew) {
  auto jobs = start(base_settings());
  auto f = jobs.submit({"boom", "x"});
  EXPECT_EQ(outcome(f), "failed: worker exploded on x");
}

// proves: J3
TEST_F(JobServiceTest, AWorkerFailureReachesTheRequesterWithItsReason) {
  auto jobs = start(base_settings());
  auto f = jobs.submit({"refuse", "disk full"});
  EXPECT_EQ(outcome(f), "failed: refused: disk full");
}

// Unknown job kind.
// proves: J3
TEST_F(JobServiceTest, AJobKindTheTranslatorDoesNotKnowFailsNamingTheKind) {
  auto jobs = start(base_settings());
  auto f = jobs.submit({"teleport", "x"});
  EXPECT_EQ(outcome(f), "failed: no worker for job kind 'teleport'");
  auto next = jobs.submit({"echo", "still serving"});
  EXPECT_EQ(outcome(next), "succeeded: still serving!");
}

// No service for the job.
// proves: J3
TEST_F(JobServiceTest, AWorkerKindNobodyRegisteredFailsNamingIt) {
  auto jobs = start(base_settings());
  auto f = jobs.submit({"ghost", "x"});
  EXPECT_EQ(outcome(f), "failed: job kind 'ghost' maps to worker kind 'nobody', which is not registered");
}

// proves: J3
TEST_F(JobServiceTest, ATranslatorThatThrowsFailsTheJob) {
  auto jobs = start(base_settings());
  auto f = jobs.submit({"bad-translation", "x"});
  EXPECT_EQ(outcome(f), "failed: translator failed for job kind 'bad-translation': cannot parse payload");
}

// --- J4: priorities ----------------------------------------------------------------

// Exact order with one worker.
// proves: J4
TEST_F(JobServiceTest, HigherPriorityRunsFirstAndFifoWithinAPriority) {
  auto s = base_settings();
  s.start_paused = true;
  auto jobs = start(s);
  std::vector<std::pair<std::string, int>> plan = {{"a", 1}, {"b", 3}, {"c", 2}, {"d", 3}, {"e", 1},
                                                   {"f", 2}, {"g", -5}, {"h", 3}, {"i", 0}};
  std::vector<Future<JobOutcome>> fs;
  for (auto& [name, prio] : plan) fs.push_back(jobs.submit({"echo", name}, prio));
  settle();
  auto st = jobs.stats();
  EXPECT_EQ(st.queued, plan.size());
  EXPECT_EQ(st.queued_by_priority, (std::vector<troupe::JobQueueLevel>{{3, 3}, {2, 2}, {1, 2}, {0, 1}, {-5, 1}}));
  EXPECT_TRUE(rec->order().empty());
  jobs.resume();
  for (auto& f : fs) EXPECT_EQ(outcome(f).substr(0, 9), "succeeded");
  settle();
  EXPECT_EQ(rec->order(),
            (std::vector<std::string>{"b#1", "d#1", "h#1", "c#1", "f#1", "a#1", "e#1", "i#1", "g#1"}));
}

// The busy FSM holds no job it did not pull.
// proves: J4
TEST_F(JobServiceTest, JobsArrivingWhileTheWorkerIsBusyAreStillTakenInPriorityOrder) {
  auto jobs = start(base_settings());
  auto busy = jobs.submit({"hang", "busy"}, 0, 5s);
  settle();
  std::vector<Future<JobOutcome>> fs;
  fs.push_back(jobs.submit({"echo", "low"}, 1));
  fs.push_back(jobs.submit({"echo", "high"}, 9));
  fs.push_back(jobs.submit({"echo", "mid"}, 5));
  fs.push_back(jobs.submit({"echo", "high2"}, 9));
  settle();
  ASSERT_EQ(rec->held_count(), 1u);
  rec->held_at(0).succeed("free");
  for (auto& f : fs) EXPECT_EQ(outcome(f).substr(0, 9), "succeeded");
  settle();
  EXPECT_EQ(rec->order(), (std::vector<std::string>{"busy#1", "high#1", "high2#1", "mid#1", "low#1"}));
}

// --- retries, dead letters ----------------------------------------------------------

// The final outcome is Failed with the last reason; retries with back-off.
// proves: J3
TEST_F(JobServiceTest, FailedAttemptsAreRetriedWithExponentialBackOffThenDeadLettered) {
  auto s = base_settings();
  s.max_attempts = 3;
  s.backoff_min = 100ms;
  s.backoff_max = 150ms;  // 100 ms, then min(200, 150)
  auto jobs = start(s);
  auto f = jobs.submit({"refuse", "r"}, 7);
  settle();
  EXPECT_EQ(rec->order().size(), 1u);
  EXPECT_EQ(jobs.stats().waiting_retry, 1u);
  advance(99ms);
  EXPECT_EQ(rec->order().size(), 1u);
  advance(1ms);
  EXPECT_EQ(rec->order().size(), 2u);
  advance(149ms);
  EXPECT_EQ(rec->order().size(), 2u);
  EXPECT_FALSE(f.ready());
  advance(1ms);
  EXPECT_EQ(outcome(f), "failed: refused: r");
  EXPECT_EQ(rec->order(), (std::vector<std::string>{"r#1", "r#2", "r#3"}));
  auto st = jobs.stats();
  EXPECT_EQ(st.retried, 2u);
  EXPECT_EQ(st.failed, 1u);
  EXPECT_EQ(st.dead_lettered, 1u);
  EXPECT_EQ(st.waiting_retry, 0u);
  auto dl = jobs.dead_letters();
  ASSERT_EQ(dl.size(), 1u);
  EXPECT_EQ(dl[0].id, 1u);
  EXPECT_EQ(dl[0].job, (Job{"refuse", "r"}));
  EXPECT_EQ(dl[0].priority, 7);
  EXPECT_EQ(dl[0].attempts, 3u);
  EXPECT_EQ(dl[0].reason, "refused: r");
}

// With retries: a timeout is an attempt's end, not necessarily the job's.
// proves: J2
TEST_F(JobServiceTest, ATimedOutAttemptIsRetriedAndTheRetryMaySucceed) {
  auto s = base_settings();
  s.max_attempts = 2;
  s.backoff_min = 0ms;
  s.backoff_max = 0ms;
  auto jobs = start(s);
  auto f = jobs.submit({"flaky", "x"});
  EXPECT_EQ(outcome(f), "succeeded: ok on attempt 2");
  auto h = jobs.submit({"hang", "h"});
  settle();
  advance(100ms);  // attempt 1 times out, attempt 2 starts at once
  EXPECT_FALSE(h.ready());
  advance(100ms);
  EXPECT_EQ(outcome(h), "timed out");
  auto st = jobs.stats();
  EXPECT_EQ(st.retried, 2u);
  EXPECT_EQ(st.timed_out, 1u);
  auto dl = jobs.dead_letters();
  ASSERT_EQ(dl.size(), 1u);
  EXPECT_EQ(dl[0].reason, "attempt 2 timed out after 100 ms");
}

// Retries re-enter their own priority level, at its back.
// proves: J4
TEST_F(JobServiceTest, ARetriedJobKeepsItsPriority) {
  auto s = base_settings();
  s.max_attempts = 2;
  s.backoff_min = 0ms;
  s.backoff_max = 0ms;
  s.start_paused = true;
  auto jobs = start(s);
  auto x = jobs.submit({"flaky", "x"}, 5);
  auto low = jobs.submit({"echo", "low"}, 1);
  auto z = jobs.submit({"echo", "z"}, 5);
  settle();
  jobs.resume();
  EXPECT_EQ(outcome(x), "succeeded: ok on attempt 2");
  EXPECT_EQ(outcome(low), "succeeded: low!");
  EXPECT_EQ(outcome(z), "succeeded: z!");
  settle();
  EXPECT_EQ(rec->order(), (std::vector<std::string>{"x#1", "z#1", "x#2", "low#1"}));
}

// Finally failed jobs are kept, with their reason, in a bounded list.
TEST_F(JobServiceTest, TheDeadLetterListIsBoundedAndCountsWhatItDrops) {
  auto s = base_settings();
  s.dead_letter_capacity = 2;
  auto jobs = start(s);
  for (const char* k : {"u1", "u2", "u3"}) {
    auto f = jobs.submit({k, ""});
    EXPECT_EQ(outcome(f), std::string("failed: no worker for job kind '") + k + "'");
  }
  auto dl = jobs.dead_letters();
  ASSERT_EQ(dl.size(), 2u);
  EXPECT_EQ(dl[0].job.kind, "u2");
  EXPECT_EQ(dl[1].job.kind, "u3");
  EXPECT_EQ(dl[1].attempts, 1u);
  auto st = jobs.stats();
  EXPECT_EQ(st.dead_lettered, 3u);
  EXPECT_EQ(st.dead_letters_dropped, 1u);
}

// --- back-pressure ----------------------------------------------------------------

// The proxy's intake is bounded: refused on the caller's thread.
TEST_F(JobServiceTest, AFullQueueRefusesAtOnceWithBufferOverflow) {
  auto s = base_settings();
  s.queue_capacity = 2;
  s.start_paused = true;
  auto jobs = start(s);
  auto a = jobs.submit({"echo", "a"});
  auto b = jobs.submit({"echo", "b"});
  auto c = jobs.submit({"echo", "c"});
  ASSERT_TRUE(c.ready());  // refused on the caller's thread, before any message
  auto rc = c.get();
  ASSERT_FALSE(rc.ok());
  EXPECT_EQ(rc.error().code(), ErrorCode::buffer_overflow);
  EXPECT_EQ(rc.error().message(), "job service 'jobs' is full: 2 jobs waiting");
  auto id = jobs.enqueue({"echo", "d"});
  ASSERT_TRUE(id.ready());
  EXPECT_EQ(id.get().error().code(), ErrorCode::buffer_overflow);
  EXPECT_EQ(jobs.stats().refused, 2u);
  jobs.resume();
  EXPECT_EQ(outcome(a), "succeeded: a!");
  EXPECT_EQ(outcome(b), "succeeded: b!");
  auto later = jobs.submit({"echo", "later"});  // room again
  EXPECT_EQ(outcome(later), "succeeded: later!");
}

// FSMs get work only by pulling from the queue.
// proves: J1
TEST_F(JobServiceTest, PauseHoldsQueuedJobsAndResumeReleasesThem) {
  auto jobs = start(base_settings());
  jobs.pause();
  auto f = jobs.submit({"echo", "p"});
  settle();
  EXPECT_FALSE(f.ready());
  EXPECT_EQ(jobs.stats().queued, 1u);
  jobs.resume();
  EXPECT_EQ(outcome(f), "succeeded: p!");
}

// --- stopping ----------------------------------------------------------------------

// No requester is left waiting: stop answers every job.
// proves: J2
TEST_F(JobServiceTest, StopAnswersQueuedAndRunningJobsWithShuttingDown) {
  auto jobs = start(base_settings());
  auto running = jobs.submit({"hang", "r"});
  settle();
  auto queued1 = jobs.submit({"echo", "q1"});
  auto queued2 = jobs.submit({"echo", "q2"}, 3);
  auto waiting = jobs.enqueue({"echo", "q3"});
  settle();
  ASSERT_TRUE(jobs.stop().ok());
  for (auto* f : {&running, &queued1, &queued2}) {
    auto r = await(*f);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  }
  EXPECT_TRUE(await(waiting).ok());  // it had been accepted; its outcome is what was lost
  auto after = jobs.submit({"echo", "after"});
  ASSERT_TRUE(after.ready());
  EXPECT_EQ(after.get().error().code(), ErrorCode::shutting_down);
  ASSERT_EQ(rec->held_count(), 1u);
  EXPECT_FALSE(rec->held_at(0).succeed("after stop"));  // ignored
  EXPECT_TRUE(jobs.stop().ok());                        // idempotent
}

// No requester is left waiting when the system goes away.
// proves: J2
TEST(JobServiceShutdown, TheSystemsShutdownAnswersEveryJob) {
  auto clock = std::make_shared<troupe::ManualClock>();
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  cfg.clock = clock;
  cfg.log_dead_letters = false;
  auto rec = std::make_shared<Recorder>();
  std::vector<Future<JobOutcome>> fs;
  {
    troupe::ActorSystem sys(cfg);
    auto jobs = JobService::start(sys, base_settings(), translator(), workers(rec));
    ASSERT_TRUE(jobs.ok());
    fs.push_back(jobs->submit({"hang", "running"}));
    for (int i = 0; i < 5; ++i) fs.push_back(jobs->submit({"echo", std::to_string(i)}));
    ASSERT_TRUE(sys.wait_idle(kBound));
  }
  for (auto& f : fs) {
    auto r = await(f);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::shutting_down);
  }
}

// --- bad input ----------------------------------------------------------------------

// proves: X1
TEST_F(JobServiceTest, BadSettingsAreRefusedWithAClearMessage) {
  struct Case {
    std::function<void(JobSettings&)> change;
    std::string message;
  };
  std::vector<Case> cases = {
      {[](JobSettings& s) { s.name = ""; }, "job service: name is empty"},
      {[](JobSettings& s) { s.name = "a|b"; }, "job service 'a|b': name contains '|'"},
      {[](JobSettings& s) { s.workers = 0; }, "job service 'jobs': workers is 0 (at least one FSM worker is needed)"},
      {[](JobSettings& s) { s.queue_capacity = 0; }, "job service 'jobs': queue_capacity is 0"},
      {[](JobSettings& s) { s.default_timeout = 0ms; }, "job service 'jobs': default_timeout must be positive"},
      {[](JobSettings& s) { s.watchdog_limit = -1ms; }, "job service 'jobs': watchdog_limit must be positive"},
      {[](JobSettings& s) { s.watchdog_interval = 0ms; }, "job service 'jobs': watchdog_interval must be positive"},
      {[](JobSettings& s) { s.watchdog_limit = 100ms; },
       "job service 'jobs': default_timeout (100 ms) must be below watchdog_limit (100 ms)"},
      {[](JobSettings& s) { s.max_attempts = 0; }, "job service 'jobs': max_attempts is 0 (1 means no retries)"},
      {[](JobSettings& s) { s.backoff_min = -1ms; }, "job service 'jobs': backoff_min is negative"},
      {[](JobSettings& s) {
         s.backoff_min = 2s;
         s.backoff_max = 1s;
       },
       "job service 'jobs': backoff_max is below backoff_min"},
  };
  for (auto& c : cases) {
    auto s = base_settings();
    c.change(s);
    auto r = JobService::start(system, s, translator(), workers(rec));
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
    EXPECT_EQ(r.error().message(), c.message);
  }
  auto no_translator = JobService::start(system, base_settings(), {}, workers(rec));
  ASSERT_FALSE(no_translator.ok());
  EXPECT_EQ(no_translator.error().message(), "job service 'jobs': no translator");
  auto no_workers = JobService::start(system, base_settings(), translator(), {});
  ASSERT_FALSE(no_workers.ok());
  EXPECT_EQ(no_workers.error().message(), "job service 'jobs': no workers registered");
  JobWorkers empty_fn;
  empty_fn["echo"] = nullptr;
  auto bad_worker = JobService::start(system, base_settings(), translator(), empty_fn);
  ASSERT_FALSE(bad_worker.ok());
  EXPECT_EQ(bad_worker.error().message(), "job service 'jobs': worker kind 'echo' has an empty function");
  EXPECT_EQ(system.stats().actors_live, 0u);  // nothing was started
}

// proves: X1
TEST_F(JobServiceTest, AJobTimeoutThatIsNotPositiveOrNotBelowTheWatchdogLimitIsRefused) {
  auto jobs = start(base_settings());
  auto zero = jobs.submit({"echo", "x"}, 0, 0ms);
  ASSERT_TRUE(zero.ready());
  auto rz = zero.get();
  EXPECT_EQ(rz.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(rz.error().message(), "job timeout must be positive, got 0 ns");
  auto huge = jobs.submit({"echo", "x"}, 0, 10s);
  ASSERT_TRUE(huge.ready());
  auto rh = huge.get();
  EXPECT_EQ(rh.error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(rh.error().message(), "job timeout 10000 ms is not below the watchdog limit 10000 ms of job service 'jobs'");
  EXPECT_EQ(jobs.stats().submitted, 0u);
}

// Under load: several FSMs pull from one queue.
// proves: J1
TEST_F(JobServiceTest, ManyJobsOnManyWorkersAllFinishOnce) {
  auto s = base_settings();
  s.workers = 8;
  auto jobs = start(s);
  std::vector<Future<JobOutcome>> fs;
  for (int i = 0; i < 2000; ++i) fs.push_back(jobs.submit({"echo", std::to_string(i)}, i % 4));
  for (int i = 0; i < 2000; ++i) EXPECT_EQ(outcome(fs[static_cast<std::size_t>(i)]), "succeeded: " + std::to_string(i) + "!");
  settle();
  auto st = jobs.stats();
  EXPECT_EQ(st.succeeded, 2000u);
  EXPECT_EQ(st.idle, 8u);
  EXPECT_EQ(st.queued, 0u);
}

}  // namespace
