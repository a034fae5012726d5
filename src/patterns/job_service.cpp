// The job service: proxy, priority queue, FSM workers and watchdog actors.
// See include/troupe/patterns/job_service.hpp for the contract and
// doc/jobs.md for the design and the journal format.

#include "troupe/patterns/job_service.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "troupe/persist/codec.hpp"

namespace troupe {
namespace detail {
namespace {

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

void job_bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

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
    if (settings.log) std::fprintf(stderr, "troupe: job service '%s': %s\n", settings.name.c_str(), what.c_str());
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

namespace {

std::shared_ptr<JobCore> lock_job_core(const std::weak_ptr<JobCore>& w) {
  auto c = w.lock();
  if (!c) throw std::logic_error("job service already destroyed");
  return c;
}

// A single-consumer ring buffer that grows by doubling: the queue levels
// and the waiting FSMs, without an allocation per element.
template <class T>
class JobRing {
 public:
  bool empty() const noexcept { return size_ == 0; }
  std::size_t size() const noexcept { return size_; }
  void push_back(T&& v) {
    if (size_ == buf_.size()) grow();
    buf_[(head_ + size_) & (buf_.size() - 1)] = std::move(v);
    ++size_;
  }
  T pop_front() {
    T v = std::move(buf_[head_]);
    head_ = (head_ + 1) & (buf_.size() - 1);
    --size_;
    return v;
  }
  void clear() {
    buf_.clear();
    head_ = size_ = 0;
  }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 16 : buf_.size() * 2);
    for (std::size_t i = 0; i < size_; ++i) next[i] = std::move(buf_[(head_ + i) & (buf_.size() - 1)]);
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

std::string job_ms(Duration d) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
}

// ---------------------------------------------------------------------------
// FSM worker (J1, J2)

// Idle: has asked the queue for one job (QPull) and waits for it.
// Active: runs one attempt; leaves on the worker's completion, on the
// attempt's deadline, or when the watchdog retires it.
// One timer per FSM, armed at the current attempt's deadline at most: a
// fire that finds the current attempt not yet due re-arms for it, so a
// stream of short jobs arms no timer per job.
class JobFsm final : public Actor<FsmMsg> {
 public:
  JobFsm(const std::weak_ptr<JobCore>& core, std::size_t slot, std::uint64_t gen)
      : core_(lock_job_core(core)), slot_(core_->slots.at(slot).get()), gen_(gen) {}
  ~JobFsm() {
    if (attempt_) attempt_->release();
  }

  void on_start() {
    self_ = self();
    pull();
  }

  void on_stop() {
    // Stopped while Active (stop(), system shutdown): the attempt is
    // answered shutting_down unless something ended it already.
    if (state_ == State::active && attempt_ && !attempt_->claimed.exchange(true, std::memory_order_acq_rel)) {
      JobRecord dropped = std::move(attempt_->record);
    }
    unpublish();
  }

  void receive(FsmMsg& m) {
    if (retired()) {
      if (auto* a = std::get_if<FsmAssign>(&m)) give_back(a->rec);
      stop();
      return;
    }
    match(
        m, [&](FsmAssign& a) { on_assign(a.rec); },
        [&](FsmDone& d) {
          if (state_ == State::active && attempt_->seq == d.seq) end_attempt();
        },
        [&](FsmTick&) { on_tick(); });
  }

 private:
  enum class State : std::uint8_t { idle, active };

  bool retired() const noexcept { return slot_->gen.load(std::memory_order_acquire) != gen_; }

  void pull() {
    if (core_->stopping.load(std::memory_order_acquire) || retired()) return;
    (void)core_->queue.tell(QPull{self_});
  }

  void give_back(JobRecord& rec) {
    core_->backlog.fetch_add(1, std::memory_order_relaxed);
    (void)core_->queue.tell(QRetry{std::move(rec), Duration::zero()});
  }

  void on_assign(JobRecord& rec) {
    // Stopping: the record goes with the message and answers shutting_down.
    if (core_->stopping.load(std::memory_order_acquire)) return;
    ++rec.attempts;
    const TimePoint now = this->now();
    std::optional<JobWorkerCall> call;
    try {
      call = core_->translator(rec.job);
    } catch (const std::exception& e) {
      return fail_unrun(rec, "translator failed for job kind '" + rec.job.kind + "': " + e.what());
    } catch (...) {
      return fail_unrun(rec, "translator failed for job kind '" + rec.job.kind + "' (not a std::exception)");
    }
    if (!call) return fail_unrun(rec, "no worker for job kind '" + rec.job.kind + "'");
    const JobWorker* worker = lookup(call->worker_kind);
    if (!worker) {
      return fail_unrun(rec, "job kind '" + rec.job.kind + "' maps to worker kind '" + call->worker_kind +
                                 "', which is not registered");
    }

    JobAttempt* a = fresh_attempt();
    a->seq = ++seq_;
    a->id = rec.id;
    a->attempt = rec.attempts;
    a->detail = std::move(call->detail);
    deadline_ = deadline_after(now, rec.timeout);
    a->record = std::move(rec);
    a->phase.store(JobAttempt::kInCall, std::memory_order_relaxed);
    a->claimed.store(false, std::memory_order_release);
    publish(a, now);
    state_ = State::active;
    arm(now);

    try {
      (*worker)(JobAttempt::run_of(a));
    } catch (const std::exception& e) {
      a->complete(JobFailed{e.what()}, false);
    } catch (...) {
      a->complete(JobFailed{"worker '" + call->worker_kind + "' threw something that is not a std::exception"},
                  false);
    }
    std::uint8_t expected = JobAttempt::kInCall;
    const bool done_in_call =
        !a->phase.compare_exchange_strong(expected, JobAttempt::kDetached, std::memory_order_acq_rel);
    // The watchdog may have given this slot to a fresh FSM while the worker
    // held the thread: then this one only goes away.
    if (retired()) {
      stop();
      return;
    }
    if (done_in_call) end_attempt();
  }

  void on_tick() {
    armed_ = TimePoint::max();
    if (state_ != State::active) return;
    const TimePoint now = this->now();
    if (now < deadline_) {
      arm(now);
      return;
    }
    // A completion that won the claim has its FsmDone on the way.
    if (attempt_->claimed.exchange(true, std::memory_order_acq_rel)) return;
    core_->finish(std::move(attempt_->record), JobTimedOut{}, true);
    end_attempt();
  }

  // Translation failed: the job fails without running (no retry: the same
  // job would fail the same way) and the FSM, still Idle, pulls again.
  void fail_unrun(JobRecord& rec, std::string reason) {
    core_->finish(std::move(rec), JobFailed{std::move(reason)}, false);
    pull();
  }

  void end_attempt() {
    unpublish();
    state_ = State::idle;
    pull();
  }

  void arm(TimePoint now) {
    if (deadline_ >= armed_) return;
    start_timer("deadline", deadline_ - now, FsmMsg{FsmTick{}});
    armed_ = deadline_;
  }

  JobAttempt* fresh_attempt() {
    if (attempt_ && attempt_->refs.load(std::memory_order_acquire) == 1) return attempt_;
    if (attempt_) attempt_->release();
    attempt_ = new JobAttempt(core_, self_);
    return attempt_;
  }

  const JobWorker* lookup(const std::string& kind) {
    if (last_worker_ && kind == last_kind_) return last_worker_;
    last_worker_ = core_->find_worker(kind);
    if (last_worker_) last_kind_ = kind;
    return last_worker_;
  }

  void publish(JobAttempt* a, TimePoint now) {
    std::lock_guard lk(slot_->mu);
    if (slot_->gen.load(std::memory_order_relaxed) != gen_) return;
    slot_->current = a;
    slot_->since = now;
  }
  void unpublish() {
    std::lock_guard lk(slot_->mu);
    if (slot_->gen.load(std::memory_order_relaxed) == gen_ && slot_->current == attempt_) slot_->current = nullptr;
  }

  std::shared_ptr<JobCore> core_;
  JobSlot* slot_;
  std::uint64_t gen_;
  ActorRef<FsmMsg> self_;
  State state_ = State::idle;
  JobAttempt* attempt_ = nullptr;
  std::uint64_t seq_ = 0;
  TimePoint deadline_{};
  TimePoint armed_ = TimePoint::max();
  const JobWorker* last_worker_ = nullptr;
  std::string last_kind_;
};

// ---------------------------------------------------------------------------
// Priority queue (J4) and retry back-off

class JobQueue final : public Actor<QueueMsg> {
 public:
  explicit JobQueue(const std::weak_ptr<JobCore>& core)
      : core_(lock_job_core(core)), paused_(core_->settings.start_paused) {}

  void on_stop() {
    // Answer everything held here now (shutting_down), before stop() is
    // told the queue is down.
    for (auto& l : levels_) {
      l->q.clear();
      l->depth->store(0, std::memory_order_relaxed);
    }
    delayed_.clear();
    core_->waiting_retry.store(0, std::memory_order_relaxed);
    waiting_.clear();
    core_->note_down(JobCore::kQueueDown);
  }

  void receive(QueueMsg& m) {
    match(
        m,
        [&](QAccepted& a) {
          for (auto& r : a.recs) push(std::move(r));
          serve();
        },
        [&](QPull& p) {
          if (!paused_ && top_ != kNone && waiting_.empty()) {
            assign(p.fsm);
          } else {
            waiting_.push_back(std::move(p.fsm));
          }
        },
        [&](QRetry& r) { on_retry(r); }, [&](QRetryTick&) { on_retry_tick(); },
        [&](QPause& p) {
          paused_ = p.paused;
          serve();
        },
        [&](QStop&) { stop(); });
  }

 private:
  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();
  // Empty levels are dropped once there are more than this many levels.
  static constexpr std::size_t kKeptLevels = 64;

  struct Level {
    int priority = 0;
    std::size_t index = 0;
    JobRing<JobRecord> q;
    std::atomic<std::uint64_t>* depth = nullptr;
  };
  struct Delayed {
    TimePoint due;
    std::uint64_t order;
    JobRecord rec;
  };
  struct Later {
    bool operator()(const Delayed& a, const Delayed& b) const noexcept {
      return a.due != b.due ? a.due > b.due : a.order > b.order;
    }
  };

  static void add(std::atomic<std::uint64_t>* c, std::int64_t by) noexcept {
    // single writer (this actor); stats() only reads
    c->store(c->load(std::memory_order_relaxed) + static_cast<std::uint64_t>(by), std::memory_order_relaxed);
  }

  Level& level_for(int priority) {
    if (last_ && last_->priority == priority) return *last_;
    auto it = std::lower_bound(levels_.begin(), levels_.end(), priority,
                               [](const std::unique_ptr<Level>& l, int p) { return l->priority > p; });
    if (it == levels_.end() || (*it)->priority != priority) {
      auto l = std::make_unique<Level>();
      l->priority = priority;
      {
        std::lock_guard lk(core_->levels_mu);
        l->depth = &core_->levels.try_emplace(priority).first->second;
      }
      it = levels_.insert(it, std::move(l));
      reindex();
    }
    last_ = it->get();
    return *last_;
  }

  void reindex() {
    top_ = kNone;
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      levels_[i]->index = i;
      if (top_ == kNone && !levels_[i]->q.empty()) top_ = i;
    }
  }

  void push(JobRecord&& rec) {
    Level& l = level_for(rec.priority);
    l.q.push_back(std::move(rec));
    add(l.depth, 1);
    if (top_ == kNone || l.index < top_) top_ = l.index;
  }

  JobRecord pop_top() {
    Level& l = *levels_[top_];
    JobRecord r = l.q.pop_front();
    add(l.depth, -1);
    if (l.q.empty()) {
      std::size_t i = top_ + 1;
      while (i < levels_.size() && levels_[i]->q.empty()) ++i;
      top_ = i < levels_.size() ? i : kNone;
      if (levels_.size() > kKeptLevels) prune();
    }
    return r;
  }

  // Many distinct priorities seen: forget the empty levels.
  void prune() {
    std::lock_guard lk(core_->levels_mu);
    std::erase_if(levels_, [&](const std::unique_ptr<Level>& l) {
      if (!l->q.empty()) return false;
      core_->levels.erase(l->priority);
      return true;
    });
    last_ = nullptr;
    reindex();
  }

  void assign(ActorRef<FsmMsg>& fsm) {
    JobRecord r = pop_top();
    core_->backlog.fetch_sub(1, std::memory_order_relaxed);
    (void)fsm.tell(FsmAssign{std::move(r)});
  }

  void serve() {
    while (!paused_ && top_ != kNone && !waiting_.empty()) {
      ActorRef<FsmMsg> f = waiting_.pop_front();
      if (f.terminated()) continue;  // a retired FSM's pull, never answered
      assign(f);
    }
  }

  void on_retry(QRetry& r) {
    if (r.delay <= Duration::zero()) {
      push(std::move(r.rec));
      serve();
      return;
    }
    const TimePoint now = this->now();
    delayed_.push_back(Delayed{deadline_after(now, r.delay), ++order_, std::move(r.rec)});
    std::push_heap(delayed_.begin(), delayed_.end(), Later{});
    core_->waiting_retry.fetch_add(1, std::memory_order_relaxed);
    arm(now);
  }

  void on_retry_tick() {
    armed_ = TimePoint::max();
    const TimePoint now = this->now();
    while (!delayed_.empty() && delayed_.front().due <= now) {
      std::pop_heap(delayed_.begin(), delayed_.end(), Later{});
      push(std::move(delayed_.back().rec));
      delayed_.pop_back();
      core_->waiting_retry.fetch_sub(1, std::memory_order_relaxed);
    }
    arm(now);
    serve();
  }

  void arm(TimePoint now) {
    if (delayed_.empty() || delayed_.front().due >= armed_) return;
    armed_ = delayed_.front().due;
    start_timer("retry", armed_ - now, QueueMsg{QRetryTick{}});
  }

  std::shared_ptr<JobCore> core_;
  bool paused_;
  std::vector<std::unique_ptr<Level>> levels_;  // highest priority first
  std::size_t top_ = kNone;                     // highest level holding jobs
  Level* last_ = nullptr;                       // the level of the last push
  JobRing<ActorRef<FsmMsg>> waiting_;           // Idle FSMs that pulled, in order
  std::vector<Delayed> delayed_;                // min-heap by due time
  std::uint64_t order_ = 0;
  TimePoint armed_ = TimePoint::max();
};

// ---------------------------------------------------------------------------
// Journal encoding (doc/jobs.md, "Journal format")

constexpr std::string_view kAcceptedType = "job.accepted";
constexpr std::string_view kFinishedType = "job.finished";
constexpr std::uint32_t kFormatVersion = 1;
// Jobs per journal event: a batch of many jobs is a few rows, not one per job.
constexpr std::size_t kJobsPerEvent = 4096;

enum : std::uint8_t { kTagSucceeded = 0, kTagFailed = 1, kTagTimedOut = 2 };

void encode_accepted(ByteWriter& w, const JobRecord& r) {
  w.u64(r.id).i64(r.priority).i64(r.timeout.count()).str(r.job.kind).str(r.job.payload);
}

void encode_finished(ByteWriter& w, JobId id, const JobOutcome& out) {
  w.u64(id);
  match(
      out, [&](const JobSucceeded& s) { w.u8(kTagSucceeded).str(s.output); },
      [&](const JobFailed& f) { w.u8(kTagFailed).str(f.reason); },
      [&](const JobTimedOut&) { w.u8(kTagTimedOut).str(""); });
}

std::int64_t wall_ms_of(WallTime t) noexcept {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// ---------------------------------------------------------------------------
// Proxy (J1 intake, J6 group commit)

// Takes requests, assigns ids and hands jobs to the queue in batches. With a
// journal it first journals them: one append in flight at a time, and
// everything that arrives meanwhile (jobs and outcomes) goes into the next
// one. Outcomes of durable jobs come back here and are reported once their
// append has succeeded. Rows whose jobs have all finished are deleted.
class JobProxy final : public Actor<ProxyMsg> {
 public:
  explicit JobProxy(const std::weak_ptr<JobCore>& core)
      : core_(lock_job_core(core)), js_(std::move(core_->journal_state)) {}

  void on_start() { self_ = self(); }

  void on_stop() {
    pending_.clear();
    in_flight_.clear();
    forward_.clear();
    finished_.clear();
    finished_in_flight_.clear();
    core_->note_down(JobCore::kProxyDown);
  }

  void receive(ProxyMsg& m) {
    match(
        m, [&](PSubmit& s) { on_submit(s); },
        [&](PFlush&) {
          flush_scheduled_ = false;
          flush();
        },
        [&](PAppended& a) { on_appended(a.result); },
        [&](PFinished& f) {
          finished_.emplace_back(std::move(f.rec), std::move(f.outcome));
          if (!in_flight_flag_) schedule_flush();
        },
        [&](PDeleted& d) {
          delete_in_flight_ = false;
          if (d.result.ok()) {
            js_.deleted_to = std::max(js_.deleted_to, d.to);
          } else {
            job_bump(core_->journal_failures);
            core_->log("deleting finished jobs from the journal failed: " + d.result.error().to_string());
          }
        },
        [&](PStop&) { on_stop_request(); });
    if (stopping_) maybe_stop();
  }

 private:
  struct Pending {
    JobRecord rec;
    JobAnswer<JobId> ack;
  };

  void on_submit(PSubmit& s) {
    if (stopping_) return;  // answered shutting_down with the message
    s.rec.id = js_.next_id++;
    if (!core_->durable) {
      job_bump(core_->accepted);
      s.ack.value(s.rec.id);
      forward_.push_back(std::move(s.rec));
    } else {
      pending_.push_back(Pending{std::move(s.rec), std::move(s.ack)});
      if (in_flight_flag_) return;
    }
    schedule_flush();
  }

  // Flushing through a message to ourselves: it queues behind everything
  // already in the mailbox, so one flush carries all of that.
  void schedule_flush() {
    if (flush_scheduled_) return;
    flush_scheduled_ = true;
    (void)self_.tell(PFlush{});
  }

  void flush() {
    if (!core_->durable) {
      if (forward_.empty()) return;
      std::vector<JobRecord> batch;
      batch.swap(forward_);
      forward_.reserve(batch.size());
      (void)core_->queue.tell(QAccepted{std::move(batch)});
      return;
    }
    if (!in_flight_flag_) start_append();
  }

  void start_append() {
    if (pending_.empty() && finished_.empty()) return;
    AppendBatch b;
    b.persistence_id = core_->pid;
    std::uint64_t seq = js_.next_seq;
    const std::int64_t ts = wall_ms_of(this->wall_now());
    accept_rows_.clear();
    for (std::size_t i = 0; i < pending_.size(); i += kJobsPerEvent) {
      const std::size_t n = std::min(kJobsPerEvent, pending_.size() - i);
      ByteWriter w;
      w.bytes().reserve(n * 48);
      w.u32(static_cast<std::uint32_t>(n));
      for (std::size_t k = i; k < i + n; ++k) {
        pending_[k].rec.accept_seq = seq;
        encode_accepted(w, pending_[k].rec);
      }
      accept_rows_.push_back(JobRow{seq, n});
      b.events.push_back(EventRecord{seq++, ts, std::string(kAcceptedType), kFormatVersion, w.take()});
    }
    for (std::size_t i = 0; i < finished_.size(); i += kJobsPerEvent) {
      const std::size_t n = std::min(kJobsPerEvent, finished_.size() - i);
      ByteWriter w;
      w.bytes().reserve(n * 24);
      w.u32(static_cast<std::uint32_t>(n));
      for (std::size_t k = i; k < i + n; ++k) encode_finished(w, finished_[k].first.id, finished_[k].second);
      b.events.push_back(EventRecord{seq++, ts, std::string(kFinishedType), kFormatVersion, w.take()});
    }
    in_flight_.swap(pending_);
    finished_in_flight_.swap(finished_);
    in_flight_events_ = seq - js_.next_seq;
    in_flight_flag_ = true;
    job_bump(core_->journal_appends);
    auto self = self_;
    core_->settings.journal->append(std::move(b),
                                    [self](Result<void> r) { (void)self.tell(PAppended{std::move(r)}); });
  }

  void on_appended(Result<void>& r) {
    in_flight_flag_ = false;
    if (r.ok()) {
      js_.next_seq += in_flight_events_;
      for (auto& row : accept_rows_) {
        js_.rows.push_back(row);
        js_.last_accept_seq = row.seq;
      }
      if (!in_flight_.empty()) {
        job_bump(core_->accepted, in_flight_.size());
        std::vector<JobRecord> batch;
        batch.reserve(in_flight_.size());
        for (auto& p : in_flight_) {
          p.ack.value(p.rec.id);
          batch.push_back(std::move(p.rec));
        }
        (void)core_->queue.tell(QAccepted{std::move(batch)});
      }
      for (auto& [rec, out] : finished_in_flight_) {
        note_finished(rec.accept_seq);
        core_->deliver(rec, std::move(out));
      }
      compact();
    } else {
      job_bump(core_->journal_failures);
      core_->log("journal append failed: " + r.error().to_string());
      // Another writer holds this log: every later append would be
      // refused the same way, so nothing this service accepts could ever
      // be stored. Stop, loudly, instead of refusing jobs one by one.
      const bool taken = r.error().code() == ErrorCode::journal_conflict;
      if (!in_flight_.empty()) {
        core_->backlog.fetch_sub(static_cast<std::int64_t>(in_flight_.size()), std::memory_order_relaxed);
        Error e(r.error().code(), "job not accepted: the journal append failed: " + r.error().message());
        for (auto& p : in_flight_) {
          p.rec.reply.error(e);
          p.ack.error(e);
        }
      }
      // The jobs did finish; told so, they may run again after a restart
      // since their outcome is not in the journal.
      for (auto& [rec, out] : finished_in_flight_) core_->deliver(rec, std::move(out));
      if (taken) {
        in_flight_.clear();
        finished_in_flight_.clear();
        core_->fail(Error(ErrorCode::journal_conflict,
                          "another writer appended to its journal log '" + core_->pid + "' (" + r.error().message() +
                              "). A durable job service needs its log to itself: on a journal shared by several "
                              "nodes use troupe::cluster::start_job_service"));
        return;
      }
    }
    in_flight_.clear();
    finished_in_flight_.clear();
    if (!pending_.empty() || !finished_.empty()) start_append();
  }

  void note_finished(std::uint64_t accept_seq) {
    if (accept_seq == 0) return;
    auto it = std::lower_bound(js_.rows.begin(), js_.rows.end(), accept_seq,
                               [](const JobRow& row, std::uint64_t s) { return row.seq < s; });
    if (it != js_.rows.end() && it->seq == accept_seq && it->unfinished > 0) --it->unfinished;
  }

  // Deletes the journal's prefix of rows whose jobs have all finished. The
  // newest accepted row is kept: it holds the highest id issued, where the
  // next start continues.
  void compact() {
    while (!js_.rows.empty() && js_.rows.front().unfinished == 0 && js_.rows.front().seq != js_.last_accept_seq)
      js_.rows.pop_front();
    std::uint64_t deletable = js_.next_seq - 1;
    if (!js_.rows.empty()) deletable = js_.rows.front().seq - 1;
    if (js_.last_accept_seq > 0) deletable = std::min(deletable, js_.last_accept_seq - 1);
    if (deletable <= js_.deleted_to || delete_in_flight_ || stopping_) return;
    delete_in_flight_ = true;
    auto self = self_;
    core_->settings.journal->delete_up_to(
        core_->pid, deletable, [self, deletable](Result<void> r) { (void)self.tell(PDeleted{std::move(r), deletable}); });
  }

  void on_stop_request() {
    stopping_ = true;
    pending_.clear();  // answered shutting_down
    forward_.clear();
  }

  // Stopping: outcomes already decided are journaled (and reported) first;
  // the proxy goes once nothing of its own is in flight, so no journal
  // callback or flush of its own ever finds it gone.
  void maybe_stop() {
    if (in_flight_flag_ || delete_in_flight_ || flush_scheduled_) return;
    if (core_->durable && !finished_.empty()) {
      start_append();
      return;
    }
    stop();
  }

  std::shared_ptr<JobCore> core_;
  JobJournalState js_;
  ActorRef<ProxyMsg> self_;
  bool flush_scheduled_ = false;
  bool stopping_ = false;
  bool in_flight_flag_ = false;
  bool delete_in_flight_ = false;
  std::vector<JobRecord> forward_;  // in memory: accepted, not yet handed to the queue
  std::vector<Pending> pending_, in_flight_;
  std::vector<std::pair<JobRecord, JobOutcome>> finished_, finished_in_flight_;
  std::vector<JobRow> accept_rows_;  // rows of the append in flight
  std::uint64_t in_flight_events_ = 0;
};

// ---------------------------------------------------------------------------
// Watchdog (J5)

class JobWatchdog final : public Actor<WatchdogTick> {
 public:
  explicit JobWatchdog(const std::weak_ptr<JobCore>& core) : core_(lock_job_core(core)) {}
  void on_start() { (void)start_periodic_timer("watchdog", core_->settings.watchdog_interval, WatchdogTick{}); }
  void receive(WatchdogTick&) { core_->watchdog_scan(now()); }

 private:
  std::shared_ptr<JobCore> core_;
};

}  // namespace

// ---------------------------------------------------------------------------
// JobCore

void JobCore::finish(JobRecord&& rec, JobOutcome&& out, bool may_retry, std::string_view why) {
  const bool ok = std::holds_alternative<JobSucceeded>(out);
  if (!ok && may_retry && rec.attempts < settings.max_attempts && !stopping.load(std::memory_order_acquire)) {
    job_bump(retried);
    backlog.fetch_add(1, std::memory_order_relaxed);
    const Duration d = backoff_for(rec.attempts);
    if (queue.tell(QRetry{std::move(rec), d}) != Delivery::delivered)
      backlog.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  if (ok) {
    job_bump(succeeded);
  } else if (std::holds_alternative<JobTimedOut>(out)) {
    job_bump(timed_out);
  } else {
    job_bump(failed);
  }
  if (!ok) add_dead_letter(rec, out, why);
  if (durable) {
    // Reported once the outcome is journaled. If the proxy is gone the
    // record answers shutting_down and the job runs again after a restart.
    (void)proxy.tell(PFinished{std::move(rec), std::move(out)});
    return;
  }
  deliver(rec, std::move(out));
}

void JobCore::deliver(JobRecord& rec, JobOutcome&& out) {
  if (rec.reply) {
    rec.reply.value(std::move(out));
    return;
  }
  if (!settings.on_outcome) return;
  try {
    settings.on_outcome(rec.id, rec.job, out);
  } catch (...) {
    // documented: exceptions from on_outcome are dropped
  }
}

void JobCore::add_dead_letter(const JobRecord& rec, const JobOutcome& out, std::string_view why) {
  JobDeadLetter d;
  d.id = rec.id;
  d.job = rec.job;
  d.priority = rec.priority;
  d.attempts = rec.attempts;
  if (auto* f = std::get_if<JobFailed>(&out)) {
    d.reason = f->reason;
  } else if (!why.empty()) {
    d.reason = std::string(why);
  } else {
    d.reason = "attempt " + std::to_string(rec.attempts) + " timed out after " + job_ms(rec.timeout);
  }
  job_bump(dead_lettered);
  std::lock_guard lk(dead_mu);
  if (settings.dead_letter_capacity == 0) {
    ++dead_dropped;
    return;
  }
  if (dead.size() >= settings.dead_letter_capacity) {
    dead.pop_front();
    ++dead_dropped;
  }
  dead.push_back(std::move(d));
}

ActorRef<FsmMsg> JobCore::spawn_fsm(std::size_t slot, std::uint64_t gen) {
  std::string n = settings.name + ".fsm-" + std::to_string(slot);
  if (gen > 0) n += "." + std::to_string(gen);
  return system->spawn<JobFsm>(SpawnOptions{.name = std::move(n)}, self, slot, gen);
}

void JobCore::watchdog_scan(TimePoint now) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (stopping.load(std::memory_order_acquire)) return;
    JobSlot& s = *slots[i];
    JobAttempt* a = nullptr;
    bool claimed_here = false;
    ActorRef<FsmMsg> old;
    std::uint64_t gen = 0;
    Duration stuck{};
    {
      std::lock_guard lk(s.mu);
      if (!s.current || now - s.since <= settings.watchdog_limit) continue;
      // Stuck. Even an attempt something else has ended is reset: its FSM
      // has not come back to take the next job within the limit.
      a = s.current;
      a->retain();
      claimed_here = !a->claimed.exchange(true, std::memory_order_acq_rel);
      stuck = now - s.since;
      s.current = nullptr;
      gen = s.gen.load(std::memory_order_relaxed) + 1;
      s.gen.store(gen, std::memory_order_release);
      old = std::exchange(s.fsm, ActorRef<FsmMsg>{});
    }
    job_bump(watchdog_resets);
    log("worker slot " + std::to_string(i) + " was Active for " + job_ms(stuck) + " (limit " +
        job_ms(settings.watchdog_limit) + "): reset" + (claimed_here ? ", job " + std::to_string(a->id) + " timed out" : ""));
    if (claimed_here) {
      const std::string why = "attempt " + std::to_string(a->attempt) + " timed out: its worker slot was stuck for " +
                              job_ms(stuck) + " and the watchdog reset it";
      finish(std::move(a->record), JobTimedOut{}, true, why);
    }
    a->release();
    old.stop();  // a thread still inside the worker stops it when it returns
    auto fresh = spawn_fsm(i, gen);
    bool keep = false;
    {
      std::lock_guard lk(s.mu);
      if (s.gen.load(std::memory_order_relaxed) == gen && !stopping.load(std::memory_order_acquire)) {
        s.fsm = fresh;
        keep = true;
      }
    }
    if (!keep) fresh.stop();
  }
}

void JobCore::begin_stop() {
  if (stopping.exchange(true, std::memory_order_acq_rel)) return;
  for (auto& sp : slots) {
    JobSlot& s = *sp;
    JobAttempt* a = nullptr;
    ActorRef<FsmMsg> f;
    {
      std::lock_guard lk(s.mu);
      if (s.current && !s.current->claimed.exchange(true, std::memory_order_acq_rel)) {
        a = s.current;
        a->retain();
      }
      f = s.fsm;
    }
    if (a) {
      JobRecord dropped = std::move(a->record);  // answers shutting_down
      a->release();
    }
    f.stop();
  }
  watchdog.stop();
  if (queue.tell(QStop{}) != Delivery::delivered) note_down(kQueueDown);
  if (proxy.tell(PStop{}) != Delivery::delivered) note_down(kProxyDown);
}

void JobCore::fail(Error e) {
  {
    std::lock_guard lk(failure_mu);
    if (failure) return;
    failure = e;
  }
  // Logged whatever settings.log says: the service is gone.
  std::fprintf(stderr, "troupe: job service '%s' stopped: %s\n", settings.name.c_str(), e.to_string().c_str());
  begin_stop();
}

bool JobCore::wait_stopped(Duration bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  std::unique_lock lk(stop_mu);
  for (;;) {
    // An actor the system already stopped (its mailbox closed) counts as down.
    const bool q = (down & kQueueDown) || queue.terminated();
    const bool p = (down & kProxyDown) || proxy.terminated();
    if (q && p) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    stop_cv.wait_for(lk, std::chrono::milliseconds(10));
  }
}

Result<Duration> JobCore::admit(std::optional<Duration> timeout) {
  if (stopping.load(std::memory_order_acquire)) {
    if (auto f = failed_with())
      return Error(f->code(), "job service '" + settings.name + "' has stopped: " + f->message());
    return Error(ErrorCode::shutting_down, "job service '" + settings.name + "' is stopping");
  }
  Duration t = timeout.value_or(settings.default_timeout);
  if (t <= Duration::zero())
    return Error(ErrorCode::invalid_argument, "job timeout must be positive, got " + std::to_string(t.count()) + " ns");
  if (t >= settings.watchdog_limit)
    return Error(ErrorCode::invalid_argument, "job timeout " + job_ms(t) + " is not below the watchdog limit " +
                                                  job_ms(settings.watchdog_limit) + " of job service '" +
                                                  settings.name + "'");
  const auto cap = static_cast<std::int64_t>(settings.queue_capacity);
  if (backlog.fetch_add(1, std::memory_order_relaxed) >= cap) {
    backlog.fetch_sub(1, std::memory_order_relaxed);
    job_bump(refused);
    return Error(ErrorCode::buffer_overflow, "job service '" + settings.name + "' is full: " +
                                                 std::to_string(cap) + " jobs waiting");
  }
  job_bump(submitted);
  return t;
}

void JobCore::send(JobRecord&& rec, JobAnswer<JobId>&& ack) {
  // A refused tell destroys the message; its answers say shutting_down.
  if (proxy.tell(PSubmit{std::move(rec), std::move(ack)}) != Delivery::delivered)
    backlog.fetch_sub(1, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------
// Recovery (J6)

namespace {

Error corrupt(const std::string& pid, std::uint64_t seq, const std::string& what) {
  return Error(ErrorCode::corrupt_record,
               "job journal '" + pid + "', row " + std::to_string(seq) + ": " + what + "; the service did not start");
}

// Reads the journal: jobs accepted without a journaled outcome are re-queued
// in acceptance order. Fills core.journal_state; returns the jobs.
Result<std::vector<JobRecord>> recover_jobs(JobCore& core) {
  auto r = journal_sync::recover(*core.settings.journal, core.pid);
  if (!r.ok()) {
    if (r.error().code() == ErrorCode::corrupt_record) {
      return Error(ErrorCode::corrupt_record,
                   "job journal '" + core.pid + "': " + r.error().message() + "; the service did not start");
    }
    return Error(ErrorCode::recovery_failed, "job journal '" + core.pid +
                                                 "' could not be read: " + r.error().to_string() +
                                                 "; the service did not start");
  }
  Recovery& rec = r.value();
  std::map<JobId, JobRecord> open;
  JobId max_id = 0;
  std::uint64_t last_accept = 0;
  for (EventRecord& e : rec.events) {
    if (e.version != kFormatVersion) {
      return corrupt(core.pid, e.seq, "unsupported version " + std::to_string(e.version) + " of '" + e.type + "'");
    }
    ByteReader in(e.payload);
    const std::uint32_t n = in.u32();
    if (in.failed() || n == 0) return corrupt(core.pid, e.seq, "'" + e.type + "' without a job count");
    if (e.type == kAcceptedType) {
      for (std::uint32_t i = 0; i < n && !in.failed(); ++i) {
        JobRecord j;
        j.id = in.u64();
        const std::int64_t prio = in.i64();
        const std::int64_t timeout = in.i64();
        j.job.kind = in.str();
        j.job.payload = in.str();
        if (in.failed()) break;
        if (j.id == 0) return corrupt(core.pid, e.seq, "job id 0");
        if (prio < std::numeric_limits<int>::min() || prio > std::numeric_limits<int>::max())
          return corrupt(core.pid, e.seq, "job " + std::to_string(j.id) + " has priority " + std::to_string(prio));
        j.priority = static_cast<int>(prio);
        j.timeout = Duration(timeout);
        // A timeout this build would refuse (e.g. the watchdog limit shrank)
        // falls back to the default rather than failing the start.
        if (j.timeout <= Duration::zero() || j.timeout >= core.settings.watchdog_limit)
          j.timeout = core.settings.default_timeout;
        j.accept_seq = e.seq;
        const JobId id = j.id;
        max_id = std::max(max_id, id);
        if (!open.emplace(id, std::move(j)).second)
          return corrupt(core.pid, e.seq, "job " + std::to_string(id) + " accepted twice");
      }
      last_accept = e.seq;
    } else if (e.type == kFinishedType) {
      for (std::uint32_t i = 0; i < n && !in.failed(); ++i) {
        const JobId id = in.u64();
        const std::uint8_t tag = in.u8();
        (void)in.str();
        if (in.failed()) break;
        if (tag > kTagTimedOut) return corrupt(core.pid, e.seq, "unknown outcome tag " + std::to_string(tag));
        max_id = std::max(max_id, id);
        open.erase(id);  // unknown ids: their accepted row was compacted away
      }
    } else {
      return corrupt(core.pid, e.seq, "unknown event type '" + e.type + "'");
    }
    if (auto fin = in.finish(0); !fin.ok()) return corrupt(core.pid, e.seq, "'" + e.type + "': " + fin.error().message());
  }

  JobJournalState& js = core.journal_state;
  js.next_id = max_id + 1;
  js.next_seq = rec.highest_seq + 1;
  js.deleted_to = rec.events.empty() ? rec.highest_seq : rec.events.front().seq - 1;
  js.last_accept_seq = last_accept;
  std::map<std::uint64_t, std::uint64_t> per_row;
  if (last_accept > 0) per_row[last_accept] = 0;
  std::vector<JobRecord> jobs;
  jobs.reserve(open.size());
  for (auto& [id, j] : open) {
    ++per_row[j.accept_seq];
    jobs.push_back(std::move(j));
  }
  for (auto& [seq, n] : per_row) js.rows.push_back(JobRow{seq, n});
  return jobs;
}

Result<void> validate(const JobSettings& s, const JobTranslator& t, const JobWorkers& w) {
  auto bad = [&](const std::string& m) {
    return Error(ErrorCode::invalid_argument,
                 (s.name.empty() ? std::string("job service") : "job service '" + s.name + "'") + ": " + m);
  };
  if (s.name.empty()) return bad("name is empty");
  if (s.name.find('|') != std::string::npos) return bad("name contains '|'");
  if (s.workers == 0) return bad("workers is 0 (at least one FSM worker is needed)");
  if (s.queue_capacity == 0) return bad("queue_capacity is 0");
  if (s.queue_capacity > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max() / 2))
    return bad("queue_capacity is too large");
  if (s.default_timeout <= Duration::zero()) return bad("default_timeout must be positive");
  if (s.watchdog_limit <= Duration::zero()) return bad("watchdog_limit must be positive");
  if (s.watchdog_interval <= Duration::zero()) return bad("watchdog_interval must be positive");
  if (s.default_timeout >= s.watchdog_limit)
    return bad("default_timeout (" + job_ms(s.default_timeout) + ") must be below watchdog_limit (" +
               job_ms(s.watchdog_limit) + ")");
  if (s.max_attempts == 0) return bad("max_attempts is 0 (1 means no retries)");
  if (s.backoff_min < Duration::zero()) return bad("backoff_min is negative");
  if (s.backoff_max < s.backoff_min) return bad("backoff_max is below backoff_min");
  if (!t) return bad("no translator");
  if (w.empty()) return bad("no workers registered");
  for (auto& [kind, fn] : w) {
    if (!fn) return bad("worker kind '" + kind + "' has an empty function");
  }
  return {};
}

}  // namespace
}  // namespace detail

// ---------------------------------------------------------------------------
// JobRun

JobRun::JobRun(const JobRun& o) noexcept : a_(o.a_) { a_->retain(); }
JobRun::JobRun(JobRun&& o) noexcept : a_(o.a_) { a_->retain(); }
JobRun& JobRun::operator=(const JobRun& o) noexcept {
  if (a_ != o.a_) {
    o.a_->retain();
    a_->release();
    a_ = o.a_;
  }
  return *this;
}
JobRun& JobRun::operator=(JobRun&& o) noexcept { return *this = static_cast<const JobRun&>(o); }
JobRun::~JobRun() { a_->release(); }

const std::string& JobRun::detail() const noexcept { return a_->detail; }
JobId JobRun::job_id() const noexcept { return a_->id; }
std::uint32_t JobRun::attempt() const noexcept { return a_->attempt; }
bool JobRun::succeed(std::string output) const { return a_->complete(JobSucceeded{std::move(output)}, true); }
bool JobRun::fail(std::string reason) const { return a_->complete(JobFailed{std::move(reason)}, true); }
bool JobRun::pending() const noexcept { return !a_->claimed.load(std::memory_order_acquire); }

// ---------------------------------------------------------------------------
// JobService

Result<JobService> JobService::start(ActorSystem& system, JobSettings settings, JobTranslator translator,
                                     JobWorkers workers) {
  if (auto v = detail::validate(settings, translator, workers); !v.ok()) return v.error();

  auto core = std::make_shared<detail::JobCore>();
  core->system = &system;
  core->self = core;
  core->pid = "jobs|" + settings.name;
  core->durable = static_cast<bool>(settings.journal);
  core->settings = std::move(settings);
  core->translator = std::move(translator);
  for (auto& [kind, fn] : workers) core->workers.emplace(kind, std::move(fn));
  for (std::size_t i = 0; i < core->settings.workers; ++i) core->slots.push_back(std::make_unique<detail::JobSlot>());

  std::vector<detail::JobRecord> recovered;
  if (core->durable) {
    auto r = detail::recover_jobs(*core);
    if (!r.ok()) return std::move(r).error();
    recovered = std::move(r).value();
  }

  const std::string& name = core->settings.name;
  std::weak_ptr<detail::JobCore> weak = core;
  auto refuse = [&] {
    core->begin_stop();
    return Error(ErrorCode::shutting_down, "the actor system is shutting down");
  };
  core->queue = system.spawn<detail::JobQueue>(SpawnOptions{.name = name + ".queue"}, weak);
  if (!core->queue) return refuse();
  if (!recovered.empty()) {
    core->recovered.store(recovered.size(), std::memory_order_relaxed);
    core->accepted.store(recovered.size(), std::memory_order_relaxed);
    core->backlog.store(static_cast<std::int64_t>(recovered.size()), std::memory_order_relaxed);
    (void)core->queue.tell(detail::QAccepted{std::move(recovered)});
  }
  core->proxy = system.spawn<detail::JobProxy>(SpawnOptions{.name = name + ".proxy"}, weak);
  if (!core->proxy) return refuse();
  for (std::size_t i = 0; i < core->slots.size(); ++i) {
    auto f = core->spawn_fsm(i, 0);
    if (!f) return refuse();
    std::lock_guard lk(core->slots[i]->mu);
    core->slots[i]->fsm = std::move(f);
  }
  core->watchdog = system.spawn<detail::JobWatchdog>(SpawnOptions{.name = name + ".watchdog"}, weak);
  if (!core->watchdog) return refuse();
  // Shutdown answers every job first. The hook holds the service weakly.
  (void)system.add_shutdown_hook([weak] {
    if (auto c = weak.lock()) {
      c->begin_stop();
      (void)c->wait_stopped(std::chrono::seconds(10));
    }
  });
  return JobService(std::move(core));
}

namespace {

// submit() and enqueue(): admit (or refuse at once), then hand the record
// and the caller's promise to `send`.
template <class T, class Send>
Future<T> admit_and_send(detail::JobCore& core, Job job, int priority, std::optional<Duration> timeout,
                         Send send) {
  Promise<T> p;
  Future<T> f = p.future();
  auto t = core.admit(timeout);
  if (!t.ok()) {
    p.set_error(std::move(t).error());
    return f;
  }
  detail::JobRecord r;
  r.priority = priority;
  r.timeout = t.value();
  r.job = std::move(job);
  send(std::move(r), std::move(p));
  return f;
}

}  // namespace

Future<JobOutcome> JobService::submit(Job job, int priority, std::optional<Duration> timeout) const {
  return admit_and_send<JobOutcome>(*core_, std::move(job), priority, timeout,
                                    [&](detail::JobRecord r, Promise<JobOutcome> p) {
                                      r.reply = detail::JobAnswer<JobOutcome>(std::move(p));
                                      core_->send(std::move(r), {});
                                    });
}

Future<JobId> JobService::enqueue(Job job, int priority, std::optional<Duration> timeout) const {
  return admit_and_send<JobId>(*core_, std::move(job), priority, timeout,
                               [&](detail::JobRecord r, Promise<JobId> p) {
                                 core_->send(std::move(r), detail::JobAnswer<JobId>(std::move(p)));
                               });
}

void JobService::pause() const { (void)core_->queue.tell(detail::QPause{true}); }
void JobService::resume() const { (void)core_->queue.tell(detail::QPause{false}); }

JobStats JobService::stats() const {
  auto& c = *core_;
  JobStats s;
  {
    std::lock_guard lk(c.levels_mu);
    for (auto& [prio, depth] : c.levels) {
      const std::uint64_t d = depth.load(std::memory_order_relaxed);
      if (d == 0) continue;
      s.queued_by_priority.push_back(JobQueueLevel{prio, d});
      s.queued += d;
    }
  }
  for (auto& slot : c.slots) {
    std::lock_guard lk(slot->mu);
    if (slot->current) ++s.active;
  }
  s.idle = c.slots.size() - s.active;
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  s.waiting_retry = get(c.waiting_retry);
  s.submitted = get(c.submitted);
  s.accepted = get(c.accepted);
  s.recovered = get(c.recovered);
  s.succeeded = get(c.succeeded);
  s.failed = get(c.failed);
  s.timed_out = get(c.timed_out);
  s.retried = get(c.retried);
  s.dead_lettered = get(c.dead_lettered);
  s.refused = get(c.refused);
  s.watchdog_resets = get(c.watchdog_resets);
  s.late_completions = get(c.late_completions);
  s.journal_appends = get(c.journal_appends);
  s.journal_failures = get(c.journal_failures);
  {
    std::lock_guard lk(c.dead_mu);
    s.dead_letters_dropped = c.dead_dropped;
  }
  return s;
}

std::vector<JobDeadLetter> JobService::dead_letters() const {
  std::lock_guard lk(core_->dead_mu);
  return {core_->dead.begin(), core_->dead.end()};
}

Result<void> JobService::stop(Duration bound) const {
  core_->begin_stop();
  if (core_->wait_stopped(bound)) return {};
  return Error(ErrorCode::timeout, "job service '" + core_->settings.name + "': queue or proxy still running after " +
                                       detail::job_ms(bound));
}

Result<void> JobService::health() const {
  if (auto f = core_->failed_with()) return std::move(*f);
  return {};
}

const JobSettings& JobService::settings() const noexcept { return core_->settings; }

}  // namespace troupe
