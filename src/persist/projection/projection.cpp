// The projection runtime (projection.hpp): an actor that queries the
// journal after the stored offset, on hints and on a poll timer, and hands
// each page to a thread of its own that applies it to the read model
// together with the offset; back-off, failure and restart.

#include "troupe/persist/projection.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"

namespace troupe {

std::string_view to_string(ProjectionState s) noexcept {
  switch (s) {
    case ProjectionState::running: return "running";
    case ProjectionState::failed: return "failed";
    case ProjectionState::stopped: return "stopped";
  }
  return "unknown";
}

std::optional<std::int64_t> projection_lag_quantile(const ProjectionStatus& s, double q) {
  std::uint64_t total = 0;
  for (auto c : s.lag_counts) total += c;
  if (total == 0 || q <= 0 || q > 1) return std::nullopt;
  const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total)));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < projection_lag_bounds_ms.size(); ++i) {
    seen += s.lag_counts[i];
    if (seen >= rank) return projection_lag_bounds_ms[i];
  }
  return std::nullopt;
}

namespace detail {

// A thread that runs the read model's blocking transactions, one at a time.
class ProjectionWorker {
 public:
  explicit ProjectionWorker(std::unique_ptr<ProjectionTarget> target) : target_(std::move(target)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~ProjectionWorker() {
    {
      std::lock_guard lk(mu_);
      closed_ = true;
    }
    cv_.notify_one();
    if (thread_.get_id() == std::this_thread::get_id())
      thread_.detach();
    else
      thread_.join();
  }
  ProjectionWorker(const ProjectionWorker&) = delete;
  ProjectionWorker& operator=(const ProjectionWorker&) = delete;

  void post(std::function<void(ProjectionTarget&)> task) {
    {
      std::lock_guard lk(mu_);
      if (closed_) return;
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void(ProjectionTarget&)> task;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return closed_ || !queue_.empty(); });
        if (closed_) return;  // what is queued is dropped: the projection stopped
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task(*target_);
    }
  }

  std::unique_ptr<ProjectionTarget> target_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void(ProjectionTarget&)>> queue_;  // guarded by mu_
  bool closed_ = false;                                       // guarded by mu_
  std::thread thread_;
};

struct ProjWake {};
struct ProjLoaded {
  Result<std::optional<JournalOffset>> offset;
};
struct ProjPage {
  Result<EventPage> page;
};
struct ProjApplied {
  Result<void> result;
  std::size_t failed_at = 0;
};
struct ProjRetry {};
struct ProjRestart {};
struct ProjLinger {};
using ProjMsg = std::variant<ProjWake, ProjLoaded, ProjPage, ProjApplied, ProjRetry, ProjRestart, ProjLinger>;

struct ProjectionCore {
  ProjectionSettings settings;
  std::string key;
  std::shared_ptr<Journal> journal;
  std::shared_ptr<ProjectionWorker> worker;
  ActorRef<ProjMsg> actor;
  std::atomic<bool> wake_queued{false};

  mutable std::mutex mu;
  std::condition_variable changed;
  ProjectionStatus status;  // guarded by mu

  template <class F>
  void update(F&& f) {
    {
      std::lock_guard lk(mu);
      f(status);
    }
    changed.notify_all();
  }
};

namespace {

std::int64_t wall_ms(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

class ProjectionActor final : public Actor<ProjMsg> {
 public:
  // Holds the core weakly in its spawn arguments (the core holds the
  // actor's ref) and strongly once running.
  explicit ProjectionActor(const std::weak_ptr<ProjectionCore>& core) : core_(core.lock()) {
    if (!core_) throw std::logic_error("the projection was dropped before its actor started");
  }

  void on_start() {
    std::weak_ptr<ProjectionCore> weak = core_;
    // Its own ref, not core_->actor: start_projection may still be storing
    // that one while a hint comes in on the journal's thread. on_stop
    // removes the listener, and the ref with it.
    listener_ = core_->journal->add_append_listener([weak, self = this->self()] {
      auto c = weak.lock();
      if (c && !c->wake_queued.exchange(true, std::memory_order_acq_rel)) (void)self.tell(ProjWake{});
    });
    (void)start_periodic_timer("poll", core_->settings.poll_interval, ProjWake{});
    load(true);
  }

  void on_stop() {
    if (listener_ != 0) core_->journal->remove_append_listener(listener_);
    core_->update([](ProjectionStatus& s) {
      if (s.state == ProjectionState::running) s.state = ProjectionState::stopped;
    });
  }

  void receive(ProjMsg& m) {
    std::visit(overloaded{
                   [&](ProjWake&) {
                     core_->wake_queued.store(false, std::memory_order_release);
                     wake();
                   },
                   [&](ProjLinger&) {
                     lingering_ = false;
                     query();
                   },
                   [&](ProjLoaded& l) { on_loaded(std::move(l.offset)); },
                   [&](ProjPage& p) { on_page(std::move(p.page)); },
                   [&](ProjApplied& a) { on_applied(std::move(a.result), a.failed_at); },
                   [&](ProjRetry&) { retry(); },
                   [&](ProjRestart&) { restart(); },
               },
               m);
  }

 private:
  enum class Step { loading, idle, querying, applying, backing_off, failed };

  // Runs setup (the first time) and reads the stored offset, on the worker.
  void load(bool with_setup) {
    step_ = Step::loading;
    auto self = this->self();
    std::string key = core_->key;
    core_->worker->post([self, key, with_setup](ProjectionTarget& t) {
      if (with_setup)
        if (auto s = t.setup(); !s) return (void)self.tell(ProjLoaded{std::move(s).error()});
      (void)self.tell(ProjLoaded{t.load_offset(key)});
    });
  }

  void on_loaded(Result<std::optional<JournalOffset>> r) {
    if (!r) return failed_try(std::move(r).error(), std::nullopt, !set_up_);
    set_up_ = true;
    offset_ = *r;
    core_->update([&](ProjectionStatus& s) { s.offset = offset_; });
    step_ = Step::idle;
    query();
  }

  // A hint or the poll: query at once, or after the linger when the last
  // query found the reader caught up.
  void wake() {
    const Duration linger = core_->settings.linger;
    if (linger <= Duration::zero() || step_ != Step::idle || !caught_up_) return query();
    if (lingering_) return;
    lingering_ = true;
    this->start_timer("linger", linger, ProjLinger{});
  }

  void query() {
    if (step_ != Step::idle) {
      if (step_ == Step::querying || step_ == Step::applying) again_ = true;
      return;
    }
    step_ = Step::querying;
    again_ = false;
    auto self = this->self();
    const auto& st = core_->settings;
    // No waiting for hidden events: the hints and the poll bring it back.
    core_->journal->query_events(EventQuery{st.source, offset_.value_or(JournalOffset{}), st.batch,
                                            std::chrono::milliseconds(0)},
                                 [self](Result<EventPage> p) { (void)self.tell(ProjPage{std::move(p)}); });
  }

  void on_page(Result<EventPage> r) {
    if (!r) return failed_try(std::move(r).error(), std::nullopt, false);
    failures_ = 0;
    caught_up_ = r->events.empty();
    if (r->events.empty()) {
      step_ = Step::idle;
      core_->update([](ProjectionStatus& s) {
        s.caught_up = true;
        s.lag_ms = 0;
      });
      if (again_) query();
      return;
    }
    page_ = std::make_shared<std::vector<StreamEvent>>(std::move(r->events));
    apply();
  }

  void apply() {
    step_ = Step::applying;
    auto self = this->self();
    auto page = page_;
    std::string key = core_->key;
    std::optional<JournalOffset> from = offset_;
    auto on_applied = core_->settings.on_applied;
    core_->worker->post([self, page, key, from, on_applied](ProjectionTarget& t) {
      std::size_t failed_at = 0;
      Result<void> r = t.apply(key, from, page->back().offset, *page, failed_at);
      if (r && on_applied) on_applied(*page);
      (void)self.tell(ProjApplied{std::move(r), failed_at});
    });
  }

  void on_applied(Result<void> r, std::size_t failed_at) {
    if (!r) {
      if (r.error().code() == ErrorCode::journal_conflict) {
        // Another instance moved the offset: read it again, apply nothing.
        core_->update([](ProjectionStatus& s) { ++s.conflicts; });
        page_.reset();
        return load(false);
      }
      return failed_try(std::move(r).error(), failed_at, true);
    }
    attempts_ = 0;
    const auto& page = *page_;
    offset_ = page.back().offset;
    const std::int64_t now = wall_ms(wall_now());
    const std::int64_t lag = std::max<std::int64_t>(0, now - page.back().event.timestamp_ms);
    core_->update([&](ProjectionStatus& s) {
      for (const StreamEvent& e : page) {
        const std::int64_t l = std::max<std::int64_t>(0, now - e.event.timestamp_ms);
        const auto b = std::lower_bound(projection_lag_bounds_ms.begin(), projection_lag_bounds_ms.end(), l);
        ++s.lag_counts[static_cast<std::size_t>(b - projection_lag_bounds_ms.begin())];
        s.lag_sum_ms += l;
      }
      s.offset = offset_;
      s.events_applied += page.size();
      ++s.pages_applied;
      s.lag_ms = lag;
      s.caught_up = false;
    });
    page_.reset();
    step_ = Step::idle;
    // After a full page there is more; after a short one, one more query
    // finds whether the reader has caught up (and records it).
    query();
  }

  // A try failed: a handler or read model failure (page, counted against
  // max_attempts), a setup failure (counted too), or a journal error on a
  // query (retried without limit).
  void failed_try(Error e, std::optional<std::size_t> failed_at, bool counts) {
    const auto& st = core_->settings;
    if (counts) ++attempts_;
    if (counts && attempts_ >= st.max_attempts) {
      step_ = Step::failed;
      ProjectionFailure f;
      f.attempts = attempts_;
      f.error = std::move(e);
      if (page_ && !page_->empty()) {
        const StreamEvent& ev = (*page_)[std::min(failed_at.value_or(0), page_->size() - 1)];
        f.persistence_id = ev.persistence_id;
        f.seq = ev.event.seq;
        f.offset = ev.offset;
      }
      core_->update([&](ProjectionStatus& s) {
        s.state = ProjectionState::failed;
        s.failure = std::move(f);
      });
      return;
    }
    step_ = Step::backing_off;
    const std::uint32_t tries = counts ? attempts_ : ++failures_;
    Duration d = st.min_backoff;
    for (std::uint32_t i = 1; i < tries && d < st.max_backoff; ++i) d *= 2;
    // Armed before the count is published, so whoever sees the count finds
    // the back-off running.
    this->start_timer("retry", std::min(d, st.max_backoff), ProjRetry{});
    core_->update([](ProjectionStatus& s) { ++s.retries; });
  }

  void retry() {
    if (step_ != Step::backing_off) return;
    if (!set_up_) return load(true);
    if (page_) return apply();
    step_ = Step::idle;
    query();
  }

  void restart() {
    if (step_ != Step::failed) return;
    attempts_ = 0;
    failures_ = 0;
    page_.reset();
    core_->update([](ProjectionStatus& s) {
      s.state = ProjectionState::running;
      s.failure.reset();
    });
    load(!set_up_);
  }

  std::shared_ptr<ProjectionCore> core_;
  std::uint64_t listener_ = 0;
  Step step_ = Step::loading;
  bool set_up_ = false;
  bool again_ = false;
  bool caught_up_ = false;  // the last query found nothing newer
  bool lingering_ = false;  // a linger timer is running
  std::optional<JournalOffset> offset_;
  std::shared_ptr<std::vector<StreamEvent>> page_;  // the page being applied or retried
  std::uint32_t attempts_ = 0;                       // failed tries of this page (or of setup)
  std::uint32_t failures_ = 0;                       // journal errors in a row
};

Result<void> check(const std::shared_ptr<Journal>& journal, const ProjectionSettings& s) {
  auto bad = [&](std::string what) {
    return Error(ErrorCode::invalid_argument, "projection '" + s.name.substr(0, 128) + "': " + what);
  };
  if (s.name.empty() || s.name.size() > 128) return bad("the name must be 1 to 128 characters");
  for (char c : s.name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return bad("the name may hold only letters, digits, '.', '_' and '-'");
  if (auto q = validate_query(EventQuery{s.source, {}, std::max<std::size_t>(s.batch, 1)}); !q)
    return bad(q.error().message());
  if (s.batch == 0 || s.batch > max_query_limit) return bad("batch must be 1 to " + std::to_string(max_query_limit));
  if (s.poll_interval <= Duration::zero()) return bad("poll_interval must be positive");
  if (s.min_backoff <= Duration::zero() || s.max_backoff < s.min_backoff)
    return bad("back-off: 0 < min_backoff <= max_backoff");
  if (s.max_attempts == 0) return bad("max_attempts must be at least 1");
  if (!journal) return bad("no journal");
  if (!journal->supports_queries())
    return bad("the " + std::string(journal->name()) + " journal keeps no global order to project");
  return {};
}

}  // namespace

Result<std::shared_ptr<ProjectionCore>> start_projection(ActorSystem& system, std::shared_ptr<Journal> journal,
                                                         ProjectionSettings settings,
                                                         std::unique_ptr<ProjectionTarget> target) {
  if (auto ok = check(journal, settings); !ok) return std::move(ok).error();
  auto core = std::make_shared<ProjectionCore>();
  core->key = settings.name + "/" + settings.source.to_string();
  core->status.key = core->key;
  core->settings = std::move(settings);
  core->journal = std::move(journal);
  core->worker = std::make_shared<ProjectionWorker>(std::move(target));
  core->actor = system.spawn<ProjectionActor>(SpawnOptions{.name = "projection"}, std::weak_ptr<ProjectionCore>(core));
  if (!core->actor) return Error(ErrorCode::shutting_down, "the actor system is shutting down");
  return core;
}

ProjectionStatus projection_status(const ProjectionCore& core) {
  std::lock_guard lk(core.mu);
  return core.status;
}

void stop_projection(ProjectionCore& core) { core.actor.stop(); }

void restart_projection(ProjectionCore& core) { (void)core.actor.tell(ProjRestart{}); }

bool wait_projection(ProjectionCore& core, const std::function<bool(const ProjectionStatus&)>& until, Duration bound) {
  std::unique_lock lk(core.mu);
  return core.changed.wait_for(lk, bound, [&] { return until(core.status); });
}

}  // namespace detail
}  // namespace troupe
