// co_await on the patterns' futures: a keyed lock, a job and a process,
// awaited in a coroutine handler of an actor (resuming in it) and outside
// actors (sync_wait), with their errors as values.

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "troupe/core.hpp"
#include "troupe/core/task.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/patterns/keyed_lock.hpp"
#include "troupe/patterns/process_manager.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ErrorCode;
using troupe::Job;
using troupe::JobOutcome;
using troupe::JobService;
using troupe::KeyedLock;
using troupe::LockLease;
using troupe::ProcessHandle;
using troupe::ProcessManager;
using troupe::Result;
using troupe::Task;

// A process that completes with n * n at once, or fails for a negative n.
struct Square : troupe::Actor<std::monostate> {
  using result_type = int;
  Square(ProcessHandle<int> h, int v) : done(std::move(h)), n(v) {}
  void on_start() {
    if (n < 0) {
      done.fail(troupe::Error(ErrorCode::invalid_argument, "negative"));
    } else {
      done.complete(n * n);
    }
  }
  void receive(std::monostate&) {}
  ProcessHandle<int> done;
  int n;
};

JobService echo_jobs(troupe::ActorSystem& sys) {
  troupe::JobSettings s;
  s.name = "jobs";
  s.workers = 2;
  s.log = false;
  troupe::JobWorkers w;
  w["echo"] = [](troupe::JobRun r) { r.succeed(r.detail() + "!"); };
  auto translator = [](const Job& j) -> std::optional<troupe::JobWorkerCall> {
    if (j.kind != "echo") return std::nullopt;
    return troupe::JobWorkerCall{"echo", j.payload};
  };
  return JobService::start(sys, s, translator, w).value();
}

std::string outcome_text(const Result<JobOutcome>& r) {
  if (!r.ok()) return std::string(troupe::to_string(r.error().code()));
  if (auto* s = std::get_if<troupe::JobSucceeded>(&*r)) return s->output;
  if (auto* f = std::get_if<troupe::JobFailed>(&*r)) return "failed: " + f->reason;
  return "timed out";
}

struct Report {
  std::string what;
  bool on_actor = false;  // resumed on a runtime thread, not the test's
};

// Awaits the lock, the job and the process in turn, reporting each.
struct User : troupe::Actor<int> {
  User(KeyedLock l, JobService j, ProcessManager<Square> p, troupe::ActorRef<Report> o)
      : lock(std::move(l)), jobs(std::move(j)), squares(std::move(p)), out(std::move(o)) {}
  Task<> receive(int n) {
    Result<int> held = co_await lock.lock("k", [n](const LockLease&) { return n + 1; });
    report(held.ok() ? "lock " + std::to_string(*held) : "lock failed");
    // Jobs built first: GCC 12 mishandles an aggregate temporary with
    // string members inside a co_await expression (doc/coroutines.md).
    Job echo{"echo", std::to_string(n)};
    Result<JobOutcome> job = co_await jobs.submit(std::move(echo));
    report("job " + outcome_text(job));
    Job nobody{"nobody", ""};
    Result<JobOutcome> unknown = co_await jobs.submit(std::move(nobody));
    report("job " + outcome_text(unknown));
    Result<int> sq = co_await squares.submit(n);
    report(sq.ok() ? "square " + std::to_string(*sq) : "square failed");
    Result<int> neg = co_await squares.submit(-n);
    report(neg.ok() ? "negative ok" : "negative " + std::string(troupe::to_string(neg.error().code())));
  }
  void report(std::string what) { out.tell(Report{std::move(what), std::this_thread::get_id() != test_thread}); }
  KeyedLock lock;
  JobService jobs;
  ProcessManager<Square> squares;
  troupe::ActorRef<Report> out;
  std::thread::id test_thread = std::this_thread::get_id();
};

class PatternsCoroutines : public ::testing::Test {
 protected:
  troupe::ActorSystem sys{troupe::SystemConfig{.threads = 2, .log_dead_letters = false}};
  KeyedLock lock = KeyedLock::start(sys, {.name = "accounts"}).value();
  JobService jobs = echo_jobs(sys);
  ProcessManager<Square> squares = ProcessManager<Square>::start(sys, {.name = "squares"}).value();
};

TEST_F(PatternsCoroutines, a_coroutine_handler_awaits_a_lock_a_job_and_a_process_and_resumes_in_its_actor) {
  troupe::testkit::TestProbe<Report> probe(sys);
  auto user = sys.spawn<User>(lock, jobs, squares, probe.ref());
  user.tell(6);
  for (std::string want : {"lock 7", "job 6!", "job failed: ", "square 36", "negative invalid_argument"}) {
    Report r = probe.expect_message(10s);
    EXPECT_EQ(r.what.rfind(want, 0), 0u) << r.what << " is not " << want;
    EXPECT_TRUE(r.on_actor) << r.what;
  }
}

TEST_F(PatternsCoroutines, outside_actors_a_task_awaits_them_and_sync_wait_blocks_for_it) {
  auto body = [&]() -> Task<std::string> {
    Result<int> held = co_await lock.lock("k", [](const LockLease& l) { return l.is_current() ? 1 : 0; });
    Job echo{"echo", "x"};
    Result<JobOutcome> job = co_await jobs.submit(std::move(echo));
    Result<int> sq = co_await squares.submit(3);
    co_return std::to_string(*held) + " " + outcome_text(job) + " " + std::to_string(*sq);
  };
  Result<std::string> r = troupe::sync_wait(body());
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r, "1 x! 9");
}

TEST_F(PatternsCoroutines, a_lock_block_may_be_a_task_turned_into_a_future) {
  troupe::Promise<int> gate;
  auto gate_future = std::make_shared<troupe::Future<int>>(gate.future());
  auto block = [gate_future](const LockLease&) -> troupe::Future<int> {
    auto critical = [](std::shared_ptr<troupe::Future<int>> f) -> Task<int> {
      Result<int> v = co_await std::move(*f);  // holds the key while it waits
      co_return *v * 10;
    };
    return troupe::into_future(critical(gate_future));
  };
  auto first = lock.lock("k", block);
  auto second = lock.lock("k", [](const LockLease&) { return 2; });
  EXPECT_FALSE(second.wait_for(50ms));  // the key is held by the suspended task
  gate.set_value(4);
  EXPECT_EQ(*first.get(), 40);
  EXPECT_EQ(*second.get(), 2);
}

}  // namespace
