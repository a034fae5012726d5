// The job service: proxy, priority queue, FSM workers and watchdog actors.
// See include/troupe/patterns/job_service.hpp for the contract and
// doc/jobs.md for the design and the journal format.
//
// This file: settings validation, start(), JobRun, and the JobService
// handle with its backend seam (LocalJobBackend, the service of this
// process; detail::make_job_service for any other). The actors are in
// job_fsm.cpp, job_queue.cpp and job_journal.cpp, JobCore's members in
// job_core.cpp, what they share in job_internal.hpp.

#include "troupe/patterns/job_service.hpp"

#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "job_internal.hpp"

namespace troupe {
namespace detail {
namespace {

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

namespace detail {
namespace {

// The service of this process: its actors, around one JobCore. Each member
// is what the JobService member of the same name did before the seam.
class LocalJobBackend final : public JobBackend {
 public:
  explicit LocalJobBackend(std::shared_ptr<JobCore> core) noexcept : core_(std::move(core)) {}

  Future<JobOutcome> submit(Job job, int priority, std::optional<Duration> timeout) override;
  Future<JobId> enqueue(Job job, int priority, std::optional<Duration> timeout) override;
  void pause() override;
  void resume() override;
  JobStats stats() const override;
  std::vector<JobDeadLetter> dead_letters() const override;
  Result<void> stop(Duration bound) override;
  Result<void> health() const override;
  const JobSettings& settings() const noexcept override;

 private:
  std::shared_ptr<JobCore> core_;
};

}  // namespace
}  // namespace detail

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
  core->queue = detail::spawn_job_queue(system, name + ".queue", weak);
  if (!core->queue) return refuse();
  if (!recovered.empty()) {
    core->recovered.store(recovered.size(), std::memory_order_relaxed);
    core->accepted.store(recovered.size(), std::memory_order_relaxed);
    core->backlog.store(static_cast<std::int64_t>(recovered.size()), std::memory_order_relaxed);
    (void)core->queue.tell(detail::QAccepted{std::move(recovered)});
  }
  core->proxy = detail::spawn_job_proxy(system, name + ".proxy", weak);
  if (!core->proxy) return refuse();
  for (std::size_t i = 0; i < core->slots.size(); ++i) {
    auto f = core->spawn_fsm(i, 0);
    if (!f) return refuse();
    std::lock_guard lk(core->slots[i]->mu);
    core->slots[i]->fsm = std::move(f);
  }
  core->watchdog = detail::spawn_job_watchdog(system, name + ".watchdog", weak);
  if (!core->watchdog) return refuse();
  // Shutdown answers every job first. The hook holds the service weakly.
  (void)system.add_shutdown_hook([weak] {
    if (auto c = weak.lock()) {
      c->begin_stop();
      (void)c->wait_stopped(std::chrono::seconds(10));
    }
  });
  return JobService(std::make_shared<detail::LocalJobBackend>(std::move(core)));
}

// The handle forwards; the backend decides. Nothing here allocates: a
// submit costs the backend's submit and one virtual call.
Future<JobOutcome> JobService::submit(Job job, int priority, std::optional<Duration> timeout) const {
  return backend_->submit(std::move(job), priority, timeout);
}
Future<JobId> JobService::enqueue(Job job, int priority, std::optional<Duration> timeout) const {
  return backend_->enqueue(std::move(job), priority, timeout);
}
void JobService::pause() const { backend_->pause(); }
void JobService::resume() const { backend_->resume(); }
JobStats JobService::stats() const { return backend_->stats(); }
std::vector<JobDeadLetter> JobService::dead_letters() const { return backend_->dead_letters(); }
Result<void> JobService::stop(Duration bound) const { return backend_->stop(bound); }
Result<void> JobService::health() const { return backend_->health(); }
const JobSettings& JobService::settings() const noexcept { return backend_->settings(); }

Result<void> detail::check_job_settings(const JobSettings& settings, const JobTranslator& translator,
                                        const JobWorkers& workers) {
  return detail::validate(settings, translator, workers);
}

JobService detail::make_job_service(std::shared_ptr<JobBackend> backend) {
  return JobService(std::move(backend));
}

// ---------------------------------------------------------------------------
// LocalJobBackend

namespace detail {
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

Future<JobOutcome> LocalJobBackend::submit(Job job, int priority, std::optional<Duration> timeout) {
  return admit_and_send<JobOutcome>(*core_, std::move(job), priority, timeout,
                                    [&](detail::JobRecord r, Promise<JobOutcome> p) {
                                      r.reply = detail::JobAnswer<JobOutcome>(std::move(p));
                                      core_->send(std::move(r), {});
                                    });
}

Future<JobId> LocalJobBackend::enqueue(Job job, int priority, std::optional<Duration> timeout) {
  return admit_and_send<JobId>(*core_, std::move(job), priority, timeout,
                               [&](detail::JobRecord r, Promise<JobId> p) {
                                 core_->send(std::move(r), detail::JobAnswer<JobId>(std::move(p)));
                               });
}

void LocalJobBackend::pause() { (void)core_->queue.tell(detail::QPause{true}); }
void LocalJobBackend::resume() { (void)core_->queue.tell(detail::QPause{false}); }

JobStats LocalJobBackend::stats() const {
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

std::vector<JobDeadLetter> LocalJobBackend::dead_letters() const {
  std::lock_guard lk(core_->dead_mu);
  return {core_->dead.begin(), core_->dead.end()};
}

Result<void> LocalJobBackend::stop(Duration bound) {
  core_->begin_stop();
  if (core_->wait_stopped(bound)) return {};
  return Error(ErrorCode::timeout, "job service '" + core_->settings.name + "': queue or proxy still running after " +
                                       detail::job_ms(bound));
}

Result<void> LocalJobBackend::health() const {
  if (auto f = core_->failed_with()) return std::move(*f);
  return {};
}

const JobSettings& LocalJobBackend::settings() const noexcept { return core_->settings; }

}  // namespace
}  // namespace detail
}  // namespace troupe
