// Job service workloads (the peer is BullMQ on Redis with appendfsync
// everysec): 100,000 trivial jobs are added first, with the workers paused,
// and then processed.
//
//   jobs_<memory|durable>_c<1|50>[_prio]
//     memory   — no journal;
//     durable  — SqliteJournal in a fresh temporary directory with
//                Durability::process_crash (no fsync per commit, as Redis
//                with appendfsync everysec);
//     c1, c50  — JobSettings::workers, the concurrency;
//     _prio    — priorities cycling 1..5 (0 otherwise).
//
// Each job (payload: its number n) is added with enqueue(), which answers
// once the job is accepted (journaled first when durable), as BullMQ's
// Queue.add answers once Redis has the job. The worker succeeds at once with
// n as its output; outcomes are counted in on_outcome (after their journal
// write when durable), as BullMQ's worker counts "completed". As on the peer,
// every job must complete exactly once with its own n (checked by the sum).
//
// Metrics, in jobs/s: "<workload>_add" — adding every job until the last
// acceptance; "<workload>" — from resume() (starting the workers) until the
// 100,000th outcome.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/report.hpp"
#include "troupe/core.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace troupe_bench {
namespace {

constexpr long kJobs = 100'000;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_troupe: jobs: %s\n", what.c_str());
  std::exit(1);
}

struct Workload {
  bool durable = false;
  std::size_t workers = 1;
  bool prio = false;
};

Workload parse(const std::string& name) {
  Workload w;
  std::string rest;
  if (name.rfind("jobs_memory_", 0) == 0) {
    rest = name.substr(12);
  } else if (name.rfind("jobs_durable_", 0) == 0) {
    w.durable = true;
    rest = name.substr(13);
  } else {
    die("unknown workload '" + name + "'");
  }
  if (rest.size() > 5 && rest.compare(rest.size() - 5, 5, "_prio") == 0) {
    w.prio = true;
    rest.resize(rest.size() - 5);
  }
  if (rest == "c1") {
    w.workers = 1;
  } else if (rest == "c50") {
    w.workers = 50;
  } else {
    die("unknown concurrency in workload '" + name + "' (c1 or c50)");
  }
  return w;
}

// Counts outcomes and sums their outputs; opens `done` at the n-th.
struct Outcomes {
  explicit Outcomes(long n) : target(n) {}
  void add(long value) {
    sum.fetch_add(value, std::memory_order_relaxed);
    if (count.fetch_add(1, std::memory_order_relaxed) + 1 == target) done.set_value();
  }
  const long target;
  std::atomic<long> count{0};
  std::atomic<long> sum{0};
  std::promise<void> done;
};

}  // namespace

void jobs(const std::string& workload) {
  const Workload w = parse(workload);
  const long n = kJobs / bench::scale();

  std::filesystem::path dir;
  std::shared_ptr<troupe::SqliteJournal> journal;
  if (w.durable) {
    dir = std::filesystem::temp_directory_path() / ("troupe-bench-jobs-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    troupe::SqliteJournalOptions o;
    o.path = (dir / "jobs.db").string();
    o.durability = troupe::Durability::process_crash;
    auto j = troupe::SqliteJournal::open(o);
    if (!j.ok()) die("cannot open the journal: " + j.error().to_string());
    journal = std::move(j).value();
  }

  auto outcomes = std::make_shared<Outcomes>(n);
  {
    troupe::SystemConfig cfg;
    cfg.threads = 2;
    troupe::ActorSystem sys(cfg);

    troupe::JobSettings s;
    s.name = "bench";
    s.workers = w.workers;
    s.queue_capacity = static_cast<std::size_t>(n);
    s.journal = journal;
    s.start_paused = true;
    s.log = false;
    s.on_outcome = [outcomes](troupe::JobId, const troupe::Job& j, const troupe::JobOutcome& o) {
      const auto* ok = std::get_if<troupe::JobSucceeded>(&o);
      if (!ok || ok->output != j.payload) die("job " + j.payload + " did not succeed with its own number");
      outcomes->add(std::atol(ok->output.c_str()));
    };
    troupe::JobWorkers workers;
    workers["noop"] = [](troupe::JobRun r) { r.succeed(r.detail()); };
    auto svc = troupe::JobService::start(
        sys, s,
        [](const troupe::Job& j) { return std::optional<troupe::JobWorkerCall>(troupe::JobWorkerCall{"noop", j.payload}); },
        std::move(workers));
    if (!svc.ok()) die("cannot start the job service: " + svc.error().to_string());
    auto& service = svc.value();
    journal.reset();  // the service holds it now

    std::vector<troupe::Future<troupe::JobId>> accepted;
    accepted.reserve(static_cast<std::size_t>(n));
    bench::Stopwatch add;
    for (long i = 0; i < n; ++i) {
      const int prio = w.prio ? static_cast<int>(1 + i % 5) : 0;
      accepted.push_back(service.enqueue(troupe::Job{"noop", std::to_string(i)}, prio));
    }
    for (auto& f : accepted) {
      auto r = f.get();
      if (!r.ok()) die("a job was not accepted: " + r.error().to_string());
    }
    const double add_s = add.seconds();

    bench::Stopwatch run;
    service.resume();
    outcomes->done.get_future().wait();
    const double run_s = run.seconds();
    if (outcomes->sum.load() != n * (n - 1) / 2) die("outcomes do not add up: a job ran twice or not at all");

    bench::report((workload + "_add").c_str(), static_cast<double>(n) / add_s, "jobs/s");
    bench::report(workload.c_str(), static_cast<double>(n) / run_s, "jobs/s");
    if (auto r = service.stop(); !r.ok()) die(r.error().to_string());
  }
  if (w.durable) std::filesystem::remove_all(dir);
}

}  // namespace troupe_bench
