#pragma once
// Private to the job service (src/patterns/job_*.cpp): the values that travel
// between its actors, the state they share (JobCore, JobSlot, JobAttempt)
// and the helpers they all use. The actors are in job_fsm.cpp (FSM workers,
// watchdog), job_queue.cpp (priority queue) and job_journal.cpp (proxy,
// journal format, recovery); JobCore's members in job_core.cpp; start() and
// the handle in job_service.cpp. See include/troupe/patterns/job_service.hpp
// for the contract and doc/jobs.md for the design and the journal format.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/log.hpp"
#include "troupe/patterns/job_service.hpp"

namespace troupe::detail {

// ---------------------------------------------------------------------------
// Values that travel between the actors

// A requester's reply target. Dropping it unanswered (a queue or proxy that
// stops with the job inside, a message that became a dead letter) answers
// shutting_down, so no path can leave a requester waiting forever.
template <class R>
class JobAnswer {
 public:
  JobAnswer() = default;
  explicit JobAnswer(Promise<R> p) : p_(std::move(p)) {}
  JobAnswer(JobAnswer&& o) noexcept : p_(std::move(o.p_)) { o.p_.reset(); }
  JobAnswer& operator=(JobAnswer&& o) noexcept {
    if (this != &o) {
      drop();
      p_ = std::move(o.p_);
      o.p_.reset();
    }
    return *this;
  }
  JobAnswer(const JobAnswer&) = delete;
  JobAnswer& operator=(const JobAnswer&) = delete;
  ~JobAnswer() { drop(); }

  explicit operator bool() const noexcept { return p_.has_value(); }
  void value(R v) {
    if (p_) {
      p_->set_value(std::move(v));
      p_.reset();
    }
  }
  void error(Error e) {
    if (p_) {
      p_->set_error(std::move(e));
      p_.reset();
    }
  }

 private:
  void drop() noexcept {
    if (p_ && p_->pending()) {
      try {
        p_->set_error(Error(ErrorCode::shutting_down, "the job service stopped before the job finished"));
      } catch (...) {
        // out of memory for the message: the promise's own drop answers no_reply
      }
    }
    p_.reset();
  }
  std::optional<Promise<R>> p_;
};

// One job on its way through the service.
struct JobRecord {
  JobId id = 0;
  int priority = 0;
  std::uint32_t attempts = 0;    // attempts started so far
  Duration timeout{};            // per attempt
  std::uint64_t accept_seq = 0;  // journal row that accepted it (0: not journaled)
  Job job;
  JobAnswer<JobOutcome> reply;   // empty: report to settings.on_outcome
};

// Messages into an FSM worker.
struct FsmAssign {
  JobRecord rec;
};
struct FsmDone {
  std::uint64_t seq;  // the attempt a completion from another thread ended
};
struct FsmTick {};
using FsmMsg = std::variant<FsmAssign, FsmDone, FsmTick>;

// Messages into the priority queue.
struct QAccepted {
  std::vector<JobRecord> recs;
};
struct QPull {
  ActorRef<FsmMsg> fsm;
};
struct QRetry {
  JobRecord rec;
  Duration delay{};
};
struct QRetryTick {};
struct QPause {
  bool paused;
};
struct QStop {};
using QueueMsg = std::variant<QAccepted, QPull, QRetry, QRetryTick, QPause, QStop>;

// Messages into the proxy.
struct PSubmit {
  JobRecord rec;
  JobAnswer<JobId> ack;
};
struct PFlush {};
struct PAppended {
  Result<void> result;
};
struct PFinished {
  JobRecord rec;
  JobOutcome outcome;
};
struct PDeleted {
  Result<void> result;
  std::uint64_t to = 0;
};
struct PStop {};
using ProxyMsg = std::variant<PSubmit, PFlush, PAppended, PFinished, PDeleted, PStop>;

struct WatchdogTick {};

// ---------------------------------------------------------------------------
// Shared state

// One accepted row of the journal and how many of its jobs have no
// journaled outcome yet.
struct JobRow {
  std::uint64_t seq = 0;
  std::uint64_t unfinished = 0;
};

// Where the proxy starts: from the journal's recovery, or fresh.
struct JobJournalState {
  JobId next_id = 1;
  std::uint64_t next_seq = 1;
  std::uint64_t deleted_to = 0;
  std::uint64_t last_accept_seq = 0;
  std::deque<JobRow> rows;
};

// A worker slot: the FSM that serves it now and the attempt it runs, for
// the watchdog and stop(). `gen` changes when the watchdog gives the slot
// to a fresh FSM; an FSM whose generation is no longer the slot's is
// retired and stops.
struct JobSlot {
  std::mutex mu;
  JobAttempt* current = nullptr;  // the FSM's; valid while set (guarded by mu)
  TimePoint since{};
  std::atomic<std::uint64_t> gen{0};
  ActorRef<FsmMsg> fsm;
};

inline void job_bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

struct JobCore {
  enum : int { kQueueDown = 1, kProxyDown = 2 };

  ActorSystem* system = nullptr;
  std::weak_ptr<JobCore> self;
  JobSettings settings;
  JobTranslator translator;
  std::unordered_map<std::string, JobWorker> workers;
  std::string pid;  // "jobs|<name>"
  bool durable = false;

  ActorRef<ProxyMsg> proxy;
  ActorRef<QueueMsg> queue;
  ActorRef<WatchdogTick> watchdog;
  std::vector<std::unique_ptr<JobSlot>> slots;
  JobJournalState journal_state;  // taken by the proxy when it starts

  std::atomic<bool> stopping{false};
  // Jobs submitted and not yet started; the queue_capacity bound.
  alignas(64) std::atomic<std::int64_t> backlog{0};
  alignas(64) std::atomic<std::uint64_t> submitted{0}, refused{0};
  alignas(64) std::atomic<std::uint64_t> accepted{0}, recovered{0}, succeeded{0}, failed{0}, timed_out{0},
      retried{0}, dead_lettered{0}, watchdog_resets{0}, late_completions{0}, journal_appends{0},
      journal_failures{0}, waiting_retry{0};

  // Queue depth per priority: the queue actor owns the map's shape and
  // writes the depths; stats() reads them under the lock.
  std::mutex levels_mu;
  std::map<int, std::atomic<std::uint64_t>, std::greater<>> levels;

  std::mutex dead_mu;
  std::deque<JobDeadLetter> dead;
  std::uint64_t dead_dropped = 0;

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  int down = 0;

  // The error that stopped the service, if one did (health()).
  mutable std::mutex failure_mu;
  std::optional<Error> failure;

  void log(const std::string& what) const {
    if (settings.log) log::warn(log::Component::patterns, what, {{"job_service", settings.name}});
  }

  Duration backoff_for(std::uint32_t failed_attempt) const noexcept {
    Duration d = settings.backoff_min;
    for (std::uint32_t k = 1; k < failed_attempt && d < settings.backoff_max; ++k) {
      d = d > settings.backoff_max / 2 ? settings.backoff_max : d * 2;
    }
    return std::min(d, settings.backoff_max);
  }

  const JobWorker* find_worker(const std::string& kind) const {
    auto it = workers.find(kind);
    return it == workers.end() ? nullptr : &it->second;
  }

  void finish(JobRecord&& rec, JobOutcome&& out, bool may_retry, std::string_view why = {});
  void deliver(JobRecord& rec, JobOutcome&& out);
  void add_dead_letter(const JobRecord& rec, const JobOutcome& out, std::string_view why);
  ActorRef<FsmMsg> spawn_fsm(std::size_t slot, std::uint64_t gen);
  void watchdog_scan(TimePoint now);
  void begin_stop();
  // A fault the service cannot go on after (another writer in its journal
  // log): remembered for health() and every later submit, logged, and the
  // service stops. The first fault wins.
  void fail(Error e);
  std::optional<Error> failed_with() const {
    std::lock_guard lk(failure_mu);
    return failure;
  }
  bool wait_stopped(Duration bound);
  void note_down(int which) {
    std::lock_guard lk(stop_mu);
    down |= which;
    stop_cv.notify_all();
  }
  // Admission on the caller's thread: stopping, timeout, capacity.
  Result<Duration> admit(std::optional<Duration> timeout);
  void send(JobRecord&& rec, JobAnswer<JobId>&& ack);
};

// One attempt of one job: the record (owned by whoever claims the attempt),
// the claim flag that makes the first ending win, and what JobRun reads.
// An FSM reuses its attempt object for the next job when nobody else holds
// it, so a worker that completes at once costs no allocation.
struct JobAttempt {
  enum : std::uint8_t { kDetached = 0, kInCall = 1, kDoneInCall = 2 };

  JobAttempt(std::weak_ptr<JobCore> c, ActorRef<FsmMsg> f) : core(std::move(c)), fsm(std::move(f)) {}

  void retain() noexcept { refs.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept {
    if (refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  static JobRun run_of(JobAttempt* a) noexcept {
    a->retain();
    return JobRun(a);
  }

  // Ends the attempt with `out` if nothing ended it before. The FSM learns
  // of it without a message when it happens inside the worker call (the
  // common, synchronous case), else through FsmDone.
  bool complete(JobOutcome&& out, bool from_user) {
    if (claimed.exchange(true, std::memory_order_acq_rel)) {
      if (from_user) {
        if (auto c = core.lock()) job_bump(c->late_completions);
      }
      return false;
    }
    auto c = core.lock();
    if (!c) {
      // Unreachable while the service runs (stopping claims every attempt);
      // the record answers shutting_down as it goes.
      JobRecord dropped = std::move(record);
      return false;
    }
    c->finish(std::move(record), std::move(out), true);
    std::uint8_t expected = kInCall;
    if (!phase.compare_exchange_strong(expected, kDoneInCall, std::memory_order_acq_rel)) {
      (void)fsm.tell(FsmDone{seq});
    }
    return true;
  }

  std::atomic<std::uint32_t> refs{1};
  std::atomic<bool> claimed{true};
  std::atomic<std::uint8_t> phase{kDetached};
  // Weak: a JobRun a worker keeps must not keep the service (and its
  // journal) alive after it has stopped.
  std::weak_ptr<JobCore> core;
  ActorRef<FsmMsg> fsm;
  // Set by the FSM before the worker call; read-only while anyone else
  // holds the attempt.
  std::uint64_t seq = 0;
  JobId id = 0;
  std::uint32_t attempt = 0;
  std::string detail;
  JobRecord record;
};

inline std::shared_ptr<JobCore> lock_job_core(const std::weak_ptr<JobCore>& w) {
  auto c = w.lock();
  if (!c) throw std::logic_error("job service already destroyed");
  return c;
}

inline std::string job_ms(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

// The service's actors, spawned by JobService::start: the priority queue
// (job_queue.cpp), the proxy (job_journal.cpp) and the watchdog
// (job_fsm.cpp). The FSMs are JobCore::spawn_fsm's.
ActorRef<QueueMsg> spawn_job_queue(ActorSystem& system, std::string name, const std::weak_ptr<JobCore>& core);
ActorRef<ProxyMsg> spawn_job_proxy(ActorSystem& system, std::string name, const std::weak_ptr<JobCore>& core);
ActorRef<WatchdogTick> spawn_job_watchdog(ActorSystem& system, std::string name,
                                          const std::weak_ptr<JobCore>& core);

// Recovery at start (J6, job_journal.cpp): the jobs of the journal without
// a journaled outcome; fills core.journal_state.
Result<std::vector<JobRecord>> recover_jobs(JobCore& core);
// The layout of the journal's rows (doc/jobs.md, "Journal format"):
// written by the proxy (job_journal.cpp), read by decode_job_rows
// (job_rows.cpp).
namespace job_rows {
inline constexpr std::string_view kAcceptedType = "job.accepted";
inline constexpr std::string_view kFinishedType = "job.finished";
inline constexpr std::uint32_t kFormatVersion = 1;
// An outcome's tag in a finished row.
inline constexpr std::uint8_t kTagSucceeded = 0, kTagFailed = 1, kTagTimedOut = 2;
}  // namespace job_rows

// recover_jobs' reading of the rows it recovered (persistence id `pid`): the
// jobs accepted without an outcome, by id, and in `state` where the proxy
// goes on. A row this service would not have written is corrupt_record.
// A pure function of its arguments.
Result<std::vector<JobRecord>> decode_job_rows(Recovery& rec, const std::string& pid, Duration default_timeout,
                                               Duration watchdog_limit, JobJournalState& state);

}  // namespace troupe::detail
