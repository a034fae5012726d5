// The job service's shared state, JobCore: final outcomes (retry, dead
// letters, delivery), admission of submits, and stopping. See
// include/troupe/patterns/job_service.hpp for the contract and doc/jobs.md
// for the design.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "job_internal.hpp"

namespace troupe::detail {

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
  log::error(log::Component::patterns, "job service stopped", {{"job_service", settings.name}, {"error", e.to_string()}});
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

}  // namespace troupe::detail
