// The Redis coordinator's life: Coordinator::create checks the settings and
// starts the io thread; start() connects, registers and begins the
// heartbeat; stop() stops every unit, leaves the cluster and closes the
// connections. The Impl's state is in coordinator_impl.hpp; what it does
// while running is in the files that header lists.

// clang-format off
#include "coordinator_impl.hpp"  // first: it includes Asio first (see there)
// clang-format on

#include <cstdio>
#include <random>

#include "troupe/cluster/node_id.hpp"
#include "troupe/core/log.hpp"

namespace troupe::cluster {

namespace detail {

std::string random_session() {
  std::random_device rd;
  std::uint64_t v = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace detail

// --- construction and shutdown -------------------------------------------------

Coordinator::Impl::Impl(CoordinatorSettings s)
    : s_(std::move(s)),
      keys_(s_.key_prefix),
      endpoint_{s_.redis_host, s_.redis_port, s_.redis_user, s_.redis_password},
      script_keys_(keys_.script_keys()),
      work_(asio::make_work_guard(io_)),
      cmd_(io_, endpoint_, "commands", s_.command_timeout),
      sub_(io_, endpoint_, "notices", s_.command_timeout),
      beat_(io_, endpoint_, "heartbeats", s_.command_timeout),
      heartbeat_timer_(io_),
      fence_timer_(io_),
      reconnect_timer_(io_),
      beat_reconnect_timer_(io_),
      periodic_timer_(io_),
      start_retry_timer_(io_),
      backoff_(s_.reconnect_min_backoff),
      beat_backoff_(s_.reconnect_min_backoff),
      member_roles_(detail::roles_text(s_.roles, "")) {
  for (const auto& [group, roles] : s_.group_roles) group_roles_[group] = detail::roles_text(roles, "*");
  cmd_.set_lost_handler([this](const Error& e) { on_link_lost(e); });
  sub_.set_lost_handler([this](const Error& e) { on_link_lost(e); });
  beat_.set_lost_handler([this](const Error& e) { on_beat_link_lost(e); });
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
  if (s_.log) {
    try {
      s_.log(level, "coordinator " + s_.node_id + ": " + msg);
    } catch (...) {
    }
    return;
  }
  static constexpr log::Level kLevels[] = {log::Level::debug, log::Level::info, log::Level::warn,
                                           log::Level::error};
  const log::Level l = kLevels[static_cast<int>(level)];
  if (log::enabled(log::Component::cluster, l)) log::write(log::Component::cluster, l, "coordinator: " + msg);
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
  beat_.close();
  beat_reconnect_timer_.cancel();
  fence_timer_.cancel();
  start_retry_timer_.cancel();
  for (auto& w : start_waiters_) w.set_error(e);
  start_waiters_.clear();
  for (auto& [group, w] : pending_declares_) w.set_error(e);
  pending_declares_.clear();
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
  // Groups synced periodically, and rounds asked for before start-up.
  for (auto& [group, st] : syncs_) {
    if (!st.in_flight && (st.periodic || !st.waiters.empty())) run_sync(group);
  }
  // Declared while the registration was on its way: it may not have
  // carried them.
  auto declares = std::move(pending_declares_);
  pending_declares_.clear();
  for (auto& [group, p] : declares) run_declare(group, std::nullopt, std::move(p));
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
    end_hand_off(shutting_down_error());
    log(CoordinatorLogLevel::info, "stopping: stopping every unit, then leaving");
    for (auto& [group, st] : syncs_)
      if (st.timer) st.timer->cancel();
    for (auto& [group, g] : served_) {
      std::vector<std::string> names;
      for (auto& [unit, u] : g.units)
        if (!u.stopping) names.push_back(unit);
      // Released once stopped: a unit whose hand-off relocated it already
      // has a new owner waiting for that; for the others the release is a
      // no-op and the leave script hands them over.
      for (const auto& unit : names) begin_stop(group, unit, /*release_after=*/true);
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
  // Releases still queued go first (one connection: in order), so a new
  // owner waiting for them need not wait for this entry to expire.
  flush_releases();
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
  beat_.close();
  beat_reconnect_timer_.cancel();
  heartbeat_timer_.cancel();
  fence_timer_.cancel();
  reconnect_timer_.cancel();
  periodic_timer_.cancel();
  start_retry_timer_.cancel();
  end_hand_off(shutting_down_error());
  for (auto& [g, queued] : release_batch_)
    for (auto& q : queued)
      if (q.k) q.k(shutting_down_error());
  release_batch_.clear();
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

// --- the public class -------------------------------------------------------------------

Result<std::unique_ptr<Coordinator>> Coordinator::create(CoordinatorSettings s) {
  auto bad = [](const std::string& what) {
    return Error(ErrorCode::invalid_argument, "coordinator settings: " + what);
  };
  if (auto v = validate_node_id(s.node_id); !v.ok()) return bad(v.error().message());
  if (s.address.host.empty() || s.address.host.find_first_of(" \t\r\n") != std::string::npos)
    return bad("address.host must be a non-empty name or IP without blanks");
  if (s.address.port == 0) return bad("address.port must not be 0");
  if (auto v = validate_app_version(s.app_version); !v.ok()) return bad(v.error().message());
  if (s.redis_host.empty()) return bad("redis_host is empty");
  if (s.redis_port == 0) return bad("redis_port must not be 0");
  if (!s.redis_user.empty() && s.redis_password.empty())
    return bad("redis_user '" + s.redis_user + "' needs a redis_password (Redis' AUTH takes both)");
  if (s.redis_user.find_first_of(" \t\r\n") != std::string::npos) return bad("redis_user must not contain blanks");
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
  for (const auto& role : s.roles)
    if (auto v = validate_role(role); !v.ok()) return bad("roles: " + v.error().message());
  for (const auto& [group, roles] : s.group_roles) {
    if (auto v = validate_group(group); !v.ok()) return bad("group_roles: " + v.error().message());
    for (const auto& role : roles)
      if (auto v = validate_role(role); !v.ok())
        return bad("group_roles['" + group + "']: " + v.error().message());
  }
  auto impl = std::make_shared<Impl>(std::move(s));
  impl->launch();
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

Coordinator::Coordinator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Coordinator::~Coordinator() { impl_->halt(); }

Future<void> Coordinator::start() { return impl_->start(); }
Future<void> Coordinator::started() { return impl_->started(); }
Future<void> Coordinator::stop() { return impl_->stop(); }
Future<HandOffReport> Coordinator::hand_off(std::size_t batch, std::function<void(const HandOffReport&)> progress) {
  return impl_->hand_off(batch, std::move(progress));
}
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
Future<std::vector<Move>> Coordinator::rebalance_all(const std::string& group, std::size_t max_moves) {
  return impl_->rebalance_all(group, max_moves);
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
Future<SyncReport> Coordinator::sync(const std::string& group, DesiredSource source, bool periodic) {
  return impl_->sync(group, std::move(source), periodic);
}
Result<void> Coordinator::serve(const std::string& group, Reconciler reconciler) {
  return impl_->serve(group, std::move(reconciler));
}
Future<void> Coordinator::declare_roles(const std::string& group, std::vector<std::string> roles) {
  return impl_->declare_roles(group, std::move(roles));
}

}  // namespace troupe::cluster
