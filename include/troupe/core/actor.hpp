#pragma once
// Typed actors.
//
// An actor is a class deriving from `Actor<Msg>` with a `void receive(Msg&)`
// member; `Msg` is any movable type, usually a std::variant protocol. The
// runtime guarantees that one actor handles one message at a time, so an
// actor's members need no locks. Everything else reaches it only through an
// `ActorRef<Msg>`.
//
//   struct Counter : troupe::Actor<CounterMsg> {
//     int n = 0;
//     void receive(CounterMsg& m) { ... }
//   };
//   auto ref = system.spawn<Counter>(troupe::SpawnOptions{.name = "counter"});
//   ref.tell(Inc{});
//
// Inside a handler an actor may change its behaviour (`become`), start keyed
// timers, stash, watch other actors, ask with a continuation, spawn children
// and stop itself. Those members may be called only from the actor's own
// handlers and hooks (they touch state owned by the running activation).
//
// A handler may be a coroutine: `troupe::Task<> receive(Msg m)` (the message
// by value: it lives in the coroutine's frame). It runs until its first
// co_await, and resumes in this actor, as a message of its own. Meanwhile the
// actor keeps receiving: other messages run between a handler's co_awaits
// (never concurrently with it), so state read before a co_await may have
// changed after it. A stop or restart destroys suspended handlers (their
// frames and locals), and what they awaited is dropped (doc/coroutines.md).
//
// This header is the contract. The machinery behind it lives in
// troupe/core/detail/: typed cells and message dispatch (typed_cell.hpp),
// timers (actor_timers.hpp), watches (actor_watch.hpp), asks (actor_ask.hpp)
// and spawning (spawn.hpp), coroutine handlers (actor_await.hpp); futures
// and reply targets are in future.hpp, coroutines in task.hpp.

#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include "troupe/core/clock.hpp"
#include "troupe/core/detail/cell.hpp"
#include "troupe/core/detail/typed_cell.hpp"
#include "troupe/core/future.hpp"
#include "troupe/core/result.hpp"
#include "troupe/core/task.hpp"

namespace troupe {

template <class Msg>
class ActorRef;
template <class Msg>
class Actor;
class ActorSystem;

// ---------------------------------------------------------------------------
// Spawn options and supervision

// Restart with exponential back-off: the k-th restart within the window
// waits min(max_backoff, min_backoff * factor^(k-1)). More than
// `max_restarts` failures within `within` stop the actor instead.
struct RestartPolicy {
  Duration min_backoff = Duration::zero();
  Duration max_backoff = std::chrono::seconds(10);
  double factor = 2.0;
  std::uint32_t max_restarts = 10;
  Duration within = std::chrono::seconds(60);
};

// What happens to an actor whose handler throws. The message that failed is
// dropped in every case; nothing else in its mailbox is lost.
class Supervision {
 public:
  enum class Directive : std::uint8_t { stop, resume, restart };
  using Restart = RestartPolicy;

  static Supervision stop() { return Supervision(Directive::stop, {}); }
  static Supervision resume() { return Supervision(Directive::resume, {}); }
  static Supervision restart(Restart policy = {}) {
    return Supervision(Directive::restart, policy);
  }

  Directive directive() const noexcept { return directive_; }
  const Restart& policy() const noexcept { return policy_; }

 private:
  Supervision(Directive d, Restart p) : directive_(d), policy_(p) {}
  Directive directive_;
  Restart policy_;
};

// How to spawn an actor. Defaults: unnamed, unbounded mailbox, stash bound
// 1000, stop on failure (a failing actor does not spin).
struct SpawnOptions {
  std::string name{};
  std::uint32_t mailbox_capacity = 0;  // 0 = unbounded
  std::size_t stash_capacity = 1000;
  Supervision supervision = Supervision::stop();
};

// ---------------------------------------------------------------------------
// Untyped identity and termination notices

// A reference to an actor of any message type: identity, name and liveness,
// but no tell. Value type; thread-safe like ActorRef.
class AnyRef {
 public:
  AnyRef() = default;
  explicit AnyRef(detail::CellRef c) : cell_(std::move(c)) {}
  template <class M>
  AnyRef(const ActorRef<M>& r);  // NOLINT: identity conversion
  const std::string& name() const;
  bool terminated() const noexcept { return !cell_ || cell_->closed(); }
  explicit operator bool() const noexcept { return static_cast<bool>(cell_); }
  friend bool operator==(const AnyRef& a, const AnyRef& b) noexcept {
    return a.cell_.get() == b.cell_.get();
  }
  detail::CellBase* cell() const noexcept { return cell_.get(); }

 private:
  detail::CellRef cell_;
};

// Sent to a watcher when a watched actor terminates.
struct Down {
  AnyRef actor;
  ExitReason reason = ExitReason::normal;
  std::string detail;  // the failure's what() for ExitReason::failure
};

// ---------------------------------------------------------------------------
// ActorRef

// A typed handle to an actor. Cheap to copy (one reference count); holding
// one keeps the actor's 80-byte header alive, not the actor itself. All
// members are thread-safe. A default-constructed ref is empty: tell() on it
// is a dead letter.
template <class Msg>
class ActorRef {
 public:
  using message_type = Msg;
  ActorRef() = default;
  explicit ActorRef(detail::CellRef c) : cell_(std::move(c)) {}

  // Enqueues `m` (anything Msg can be built from, e.g. one alternative of a
  // variant protocol). Never blocks, never throws on a full or dead mailbox:
  // the outcome says what happened, and a refused message is counted.
  template <class M>
    requires std::constructible_from<Msg, M&&>
  Delivery tell(M&& m) const {
    if (!cell_) return Delivery::dead_letter;
    auto* e = new detail::MsgEnvelope<Msg>(std::forward<M>(m));
    Delivery d = cell_->push_user(e);
    if (d != Delivery::delivered) [[unlikely]] {
      refused(d, e);
    }
    return d;
  }

  // Asks the actor to stop once it has handled what is already queued
  // (like a poison pill). Harmless on a stopped actor.
  void stop() const {
    if (cell_) cell_->request_stop();
  }

  const std::string& name() const;
  bool terminated() const noexcept { return !cell_ || cell_->closed(); }
  explicit operator bool() const noexcept { return static_cast<bool>(cell_); }
  friend bool operator==(const ActorRef& a, const ActorRef& b) noexcept {
    return a.cell_ == b.cell_;
  }

  const detail::CellRef& cell() const noexcept { return cell_; }

 private:
  void refused(Delivery d, detail::MsgEnvelope<Msg>* e) const {
    if (d == Delivery::mailbox_full) {
      detail::count_mailbox_full(cell_->system());
    } else {
      cell_->count_dead_letter(typeid(Msg).name());
    }
    delete e;
  }
  detail::CellRef cell_;
};

template <class M>
AnyRef::AnyRef(const ActorRef<M>& r) : cell_(r.cell()) {}

template <class Msg>
const std::string& ActorRef<Msg>::name() const {
  static const std::string empty;
  return cell_ ? cell_->name() : empty;
}

// ---------------------------------------------------------------------------
// Actor

namespace detail {
template <class R, class M, class Make>
class AskAwaitable;
// A coroutine receive: Task<> receive(Msg).
template <class A>
concept CoroutineReceive = requires(A& a, typename A::message_type&& m) {
  { a.receive(std::move(m)) } -> std::same_as<Task<>>;
};
// What spawn<A> requires of an actor class A.
template <class A>
concept ActorType = (requires(A& a, typename A::message_type& m) {
  { a.receive(m) };
} || CoroutineReceive<A>) && std::derived_from<A, Actor<typename A::message_type>>;
}  // namespace detail

// Base of every actor class. Holds only a pointer to the runtime cell; the
// members below are the actor's view of the runtime and may be called only
// from its own handlers and hooks (on_start, receive, continuations, on_stop).
//
// Hooks, found by name on the derived class (not virtual):
//   void on_start();  // before the first message of each incarnation
//   void on_stop();   // after the last message; timers already cancelled
template <class Msg>
class Actor {
 public:
  using message_type = Msg;
  using behavior_type = std::function<void(Msg&)>;

  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  void on_start() {}
  void on_stop() {}

 protected:
  Actor() noexcept : cell_(static_cast<detail::TypedCell<Msg>*>(detail::t_constructing)) {}
  ~Actor() = default;

  ActorRef<Msg> self() const { return ActorRef<Msg>(detail::CellRef(cell_)); }
  const std::string& name() const { return cell_->name(); }
  TimePoint now() const { return cell_->now(); }
  // now() to within a clock tick (a few ms), cheaper: see Clock::coarse_now.
  TimePoint coarse_now() const { return cell_->coarse_now(); }
  WallTime wall_now() const { return detail::clock_of(cell_->system()).wall_now(); }

  // Stops this actor after the current message. Queued messages become dead
  // letters; watchers get Down{normal}; children are stopped.
  void stop() { cell_->stop_self(); }

  // Handles later messages with `b` instead of receive() (or the previous
  // become). The switch takes effect from the next message.
  void become(behavior_type b) {
    auto* p = new behavior_type(std::move(b));
    cell_->set_behavior(p, [](void* q) { delete static_cast<behavior_type*>(q); });
  }
  // become(&Self::state) for a member function void Self::state(Msg&).
  template <class Self>
  void become(void (Self::*fn)(Msg&)) {
    auto* s = static_cast<Self*>(this);
    become([s, fn](Msg& m) { (s->*fn)(m); });
  }
  // Back to receive().
  void unbecome() { cell_->set_behavior(nullptr, nullptr); }

  // Keyed timers. Starting a key that is running replaces it. A cancelled or
  // replaced timer's fire is never delivered, even if it is already queued.
  // Timers are cancelled when the actor stops or restarts.
  void start_timer(std::string key, Duration delay, Msg msg) {
    arm_timer(std::move(key), delay, std::move(msg), false);
  }
  // Fires every `interval` (first after one interval). Msg must be copyable.
  // A zero or negative interval is refused with invalid_argument.
  Result<void> start_periodic_timer(std::string key, Duration interval, Msg msg);
  // True if a timer with that key was running (it is now cancelled).
  bool cancel_timer(std::string_view key);
  bool timer_active(std::string_view key) const;

  // Stashes the message being handled; unstash_all() puts every stashed
  // message back at the front of the mailbox, in order. Past the stash bound
  // (SpawnOptions::stash_capacity) stash() fails with stash_overflow and the
  // message stays with the handler.
  Result<void> stash() { return cell_->stash_current(); }
  void unstash_all() { cell_->unstash_all(); }
  std::size_t stash_size() const { return cell_->stash_size(); }

  // After `d` without any message, `msg` is delivered; again every `d` while
  // quiet. Replaces an earlier setting. A zero or negative `d` is refused
  // with invalid_argument (it would flood the actor); once the actor is
  // stopping, with dead_letter.
  Result<void> set_receive_timeout(Duration d, Msg msg);
  void cancel_receive_timeout();

  // Watch: when `target` terminates, `to_msg(Down)` is delivered here, once.
  // Watching a terminated actor delivers at once. After unwatch() no notice
  // for that target is delivered.
  template <class M, class F>
    requires std::is_invocable_r_v<Msg, F, const Down&>
  void watch(const ActorRef<M>& target, F to_msg) {
    watch_cell(target.cell().get(), std::move(to_msg));
  }
  template <class M>
    requires std::constructible_from<Msg, Down>
  void watch(const ActorRef<M>& target) {
    watch(target, [](const Down& d) { return Msg(d); });
  }
  template <class M>
  void unwatch(const ActorRef<M>& target);

  // Request/response without blocking: `make(ReplyTo<R>)` builds the request;
  // `k(Result<R>)` runs later in this actor (like a message) with the reply,
  // or timeout / dead_letter / mailbox_full / no_reply. Exactly once.
  template <class R, class M, class Make, class K>
  void ask(const ActorRef<M>& target, Make&& make, Duration timeout, K&& k);
  // The same for a coroutine handler: `auto r = co_await ask<R>(target,
  // make, timeout);` sends the request and yields the Result<R>; the
  // handler resumes in this actor. Awaited elsewhere: invalid_argument.
  template <class R, class M, class Make>
  auto ask(const ActorRef<M>& target, Make&& make, Duration timeout)
      -> detail::AskAwaitable<R, M, std::decay_t<Make>>;

  // Runs `task` now as a handler of this actor, like a coroutine receive().
  void start_task(Task<> task);

  // Spawns a child: it stops when this actor stops. Same arguments as
  // ActorSystem::spawn.
  template <class A, class... Args>
  ActorRef<typename A::message_type> spawn(Args&&... args);

 private:
  template <class F>
  void watch_cell(detail::CellBase* tc, F to_msg);
  void arm_timer(std::string key, Duration delay, Msg msg, bool periodic);

  template <class, class...>
  friend class detail::CellImpl;
  detail::TypedCell<Msg>* cell_;
};

// Calls the alternative of `v` that matches: troupe::match(msg, [](A&){}, [](B&){}).
template <class... Fs>
struct overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
overloaded(Fs...) -> overloaded<Fs...>;

template <class V, class... Fs>
decltype(auto) match(V&& v, Fs&&... fs) {
  return std::visit(overloaded{std::forward<Fs>(fs)...}, std::forward<V>(v));
}

}  // namespace troupe

// The machinery behind Actor's members; each of these includes this header
// first, so either may be included on its own.
#include "troupe/core/detail/actor_ask.hpp"     // IWYU pragma: export
#include "troupe/core/detail/actor_await.hpp"   // IWYU pragma: export
#include "troupe/core/detail/actor_timers.hpp"  // IWYU pragma: export
#include "troupe/core/detail/actor_watch.hpp"   // IWYU pragma: export
#include "troupe/core/detail/spawn.hpp"         // IWYU pragma: export
