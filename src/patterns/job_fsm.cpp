// The job service's FSM workers (J1, J2) and watchdog (J5): the FSM actor,
// the watchdog actor and JobCore::watchdog_scan, which resets stuck slots.
// See include/troupe/patterns/job_service.hpp for the contract and
// doc/jobs.md for the design.

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "job_internal.hpp"

namespace troupe::detail {
namespace {

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

ActorRef<WatchdogTick> spawn_job_watchdog(ActorSystem& system, std::string name,
                                          const std::weak_ptr<JobCore>& core) {
  return system.spawn<JobWatchdog>(SpawnOptions{.name = std::move(name)}, core);
}

// ---------------------------------------------------------------------------
// JobCore: FSMs and their slots

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

}  // namespace troupe::detail
