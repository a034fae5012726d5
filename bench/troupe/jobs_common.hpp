#pragma once
// What the job service workloads share (jobs.cpp on one node,
// jobs_cluster.cpp on three): the job count, the durable journal, the
// settings, the trivial worker and the outcome count, so every jobs_* row
// runs the same jobs on the same journal and durability.

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "troupe/core.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace troupe_bench::jobs_common {

// Jobs per run (divided by BENCH_SCALE).
inline constexpr long kJobs = 100'000;

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "bench_troupe: jobs: %s\n", what.c_str());
  std::exit(1);
}

// Counts outcomes and sums their outputs; opens `done` at the n-th.
struct Outcomes {
  explicit Outcomes(long n) : target(n) {}
  void add(long value) {
    sum.fetch_add(value, std::memory_order_relaxed);
    if (count.fetch_add(1, std::memory_order_relaxed) + 1 == target) done.set_value();
  }
  // Every job 0..n-1 completed exactly once with its own number.
  void check() const {
    if (sum.load() != target * (target - 1) / 2) die("outcomes do not add up: a job ran twice or not at all");
  }
  const long target;
  std::atomic<long> count{0};
  std::atomic<long> sum{0};
  std::promise<void> done;
};

// The durable journal: SqliteJournal in a fresh temporary directory with
// `durability`: Durability::process_crash by default (no fsync per commit, as
// Redis with appendfsync everysec), Durability::full for the jobs_durable_fsync
// rows (an fsync per commit, as Redis with appendfsync always). The directory
// is removed when this goes, so keep it until the services holding the
// journal have stopped.
class DurableJournal {
 public:
  explicit DurableJournal(troupe::Durability durability = troupe::Durability::process_crash) {
    dir_ = std::filesystem::temp_directory_path() / ("troupe-bench-jobs-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    troupe::SqliteJournalOptions o;
    o.path = (dir_ / "jobs.db").string();
    o.durability = durability;
    auto j = troupe::SqliteJournal::open(o);
    if (!j.ok()) die("cannot open the journal: " + j.error().to_string());
    journal_ = std::move(j).value();
  }
  ~DurableJournal() {
    journal_.reset();  // closed first (the services holding it are gone)
    std::filesystem::remove_all(dir_);
  }
  DurableJournal(const DurableJournal&) = delete;
  DurableJournal& operator=(const DurableJournal&) = delete;

  const std::shared_ptr<troupe::SqliteJournal>& journal() const { return journal_; }

 private:
  std::filesystem::path dir_;
  std::shared_ptr<troupe::SqliteJournal> journal_;
};

// Paused, quiet settings for n jobs whose outcomes go to `outcomes`; the
// worker must succeed with the job's own number (its payload).
inline troupe::JobSettings settings(long n, std::size_t workers, std::shared_ptr<troupe::Journal> journal,
                                    std::shared_ptr<Outcomes> outcomes) {
  troupe::JobSettings s;
  s.name = "bench";
  s.workers = workers;
  s.queue_capacity = static_cast<std::size_t>(n);
  s.journal = std::move(journal);
  s.start_paused = true;
  s.log = false;
  s.on_outcome = [outcomes](troupe::JobId, const troupe::Job& j, const troupe::JobOutcome& o) {
    const auto* ok = std::get_if<troupe::JobSucceeded>(&o);
    if (!ok || ok->output != j.payload) die("job " + j.payload + " did not succeed with its own number");
    outcomes->add(std::atol(ok->output.c_str()));
  };
  return s;
}

// Every job runs the worker "noop", which succeeds at once with its detail
// (the payload).
inline troupe::JobTranslator translator() {
  return [](const troupe::Job& j) {
    return std::optional<troupe::JobWorkerCall>(troupe::JobWorkerCall{"noop", j.payload});
  };
}
inline troupe::JobWorkers workers() {
  troupe::JobWorkers w;
  w["noop"] = [](troupe::JobRun r) { r.succeed(r.detail()); };
  return w;
}

}  // namespace troupe_bench::jobs_common
