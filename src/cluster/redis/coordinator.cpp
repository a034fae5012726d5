// The Redis coordinator: one io thread runs two hiredis connections
// (commands and pub/sub), the heartbeat, the fence timer, takeovers, syncs
// and reconciles. Every piece of state below is touched only on that thread,
// except the cached views (members, first-manager answer, fenced flag,
// running units), which sit behind view_mu_ for the public getters.

// clang-format off
#include "../asio_headers.hpp"  // first: see there
// clang-format on
#include "troupe/cluster/coordinator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "redis_connection.hpp"
#include "redis_values.hpp"
#include "scripts.hpp"
#include "troupe/cluster/node_id.hpp"

namespace troupe::cluster {

using detail::KeyNames;
using detail::RedisConnection;
using detail::RedisEndpoint;
using detail::RedisReply;
using detail::Script;
using detail::int_of;
using detail::parse_assignment;
using detail::split_words;
using detail::text_of;

std::string_view to_string(PlacementOutcome o) noexcept {
  switch (o) {
    case PlacementOutcome::assigned:
      return "ASSIGNED";
    case PlacementOutcome::already_installed:
      return "ALREADY_INSTALLED";
    case PlacementOutcome::relocated:
      return "RELOCATED";
    case PlacementOutcome::no_need_to_relocate:
      return "NO_NEED_TO_RELOCATE";
  }
  return "?";
}

namespace {

using std::chrono::duration_cast;
using std::chrono::milliseconds;

TimePoint steady_now() { return TimePoint(std::chrono::steady_clock::now().time_since_epoch()); }
std::chrono::steady_clock::time_point to_asio(TimePoint t) {
  return std::chrono::steady_clock::time_point(t.time_since_epoch());
}
long long to_ms(Duration d) { return duration_cast<milliseconds>(d).count(); }
std::string ms_text(Duration d) { return std::to_string(to_ms(d)) + " ms"; }

std::string random_session() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Runs DesiredSources, which may block, away from the coordinator thread:
// one thread, started by the first job, running jobs in order. Owned by the
// coordinator; post() and shutdown() are thread-safe; shutdown() drops jobs
// not started and waits for the one running.
class SourceRunner {
 public:
  ~SourceRunner() { shutdown(); }
  void post(std::function<void()> job) {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }
  void shutdown() {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      jobs_.clear();
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lk(mu_);
    while (true) {
      cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
      if (stopping_) return;
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      job();
      lk.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace

// ---------------------------------------------------------------------------------

// The coordinator's state and its io thread. Owned by the Coordinator (and,
// for a moment, by completion callbacks that hold a weak reference and post
// back to it); public entry points are thread-safe, everything else runs on
// the io thread (see the top of this file).
class Coordinator::Impl : public std::enable_shared_from_this<Impl> {
 public:
  explicit Impl(CoordinatorSettings s);
  ~Impl();

  void launch() {
    thread_ = std::thread([this] { io_.run(); });
  }
  void halt();

  // --- public entry points (any thread) ---
  Future<void> start();
  Future<void> started();
  Future<void> stop();
  std::vector<Member> members() const {
    std::lock_guard lk(view_mu_);
    return members_view_;
  }
  Result<bool> is_first_manager() const {
    std::lock_guard lk(view_mu_);
    if (!first_manager_)
      return Error(ErrorCode::not_ready, "is_first_manager() asked before start-up finished on node '" +
                                             s_.node_id + "'; wait for started()");
    return *first_manager_;
  }
  bool is_fenced() const noexcept { return fenced_flag_.load(std::memory_order_acquire); }
  std::map<std::string, std::uint64_t> running(const std::string& group) const {
    std::lock_guard lk(view_mu_);
    auto it = running_view_.find(group);
    return it == running_view_.end() ? std::map<std::string, std::uint64_t>{} : it->second;
  }
  Future<Placement> assign(const std::string& group, const std::string& unit, const std::string& spec);
  Future<Placement> relocate(const std::string& group, const std::string& unit, bool force);
  Future<bool> unassign(const std::string& group, const std::string& unit);
  Future<std::vector<Move>> rebalance_all(const std::string& group);
  Future<std::optional<Assignment>> assignment(const std::string& group, const std::string& unit);
  Future<std::vector<Assignment>> owned_units(const std::string& group);
  Future<bool> release(const std::string& group, const std::string& unit, std::uint64_t epoch);
  Future<SyncReport> sync(const std::string& group, DesiredSource source);
  Result<void> serve(const std::string& group, Reconciler reconciler);

  const CoordinatorSettings s_;

 private:
  enum class Phase { idle, starting, running, stopping, stopped };

  struct LocalUnit {
    std::string spec;
    std::uint64_t epoch = 0;
    bool stopping = false;
    bool release_after = false;  // release the hand-off once stopped
  };
  struct ServedGroup {
    Reconciler reconciler;
    std::map<std::string, LocalUnit> units;
    bool in_flight = false;  // a my_units read is out
    bool dirty = false;      // something changed meanwhile: read again
    bool waiting = false;    // some unit waits for a hand-off: re-read on each heartbeat
  };
  struct SyncState {
    DesiredSource source;
    std::vector<Promise<SyncReport>> waiters;        // for the next round
    std::vector<Promise<SyncReport>> round_waiters;  // for the round in flight
    bool in_flight = false;
    bool again = false;
    std::unique_ptr<asio::steady_timer> timer;
  };
  struct PendingRelease {
    std::string group, unit;
    std::uint64_t epoch;
  };
  using Reply = Result<RedisReply>;
  template <class Sig>
  using Fn = troupe::detail::UniqueFunction<Sig>;  // move-only: continuations may own promises
  using ReplyK = Fn<void(Reply)>;

  // Runs `f(promise)` on the io thread; a halted coordinator answers
  // shutting_down.
  template <class T, class F>
  Future<T> call(F&& f) {
    Promise<T> p;
    Future<T> fut = p.future();
    if (halting_.load(std::memory_order_acquire)) {
      p.set_error(shutting_down_error());
      return fut;
    }
    asio::post(io_, [this, p = std::move(p), f = std::forward<F>(f)]() mutable {
      if (halted_) {
        p.set_error(shutting_down_error());
        return;
      }
      f(p);
    });
    return fut;
  }

  Error shutting_down_error() const {
    return Error(ErrorCode::shutting_down, "the coordinator of node '" + s_.node_id + "' has stopped");
  }
  Error not_connected_error() const {
    return Error(ErrorCode::coordination_failed,
                 "not connected to Redis at " + endpoint_.describe() + " (reconnecting)");
  }
  void log(CoordinatorLogLevel level, const std::string& msg) const;

  // --- link ---
  void connect_link(std::function<void(Result<void>)> done);
  void load_scripts(std::function<void(Result<void>)> done);
  void on_link_lost(const Error& e);
  void schedule_reconnect();
  void eval(Script s, std::vector<std::string> args, ReplyK k);
  Reply script_reply(Script s, Reply r) const;

  // --- start, heartbeat, fencing ---
  void begin_start();
  void fail_start(const Error& e);
  void finish_start();
  void tick();
  void send_beat();
  void on_beat(TimePoint sent, bool registering, Reply r);
  void update_view(const RedisReply& view);
  void arm_fence_timer();
  void fence(const std::string& why);
  void unfence();
  void run_takeover(std::vector<std::string> dead);
  void note_epoch(std::uint64_t e) { max_epoch_seen_ = std::max(max_epoch_seen_, e); }

  // --- placement ---
  Error unexpected(Script s, const RedisReply& r) const;
  void do_assign(const std::string& group, const std::string& unit, const std::string& spec, bool notify,
                 Fn<void(Result<Placement>)> k);
  void do_unassign(const std::string& group, const std::string& unit, bool notify, Fn<void(Result<bool>)> k);
  void do_set_spec(const std::string& group, const std::string& unit, const std::string& spec, bool notify,
                   Fn<void(Result<bool>)> k);
  void do_release(const std::string& group, const std::string& unit, std::uint64_t epoch,
                  Fn<void(Result<bool>)> k);

  // --- reconcile ---
  void reconcile(const std::string& group);
  void reconcile_all();
  void apply(const std::string& group, const RedisReply& units);
  void begin_stop(const std::string& group, const std::string& unit, bool release_after);
  void on_stopped(const std::string& group, const std::string& unit, std::uint64_t epoch,
                  const Result<void>& r);
  void publish_running(const std::string& group);
  void maybe_finish_stop();
  void finish_stop();
  void close_all();

  // --- sync ---
  void run_sync(const std::string& group);
  void on_desired(const std::string& group, Result<DesiredSet> desired);
  void finish_sync(const std::string& group, Result<SyncReport> r);
  void schedule_sync(const std::string& group);

  // --- events ---
  void on_event(std::string_view payload);

  KeyNames keys_;
  RedisEndpoint endpoint_;
  std::string session_ = random_session();
  std::vector<std::string> script_keys_;

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  RedisConnection cmd_;
  RedisConnection sub_;
  asio::steady_timer heartbeat_timer_;
  asio::steady_timer fence_timer_;
  asio::steady_timer reconnect_timer_;
  asio::steady_timer periodic_timer_;
  asio::steady_timer start_retry_timer_;
  SourceRunner sources_;

  std::atomic<bool> halting_{false};
  // --- io thread only ---
  bool halted_ = false;
  Phase phase_ = Phase::idle;
  std::array<std::string, detail::script_count> sha_;
  bool link_up_ = false;
  bool connecting_link_ = false;
  Duration backoff_;
  bool beat_in_flight_ = false;
  bool registered_ = false;
  bool fenced_ = false;
  bool superseded_ = false;
  bool takeover_in_flight_ = false;
  TimePoint last_ok_send_{};
  TimePoint start_deadline_{};
  std::uint64_t max_epoch_seen_ = 0;
  std::map<std::string, ServedGroup> served_;
  std::map<std::string, SyncState> syncs_;
  std::vector<PendingRelease> pending_releases_;
  std::vector<Promise<void>> start_waiters_;
  std::vector<Promise<void>> stop_waiters_;
  std::optional<Error> start_error_;
  std::set<std::string> warned_entries_;
  bool link_warned_ = false;
  std::vector<Member> last_members_;

  // --- cached views (view_mu_) ---
  mutable std::mutex view_mu_;
  std::vector<Member> members_view_;
  std::optional<bool> first_manager_;
  std::map<std::string, std::map<std::string, std::uint64_t>> running_view_;
  std::set<std::string> served_names_;
  std::atomic<bool> fenced_flag_{false};
};

// --- construction and shutdown -------------------------------------------------

Coordinator::Impl::Impl(CoordinatorSettings s)
    : s_(std::move(s)),
      keys_(s_.key_prefix),
      endpoint_{s_.redis_host, s_.redis_port, s_.redis_password},
      script_keys_(keys_.script_keys()),
      work_(asio::make_work_guard(io_)),
      cmd_(io_, endpoint_, "commands", s_.command_timeout),
      sub_(io_, endpoint_, "notices", s_.command_timeout),
      heartbeat_timer_(io_),
      fence_timer_(io_),
      reconnect_timer_(io_),
      periodic_timer_(io_),
      start_retry_timer_(io_),
      backoff_(s_.reconnect_min_backoff) {
  cmd_.set_lost_handler([this](const Error& e) { on_link_lost(e); });
  sub_.set_lost_handler([this](const Error& e) { on_link_lost(e); });
}

Coordinator::Impl::~Impl() {
  // The thread is joined (halt()). Run what is left (cancelled waits, late
  // posts) here, while every member they may touch still exists.
  io_.restart();
  io_.poll();
}

void Coordinator::Impl::halt() {
  if (halting_.exchange(true)) return;
  sources_.shutdown();
  asio::post(io_, [this] {
    halted_ = true;
    close_all();
    for (auto& w : start_waiters_) w.set_error(shutting_down_error());
    start_waiters_.clear();
    for (auto& w : stop_waiters_) w.set_error(shutting_down_error());
    stop_waiters_.clear();
    io_.stop();
  });
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // destroyed from one of its own callbacks (documented as not allowed)
    } else {
      thread_.join();
    }
  }
}

void Coordinator::Impl::log(CoordinatorLogLevel level, const std::string& msg) const {
  std::string line = "coordinator " + s_.node_id + ": " + msg;
  if (s_.log) {
    try {
      s_.log(level, line);
    } catch (...) {
    }
    return;
  }
  if (level == CoordinatorLogLevel::warning || level == CoordinatorLogLevel::error)
    std::fprintf(stderr, "troupe: %s\n", line.c_str());
}

// --- the link to Redis ------------------------------------------------------------

void Coordinator::Impl::connect_link(std::function<void(Result<void>)> done) {
  connecting_link_ = true;
  auto fail = [this, done](const Error& e) {
    connecting_link_ = false;
    cmd_.close();
    sub_.close();
    done(e);
  };
  cmd_.connect([this, done, fail](Result<void> r) {
    if (halted_) return;
    if (!r.ok()) return fail(r.error());
    load_scripts([this, done, fail](Result<void> lr) {
      if (halted_) return;
      if (!lr.ok()) return fail(lr.error());
      sub_.connect([this, done, fail](Result<void> sr) {
        if (halted_) return;
        if (!sr.ok()) return fail(sr.error());
        sub_.subscribe(
            keys_.events(), [this](std::string_view payload) { on_event(payload); },
            [this, done, fail](Result<void> subr) {
              if (halted_) return;
              if (!subr.ok()) return fail(subr.error());
              if (!cmd_.ready() || !sub_.ready())
                return fail(
                    Error(ErrorCode::coordination_failed,
                          "the connection to Redis at " + endpoint_.describe() + " broke while connecting"));
              connecting_link_ = false;
              link_up_ = true;
              done({});
            });
      });
    });
  });
}

void Coordinator::Impl::load_scripts(std::function<void(Result<void>)> done) {
  struct Batch {
    std::size_t left = detail::script_count;
    std::optional<Error> error;
  };
  auto batch = std::make_shared<Batch>();
  for (std::size_t i = 0; i < detail::script_count; ++i) {
    auto s = static_cast<Script>(i);
    cmd_.command({"SCRIPT", "LOAD", detail::script_text(s)}, [this, s, i, batch, done](Reply r) {
      if (!r.ok()) {
        if (!batch->error) batch->error = r.error();
      } else if (r->is_error() || !r->is_text()) {
        if (!batch->error)
          batch->error = Error(ErrorCode::coordination_failed,
                               "Redis at " + endpoint_.describe() + " refused to load script " +
                                   std::string(detail::script_name(s)) + ": " + r->describe());
      } else {
        sha_[i] = r->str;
      }
      if (--batch->left == 0) {
        if (batch->error) {
          done(*batch->error);
        } else {
          done({});
        }
      }
    });
  }
}

void Coordinator::Impl::on_link_lost(const Error& e) {
  if (halted_ || connecting_link_ || !link_up_) return;
  link_up_ = false;
  log(CoordinatorLogLevel::warning, "lost Redis: " + e.message() + "; reconnecting");
  link_warned_ = true;
  cmd_.close();
  sub_.close();
  schedule_reconnect();
}

void Coordinator::Impl::schedule_reconnect() {
  if (halted_ || phase_ == Phase::stopped || phase_ == Phase::idle) return;
  reconnect_timer_.expires_after(backoff_);
  reconnect_timer_.async_wait([this](const asio::error_code& ec) {
    if (ec || halted_ || link_up_ || connecting_link_) return;
    if (phase_ != Phase::running && phase_ != Phase::stopping) return;
    connect_link([this](Result<void> r) {
      if (halted_) return;
      if (!r.ok()) {
        log(CoordinatorLogLevel::debug, "reconnect failed: " + r.error().message());
        backoff_ = std::min(backoff_ * 2, s_.reconnect_max_backoff);
        schedule_reconnect();
        return;
      }
      backoff_ = s_.reconnect_min_backoff;
      log(CoordinatorLogLevel::info, "reconnected to Redis at " + endpoint_.describe());
      link_warned_ = false;
      send_beat();
      // Notices published while the subscription was down are lost: read
      // again rather than trust that nothing happened.
      reconcile_all();
      for (const auto& pr : pending_releases_) do_release(pr.group, pr.unit, pr.epoch, [](Result<bool>) {});
      pending_releases_.clear();
    });
  });
}

void Coordinator::Impl::eval(Script s, std::vector<std::string> args, ReplyK k) {
  if (phase_ == Phase::stopped) {
    asio::post(io_, [k = std::move(k), e = shutting_down_error()]() mutable { k(e); });
    return;
  }
  if (!link_up_ && !connecting_link_ && phase_ != Phase::starting) {
    Error e = phase_ == Phase::idle ? Error(ErrorCode::not_ready, "the coordinator of node '" + s_.node_id +
                                                                      "' is not started; call start() first")
                                    : not_connected_error();
    asio::post(io_, [k = std::move(k), e = std::move(e)]() mutable { k(e); });
    return;
  }
  auto argv = std::make_shared<std::vector<std::string>>();
  argv->reserve(4 + script_keys_.size() + args.size());
  argv->push_back("EVALSHA");
  argv->push_back(sha_[static_cast<std::size_t>(s)]);
  argv->push_back(std::to_string(script_keys_.size()));
  argv->insert(argv->end(), script_keys_.begin(), script_keys_.end());
  argv->push_back(keys_.base());
  for (auto& a : args) argv->push_back(std::move(a));
  cmd_.command(*argv, [this, s, argv, k = std::move(k)](Reply r) mutable {
    if (r.ok() && r->is_error() && r->str.compare(0, 8, "NOSCRIPT") == 0) {
      // The script cache was flushed (SCRIPT FLUSH, a failover): send the
      // text, which also loads it again.
      (*argv)[0] = "EVAL";
      (*argv)[1] = detail::script_text(s);
      cmd_.command(*argv,
                   [this, s, k = std::move(k)](Reply r2) mutable { k(script_reply(s, std::move(r2))); });
      return;
    }
    k(script_reply(s, std::move(r)));
  });
}

Coordinator::Impl::Reply Coordinator::Impl::script_reply(Script s, Reply r) const {
  if (!r.ok()) return r;
  if (r->is_error())
    return Error(ErrorCode::coordination_failed, "Redis at " + endpoint_.describe() + " failed script " +
                                                     std::string(detail::script_name(s)) + ": " + r->str);
  if (!r->is_array() || r->elements.empty() || !r->elements[0].is_text()) return unexpected(s, *r);
  return r;
}

Error Coordinator::Impl::unexpected(Script s, const RedisReply& r) const {
  std::string msg = "unexpected reply from Redis to script " + std::string(detail::script_name(s)) + ": " +
                    r.describe() +
                    (r.is_array() && !r.elements.empty() ? " starting " + r.elements[0].describe() : "");
  log(CoordinatorLogLevel::error, msg);
  return Error(ErrorCode::coordination_failed, msg);
}

// --- start-up -----------------------------------------------------------------------

Future<void> Coordinator::Impl::start() {
  return call<void>([this](Promise<void>& p) {
    switch (phase_) {
      case Phase::running:
        p.set_value();
        return;
      case Phase::stopping:
      case Phase::stopped:
        p.set_error(shutting_down_error());
        return;
      case Phase::starting:
        start_waiters_.push_back(std::move(p));
        return;
      case Phase::idle:
        start_waiters_.push_back(std::move(p));
        begin_start();
        return;
    }
  });
}

Future<void> Coordinator::Impl::started() {
  return call<void>([this](Promise<void>& p) {
    if (phase_ == Phase::running) {
      p.set_value();
    } else if (phase_ == Phase::idle && start_error_) {
      p.set_error(*start_error_);
    } else if (phase_ == Phase::stopping || phase_ == Phase::stopped) {
      p.set_error(shutting_down_error());
    } else {
      start_waiters_.push_back(std::move(p));
    }
  });
}

void Coordinator::Impl::begin_start() {
  phase_ = Phase::starting;
  start_error_.reset();
  start_deadline_ = steady_now() + s_.liveness_threshold + s_.takeover_margin + 2 * s_.heartbeat_interval +
                    s_.command_timeout;
  connect_link([this](Result<void> r) {
    if (halted_ || phase_ != Phase::starting) return;
    if (!r.ok()) {
      fail_start(Error(ErrorCode::coordination_failed, "cannot start: " + r.error().message()));
      return;
    }
    send_beat();
  });
}

void Coordinator::Impl::fail_start(const Error& e) {
  log(CoordinatorLogLevel::error, e.message());
  phase_ = Phase::idle;
  start_error_ = e;
  link_up_ = false;
  registered_ = false;
  cmd_.close();
  sub_.close();
  fence_timer_.cancel();
  start_retry_timer_.cancel();
  for (auto& w : start_waiters_) w.set_error(e);
  start_waiters_.clear();
}

void Coordinator::Impl::finish_start() {
  phase_ = Phase::running;
  log(CoordinatorLogLevel::info, "started; registered at Redis " + endpoint_.describe() + " as " +
                                     s_.address.host + ":" + std::to_string(s_.address.port));
  for (auto& w : start_waiters_) w.set_value();
  start_waiters_.clear();
  // Registering was this interval's heartbeat.
  heartbeat_timer_.expires_after(s_.heartbeat_interval);
  heartbeat_timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec) tick();
  });
  periodic_timer_.expires_after(s_.sync_interval);
  // Re-reading this node's assignments every sync interval heals a notice
  // lost while the subscription was down or a notice never published.
  struct Periodic {
    Impl* self;
    void operator()(const asio::error_code& ec) const {
      if (ec || self->halted_ || self->phase_ != Phase::running) return;
      self->reconcile_all();
      self->periodic_timer_.expires_after(self->s_.sync_interval);
      self->periodic_timer_.async_wait(Periodic{self});
    }
  };
  periodic_timer_.async_wait(Periodic{this});
  reconcile_all();
  for (auto& [group, st] : syncs_) {
    if (!st.in_flight) run_sync(group);
  }
}

// --- heartbeat and fencing ------------------------------------------------------------

void Coordinator::Impl::tick() {
  if (halted_ || (phase_ != Phase::running && phase_ != Phase::stopping)) return;
  send_beat();
  heartbeat_timer_.expires_after(s_.heartbeat_interval);
  heartbeat_timer_.async_wait([this](const asio::error_code& ec) {
    if (!ec) tick();
  });
}

void Coordinator::Impl::send_beat() {
  if (halted_ || beat_in_flight_ || !link_up_ || superseded_) return;
  if (phase_ != Phase::running && phase_ != Phase::stopping && phase_ != Phase::starting) return;
  beat_in_flight_ = true;
  bool registering = fenced_ || !registered_ || phase_ == Phase::starting;
  if (registering && s_.epoch_floor) note_epoch(s_.epoch_floor());
  TimePoint sent = steady_now();
  eval(Script::heartbeat,
       {s_.node_id, session_, s_.address.host, std::to_string(s_.address.port),
        registering ? "register" : "beat", std::to_string(to_ms(s_.liveness_threshold)),
        std::to_string(to_ms(s_.takeover_margin)), std::to_string(max_epoch_seen_),
        std::to_string(std::max<std::size_t>(1, s_.takeover_batch))},
       [this, sent, registering](Reply r) {
         beat_in_flight_ = false;
         if (halted_) return;
         on_beat(sent, registering, std::move(r));
       });
}

void Coordinator::Impl::on_beat(TimePoint sent, bool registering, Reply r) {
  if (!r.ok()) {
    if (phase_ == Phase::starting) {
      fail_start(Error(ErrorCode::coordination_failed, "cannot register: " + r.error().message()));
      return;
    }
    log(CoordinatorLogLevel::debug, "heartbeat failed: " + r.error().message());
    return;
  }
  const RedisReply& rep = *r;
  const std::string& status = rep.elements[0].str;
  if (status == "OK" && rep.elements.size() == 6 && rep.elements[4].is_array() &&
      rep.elements[5].is_array()) {
    long long since = 0, others = 0;
    if (!int_of(rep.elements[2], since) || !int_of(rep.elements[3], others)) {
      (void)unexpected(Script::heartbeat, rep);
      return;
    }
    last_ok_send_ = std::max(last_ok_send_, sent);
    registered_ = true;
    // A reply that arrives after the lease ran out (a slow Redis) proves
    // nothing about now: only a registration sent while fenced, within its
    // own lease, lifts the fence.
    bool lease_valid = steady_now() < last_ok_send_ + s_.liveness_threshold;
    arm_fence_timer();
    update_view(rep.elements[4]);
    std::vector<std::string> dead;
    for (const auto& d : rep.elements[5].elements) {
      std::string id;
      if (text_of(d, id)) dead.push_back(std::move(id));
    }
    if (phase_ == Phase::starting) {
      {
        std::lock_guard lk(view_mu_);
        first_manager_ = (others == 0);
      }
      finish_start();
    } else if (fenced_ && registering && lease_valid) {
      unfence();
    }
    if (!dead.empty()) run_takeover(std::move(dead));
    for (auto& [group, g] : served_)
      if (g.waiting) reconcile(group);
    return;
  }
  if (status == "GONE") {
    // Our entry was removed, so our units were taken over: stop them now,
    // then register again.
    registered_ = false;
    if (!fenced_) fence("this node's membership was removed from Redis (its units were taken over)");
    asio::post(io_, [this] { send_beat(); });
    return;
  }
  if (status == "IN_USE") {
    long long age = 0;
    if (rep.elements.size() > 2) (void)int_of(rep.elements[2], age);
    if (phase_ == Phase::starting && steady_now() < start_deadline_) {
      log(CoordinatorLogLevel::info, "node id '" + s_.node_id +
                                         "' is still registered by another process (last heartbeat " +
                                         std::to_string(age) + " ms ago); waiting for that entry to expire");
      start_retry_timer_.expires_after(s_.heartbeat_interval);
      start_retry_timer_.async_wait([this](const asio::error_code& ec) {
        if (!ec && phase_ == Phase::starting) send_beat();
      });
      return;
    }
    Error e(ErrorCode::invalid_argument, "node id '" + s_.node_id +
                                             "' is in use by another live process (last heartbeat " +
                                             std::to_string(age) + " ms ago)");
    if (phase_ == Phase::starting) {
      fail_start(e);
      return;
    }
    superseded_ = true;
    fence(e.message());
    return;
  }
  if (status == "SUPERSEDED") {
    superseded_ = true;
    log(CoordinatorLogLevel::error, "another process registered node id '" + s_.node_id +
                                        "' after this one expired; this coordinator stays fenced");
    if (!fenced_) fence("superseded by another process with the same node id");
    return;
  }
  if (status == "CONFIG_MISMATCH") {
    long long t = 0, m = 0;
    if (rep.elements.size() > 3) {
      (void)int_of(rep.elements[2], t);
      (void)int_of(rep.elements[3], m);
    }
    Error e(ErrorCode::invalid_argument,
            "the cluster uses liveness_threshold " + std::to_string(t) + " ms and takeover_margin " +
                std::to_string(m) + " ms; this node has " + ms_text(s_.liveness_threshold) + " and " +
                ms_text(s_.takeover_margin) + " (every member must use one rule)");
    if (phase_ == Phase::starting) {
      fail_start(e);
      return;
    }
    log(CoordinatorLogLevel::error, e.message());
    return;
  }
  (void)unexpected(Script::heartbeat, rep);
}

void Coordinator::Impl::update_view(const RedisReply& view) {
  detail::MemberView parsed = detail::parse_members(view, s_.liveness_threshold);
  for (const auto& skip : parsed.skipped) {
    std::string key = skip.id + "\n" + skip.info;
    if (warned_entries_.size() > 1000) warned_entries_.clear();
    if (warned_entries_.insert(key).second)
      log(CoordinatorLogLevel::warning, "skipping member entry '" + skip.id.substr(0, 80) + "': " + skip.why);
  }
  std::vector<Member>& live = parsed.live;
  bool changed = live.size() != last_members_.size();
  for (std::size_t i = 0; !changed && i < live.size(); ++i)
    changed = live[i].id != last_members_[i].id || !(live[i].address == last_members_[i].address);
  {
    std::lock_guard lk(view_mu_);
    members_view_ = live;
  }
  if (changed) {
    last_members_ = live;
    if (s_.on_members_changed) {
      try {
        s_.on_members_changed(live);
      } catch (...) {
        log(CoordinatorLogLevel::error, "on_members_changed threw");
      }
    }
  }
}

void Coordinator::Impl::arm_fence_timer() {
  fence_timer_.expires_at(to_asio(last_ok_send_ + s_.liveness_threshold));
  fence_timer_.async_wait([this](const asio::error_code& ec) {
    if (ec || halted_ || fenced_) return;
    if (phase_ != Phase::running && phase_ != Phase::stopping) return;
    if (steady_now() < last_ok_send_ + s_.liveness_threshold) {
      arm_fence_timer();
      return;
    }
    fence("no heartbeat sent in the last " + ms_text(s_.liveness_threshold) + " succeeded");
  });
}

void Coordinator::Impl::fence(const std::string& why) {
  if (fenced_) return;
  fenced_ = true;
  log(CoordinatorLogLevel::warning, "fenced: " + why + "; stopping every unit");
  if (s_.on_fenced) {
    try {
      s_.on_fenced();
    } catch (...) {
      log(CoordinatorLogLevel::error, "on_fenced threw");
    }
  }
  for (auto& [group, g] : served_) {
    std::vector<std::string> names;
    for (auto& [unit, u] : g.units)
      if (!u.stopping) names.push_back(unit);
    for (const auto& unit : names) begin_stop(group, unit, /*release_after=*/false);
  }
  // Seen from other threads only now: a node that reports itself fenced
  // has asked every unit to stop.
  fenced_flag_.store(true, std::memory_order_release);
}

void Coordinator::Impl::unfence() {
  if (superseded_) return;
  fenced_ = false;
  fenced_flag_.store(false, std::memory_order_release);
  log(CoordinatorLogLevel::info, "unfenced: heartbeats succeed again; registered anew");
  if (s_.on_unfenced) {
    try {
      s_.on_unfenced();
    } catch (...) {
      log(CoordinatorLogLevel::error, "on_unfenced threw");
    }
  }
  // Units stopped while fenced may carry a hand-off from this node that
  // nobody else can clear while it is live again.
  for (const auto& pr : pending_releases_) do_release(pr.group, pr.unit, pr.epoch, [](Result<bool>) {});
  pending_releases_.clear();
  reconcile_all();
}

void Coordinator::Impl::run_takeover(std::vector<std::string> dead) {
  if (takeover_in_flight_ || fenced_ || phase_ != Phase::running) return;
  takeover_in_flight_ = true;
  std::vector<std::string> args{s_.node_id, session_,
                                std::to_string(std::max<std::size_t>(1, s_.takeover_batch))};
  args.insert(args.end(), dead.begin(), dead.end());
  eval(Script::takeover, std::move(args), [this, dead](Reply r) {
    takeover_in_flight_ = false;
    if (halted_) return;
    if (!r.ok()) {
      log(CoordinatorLogLevel::warning, "takeover failed: " + r.error().message());
      return;
    }
    const RedisReply& rep = *r;
    if (rep.elements[0].str != "OK") return;  // NOT_ELIGIBLE, NO_CONFIG: a later heartbeat tries again
    long long more = 0;
    if (rep.elements.size() != 3 || !int_of(rep.elements[1], more) || !rep.elements[2].is_array()) {
      (void)unexpected(Script::takeover, rep);
      return;
    }
    std::map<std::string, std::size_t> per_member;
    for (const auto& m : rep.elements[2].elements) {
      long long e = 0;
      if (m.is_array() && m.elements.size() == 5 && int_of(m.elements[4], e)) {
        note_epoch(static_cast<std::uint64_t>(e));
        ++per_member[m.elements[2].str];
      }
    }
    for (const auto& [member, n] : per_member)
      log(CoordinatorLogLevel::info,
          "took over " + std::to_string(n) + " units of expired member '" + member + "'");
    if (more != 0) asio::post(io_, [this, dead] { run_takeover(dead); });
  });
}

// --- placement ----------------------------------------------------------------------

void Coordinator::Impl::do_assign(const std::string& group, const std::string& unit, const std::string& spec,
                                  bool notify, Fn<void(Result<Placement>)> k) {
  eval(Script::assign, {group, unit, spec, notify ? "1" : "0"},
       [this, group, unit, k = std::move(k)](Reply r) mutable {
         if (!r.ok()) return k(std::move(r).error());
         const RedisReply& rep = *r;
         const std::string& status = rep.elements[0].str;
         if ((status == "ASSIGNED" || status == "ALREADY_INSTALLED") && rep.elements.size() == 2) {
           auto a = parse_assignment(rep.elements[1], group, unit);
           if (!a) return k(unexpected(Script::assign, rep));
           note_epoch(a->epoch);
           return k(Placement{
               status == "ASSIGNED" ? PlacementOutcome::assigned : PlacementOutcome::already_installed,
               std::move(*a)});
         }
         if (status == "NO_ACCEPTABLE_WORKER")
           return k(Error(ErrorCode::unreachable, "NO_ACCEPTABLE_WORKER: no live member can take unit '" +
                                                      unit + "' of group '" + group + "'"));
         if (status == "NO_CONFIG")
           return k(Error(
               ErrorCode::coordination_failed,
               "NO_CONFIG: the cluster's settings are missing in Redis (was it flushed?); members restore "
               "them when they register"));
         k(unexpected(Script::assign, rep));
       });
}

void Coordinator::Impl::do_unassign(const std::string& group, const std::string& unit, bool notify,
                                    Fn<void(Result<bool>)> k) {
  eval(Script::unassign, {group, unit, notify ? "1" : "0"}, [this, k = std::move(k)](Reply r) mutable {
    if (!r.ok()) return k(std::move(r).error());
    const std::string& status = r->elements[0].str;
    if (status == "UNASSIGNED") return k(true);
    if (status == "NOT_INSTALLED") return k(false);
    if (status == "NO_CONFIG")
      return k(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing"));
    k(unexpected(Script::unassign, *r));
  });
}

void Coordinator::Impl::do_set_spec(const std::string& group, const std::string& unit,
                                    const std::string& spec, bool notify, Fn<void(Result<bool>)> k) {
  eval(Script::set_spec, {group, unit, spec, notify ? "1" : "0"},
       [this, group, unit, k = std::move(k)](Reply r) mutable {
         if (!r.ok()) return k(std::move(r).error());
         const std::string& status = r->elements[0].str;
         if (status == "UPDATED") return k(true);
         if (status == "UNCHANGED") return k(false);
         if (status == "NOT_INSTALLED")
           return k(Error(ErrorCode::invalid_argument,
                          "NOT_INSTALLED: unit '" + unit + "' of group '" + group + "' is not placed"));
         if (status == "NO_CONFIG")
           return k(Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing"));
         k(unexpected(Script::set_spec, *r));
       });
}

void Coordinator::Impl::do_release(const std::string& group, const std::string& unit, std::uint64_t epoch,
                                   Fn<void(Result<bool>)> k) {
  eval(Script::release, {group, unit, s_.node_id, std::to_string(epoch), session_},
       [this, group, unit, k = std::move(k)](Reply r) mutable {
         if (!r.ok()) {
           log(CoordinatorLogLevel::warning,
               "release of '" + unit + "' in '" + group + "' failed: " + r.error().message());
           return k(std::move(r).error());
         }
         k(r->elements[0].str == "RELEASED");
       });
}

Future<Placement> Coordinator::Impl::assign(const std::string& group, const std::string& unit,
                                            const std::string& spec) {
  return call<Placement>([this, group, unit, spec](Promise<Placement>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    do_assign(group, unit, spec, true, [this, p = std::move(p)](Result<Placement> r) mutable {
      if (r.ok()) {
        log(CoordinatorLogLevel::info, std::string(to_string(r->outcome)) + ": '" + r->assignment.unit +
                                           "' of '" + r->assignment.group + "' on " + r->assignment.owner +
                                           " epoch " + std::to_string(r->assignment.epoch));
      } else {
        log(CoordinatorLogLevel::warning, r.error().message());
      }
      p.set_result(std::move(r));
    });
  });
}

Future<Placement> Coordinator::Impl::relocate(const std::string& group, const std::string& unit, bool force) {
  return call<Placement>([this, group, unit, force](Promise<Placement>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    eval(Script::relocate, {group, unit, force ? "1" : "0", "1"},
         [this, group, unit, p = std::move(p)](Reply r) mutable {
           if (!r.ok()) return p.set_error(std::move(r).error());
           const RedisReply& rep = *r;
           const std::string& status = rep.elements[0].str;
           auto where = "unit '" + unit + "' of group '" + group + "'";
           if ((status == "RELOCATED" || status == "NO_NEED_TO_RELOCATE") && rep.elements.size() == 2) {
             auto a = parse_assignment(rep.elements[1], group, unit);
             if (!a) return p.set_error(unexpected(Script::relocate, rep));
             note_epoch(a->epoch);
             log(CoordinatorLogLevel::info,
                 status + ": " + where + " on " + a->owner + " epoch " + std::to_string(a->epoch));
             return p.set_value(Placement{
                 status == "RELOCATED" ? PlacementOutcome::relocated : PlacementOutcome::no_need_to_relocate,
                 std::move(*a)});
           }
           Error e;
           if (status == "NOT_INSTALLED") {
             e = Error(ErrorCode::invalid_argument, "NOT_INSTALLED: " + where + " is not placed");
           } else if (status == "NO_OTHER_ACCEPTABLE_WORKER") {
             e = Error(ErrorCode::unreachable,
                       "NO_OTHER_ACCEPTABLE_WORKER: no live member but its owner can take " + where);
           } else if (status == "NO_ACCEPTABLE_WORKER") {
             e = Error(ErrorCode::unreachable, "NO_ACCEPTABLE_WORKER: no live member can take " + where);
           } else if (status == "NO_CONFIG") {
             e = Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis");
           } else {
             return p.set_error(unexpected(Script::relocate, rep));
           }
           log(CoordinatorLogLevel::warning, e.message());
           p.set_error(std::move(e));
         });
  });
}

Future<bool> Coordinator::Impl::unassign(const std::string& group, const std::string& unit) {
  return call<bool>([this, group, unit](Promise<bool>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    do_unassign(group, unit, true,
                [p = std::move(p)](Result<bool> r) mutable { p.set_result(std::move(r)); });
  });
}

Future<std::vector<Move>> Coordinator::Impl::rebalance_all(const std::string& group) {
  return call<std::vector<Move>>([this, group](Promise<std::vector<Move>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    eval(Script::rebalance, {group, "1"}, [this, group, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      const std::string& status = rep.elements[0].str;
      if (status == "NO_ACCEPTABLE_WORKER")
        return p.set_error(
            Error(ErrorCode::unreachable,
                  "NO_ACCEPTABLE_WORKER: no live member to rebalance group '" + group + "' over"));
      if (status == "NO_CONFIG")
        return p.set_error(
            Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
      if (status != "OK" || rep.elements.size() != 2 || !rep.elements[1].is_array())
        return p.set_error(unexpected(Script::rebalance, rep));
      std::vector<Move> moves;
      for (const auto& m : rep.elements[1].elements) {
        long long e = 0;
        Move mv;
        mv.group = group;
        if (!m.is_array() || m.elements.size() != 4 || !text_of(m.elements[0], mv.unit) ||
            !text_of(m.elements[1], mv.from) || !text_of(m.elements[2], mv.to) || !int_of(m.elements[3], e))
          return p.set_error(unexpected(Script::rebalance, rep));
        mv.epoch = static_cast<std::uint64_t>(e);
        note_epoch(mv.epoch);
        moves.push_back(std::move(mv));
      }
      log(CoordinatorLogLevel::info,
          "rebalanced '" + group + "': " + std::to_string(moves.size()) + " moves");
      p.set_value(std::move(moves));
    });
  });
}

Future<std::optional<Assignment>> Coordinator::Impl::assignment(const std::string& group,
                                                                const std::string& unit) {
  return call<std::optional<Assignment>>([this, group, unit](Promise<std::optional<Assignment>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    eval(Script::lookup, {group, unit}, [this, group, unit, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      const std::string& status = rep.elements[0].str;
      if (status == "NOT_INSTALLED") return p.set_value(std::nullopt);
      if (status == "NO_CONFIG")
        return p.set_error(
            Error(ErrorCode::coordination_failed, "NO_CONFIG: cluster settings missing in Redis"));
      std::optional<Assignment> a;
      if (status == "OK" && rep.elements.size() == 2) a = parse_assignment(rep.elements[1], group, unit);
      if (!a) return p.set_error(unexpected(Script::lookup, rep));
      p.set_value(std::move(a));
    });
  });
}

Future<std::vector<Assignment>> Coordinator::Impl::owned_units(const std::string& group) {
  return call<std::vector<Assignment>>([this, group](Promise<std::vector<Assignment>>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    eval(Script::my_units, {group, s_.node_id}, [this, group, p = std::move(p)](Reply r) mutable {
      if (!r.ok()) return p.set_error(std::move(r).error());
      const RedisReply& rep = *r;
      if (rep.elements[0].str != "OK" || rep.elements.size() != 3 || !rep.elements[2].is_array())
        return p.set_error(unexpected(Script::my_units, rep));
      std::vector<Assignment> out;
      for (const auto& u : rep.elements[2].elements) {
        Assignment a;
        long long e = 0, we = 0;
        if (!u.is_array() || u.elements.size() != 5 || !text_of(u.elements[0], a.unit) ||
            !int_of(u.elements[1], e) || !text_of(u.elements[2], a.spec) ||
            !text_of(u.elements[3], a.handing_off_from) || !int_of(u.elements[4], we))
          return p.set_error(unexpected(Script::my_units, rep));
        a.group = group;
        a.owner = s_.node_id;
        a.epoch = static_cast<std::uint64_t>(e);
        a.handoff_epoch = static_cast<std::uint64_t>(we);
        out.push_back(std::move(a));
      }
      std::sort(out.begin(), out.end(),
                [](const Assignment& x, const Assignment& y) { return x.unit < y.unit; });
      p.set_value(std::move(out));
    });
  });
}

Future<bool> Coordinator::Impl::release(const std::string& group, const std::string& unit,
                                        std::uint64_t epoch) {
  return call<bool>([this, group, unit, epoch](Promise<bool>& p) {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (auto v = validate_unit(unit); !v.ok()) return p.set_error(v.error());
    if (fenced_) {
      return p.set_error(
          Error(ErrorCode::fenced, "node '" + s_.node_id + "' is fenced; it releases once it is not"));
    }
    do_release(group, unit, epoch,
               [p = std::move(p)](Result<bool> r) mutable { p.set_result(std::move(r)); });
  });
}

// --- reconcile ------------------------------------------------------------------------

Result<void> Coordinator::Impl::serve(const std::string& group, Reconciler reconciler) {
  if (auto v = validate_group(group); !v.ok()) return v;
  if (halting_.load(std::memory_order_acquire)) return shutting_down_error();
  {
    std::lock_guard lk(view_mu_);
    if (!served_names_.insert(group).second)
      return Error(ErrorCode::invalid_argument, "group '" + group + "' is already served on this node");
  }
  asio::post(io_, [this, group, reconciler = std::move(reconciler)]() mutable {
    if (halted_) return;
    served_.emplace(group, ServedGroup{std::move(reconciler), {}, false, false, false});
    reconcile(group);
  });
  return {};
}

void Coordinator::Impl::reconcile_all() {
  for (auto& [group, g] : served_) reconcile(group);
}

void Coordinator::Impl::reconcile(const std::string& group) {
  auto it = served_.find(group);
  if (it == served_.end()) return;
  if (halted_ || phase_ != Phase::running || fenced_ || !link_up_ || !registered_) return;
  ServedGroup& g = it->second;
  if (g.in_flight) {
    g.dirty = true;
    return;
  }
  g.in_flight = true;
  g.dirty = false;
  eval(Script::my_units, {group, s_.node_id}, [this, group](Reply r) {
    auto git = served_.find(group);
    if (git == served_.end() || halted_) return;
    git->second.in_flight = false;
    if (!r.ok()) {
      log(CoordinatorLogLevel::debug,
          "reading this node's units of '" + group + "' failed: " + r.error().message());
    } else if (r->elements[0].str == "NO_CONFIG") {
      // Redis lost its data; the next heartbeat finds this node gone and
      // registers it again.
      log(CoordinatorLogLevel::debug,
          "the cluster settings are missing in Redis; waiting for the next heartbeat");
    } else if (r->elements[0].str != "OK" || r->elements.size() != 3 || !r->elements[2].is_array()) {
      (void)unexpected(Script::my_units, *r);
    } else {
      apply(group, r->elements[2]);
    }
    if (git->second.dirty) reconcile(group);
  });
}

void Coordinator::Impl::apply(const std::string& group, const RedisReply& units) {
  if (phase_ != Phase::running || fenced_) return;
  ServedGroup& g = served_.at(group);
  struct Want {
    std::string spec;
    std::uint64_t epoch;
    std::string waiting_for;
  };
  std::map<std::string, Want> want;
  for (const auto& u : units.elements) {
    std::string unit, spec, wait_for;
    long long e = 0, we = 0;
    if (!u.is_array() || u.elements.size() != 5 || !text_of(u.elements[0], unit) ||
        !int_of(u.elements[1], e) || !text_of(u.elements[2], spec) || !text_of(u.elements[3], wait_for) ||
        !int_of(u.elements[4], we) || !validate_unit(unit).ok()) {
      std::string key = "unit entry " + u.describe();
      if (warned_entries_.insert(key).second)
        log(CoordinatorLogLevel::warning,
            "skipping a malformed unit entry of '" + group + "': " + u.describe());
      continue;
    }
    note_epoch(static_cast<std::uint64_t>(e));
    want.emplace(std::move(unit), Want{std::move(spec), static_cast<std::uint64_t>(e), std::move(wait_for)});
  }
  // Stop what is no longer ours, or ours under another epoch (it moved away
  // and back: whatever ran under the old epoch must end first).
  std::vector<std::string> to_stop;
  for (auto& [unit, lu] : g.units) {
    if (lu.stopping) continue;
    auto w = want.find(unit);
    if (w == want.end() || w->second.epoch != lu.epoch) {
      to_stop.push_back(unit);
    } else if (w->second.spec != lu.spec) {
      lu.spec = w->second.spec;
      if (g.reconciler.update) {
        try {
          g.reconciler.update(unit, lu.spec, lu.epoch);
        } catch (const std::exception& ex) {
          log(CoordinatorLogLevel::error, "Reconciler::update of '" + unit + "' threw: " + ex.what());
        } catch (...) {
          log(CoordinatorLogLevel::error, "Reconciler::update of '" + unit + "' threw");
        }
      }
    }
  }
  for (const auto& unit : to_stop) begin_stop(group, unit, /*release_after=*/true);
  g.waiting = false;
  bool started_any = false;
  for (auto& [unit, w] : want) {
    if (g.units.count(unit) != 0) continue;  // running, or stopping (started again once stopped)
    if (!w.waiting_for.empty()) {
      g.waiting = true;
      continue;
    }
    g.units.emplace(unit, LocalUnit{w.spec, w.epoch, false, false});
    started_any = true;
    if (g.reconciler.start) {
      try {
        g.reconciler.start(unit, w.spec, w.epoch);
      } catch (const std::exception& ex) {
        log(CoordinatorLogLevel::error, "Reconciler::start of '" + unit + "' threw: " + ex.what());
      } catch (...) {
        log(CoordinatorLogLevel::error, "Reconciler::start of '" + unit + "' threw");
      }
    }
  }
  if (started_any || !to_stop.empty()) publish_running(group);
}

void Coordinator::Impl::begin_stop(const std::string& group, const std::string& unit, bool release_after) {
  ServedGroup& g = served_.at(group);
  auto it = g.units.find(unit);
  if (it == g.units.end() || it->second.stopping) return;
  it->second.stopping = true;
  it->second.release_after = release_after;
  std::uint64_t epoch = it->second.epoch;
  Future<void> f = [&]() -> Future<void> {
    if (g.reconciler.stop) {
      try {
        return g.reconciler.stop(unit);
      } catch (const std::exception& ex) {
        log(CoordinatorLogLevel::error, "Reconciler::stop of '" + unit + "' threw: " + ex.what());
      } catch (...) {
        log(CoordinatorLogLevel::error, "Reconciler::stop of '" + unit + "' threw");
      }
    }
    Promise<void> done;
    done.set_value();
    return done.future();
  }();
  std::weak_ptr<Impl> weak = weak_from_this();
  std::move(f).then([weak, group, unit, epoch](Result<void> r) {
    auto self = weak.lock();
    if (!self) return;
    Impl* raw = self.get();
    asio::post(raw->io_, [raw, group, unit, epoch, r = std::move(r)] {
      if (!raw->halted_) raw->on_stopped(group, unit, epoch, r);
    });
  });
}

void Coordinator::Impl::on_stopped(const std::string& group, const std::string& unit, std::uint64_t epoch,
                                   const Result<void>& r) {
  ServedGroup& g = served_.at(group);
  auto it = g.units.find(unit);
  if (it == g.units.end() || !it->second.stopping || it->second.epoch != epoch) return;
  bool release_after = it->second.release_after;
  g.units.erase(it);
  if (!r.ok())
    log(CoordinatorLogLevel::warning, "Reconciler::stop of '" + unit + "' failed: " + r.error().message());
  publish_running(group);
  if (release_after || fenced_) {
    if (fenced_ || !link_up_) {
      pending_releases_.push_back({group, unit, epoch});
    } else {
      do_release(group, unit, epoch, [](Result<bool>) {});
    }
  }
  if (phase_ == Phase::stopping) {
    maybe_finish_stop();
    return;
  }
  reconcile(group);
}

void Coordinator::Impl::publish_running(const std::string& group) {
  std::map<std::string, std::uint64_t> now;
  for (const auto& [unit, lu] : served_.at(group).units) now.emplace(unit, lu.epoch);
  std::lock_guard lk(view_mu_);
  running_view_[group] = std::move(now);
}

// --- graceful stop ------------------------------------------------------------------

Future<void> Coordinator::Impl::stop() {
  return call<void>([this](Promise<void>& p) {
    if (phase_ == Phase::stopped) return p.set_value();
    stop_waiters_.push_back(std::move(p));
    if (phase_ == Phase::stopping) return;
    if (phase_ == Phase::idle || phase_ == Phase::starting) {
      for (auto& w : start_waiters_) w.set_error(shutting_down_error());
      start_waiters_.clear();
      finish_stop();
      return;
    }
    phase_ = Phase::stopping;
    log(CoordinatorLogLevel::info, "stopping: stopping every unit, then leaving");
    for (auto& [group, st] : syncs_)
      if (st.timer) st.timer->cancel();
    for (auto& [group, g] : served_) {
      std::vector<std::string> names;
      for (auto& [unit, u] : g.units)
        if (!u.stopping) names.push_back(unit);
      for (const auto& unit : names) begin_stop(group, unit, /*release_after=*/false);
    }
    maybe_finish_stop();
  });
}

void Coordinator::Impl::maybe_finish_stop() {
  if (phase_ != Phase::stopping) return;
  for (const auto& [group, g] : served_)
    if (!g.units.empty()) return;
  if (!link_up_ || fenced_ || !registered_) {
    finish_stop();
    return;
  }
  eval(Script::leave, {s_.node_id, session_}, [this](Reply r) {
    if (halted_) return;
    if (!r.ok()) {
      log(CoordinatorLogLevel::warning,
          "leaving failed (the entry will expire instead): " + r.error().message());
    } else if (r->elements[0].str == "OK" && r->elements.size() == 3) {
      long long kept = 0;
      (void)int_of(r->elements[1], kept);
      log(CoordinatorLogLevel::info,
          "left the cluster; handed over " + std::to_string(r->elements[2].elements.size()) + " units" +
              (kept > 0 ? ", kept " + std::to_string(kept) + " nobody live could take" : ""));
    }
    finish_stop();
  });
}

// Closes both connections, cancels every timer and answers every sync
// waiter with shutting_down. io thread.
void Coordinator::Impl::close_all() {
  cmd_.close();
  sub_.close();
  heartbeat_timer_.cancel();
  fence_timer_.cancel();
  reconnect_timer_.cancel();
  periodic_timer_.cancel();
  start_retry_timer_.cancel();
  for (auto& [g, st] : syncs_) {
    if (st.timer) st.timer->cancel();
    for (auto& w : st.waiters) w.set_error(shutting_down_error());
    for (auto& w : st.round_waiters) w.set_error(shutting_down_error());
    st.waiters.clear();
    st.round_waiters.clear();
  }
}

void Coordinator::Impl::finish_stop() {
  phase_ = Phase::stopped;
  link_up_ = false;
  close_all();
  for (auto& w : stop_waiters_) w.set_value();
  stop_waiters_.clear();
}

// --- sync ------------------------------------------------------------------------------

Future<SyncReport> Coordinator::Impl::sync(const std::string& group, DesiredSource source) {
  return call<SyncReport>([this, group, source = std::move(source)](Promise<SyncReport>& p) mutable {
    if (auto v = validate_group(group); !v.ok()) return p.set_error(v.error());
    if (!source)
      return p.set_error(Error(ErrorCode::invalid_argument, "sync of '" + group + "' without a source"));
    if (phase_ == Phase::stopping || phase_ == Phase::stopped) return p.set_error(shutting_down_error());
    SyncState& st = syncs_[group];
    st.source = std::move(source);
    st.waiters.push_back(std::move(p));
    if (!st.timer) st.timer = std::make_unique<asio::steady_timer>(io_);
    if (phase_ == Phase::running) run_sync(group);
  });
}

void Coordinator::Impl::run_sync(const std::string& group) {
  SyncState& st = syncs_.at(group);
  if (st.in_flight) {
    st.again = true;
    return;
  }
  st.in_flight = true;
  st.again = false;
  for (auto& w : st.waiters) st.round_waiters.push_back(std::move(w));
  st.waiters.clear();
  std::weak_ptr<Impl> weak = weak_from_this();
  sources_.post([weak, group, source = st.source] {
    Result<DesiredSet> r = Error(ErrorCode::invalid_argument, "no source");
    try {
      r = source();
    } catch (const std::exception& ex) {
      r = Error(ErrorCode::invalid_argument, std::string("the desired-set source threw: ") + ex.what());
    } catch (...) {
      r = Error(ErrorCode::invalid_argument, "the desired-set source threw");
    }
    auto self = weak.lock();
    if (!self) return;
    Impl* raw = self.get();
    asio::post(raw->io_, [raw, group, r = std::move(r)]() mutable {
      if (!raw->halted_) raw->on_desired(group, std::move(r));
    });
  });
}

void Coordinator::Impl::on_desired(const std::string& group, Result<DesiredSet> desired) {
  if (!desired.ok()) {
    log(CoordinatorLogLevel::warning,
        "sync of '" + group + "' changed nothing: " + desired.error().message());
    return finish_sync(group, std::move(desired).error());
  }
  if (phase_ != Phase::running) return finish_sync(group, shutting_down_error());
  if (!link_up_) return finish_sync(group, not_connected_error());
  auto want = std::make_shared<DesiredSet>(std::move(*desired));
  eval(Script::snapshot, {group}, [this, group, want](Reply r) {
    if (halted_) return;
    if (!r.ok()) return finish_sync(group, std::move(r).error());
    const RedisReply& rep = *r;
    if (rep.elements[0].str != "OK" || rep.elements.size() != 2 || !rep.elements[1].is_array() ||
        rep.elements[1].elements.size() % 2 != 0)
      return finish_sync(group, unexpected(Script::snapshot, rep));
    std::map<std::string, std::string> have;
    for (std::size_t i = 0; i + 1 < rep.elements[1].elements.size(); i += 2)
      have.emplace(rep.elements[1].elements[i].str, rep.elements[1].elements[i + 1].str);

    struct Round {
      SyncReport report;
      std::size_t left = 0;
      bool issued = false;
    };
    auto round = std::make_shared<Round>();
    round->report.desired = want->size();
    auto one_done = [this, group, round] {
      if (--round->left != 0 || !round->issued) return;
      cmd_.command({"PUBLISH", keys_.events(), "sync " + group}, [](Reply) {});
      if (!round->report.failed.empty())
        log(CoordinatorLogLevel::warning,
            "sync of '" + group + "': " + std::to_string(round->report.failed.size()) +
                " units failed, first: " + round->report.failed.front().second.message());
      finish_sync(group, round->report);
    };
    round->left = 1;  // held until every command is issued
    for (const auto& [unit, spec] : *want) {
      if (auto v = validate_unit(unit); !v.ok()) {
        round->report.failed.emplace_back(unit, v.error());
        continue;
      }
      auto h = have.find(unit);
      if (h == have.end()) {
        ++round->left;
        do_assign(group, unit, spec, false, [round, unit = unit, one_done](Result<Placement> pr) {
          if (!pr.ok()) {
            round->report.failed.emplace_back(unit, pr.error());
          } else if (pr->outcome == PlacementOutcome::assigned) {
            ++round->report.assigned;
          } else {
            ++round->report.unchanged;
          }
          one_done();
        });
      } else if (h->second != spec) {
        ++round->left;
        do_set_spec(group, unit, spec, false, [round, unit = unit, one_done](Result<bool> ur) {
          if (!ur.ok()) {
            round->report.failed.emplace_back(unit, ur.error());
          } else if (*ur) {
            ++round->report.updated;
          } else {
            ++round->report.unchanged;
          }
          one_done();
        });
      } else {
        ++round->report.unchanged;
      }
    }
    for (const auto& [unit, spec] : have) {
      if (want->count(unit) != 0) continue;
      ++round->left;
      do_unassign(group, unit, false, [round, unit = unit, one_done](Result<bool> ur) {
        if (!ur.ok()) {
          round->report.failed.emplace_back(unit, ur.error());
        } else if (*ur) {
          ++round->report.unassigned;
        }
        one_done();
      });
    }
    round->issued = true;
    one_done();
  });
}

void Coordinator::Impl::finish_sync(const std::string& group, Result<SyncReport> r) {
  auto it = syncs_.find(group);
  if (it == syncs_.end()) return;
  SyncState& st = it->second;
  st.in_flight = false;
  for (auto& w : st.round_waiters) w.set_result(r);
  st.round_waiters.clear();
  if (halted_ || phase_ != Phase::running) {
    for (auto& w : st.waiters) w.set_error(shutting_down_error());
    st.waiters.clear();
    return;
  }
  if (st.again || !st.waiters.empty()) {
    run_sync(group);
    return;
  }
  schedule_sync(group);
}

void Coordinator::Impl::schedule_sync(const std::string& group) {
  SyncState& st = syncs_.at(group);
  st.timer->expires_after(s_.sync_interval);
  st.timer->async_wait([this, group](const asio::error_code& ec) {
    if (ec || halted_ || phase_ != Phase::running) return;
    run_sync(group);
  });
}

// --- notices ------------------------------------------------------------------------

void Coordinator::Impl::on_event(std::string_view payload) {
  auto words = split_words(payload);
  if (words.size() < 2) return;
  const std::string& kind = words[0];
  if (kind == "sync" || kind == "changed" || kind == "moved" || kind == "released") {
    reconcile(words[1]);
  }
  // "left <member>": the next heartbeat's view shows it.
}

// --- the public class -------------------------------------------------------------------

Result<std::unique_ptr<Coordinator>> Coordinator::create(CoordinatorSettings s) {
  auto bad = [](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "coordinator settings: " + what);
  };
  if (auto v = validate_node_id(s.node_id); !v.ok()) return bad(v.error().message());
  if (s.address.host.empty() || s.address.host.find_first_of(" \t\r\n") != std::string::npos)
    return bad("address.host must be a non-empty name or IP without blanks");
  if (s.address.port == 0) return bad("address.port must not be 0");
  if (s.redis_host.empty()) return bad("redis_host is empty");
  if (s.redis_port == 0) return bad("redis_port must not be 0");
  if (s.key_prefix.empty() || s.key_prefix.find_first_of("{}: \t\r\n") != std::string::npos)
    return bad("key_prefix must be non-empty, without braces, colons or blanks");
  if (s.heartbeat_interval < std::chrono::milliseconds(1))
    return bad("heartbeat_interval must be at least 1 ms");
  if (s.liveness_threshold <= s.heartbeat_interval)
    return bad("liveness_threshold (" + ms_text(s.liveness_threshold) + ") must exceed heartbeat_interval (" +
               ms_text(s.heartbeat_interval) + ")");
  if (s.takeover_margin < std::chrono::milliseconds(1)) return bad("takeover_margin must be at least 1 ms");
  if (s.sync_interval < std::chrono::milliseconds(1)) return bad("sync_interval must be at least 1 ms");
  if (s.command_timeout < std::chrono::milliseconds(1)) return bad("command_timeout must be at least 1 ms");
  if (s.reconnect_min_backoff < std::chrono::milliseconds(1) ||
      s.reconnect_max_backoff < s.reconnect_min_backoff)
    return bad("reconnect back-off must be at least 1 ms with max >= min");
  if (s.takeover_batch == 0) return bad("takeover_batch must be at least 1");
  auto impl = std::make_shared<Impl>(std::move(s));
  impl->launch();
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

Coordinator::Coordinator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Coordinator::~Coordinator() { impl_->halt(); }

Future<void> Coordinator::start() { return impl_->start(); }
Future<void> Coordinator::started() { return impl_->started(); }
Future<void> Coordinator::stop() { return impl_->stop(); }
const std::string& Coordinator::node_id() const noexcept { return impl_->s_.node_id; }
std::vector<Member> Coordinator::members() const { return impl_->members(); }
Result<bool> Coordinator::is_first_manager() const { return impl_->is_first_manager(); }
bool Coordinator::is_fenced() const noexcept { return impl_->is_fenced(); }
std::map<std::string, std::uint64_t> Coordinator::running(const std::string& group) const {
  return impl_->running(group);
}
Future<Placement> Coordinator::assign(const std::string& group, const std::string& unit,
                                      const std::string& spec) {
  return impl_->assign(group, unit, spec);
}
Future<Placement> Coordinator::relocate(const std::string& group, const std::string& unit, bool force) {
  return impl_->relocate(group, unit, force);
}
Future<bool> Coordinator::unassign(const std::string& group, const std::string& unit) {
  return impl_->unassign(group, unit);
}
Future<std::vector<Move>> Coordinator::rebalance_all(const std::string& group) {
  return impl_->rebalance_all(group);
}
Future<std::optional<Assignment>> Coordinator::assignment(const std::string& group, const std::string& unit) {
  return impl_->assignment(group, unit);
}
Future<std::vector<Assignment>> Coordinator::owned_units(const std::string& group) {
  return impl_->owned_units(group);
}
Future<bool> Coordinator::release(const std::string& group, const std::string& unit, std::uint64_t epoch) {
  return impl_->release(group, unit, epoch);
}
Future<SyncReport> Coordinator::sync(const std::string& group, DesiredSource source) {
  return impl_->sync(group, std::move(source));
}
Result<void> Coordinator::serve(const std::string& group, Reconciler reconciler) {
  return impl_->serve(group, std::move(reconciler));
}

}  // namespace troupe::cluster
