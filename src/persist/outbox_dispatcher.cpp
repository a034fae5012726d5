// OutboxDispatcher (outbox_dispatcher.hpp): one actor that claims due
// outbox records, runs their handlers, times each try out, and stores what
// became of it (done, retry after a back-off, failed for good).

#include "troupe/persist/outbox_dispatcher.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace troupe {
namespace detail {

struct OutboxTick {};
struct OutboxCount {};
struct OutboxClaimed {
  Result<std::vector<OutboxEntry>> entries;
};
// A try ended: its handler's outcome, or its timeout (timed_out).
struct OutboxFinished {
  std::string key;
  std::uint64_t token = 0;
  Result<void> result;
  bool timed_out = false;
};
struct OutboxSettled {
  Result<void> result;
};
struct OutboxCounted {
  Result<OutboxView> view;
};
using OutboxMsg = std::variant<OutboxTick, OutboxCount, OutboxClaimed, OutboxFinished, OutboxSettled, OutboxCounted>;

// What the handle and the actor share. Counters are written by the actor
// and read by anyone.
struct OutboxCore {
  OutboxSettings settings;
  OutboxHandlers handlers;
  std::shared_ptr<Journal> journal;
  std::uint64_t incarnation = 0;
  ActorRef<OutboxMsg> actor;

  std::atomic<std::uint64_t> claimed{0}, sent{0}, retries{0}, failures{0}, timeouts{0}, journal_errors{0},
      in_flight{0};
  std::atomic<bool> counted{false};
  std::atomic<std::uint64_t> pending{0}, failed{0};
};

namespace {

std::int64_t ms_of(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::int64_t ms_of(Duration d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); }

void add(std::atomic<std::uint64_t>& a, std::uint64_t n = 1) { a.fetch_add(n, std::memory_order_relaxed); }

// A number no earlier run of any owner used: time and randomness mixed.
std::uint64_t new_incarnation() {
  std::random_device rd;
  std::uint64_t r = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  r ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  r &= 0x7fff'ffff'ffff'ffffull;  // stored as a signed 64-bit number
  return r == 0 ? 1 : r;
}

class OutboxActor final : public Actor<OutboxMsg> {
 public:
  // The spawn arguments, which the actor's cell keeps, hold the core
  // weakly: the core holds the cell's ref, and a strong one back would be a
  // cycle that keeps the journal open forever.
  explicit OutboxActor(const std::weak_ptr<OutboxCore>& core) : core_(core.lock()) {
    if (!core_) throw std::logic_error("the outbox dispatcher was dropped before its actor started");
  }

  void on_start() {
    (void)start_periodic_timer("poll", core_->settings.poll_interval, OutboxTick{});
    (void)start_periodic_timer("count", core_->settings.count_interval, OutboxCount{});
    claim();
    count();
  }

  void on_stop() { core_->in_flight.store(0, std::memory_order_relaxed); }

  void receive(OutboxMsg& m) {
    std::visit(overloaded{
                   [&](OutboxTick&) { claim(); },
                   [&](OutboxCount&) { count(); },
                   [&](OutboxClaimed& c) { on_claimed(std::move(c.entries)); },
                   [&](OutboxFinished& f) { finish(f.key, f.token, std::move(f.result), f.timed_out); },
                   [&](OutboxSettled& s) {
                     if (!s.result) journal_error("storing what became of a record", s.result.error());
                   },
                   [&](OutboxCounted& c) { on_counted(std::move(c.view)); },
               },
               m);
  }

 private:
  struct Running {
    OutboxEntry entry;
    std::uint64_t token = 0;
  };

  void claim() {
    const auto& st = core_->settings;
    if (claiming_ || running_.size() >= st.max_in_flight) return;
    claiming_ = true;
    OutboxClaim c{st.owner, core_->incarnation, ms_of(wall_now()), ms_of(st.lease), st.max_in_flight - running_.size()};
    asked_ = c.limit;
    auto self = this->self();
    core_->journal->claim_outbox(std::move(c), [self](Result<std::vector<OutboxEntry>> r) {
      self.tell(OutboxClaimed{std::move(r)});
    });
  }

  void on_claimed(Result<std::vector<OutboxEntry>> r) {
    claiming_ = false;
    if (!r) return journal_error("claiming records", r.error());
    const bool full = r->size() >= asked_;
    for (auto& e : *r) {
      if (running_.contains(e.record.key)) continue;  // ours already (a lease cannot run out mid-try)
      run(std::move(e));
    }
    // A full batch: more may be due; look again without waiting for the poll.
    if (full) claim();
  }

  void run(OutboxEntry e) {
    add(core_->claimed);
    add(core_->in_flight);
    const std::uint64_t token = ++tokens_;
    const std::string key = e.record.key;
    this->start_timer("try|" + key, core_->settings.attempt_timeout,
                      OutboxFinished{key, token,
                                     Error(ErrorCode::timeout,
                                           "no answer within " + std::to_string(ms_of(core_->settings.attempt_timeout)) +
                                               " ms"),
                                     true});
    auto& running = running_[key] = Running{std::move(e), token};
    auto h = core_->handlers.find(running.entry.record.kind);
    if (h == core_->handlers.end())
      return finish(key, token,
                    Error(ErrorCode::invalid_argument, "no handler for outbox kind '" + running.entry.record.kind + "'"),
                    false);
    Future<void> f = [&]() -> Future<void> {
      try {
        return h->second(running.entry);
      } catch (...) {
        Promise<void> p;
        p.set_exception(std::current_exception(), "the outbox handler threw");
        return p.future();
      }
    }();
    auto self = this->self();
    std::move(f).then([self, key, token](Result<void> r) { self.tell(OutboxFinished{key, token, std::move(r), false}); });
  }

  void finish(const std::string& key, std::uint64_t token, Result<void> r, bool timed_out) {
    auto it = running_.find(key);
    if (it == running_.end() || it->second.token != token) return;  // a later outcome of a finished try
    OutboxEntry e = std::move(it->second.entry);
    running_.erase(it);
    this->cancel_timer("try|" + key);
    core_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (timed_out) add(core_->timeouts);
    const auto& st = core_->settings;
    OutboxSettlement s{key, st.owner, core_->incarnation, OutboxSettlement::Outcome::done, 0, {}};
    if (r) {
      add(core_->sent);
    } else if (e.attempts >= st.max_attempts) {
      s.outcome = OutboxSettlement::Outcome::failed;
      s.error = r.error().to_string();
      add(core_->failures);
      log("'" + key + "' failed " + std::to_string(e.attempts) + " times, kept as failed: " + s.error);
    } else {
      s.outcome = OutboxSettlement::Outcome::retry;
      s.next_attempt_ms = ms_of(wall_now()) + ms_of(backoff(e.attempts));
      s.error = r.error().to_string();
      add(core_->retries);
    }
    auto self = this->self();
    core_->journal->settle_outbox(std::move(s), [self](Result<void> sr) { self.tell(OutboxSettled{std::move(sr)}); });
    claim();
  }

  // The wait after the `tries`-th failed try.
  Duration backoff(std::uint32_t tries) const {
    const auto& st = core_->settings;
    const double base = static_cast<double>(st.min_backoff.count());
    const double d = base * std::pow(st.backoff_factor, static_cast<double>(tries > 0 ? tries - 1 : 0));
    const double cap = static_cast<double>(st.max_backoff.count());
    return Duration(static_cast<Duration::rep>(std::min(d, cap)));
  }

  void count() {
    auto self = this->self();
    core_->journal->read_outbox(OutboxQuery{OutboxStatus::failed, 0},
                                [self](Result<OutboxView> v) { self.tell(OutboxCounted{std::move(v)}); });
  }

  void on_counted(Result<OutboxView> v) {
    if (!v) return journal_error("counting records", v.error());
    core_->pending.store(v->pending, std::memory_order_relaxed);
    core_->failed.store(v->failed, std::memory_order_relaxed);
    core_->counted.store(true, std::memory_order_relaxed);
  }

  void journal_error(const char* doing, const Error& e) {
    add(core_->journal_errors);
    // The same error every poll says nothing new.
    std::string line = std::string(doing) + ": " + e.to_string();
    if (line != last_error_) log(line);
    last_error_ = std::move(line);
  }

  void log(const std::string& what) const {
    if (core_->settings.log)
      std::fprintf(stderr, "troupe: outbox '%s': %s\n", core_->settings.owner.c_str(), what.c_str());
  }

  std::shared_ptr<OutboxCore> core_;
  std::unordered_map<std::string, Running> running_;
  std::uint64_t tokens_ = 0;
  bool claiming_ = false;
  std::size_t asked_ = 0;
  std::string last_error_;
};

Result<void> check(const std::shared_ptr<Journal>& journal, const OutboxSettings& s, const OutboxHandlers& handlers) {
  auto bad = [](std::string m) { return Error(ErrorCode::invalid_argument, "outbox: " + std::move(m)); };
  if (!journal) return bad("no journal");
  if (!journal->stores_outbox()) return bad("the " + std::string(journal->name()) + " journal keeps no outbox");
  if (s.owner.empty()) return bad("the owner is empty");
  if (handlers.empty()) return bad("no handlers");
  for (const auto& [kind, h] : handlers)
    if (kind.empty() || !h) return bad("a handler without a kind or a function");
  if (s.poll_interval <= Duration::zero() || s.count_interval <= Duration::zero())
    return bad("poll_interval and count_interval must be above zero");
  if (s.attempt_timeout <= Duration::zero() || s.lease <= s.attempt_timeout)
    return bad("the lease must be longer than attempt_timeout, which must be above zero");
  if (s.max_in_flight == 0 || s.max_attempts == 0) return bad("max_in_flight and max_attempts must be at least 1");
  if (s.min_backoff < Duration::zero() || s.max_backoff < s.min_backoff || !(s.backoff_factor >= 1.0))
    return bad("back-off: 0 <= min_backoff <= max_backoff and backoff_factor >= 1");
  return {};
}

}  // namespace
}  // namespace detail

Result<OutboxDispatcher> OutboxDispatcher::start(ActorSystem& system, std::shared_ptr<Journal> journal,
                                                 OutboxSettings settings, OutboxHandlers handlers) {
  if (auto ok = detail::check(journal, settings, handlers); !ok) return std::move(ok).error();
  auto core = std::make_shared<detail::OutboxCore>();
  core->settings = std::move(settings);
  core->handlers = std::move(handlers);
  core->journal = std::move(journal);
  core->incarnation = detail::new_incarnation();
  core->actor = system.spawn<detail::OutboxActor>(SpawnOptions{.name = "outbox"}, std::weak_ptr<detail::OutboxCore>(core));
  if (!core->actor) return Error(ErrorCode::shutting_down, "the actor system is shutting down");
  return OutboxDispatcher(std::move(core));
}

OutboxStats OutboxDispatcher::stats() const {
  auto r = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const auto& c = *core_;
  OutboxStats s{r(c.claimed), r(c.sent), r(c.retries), r(c.failures), r(c.timeouts), r(c.journal_errors),
                r(c.in_flight), std::nullopt, std::nullopt};
  if (c.counted.load(std::memory_order_relaxed)) {
    s.pending = r(c.pending);
    s.failed = r(c.failed);
  }
  return s;
}

void OutboxDispatcher::poke() const { (void)core_->actor.tell(detail::OutboxTick{}); }

void OutboxDispatcher::stop() const { core_->actor.stop(); }

Future<OutboxView> OutboxDispatcher::read(OutboxQuery query) const {
  auto p = std::make_shared<Promise<OutboxView>>();
  Future<OutboxView> f = p->future();
  core_->journal->read_outbox(query, [p](Result<OutboxView> v) { p->set_result(std::move(v)); });
  return f;
}

const OutboxSettings& OutboxDispatcher::settings() const { return core_->settings; }

std::uint64_t OutboxDispatcher::incarnation() const { return core_->incarnation; }

}  // namespace troupe
