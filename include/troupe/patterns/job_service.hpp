#pragma once
// FSM job service (SPEC J1-J6).
//
// Jobs are small requests ("resize image 42") that some registered worker
// function carries out. The service runs them the way doradilla's FSM
// workflow does, with the gaps of that design closed:
//
//   submit() ──> proxy ──> priority queue <──pull── FSM worker (Idle/Active) ──> worker function
//                (ids,       (highest first,          │ translator: job -> worker kind + detail
//                 journal)    FIFO per priority)      └─ outcome ──> requester; FSM back to Idle
//
//   auto jobs = troupe::JobService::start(system, settings,
//       [](const troupe::Job& j) -> std::optional<troupe::JobWorkerCall> {
//         if (j.kind == "resize") return troupe::JobWorkerCall{"images", j.payload};
//         return std::nullopt;  // unknown kind: the job fails, naming it
//       },
//       {{"images", [](troupe::JobRun run) { run.succeed(resize(run.detail())); }}});
//   troupe::Future<troupe::JobOutcome> f = jobs->submit({"resize", "42"}, /*priority=*/5);
//
// What the service guarantees:
//   J1  A job goes proxy -> queue -> an Idle FSM worker, which *pulls* one
//       job at a time (the queue never pushes work to a busy worker), asks
//       the translator which worker kind runs it, calls that worker function,
//       hands the outcome to the requester and returns to Idle.
//   J2  Every attempt has a timeout, counted from when its FSM starts it.
//       When it expires the attempt ends with JobTimedOut and the FSM is
//       Idle again, whether or not the worker ever completes; a later
//       completion of that attempt is ignored. Nothing blocks waiting.
//   J3  A worker that fails or throws, a job kind the translator does not
//       know, and a worker kind nobody registered all give JobFailed with a
//       reason that names the cause.
//   J4  Higher priority first; first in, first out within a priority.
//   J5  A watchdog checks every worker slot periodically; a slot whose FSM
//       has been Active for longer than watchdog_limit (its worker function
//       blocks the thread, or the FSM is otherwise stuck) is reset: the job
//       is answered JobTimedOut (or retried) and a fresh, Idle FSM takes the
//       slot. The stuck FSM stops as soon as its thread comes back.
//   J6  With a journal, a job is accepted only once it is journaled
//       (group-committed with every job that arrived meanwhile); its outcome
//       is journaled before anyone is told. After a restart every accepted
//       job without a journaled outcome runs again (at least once) and its
//       outcome goes to settings.on_outcome.
//
// Also: retries with exponential back-off up to max_attempts, a bounded
// dead-letter list of jobs that finally failed, a bounded queue that refuses
// at once (buffer_overflow), and stop()/system shutdown answering every
// queued and running job with shutting_down. See doc/jobs.md.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

// Identifies an accepted job within its service; assigned in acceptance
// order from 1. With a journal ids keep increasing across restarts.
using JobId = std::uint64_t;

// What a requester asks for: a kind the translator understands and an
// opaque payload. Plain value type.
struct Job {
  std::string kind;
  std::string payload;

  friend bool operator==(const Job&, const Job&) = default;
};

// The typed outcome of a job. Plain value types.
struct JobSucceeded {
  std::string output;
  friend bool operator==(const JobSucceeded&, const JobSucceeded&) = default;
};
struct JobFailed {
  std::string reason;
  friend bool operator==(const JobFailed&, const JobFailed&) = default;
};
struct JobTimedOut {
  friend bool operator==(const JobTimedOut&, const JobTimedOut&) = default;
};
using JobOutcome = std::variant<JobSucceeded, JobFailed, JobTimedOut>;

// The translator's answer: which registered worker runs a job, and the
// detail that worker receives (JobRun::detail()). Plain value type.
struct JobWorkerCall {
  std::string worker_kind;
  std::string detail;
};

class JobRun;
class JobService;

// Maps a job to a worker call; nullopt means "no worker for this kind"
// (the job fails, J3). Called on runtime threads, possibly concurrently: it
// must be thread-safe and must not block. An exception fails the job.
using JobTranslator = std::function<std::optional<JobWorkerCall>(const Job&)>;
// Runs one attempt of a job. It may complete the run before returning or
// keep the JobRun and complete it later from any thread (asynchronous work).
// It is called on a runtime thread: long or blocking work belongs on the
// worker's own threads. An exception fails the attempt with its what().
using JobWorker = std::function<void(JobRun)>;
// Worker functions by worker kind.
using JobWorkers = std::map<std::string, JobWorker, std::less<>>;

namespace detail {
struct JobAttempt;
class JobBackend;
}  // namespace detail

// The right to finish one attempt of one job, given to a worker function.
// Copyable (copies share the attempt); all members are thread-safe. The
// first of succeed() / fail() / the attempt's timeout / a watchdog reset /
// the service stopping decides the attempt; everything later is ignored
// (and counted as a late completion if it was a succeed() or fail()).
// Holding a JobRun keeps a small shared block alive, not the service.
class JobRun {
 public:
  JobRun(const JobRun& o) noexcept;
  JobRun(JobRun&& o) noexcept;
  JobRun& operator=(const JobRun& o) noexcept;
  JobRun& operator=(JobRun&& o) noexcept;
  ~JobRun();

  // The translator's detail for this job.
  const std::string& detail() const noexcept;
  JobId job_id() const noexcept;
  // 1 for the first attempt, 2 for the first retry, ...
  std::uint32_t attempt() const noexcept;

  // Ends the attempt. True if this call decided it; false if the attempt
  // had already ended (timed out, reset by the watchdog, stopped, or
  // completed before).
  bool succeed(std::string output) const;
  bool fail(std::string reason) const;
  // True until the attempt has ended, whoever ended it.
  bool pending() const noexcept;

 private:
  friend struct detail::JobAttempt;
  explicit JobRun(detail::JobAttempt* a) noexcept : a_(a) {}
  detail::JobAttempt* a_;
};

// How a service behaves. start() validates every field and refuses
// unusable values with invalid_argument and a message naming the field.
// Plain value type; the service keeps its own copy.
struct JobSettings {
  // Names the service's actors and, with a journal, its persistence id
  // ("jobs|<name>"). Non-empty, no '|'.
  std::string name{};
  // FSM workers, i.e. jobs running at once. At least 1.
  std::size_t workers = 4;
  // Jobs submitted but not yet started (waiting for the journal, queued or
  // waiting out a retry back-off). A submit beyond it is refused at once
  // with buffer_overflow. At least 1.
  std::size_t queue_capacity = 100000;
  // Timeout of each attempt of a job submitted without its own timeout.
  // Positive, and below watchdog_limit.
  Duration default_timeout = std::chrono::seconds(30);
  // An FSM Active for longer than this is stuck: the watchdog resets its
  // slot (J5). Must exceed every job's timeout (submit refuses timeouts that
  // do not stay below it): the watchdog is the net under the timeout, never
  // a shorter timeout of its own.
  Duration watchdog_limit = std::chrono::seconds(60);
  // How often the watchdog looks. Positive.
  Duration watchdog_interval = std::chrono::seconds(1);
  // Attempts per job, the first included. 1 = no retries.
  std::uint32_t max_attempts = 1;
  // Back-off before retry k (k = 1, 2, ...): backoff_min * 2^(k-1), at
  // most backoff_max. 0 <= backoff_min <= backoff_max.
  Duration backoff_min = std::chrono::milliseconds(100);
  Duration backoff_max = std::chrono::seconds(10);
  // Jobs whose final outcome was not a success that dead_letters() keeps
  // (the most recent ones); older ones are dropped and counted. May be 0.
  std::size_t dead_letter_capacity = 1000;
  // Null: jobs live in memory only. Otherwise accepted jobs and their
  // outcomes are journaled under "jobs|<name>" and survive a restart (J6).
  // One service per persistence id at a time.
  std::shared_ptr<Journal> journal{};
  // Receives the outcome of every job that has no requester waiting for
  // it: jobs added with enqueue() and jobs recovered from the journal. Runs
  // on runtime threads, possibly concurrently: thread-safe, short, no
  // blocking. Exceptions are dropped. May be empty (outcomes are then only
  // counted and journaled).
  std::function<void(JobId, const Job&, const JobOutcome&)> on_outcome{};
  // Start with the queue paused: jobs are accepted but none starts until
  // resume() (e.g. to let recovered jobs wait, or to fill a queue first).
  bool start_paused = false;
  // Log watchdog resets and journal failures (warn, component patterns).
  bool log = true;
};

// One priority level of the queue, as JobStats reports it. Plain value type.
struct JobQueueLevel {
  int priority = 0;
  std::uint64_t depth = 0;
  friend bool operator==(const JobQueueLevel&, const JobQueueLevel&) = default;
};

// Counters of one service; each exact, the set not a snapshot. Outcome
// counters count final outcomes (after retries); `retried` counts attempts
// that failed or timed out and were retried. Plain value type, a copy.
struct JobStats {
  std::vector<JobQueueLevel> queued_by_priority;  // highest first; levels holding jobs
  std::uint64_t queued = 0;          // ready to run (sum of the levels)
  std::uint64_t waiting_retry = 0;   // waiting out a back-off
  std::uint64_t active = 0;          // worker slots running a job
  std::uint64_t idle = 0;            // worker slots free
  std::uint64_t submitted = 0;       // submit()/enqueue() calls that passed the checks
  std::uint64_t accepted = 0;        // jobs that entered the queue (journaled first if durable)
  std::uint64_t recovered = 0;       // accepted before a restart, re-queued at start
  std::uint64_t succeeded = 0;
  std::uint64_t failed = 0;
  std::uint64_t timed_out = 0;
  std::uint64_t retried = 0;
  std::uint64_t dead_lettered = 0;
  std::uint64_t dead_letters_dropped = 0;  // pushed out of the bounded list
  std::uint64_t refused = 0;               // buffer_overflow at submit
  std::uint64_t watchdog_resets = 0;
  std::uint64_t late_completions = 0;      // succeed()/fail() after the attempt had ended
  std::uint64_t journal_appends = 0;       // batches written (group commits)
  std::uint64_t journal_failures = 0;
};

// A job whose final outcome was a failure or a timeout, as dead_letters()
// reports it. Plain value type, a copy.
struct JobDeadLetter {
  JobId id = 0;
  Job job;
  int priority = 0;
  std::uint32_t attempts = 0;
  std::string reason;  // the last failure's reason, or what timed out
};

namespace detail {
// What a JobService handle calls: the service of this process, or another
// implementation of the same contract (troupe::cluster::start_job_service,
// a queue sharded over the nodes of a cluster). Each member has the
// meaning of the JobService member of the same name. Implementations are
// thread-safe.
class JobBackend {
 public:
  virtual ~JobBackend() = default;
  virtual Future<JobOutcome> submit(Job job, int priority, std::optional<Duration> timeout) = 0;
  virtual Future<JobId> enqueue(Job job, int priority, std::optional<Duration> timeout) = 0;
  virtual void pause() = 0;
  virtual void resume() = 0;
  virtual JobStats stats() const = 0;
  virtual std::vector<JobDeadLetter> dead_letters() const = 0;
  virtual Result<void> stop(Duration bound) = 0;
  virtual Result<void> health() const = 0;
  virtual const JobSettings& settings() const noexcept = 0;
};
// A handle over another backend (not null).
JobService make_job_service(std::shared_ptr<JobBackend> backend);
// The checks JobService::start makes of its arguments (invalid_argument,
// naming the field), for backends that start services later.
Result<void> check_job_settings(const JobSettings& settings, const JobTranslator& translator,
                                const JobWorkers& workers);
}  // namespace detail

// A running job service. start() gives one over the service of this
// process: a proxy actor, a priority-queue actor, `workers` FSM actors and a
// watchdog actor in one ActorSystem. detail::make_job_service gives one over
// another detail::JobBackend; every member forwards to the backend.
//
// Ownership: JobService is a handle; copies share one backend, i.e. one
// service. The actors keep the service's state alive while they run, so
// dropping every handle does not stop it: stop() or the system's shutdown
// does. The service keeps its journal (shared_ptr) until its actors have
// stopped.
// Thread safety: every member is thread-safe. stop() blocks (bounded) and
// must not be called from an actor's handler.
class JobService {
 public:
  // Validates `settings`, `translator` and `workers` (invalid_argument),
  // recovers unfinished jobs from settings.journal if there is one
  // (corrupt_record for a row that does not decode, recovery_failed if the
  // journal cannot be read; nothing is started then) and starts the
  // actors. Blocks while it reads the journal: call it from outside actors.
  static Result<JobService> start(ActorSystem& system, JobSettings settings, JobTranslator translator,
                                  JobWorkers workers);

  // Submits a job; the future completes with its outcome. Refused at once
  // (the future is already complete) with buffer_overflow when
  // queue_capacity jobs are waiting, invalid_argument for a timeout that is
  // not positive or not below watchdog_limit, shutting_down once stopping.
  // With a journal: journal_failed if the job could not be journaled;
  // outcomes arrive once journaled. A job still queued or running when the
  // service stops is answered shutting_down (with a journal it runs again
  // after a restart, its outcome going to on_outcome).
  Future<JobOutcome> submit(Job job, int priority = 0, std::optional<Duration> timeout = std::nullopt) const;

  // Like submit(), but answers as soon as the job is accepted (queued;
  // journaled first with a journal) with its id. The outcome goes to
  // settings.on_outcome.
  Future<JobId> enqueue(Job job, int priority = 0, std::optional<Duration> timeout = std::nullopt) const;

  // Stops handing jobs to workers (running ones finish) / starts again.
  void pause() const;
  void resume() const;

  JobStats stats() const;
  // The bounded dead-letter list, oldest first.
  std::vector<JobDeadLetter> dead_letters() const;

  // Stops taking jobs; answers every queued job and every running attempt
  // with shutting_down (a worker's later completion is ignored); writes the
  // outcomes already decided to the journal; stops the actors. Waits (real
  // time, at most `bound`) for the proxy and queue to finish; an FSM whose
  // worker blocks its thread stops when the thread comes back. The actor
  // system's shutdown does this first on its own. Idempotent.
  Result<void> stop(Duration bound = std::chrono::seconds(10)) const;

  // Whether the service runs as it should. An error once a fault stopped
  // it for good (journal_conflict: another writer appended to its log, so
  // nothing it accepts could be stored); every later submit()/enqueue() is
  // refused with that error too. A stop() asked for is not a fault.
  Result<void> health() const;

  const JobSettings& settings() const noexcept;

 private:
  friend JobService detail::make_job_service(std::shared_ptr<detail::JobBackend> backend);
  explicit JobService(std::shared_ptr<detail::JobBackend> backend) noexcept : backend_(std::move(backend)) {}
  std::shared_ptr<detail::JobBackend> backend_;  // never null
};

}  // namespace troupe
