// The process the durable-job crash tests (job_crash.test.cpp) kill with
// SIGKILL: a durable JobService on a SQLite journal, one worker slot, whose
// every step is one line appended (O_APPEND, one write(2) each, so lines
// from successive processes keep their order) to a side file:
//
//   accepted <id> <pid>          enqueue() answered: the job is journaled
//   start <id> <attempt> <pid>   the worker function began a run
//   done <id> <pid>              the run's work is over; its outcome is not
//                                yet given to the service (--after-done-ms)
//   outcome <id> <pid> <text>    on_outcome: the outcome is journaled
//   recovered <n> <pid>          at start: jobs re-queued from the journal
//
//   job_crash_node --id X --journal FILE --side FILE [--enqueue N]
//                  [--work-ms 300] [--after-done-ms 300]
//
// Prints "READY 0" once started (and its N jobs enqueued), then runs until
// killed.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "troupe/core.hpp"
#include "troupe/patterns/job_service.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

using namespace troupe;

std::string arg(int argc, char** argv, const char* name, const char* fallback = nullptr) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  if (!fallback) {
    std::fprintf(stderr, "job_crash_node: missing %s\n", name);
    std::exit(2);
  }
  return fallback;
}

int g_side = -1;
const std::string g_pid = std::to_string(getpid());

void side(const std::string& line) {
  std::string l = line + "\n";
  if (::write(g_side, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::abort();
}

std::string describe(const JobOutcome& o) {
  return match(
      o, [](const JobSucceeded& s) { return "succeeded " + s.output; },
      [](const JobFailed& f) { return "failed " + f.reason; }, [](const JobTimedOut&) { return std::string("timed-out"); });
}

}  // namespace

int main(int argc, char** argv) {
  const std::string journal_path = arg(argc, argv, "--journal");
  const std::string side_path = arg(argc, argv, "--side");
  const int jobs_to_enqueue = std::atoi(arg(argc, argv, "--enqueue", "0").c_str());
  const auto work = std::chrono::milliseconds(std::atoi(arg(argc, argv, "--work-ms", "300").c_str()));
  const auto after_done = std::chrono::milliseconds(std::atoi(arg(argc, argv, "--after-done-ms", "300").c_str()));

  g_side = ::open(side_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (g_side < 0) {
    std::fprintf(stderr, "job_crash_node: cannot open %s: %s\n", side_path.c_str(), std::strerror(errno));
    return 2;
  }

  SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  ActorSystem system(std::move(cfg));
  SqliteJournalOptions jo;
  jo.path = journal_path;
  jo.durability = Durability::process_crash;
  auto journal = SqliteJournal::open(jo);
  if (!journal.ok()) {
    std::fprintf(stderr, "job_crash_node: %s\n", journal.error().to_string().c_str());
    return 1;
  }

  JobSettings s;
  s.name = "crash";
  s.workers = 1;
  s.default_timeout = std::chrono::seconds(30);
  s.watchdog_limit = std::chrono::seconds(60);
  s.journal = journal.value();
  s.on_outcome = [](JobId id, const Job&, const JobOutcome& o) {
    side("outcome " + std::to_string(id) + " " + g_pid + " " + describe(o));
  };
  JobWorkers workers;
  // The work runs on a thread of its own, as a worker function's long work should.
  workers["work"] = [work, after_done](JobRun run) {
    side("start " + std::to_string(run.job_id()) + " " + std::to_string(run.attempt()) + " " + g_pid);
    std::thread([run, work, after_done] {
      std::this_thread::sleep_for(work);
      side("done " + std::to_string(run.job_id()) + " " + g_pid);
      std::this_thread::sleep_for(after_done);
      run.succeed("ran " + run.detail());
    }).detach();
  };
  auto jobs = JobService::start(
      system, s, [](const Job& j) { return std::optional<JobWorkerCall>(JobWorkerCall{j.kind, j.payload}); },
      std::move(workers));
  if (!jobs.ok()) {
    std::fprintf(stderr, "job_crash_node: %s\n", jobs.error().to_string().c_str());
    return 1;
  }
  side("recovered " + std::to_string(jobs->stats().recovered) + " " + g_pid);
  for (int i = 1; i <= jobs_to_enqueue; ++i) {
    jobs->enqueue({"work", "job-" + std::to_string(i)}).then([](Result<JobId> r) {
      if (r.ok()) side("accepted " + std::to_string(r.value()) + " " + g_pid);
    });
  }
  std::printf("READY 0\n");
  std::fflush(stdout);
  for (;;) pause();
}
