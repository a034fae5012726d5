// ReminderService (reminder_service.hpp): one actor that takes due
// reminders from its store a page at a time, delivers them through a token
// bucket, and records each firing or failed try.

#include "troupe/persist/reminder_service.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <deque>
#include <exception>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>

#include "reminder_support.hpp"

namespace troupe {
namespace detail {

struct ReminderWake {};
struct ReminderFinished {
  std::uint64_t attempt = 0;
  Result<void> result;
  bool timed_out = false;
};
struct ReminderSet {
  ReminderSpec spec;
  std::shared_ptr<Promise<void>> done;
};
struct ReminderCancel {
  std::string owner, name;
  std::shared_ptr<Promise<bool>> done;
};
using ReminderMsg = std::variant<ReminderWake, ReminderFinished, ReminderSet, ReminderCancel>;

// What the handles and the actor share. Counters are written by the actor
// and read by anyone.
struct ReminderCore {
  ReminderSettings settings;
  ReminderDeliver deliver;  // called, and cleared at the stop, by the actor only
  std::shared_ptr<ReminderStore> store;
  ActorRef<ReminderMsg> actor;
  std::atomic<std::uint64_t> delivered{0}, failed{0}, retried{0}, timeouts{0}, store_errors{0}, stale{0}, lapsed{0},
      in_flight{0}, held{0}, max_held{0}, due_now{0};
  std::atomic<std::int64_t> oldest_lag_ms{0};
};

namespace {

std::int64_t ms_of(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}
std::int64_t ms_of(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }
void add(std::atomic<std::uint64_t>& a, std::uint64_t n = 1) { a.fetch_add(n, std::memory_order_relaxed); }

class ReminderActor final : public Actor<ReminderMsg> {
 public:
  // The spawn arguments hold the core weakly: the core holds the actor's
  // ref, and a strong one back would be a cycle.
  explicit ReminderActor(const std::weak_ptr<ReminderCore>& core) : core_(core.lock()) {
    if (!core_) throw std::logic_error("the reminder service was dropped before its actor started");
    const auto& st = core_->settings;
    burst_ = static_cast<double>(st.burst);
    tokens_ = burst_;
  }

  void on_start() {
    last_refill_ = now();
    pump();
  }

  void on_stop() {
    core_->in_flight.store(0, std::memory_order_relaxed);
    core_->held.store(0, std::memory_order_relaxed);
    // The deliver function usually holds an entity registry whose entities
    // hold this service's handles (the core): a cycle that would keep both
    // alive for ever. Nothing delivers after the stop, so it goes here.
    core_->deliver = nullptr;
  }

  void receive(ReminderMsg& m) {
    std::visit(overloaded{
                   [&](ReminderWake&) {
                     cooling_ = false;
                     pump();
                   },
                   [&](ReminderFinished& f) { finish(f.attempt, std::move(f.result), f.timed_out); },
                   [&](ReminderSet& s) {
                     drop_queued(s.spec.owner, s.spec.name);
                     auto r = core_->store->set(s.spec);
                     if (!r) store_error("setting a reminder", r.error());
                     s.done->set_result(std::move(r));
                     pump();
                   },
                   [&](ReminderCancel& c) {
                     drop_queued(c.owner, c.name);
                     auto r = core_->store->cancel(c.owner, c.name);
                     if (!r) store_error("cancelling a reminder", r.error());
                     c.done->set_result(std::move(r));
                   },
               },
               m);
  }

 private:
  void pump() {
    refill();
    if (queue_.empty() && running_.empty() && !cooling_) fetch();
    const auto& st = core_->settings;
    let_go_lapsing();
    while (!queue_.empty() && running_.size() < st.max_in_flight && tokens_ >= 1.0 - kSlack) {
      tokens_ -= 1.0;
      Reminder r = std::move(queue_.front());
      queue_.pop_front();
      start(std::move(r));
    }
    core_->held.store(queue_.size() + running_.size(), std::memory_order_relaxed);
    schedule();
  }

  void refill() {
    const TimePoint t = now();
    const double secs = std::chrono::duration<double>(t - last_refill_).count();
    last_refill_ = t;
    tokens_ = std::min(burst_, tokens_ + secs * core_->settings.max_per_second);
  }

  // A queued reminder starts only while its claim covers a whole try
  // (attempt_timeout): otherwise another service could take it while this
  // one still delivers it. The page shares one claim, so once it runs short
  // the rest of the page goes back to the store, due again when it lapses.
  void let_go_lapsing() {
    if (queue_.empty()) return;
    if (ms_of(wall_now()) + ms_of(core_->settings.attempt_timeout) < claim_end_ms_) return;
    add(core_->lapsed, queue_.size());
    queue_.clear();
  }

  void fetch() {
    const auto& st = core_->settings;
    const std::int64_t now_ms = ms_of(wall_now());
    next_try_.reset();
    const std::int64_t lease_ms = ms_of(st.lease);
    auto page = core_->store->take_due(now_ms, st.page_size, lease_ms);
    if (!page) return store_error("taking due reminders", page.error());
    claim_end_ms_ = reminders::claim_end(now_ms, lease_ms);
    std::uint64_t due = page->size();
    if (page->empty() || page->size() >= st.page_size) {
      auto sum = core_->store->summary(now_ms);
      if (!sum) return store_error("counting due reminders", sum.error());
      due += sum->due;  // the page is claimed: no longer counted as due
      next_try_ = sum->next_try_ms;
    }
    core_->due_now.store(due, std::memory_order_relaxed);
    core_->oldest_lag_ms.store(page->empty() ? 0 : std::max<std::int64_t>(0, now_ms - page->front().next_try_ms),
                               std::memory_order_relaxed);
    for (auto& r : *page) queue_.push_back(std::move(r));
    const std::uint64_t held = queue_.size();
    std::uint64_t seen = core_->max_held.load(std::memory_order_relaxed);
    while (held > seen && !core_->max_held.compare_exchange_weak(seen, held, std::memory_order_relaxed)) {
    }
  }

  void schedule() {
    const auto& st = core_->settings;
    if (!queue_.empty()) {
      if (running_.size() >= st.max_in_flight) return;  // a finished delivery pumps again
      // Short of tokens: wake when there are enough for the next burst.
      const double need = std::min(burst_, static_cast<double>(queue_.size())) - tokens_;
      const auto ns = static_cast<Duration::rep>(std::ceil(std::max(need, 0.0) * 1e9 / st.max_per_second));
      start_timer("wake", Duration(std::max<Duration::rep>(ns, 1)), ReminderWake{});
      return;
    }
    if (!running_.empty()) return;
    Duration d = st.poll_interval;
    if (next_try_ && !cooling_) {
      const std::int64_t wait_ms = std::max<std::int64_t>(0, *next_try_ - ms_of(wall_now()));
      if (wait_ms < ms_of(d)) d = std::chrono::milliseconds(wait_ms);
    }
    start_timer("wake", d, ReminderWake{});
  }

  void start(Reminder r) {
    const std::uint64_t attempt = ++attempts_;
    if (r.attempts > 0) add(core_->retried);
    add(core_->in_flight);
    start_timer("try|" + std::to_string(attempt), core_->settings.attempt_timeout,
                ReminderFinished{attempt,
                                 Error(ErrorCode::timeout, "no answer within " +
                                                               std::to_string(ms_of(core_->settings.attempt_timeout)) +
                                                               " ms"),
                                 true});
    const Reminder& held = running_.emplace(attempt, std::move(r)).first->second;
    Future<void> f = [&]() -> Future<void> {
      try {
        return core_->deliver(held);
      } catch (...) {
        Promise<void> p;
        p.set_exception(std::current_exception(), "the reminder's delivery threw");
        return p.future();
      }
    }();
    auto self = this->self();
    std::move(f).then([self, attempt](Result<void> res) { self.tell(ReminderFinished{attempt, std::move(res), false}); });
  }

  void finish(std::uint64_t attempt, Result<void> res, bool timed_out) {
    auto it = running_.find(attempt);
    if (it == running_.end()) return;  // the other outcome of a finished try
    Reminder r = std::move(it->second);
    running_.erase(it);
    cancel_timer("try|" + std::to_string(attempt));
    core_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    const std::int64_t now_ms = ms_of(wall_now());
    Result<bool> stored = false;
    if (res) {
      add(core_->delivered);
      stored = core_->store->record_fired(r, now_ms);
    } else {
      add(core_->failed);
      if (timed_out) add(core_->timeouts);
      const std::string why = res.error().to_string();
      log_once("delivering '" + r.name + "' of '" + r.owner + "' failed (try " + std::to_string(r.attempts + 1) +
               "): " + why);
      stored = core_->store->record_failed(r, now_ms + ms_of(backoff(r.attempts + 1)), why);
    }
    if (!stored) {
      store_error("recording a delivery", stored.error());
    } else if (!*stored) {
      add(core_->stale);
    }
    pump();
  }

  // The wait after the `tries`-th failed try.
  Duration backoff(std::uint32_t tries) const {
    const auto& st = core_->settings;
    const double d = static_cast<double>(st.min_backoff.count()) *
                     std::pow(st.backoff_factor, static_cast<double>(tries > 0 ? tries - 1 : 0));
    return Duration(static_cast<Duration::rep>(std::min(d, static_cast<double>(st.max_backoff.count()))));
  }

  // A reminder set again or cancelled must not be delivered as it was.
  void drop_queued(const std::string& owner, const std::string& name) {
    std::erase_if(queue_, [&](const Reminder& r) { return r.owner == owner && r.name == name; });
    core_->held.store(queue_.size() + running_.size(), std::memory_order_relaxed);
  }

  // After a store error the next page waits for the next wake (at most
  // poll_interval): a store that reads but cannot record would otherwise
  // have the same reminders taken and delivered again at once, in a loop.
  void store_error(const char* doing, const Error& e) {
    cooling_ = true;
    add(core_->store_errors);
    log_once(std::string(doing) + ": " + e.to_string());
  }

  // The same line again says nothing new.
  void log_once(std::string line) {
    if (core_->settings.log && line != last_log_)
      std::fprintf(stderr, "troupe: reminders (%s): %s\n", std::string(core_->store->kind()).c_str(), line.c_str());
    last_log_ = std::move(line);
  }

  static constexpr double kSlack = 1e-9;  // rounding in the refill
  std::shared_ptr<ReminderCore> core_;
  std::deque<Reminder> queue_;
  std::unordered_map<std::uint64_t, Reminder> running_;
  std::optional<std::int64_t> next_try_;
  std::int64_t claim_end_ms_ = 0;  // when the claim on the page held ends (wall ms)
  bool cooling_ = false;  // a store call failed: no page before the next wake
  std::uint64_t attempts_ = 0;
  double burst_ = 1, tokens_ = 1;
  TimePoint last_refill_{};
  std::string last_log_;
};

Result<void> check(const std::shared_ptr<ReminderStore>& store, ReminderSettings& s, const ReminderDeliver& deliver) {
  auto bad = [](std::string m) { return Error(ErrorCode::invalid_argument, "reminders: " + std::move(m)); };
  if (!store) return bad("no store");
  if (!deliver) return bad("no deliver function");
  if (!(s.max_per_second > 0) || !std::isfinite(s.max_per_second)) return bad("max_per_second must be above zero");
  if (s.burst == 0) s.burst = std::max<std::size_t>(1, static_cast<std::size_t>(s.max_per_second / 10));
  if (s.page_size == 0 || s.max_in_flight == 0) return bad("page_size and max_in_flight must be at least 1");
  if (s.poll_interval <= Duration::zero() || s.attempt_timeout <= Duration::zero())
    return bad("poll_interval and attempt_timeout must be above zero");
  if (s.lease <= s.attempt_timeout)
    return bad("lease must be above attempt_timeout (a try must end before another service may take it)");
  if (s.min_backoff < Duration::zero() || s.max_backoff < s.min_backoff || !(s.backoff_factor >= 1.0))
    return bad("back-off: 0 <= min_backoff <= max_backoff and backoff_factor >= 1");
  return {};
}

template <class R>
Future<R> failed_future(Error e) {
  Promise<R> p;
  Future<R> f = p.future();
  p.set_error(std::move(e));
  return f;
}

Error no_service() { return Error(ErrorCode::shutting_down, "the reminder service has stopped"); }

}  // namespace
}  // namespace detail

Result<ReminderService> ReminderService::start(ActorSystem& system, std::shared_ptr<ReminderStore> store,
                                               ReminderSettings settings, ReminderDeliver deliver) {
  if (auto ok = detail::check(store, settings, deliver); !ok) return std::move(ok).error();
  auto core = std::make_shared<detail::ReminderCore>();
  core->settings = std::move(settings);
  core->deliver = std::move(deliver);
  core->store = std::move(store);
  core->actor =
      system.spawn<detail::ReminderActor>(SpawnOptions{.name = "reminders"}, std::weak_ptr<detail::ReminderCore>(core));
  if (!core->actor) return Error(ErrorCode::shutting_down, "the actor system is shutting down");
  return ReminderService(std::move(core));
}

ReminderStats ReminderService::stats() const {
  auto r = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const auto& c = *core_;
  ReminderStats s;
  s.delivered = r(c.delivered);
  s.failed = r(c.failed);
  s.retried = r(c.retried);
  s.timeouts = r(c.timeouts);
  s.store_errors = r(c.store_errors);
  s.stale = r(c.stale);
  s.lapsed = r(c.lapsed);
  s.in_flight = r(c.in_flight);
  s.held = r(c.held);
  s.max_held = r(c.max_held);
  s.due_now = r(c.due_now);
  s.oldest_lag_ms = c.oldest_lag_ms.load(std::memory_order_relaxed);
  return s;
}

void ReminderService::poke() const { (void)core_->actor.tell(detail::ReminderWake{}); }
void ReminderService::stop() const { core_->actor.stop(); }
const ReminderSettings& ReminderService::settings() const { return core_->settings; }
ReminderStore& ReminderService::store() const { return *core_->store; }

Future<void> Reminders::set(ReminderSpec spec) const {
  if (!core_) return detail::failed_future<void>(detail::no_service());
  auto p = std::make_shared<Promise<void>>();
  Future<void> f = p->future();
  if (core_->actor.tell(detail::ReminderSet{std::move(spec), p}) != Delivery::delivered)
    p->set_error(detail::no_service());
  return f;
}

Future<void> Reminders::set(std::string owner, std::string name, WallTime due, Duration period,
                            std::string payload) const {
  return set(ReminderSpec{std::move(owner), std::move(name), detail::ms_of(due), detail::ms_of(period),
                          std::move(payload)});
}

Future<bool> Reminders::cancel(std::string owner, std::string name) const {
  if (!core_) return detail::failed_future<bool>(detail::no_service());
  auto p = std::make_shared<Promise<bool>>();
  Future<bool> f = p->future();
  if (core_->actor.tell(detail::ReminderCancel{std::move(owner), std::move(name), p}) != Delivery::delivered)
    p->set_error(detail::no_service());
  return f;
}

ReminderDeliver route_by_type(std::map<std::string, ReminderDeliver, std::less<>> by_type) {
  return [by_type = std::move(by_type)](const Reminder& r) -> Future<void> {
    const auto bar = r.owner.find('|');
    auto it = bar == std::string::npos ? by_type.end() : by_type.find(std::string_view(r.owner).substr(0, bar));
    if (it == by_type.end())
      return detail::failed_future<void>(
          Error(ErrorCode::invalid_argument, "no delivery for the type of reminder owner '" + r.owner + "'"));
    return it->second(r);
  };
}

}  // namespace troupe
