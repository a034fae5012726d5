// Job service workloads (the peer is BullMQ, bench/peers/bullmq): 100,000
// trivial jobs are added first, with the workers paused, and then processed.
//
//   jobs_<memory|durable|durable_fsync>_c<1|50>[_prio]
//     memory         — no journal (beside BullMQ on a Redis without
//                      persistence);
//     durable        — SqliteJournal in a fresh temporary directory with
//                      Durability::process_crash (no fsync per commit; beside
//                      BullMQ on a Redis with appendfsync everysec, likewise);
//     durable_fsync  — the same with Durability::full (an fsync per commit;
//                      beside BullMQ on a Redis with appendfsync always,
//                      likewise);
//     c1, c50        — JobSettings::workers, the concurrency;
//     _prio          — priorities cycling 1..5 (0 otherwise).
//
// jobs_cluster_c50 (jobs_cluster.cpp) runs jobs_durable_c50's jobs on a
// cluster-wide job service of three nodes; jobs_common.hpp is what both share.
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

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/report.hpp"
#include "jobs_common.hpp"
#include "troupe/core.hpp"
#include "troupe/patterns/job_service.hpp"

namespace troupe_bench {
namespace {

using jobs_common::die;

struct Workload {
  bool durable = false;
  troupe::Durability durability = troupe::Durability::process_crash;  // when durable
  std::size_t workers = 1;
  bool prio = false;
};

Workload parse(const std::string& name) {
  Workload w;
  std::string rest;
  if (name.rfind("jobs_memory_", 0) == 0) {
    rest = name.substr(12);
  } else if (name.rfind("jobs_durable_fsync_", 0) == 0) {
    w.durable = true;
    w.durability = troupe::Durability::full;
    rest = name.substr(19);
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

}  // namespace

void jobs(const std::string& workload) {
  const Workload w = parse(workload);
  const long n = jobs_common::kJobs / bench::scale();

  std::optional<jobs_common::DurableJournal> durable;  // outlives the service
  if (w.durable) durable.emplace(w.durability);

  auto outcomes = std::make_shared<jobs_common::Outcomes>(n);
  {
    troupe::SystemConfig cfg;
    cfg.threads = 2;
    troupe::ActorSystem sys(cfg);

    auto svc = troupe::JobService::start(
        sys, jobs_common::settings(n, w.workers, durable ? durable->journal() : nullptr, outcomes),
        jobs_common::translator(), jobs_common::workers());
    if (!svc.ok()) die("cannot start the job service: " + svc.error().to_string());
    auto& service = svc.value();

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
    outcomes->check();

    bench::report((workload + "_add").c_str(), static_cast<double>(n) / add_s, "jobs/s");
    bench::report(workload.c_str(), static_cast<double>(n) / run_s, "jobs/s");
    if (auto r = service.stop(); !r.ok()) die(r.error().to_string());
  }
}

}  // namespace troupe_bench
