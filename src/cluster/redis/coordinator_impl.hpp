#pragma once
// The Redis coordinator's private state: Coordinator::Impl, shared by the
// files that implement it (coordinator.cpp: construction, start and stop;
// redis_link.cpp: the connections and scripts; liveness.cpp: the heartbeat;
// membership.cpp: the member view and takeovers; self_fencing.cpp;
// assignment.cpp; rebalance.cpp; reconcile.cpp; sync.cpp; worker_map.cpp).
// Internal to src/cluster/redis/.
//
// One io thread runs three hiredis connections (commands, pub/sub, and
// heartbeats alone, so placement traffic never delays a lease), the
// heartbeat, the fence timer, takeovers, syncs and reconciles. Every piece
// of state below is touched only on that thread, except the cached views
// (members, first-manager answer, fenced flag, running units), which sit
// behind view_mu_ for the public getters.

// clang-format off
#include "../asio_headers.hpp"  // first: see there
// clang-format on
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "redis_connection.hpp"
#include "redis_values.hpp"
#include "scripts.hpp"
#include "troupe/cluster/coordinator.hpp"

namespace troupe::cluster {
namespace detail {

inline TimePoint steady_now() { return TimePoint(std::chrono::steady_clock::now().time_since_epoch()); }
inline std::chrono::steady_clock::time_point to_asio(TimePoint t) {
  return std::chrono::steady_clock::time_point(t.time_since_epoch());
}
inline long long to_ms(Duration d) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
}
inline std::string ms_text(Duration d) { return std::to_string(to_ms(d)) + " ms"; }

// A fresh random name for this coordinator's registration (16 hex digits).
std::string random_session();

// Runs DesiredSources, which may block, away from the coordinator thread:
// one thread, started by the first job, running jobs in order. Owned by the
// coordinator; post() and shutdown() are thread-safe; shutdown() drops jobs
// not started and waits for the one running. Defined in sync.cpp.
class SourceRunner {
 public:
  ~SourceRunner() { shutdown(); }
  void post(std::function<void()> job);
  void shutdown();

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace detail

using detail::int_of;
using detail::KeyNames;
using detail::ms_text;
using detail::parse_assignment;
using detail::RedisConnection;
using detail::RedisEndpoint;
using detail::RedisReply;
using detail::Script;
using detail::split_words;
using detail::steady_now;
using detail::text_of;
using detail::to_asio;
using detail::to_ms;

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
  Future<HandOffReport> hand_off(std::size_t batch, std::function<void(const HandOffReport&)> progress);
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
  Future<RebalanceReport> rebalance(const std::string& group, std::size_t max_moves);
  Future<std::vector<Move>> rebalance_all(const std::string& group, std::size_t max_moves);
  Future<std::optional<Assignment>> assignment(const std::string& group, const std::string& unit);
  Future<std::vector<Assignment>> owned_units(const std::string& group);
  Future<bool> release(const std::string& group, const std::string& unit, std::uint64_t epoch);
  Future<std::vector<std::string>> groups();                         // worker_map.cpp
  Future<std::vector<Assignment>> placements(const std::string& group);  // worker_map.cpp
  Future<SyncReport> sync(const std::string& group, DesiredSource source, bool periodic);
  Result<void> serve(const std::string& group, Reconciler reconciler);
  Future<void> declare_roles(const std::string& group, std::vector<std::string> roles);

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
    // Units placed here that wait for their previous owner's release:
    // re-read on each heartbeat, and on a notice releasing one of them.
    std::set<std::string> awaited;
    // Units placed here again while still stopping under an older epoch:
    // read again once one of them has stopped.
    std::set<std::string> restart;
  };
  struct SyncState {
    DesiredSource source;
    std::vector<Promise<SyncReport>> waiters;        // for the next round
    std::vector<Promise<SyncReport>> round_waiters;  // for the round in flight
    bool in_flight = false;
    bool again = false;
    bool periodic = true;  // another round every sync_interval
    std::unique_ptr<asio::steady_timer> timer;
  };
  struct PendingRelease {
    std::string group, unit;
    std::uint64_t epoch;
  };
  // A planned hand-off under way (handoff.cpp).
  struct HandOff {
    struct Queued {
      std::string group, unit;
      std::uint64_t epoch = 0;
      bool running = true;  // false: placed here meanwhile, never started
      int tries = 0;        // relocations that failed for want of Redis
    };
    std::size_t batch = 8;
    std::function<void(const HandOffReport&)> progress;
    std::deque<Queued> queue;
    std::set<std::pair<std::string, std::string>> queued;    // group, unit: in queue, relocating or stopping
    std::set<std::pair<std::string, std::string>> stopping;  // moved, stopping here
    std::size_t relocating = 0;  // relocations out, or waiting to be tried again
    std::size_t quarters_told = 0;
    TimePoint began{};
    HandOffReport report;
    std::vector<Promise<HandOffReport>> waiters;
    bool marked = false;  // the draining mark is written
    bool done = false;
  };
  using Reply = Result<RedisReply>;
  template <class Sig>
  using Fn = troupe::detail::UniqueFunction<Sig>;  // move-only: continuations may own promises
  using ReplyK = Fn<void(Reply)>;
  struct QueuedRelease {
    std::string unit;
    std::uint64_t epoch = 0;
    Fn<void(Result<bool>)> k;  // may be empty
  };

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

  // --- the link to Redis (redis_link.cpp) ---
  void connect_link(std::function<void(Result<void>)> done);
  void load_scripts(std::function<void(Result<void>)> done);
  void on_link_lost(const Error& e);
  void schedule_reconnect();
  // After `backoff` on `timer`, while `needed()`, runs `connect`; a failure
  // doubles `backoff` (up to reconnect_max_backoff) and tries again, a
  // success resets it and runs `up`. `what` names the attempt in the log.
  void log_auth_refusal(const std::string& what, const Error& e);
  void reconnect_later(asio::steady_timer& timer, Duration& backoff, std::function<bool()> needed,
                       std::function<void(std::function<void(Result<void>)>)> connect, std::function<void()> up,
                       std::string what);
  void eval(Script s, std::vector<std::string> args, ReplyK k) { eval_on(cmd_, s, std::move(args), std::move(k)); }
  void eval_on(RedisConnection& conn, Script s, std::vector<std::string> args, ReplyK k);
  // The heartbeat connection lives apart from the other two: lost, it
  // reconnects alone; the others lost, heartbeats go on.
  void connect_beat(std::function<void(Result<void>)> done);
  void on_beat_link_lost(const Error& e);
  void schedule_beat_reconnect();
  Reply script_reply(Script s, Reply r) const;
  Error unexpected(Script s, const RedisReply& r) const;
  void on_event(std::string_view payload);

  // --- start-up and graceful stop (coordinator.cpp) ---
  void begin_start();
  void fail_start(const Error& e);
  void finish_start();
  void maybe_finish_stop();
  void finish_stop();
  void close_all();

  // --- heartbeat (liveness.cpp) ---
  void tick();
  void send_beat();
  void on_beat(TimePoint sent, bool registering, Reply r);
  void note_epoch(std::uint64_t e) { max_epoch_seen_ = std::max(max_epoch_seen_, e); }

  // --- the member view and takeovers (membership.cpp) ---
  void update_view(const RedisReply& view, const RedisReply& roles);
  void run_takeover(std::vector<std::string> dead);

  // --- roles (membership.cpp) ---
  // Declares group_roles_[group] in Redis; on refusal or failure puts back
  // `previous` (nullopt: none) and answers `p` with the error.
  void run_declare(const std::string& group, std::optional<std::string> previous, Promise<void> p);
  // invalid_argument: a live member declared `stored` for `group`, this
  // node `mine` (both as stored: 'a,b' or '*').
  Error roles_clash(const std::string& group, const std::string& stored, const std::string& mine) const;
  // The heartbeat's arguments after the app version: this member's roles
  // and, when registering, every group role this node declares.
  void add_role_args(std::vector<std::string>& args, bool registering) const;

  // --- self-fencing (self_fencing.cpp) ---
  void arm_fence_timer();
  void fence(const std::string& why);
  void unfence();

  // --- placement scripts (assignment.cpp) ---
  void do_assign(const std::string& group, const std::string& unit, const std::string& spec, bool notify,
                 Fn<void(Result<Placement>)> k);
  void do_unassign(const std::string& group, const std::string& unit, bool notify, Fn<void(Result<bool>)> k);
  void do_set_spec(const std::string& group, const std::string& unit, const std::string& spec, bool notify,
                   Fn<void(Result<bool>)> k);
  // Queues a release; the queue goes out at the end of this turn of the
  // event loop, a script call (and one notice) per batch.
  void do_release(const std::string& group, const std::string& unit, std::uint64_t epoch,
                  Fn<void(Result<bool>)> k);
  void flush_releases();
  void do_relocate(const std::string& group, const std::string& unit, bool force, Fn<void(Result<Placement>)> k);
  void log_placement(const std::string& group, const std::string& unit, const Result<Placement>& r) const;

  // --- bulk reads (worker_map.cpp) ---
  // Why a plain read cannot be sent now (stopped, never started, link
  // down); nullopt when it can.
  std::optional<Error> read_refused() const;

  // --- rebalance (rebalance.cpp) ---
  void do_rebalance(const std::string& group, std::size_t max_moves, Fn<void(Result<RebalanceReport>)> k);
  void note_rebalance(const RebalanceReport& report);

  // --- running what Redis places here (reconcile.cpp) ---
  void reconcile(const std::string& group);
  void reconcile_all();
  void apply(const std::string& group, const RedisReply& units);
  void begin_stop(const std::string& group, const std::string& unit, bool release_after);
  void on_stopped(const std::string& group, const std::string& unit, std::uint64_t epoch,
                  const Result<void>& r);
  // The running view (running()) by the units that changed.
  void publish_started(const std::string& group, const std::vector<std::pair<std::string, std::uint64_t>>& units);
  void publish_stopped(const std::string& group, const std::string& unit);

  // --- planned hand-off (handoff.cpp) ---
  // Queues a unit of this node for the hand-off (once).
  void queue_hand_off(const std::string& group, const std::string& unit, std::uint64_t epoch, bool running);
  void pump_hand_off();
  void on_relocated(HandOff::Queued q, Result<Placement> r);
  // A unit stopped here: counted if the hand-off moved it.
  void note_handed_off(const std::string& group, const std::string& unit);
  void maybe_finish_hand_off();
  void end_hand_off(const std::optional<Error>& e);

  // --- sync (sync.cpp) ---
  void run_sync(const std::string& group);
  void on_desired(const std::string& group, Result<DesiredSet> desired);
  void finish_sync(const std::string& group, Result<SyncReport> r);
  void schedule_sync(const std::string& group);

  KeyNames keys_;
  RedisEndpoint endpoint_;
  std::string session_ = detail::random_session();
  std::vector<std::string> script_keys_;

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
  RedisConnection cmd_;
  RedisConnection sub_;
  RedisConnection beat_;
  asio::steady_timer heartbeat_timer_;
  asio::steady_timer fence_timer_;
  asio::steady_timer reconnect_timer_;
  asio::steady_timer beat_reconnect_timer_;
  asio::steady_timer periodic_timer_;
  asio::steady_timer start_retry_timer_;
  detail::SourceRunner sources_;

  std::atomic<bool> halting_{false};
  // --- io thread only ---
  bool halted_ = false;
  Phase phase_ = Phase::idle;
  std::array<std::string, detail::script_count> sha_;
  bool link_up_ = false;
  bool connecting_link_ = false;
  Duration backoff_;
  Duration beat_backoff_;
  bool beat_connecting_ = false;
  bool beat_in_flight_ = false;
  bool registered_ = false;
  bool fenced_ = false;
  bool superseded_ = false;
  bool takeover_in_flight_ = false;
  TimePoint last_ok_send_{};
  TimePoint start_deadline_{};
  std::uint64_t max_epoch_seen_ = 0;
  // This member's roles ('a,b' or ''), and the roles it declares per group
  // ('a,b' or '*'), as stored in Redis.
  std::string member_roles_;
  std::map<std::string, std::string> group_roles_;
  // declare_roles() calls made while starting: declared once started.
  std::vector<std::pair<std::string, Promise<void>>> pending_declares_;
  std::string roles_clash_logged_;
  std::map<std::string, ServedGroup> served_;
  std::map<std::string, SyncState> syncs_;
  std::vector<PendingRelease> pending_releases_;
  std::map<std::string, std::vector<QueuedRelease>> release_batch_;
  bool release_flush_posted_ = false;
  std::optional<HandOff> hand_off_;
  std::vector<Promise<void>> start_waiters_;
  std::vector<Promise<void>> stop_waiters_;
  std::optional<Error> start_error_;
  std::set<std::string> warned_entries_;
  bool link_warned_ = false;
  // An AUTH refusal was logged (at auth_refused_at_): the next one waits a minute.
  bool auth_refused_logged_ = false;
  TimePoint auth_refused_at_{};
  std::vector<Member> last_members_;
  // The versions the last rebalance found mixed (empty: it ran), so waiting
  // and resuming are logged once each, however often rebalance is called.
  std::vector<std::string> rebalance_waits_on_;

  // --- cached views (view_mu_) ---
  mutable std::mutex view_mu_;
  std::vector<Member> members_view_;
  std::optional<bool> first_manager_;
  std::map<std::string, std::map<std::string, std::uint64_t>> running_view_;
  std::set<std::string> served_names_;
  std::atomic<bool> fenced_flag_{false};
};

}  // namespace troupe::cluster
