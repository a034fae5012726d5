#pragma once
// What a command handler asks the runtime to do.
//
// An entity's command handler never changes its state directly: it returns
// an Effect. The runtime carries it out in this order:
//   1. persist the effect's events (if any) in one atomic append; while they
//      are in flight the entity handles no other command (they wait, in order);
//   2. fold each stored event into the state with the event handler;
//   3. run the `then` steps in the order they were added, each seeing the
//      new state;
//   4. apply stash / unstash_all / stop / passivate.
// If the append fails, no event is applied, no `then` step runs, every
// reply step answers with the journal's error, and the entity stops (its
// in-memory state can no longer be trusted; the next command recovers it).
//
//   return Effect::persist(SettlementAccepted{amount})
//       .then_reply(cmd.reply_to, [](const State& s) { return Accepted{s.id}; });
//
// Effects are move-only values built and returned by the handler; they are
// not thread-safe and are consumed once.

#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"
#include "troupe/core/task.hpp"

namespace troupe {

// A processing state's declaration (SPEC E1-E4, E6, E8): while a state
// returns one of these from `processing(state)`, the entity is waiting on an
// external system. The runtime then
//  - arms a deadline at (time of the event that entered processing) + timeout,
//    re-armed with the same rule after recovery, so an episode that began long
//    ago times out at once (E1);
//  - handles only the current episode's deadline (E2);
//  - at the deadline persists `timeout_event`, which must move the state out
//    of processing, and unstashes (E3);
//  - cancels the deadline when the state leaves processing (E4) and unstashes;
//  - defers stop and passivation until the episode ends (E6).
template <class Event>
struct Processing {
  Duration timeout;
  Event timeout_event;
};

namespace detail {

// One `then` step: runs with the new state, or fails with the append's error.
template <class State>
class Step {
 public:
  virtual ~Step() = default;
  virtual void run(const State& s) = 0;
  virtual void fail(const Error& e) noexcept = 0;
};

template <class State, class F>
class RunStep final : public Step<State> {
 public:
  explicit RunStep(F f) : f_(std::move(f)) {}
  void run(const State& s) override {
    if constexpr (std::is_invocable_v<F&, const State&>) {
      f_(s);
    } else {
      f_();
    }
  }
  void fail(const Error&) noexcept override {}

 private:
  F f_;
};

template <class State, class R, class F>
class ReplyStep final : public Step<State> {
 public:
  ReplyStep(ReplyTo<R> to, F make) : to_(std::move(to)), make_(std::move(make)) {}
  void run(const State& s) override {
    if constexpr (std::is_invocable_v<F&, const State&>) {
      to_.reply(make_(s));
    } else {
      to_.reply(make_());
    }
  }
  void fail(const Error& e) noexcept override {
    if (to_.pending()) to_.fail(e);
  }

 private:
  ReplyTo<R> to_;
  F make_;
};

}  // namespace detail

template <class Event, class State>
class [[nodiscard]] Effect {
 public:
  enum class After : std::uint8_t { none, unstash_all, stop, passivate };

  Effect() = default;
  Effect(Effect&&) noexcept = default;
  Effect& operator=(Effect&&) noexcept = default;

  // Nothing to persist; `then` steps run at once.
  static Effect none() { return Effect(); }
  // Persists one event, or several in one atomic append.
  static Effect persist(Event e) {
    Effect x;
    x.events_.push_back(std::move(e));
    return x;
  }
  static Effect persist(std::vector<Event> es) {
    Effect x;
    x.events_ = std::move(es);
    return x;
  }
  // Keeps the command for later (bounded; past the bound the command's
  // reply target gets stash_overflow). unstash_all() or leaving a processing
  // state hands stashed commands back, in order.
  static Effect stash() {
    Effect x;
    x.stash_ = true;
    return x;
  }
  static Effect unstash_all() { return none().then_unstash_all(); }
  // Stops this incarnation once any processing episode has ended (E6).
  // Commands that arrive meanwhile go to the next incarnation.
  static Effect stop() { return none().then_stop(); }
  // Like stop(), and says the entity is idle: the registry may free it. The
  // next command recovers it.
  static Effect passivate() { return none().then_passivate(); }
  // Replies at once with `value`.
  template <class R, class V>
  static Effect reply(ReplyTo<R>& to, V&& value) {
    return none().then_reply(to, [v = R(std::forward<V>(value))]() mutable { return std::move(v); });
  }
  // Fails the request at once with `e`.
  template <class R>
  static Effect reject(ReplyTo<R>& to, Error e) {
    to.fail(std::move(e));
    return none();
  }
  // Handles the command with the coroutine `task` (it may co_await
  // EntityContext::persist, asks and futures); the Effect it returns is
  // carried out as the handler's. Stands alone: nothing may be chained.
  static Effect await(Task<Effect> task) {
    Effect x;
    x.task_ = std::move(task);
    return x;
  }

  // Runs f(state) (or f()) after the events are applied.
  template <class F>
  Effect&& then(F f) && {
    steps_.push_back(std::make_unique<detail::RunStep<State, F>>(std::move(f)));
    return std::move(*this);
  }
  // Replies with make(state) (or make()) after the events are applied; if
  // the append fails the request gets the journal's error instead. Takes
  // the reply target from the command.
  template <class R, class F>
  Effect&& then_reply(ReplyTo<R>& to, F make) && {
    steps_.push_back(std::make_unique<detail::ReplyStep<State, R, F>>(std::move(to), std::move(make)));
    return std::move(*this);
  }
  Effect&& then_unstash_all() && {
    after_ = After::unstash_all;
    return std::move(*this);
  }
  Effect&& then_stop() && {
    after_ = After::stop;
    return std::move(*this);
  }
  Effect&& then_passivate() && {
    after_ = After::passivate;
    return std::move(*this);
  }

  // Runtime side.
  std::vector<Event>& events() noexcept { return events_; }
  std::vector<std::unique_ptr<detail::Step<State>>>& steps() noexcept { return steps_; }
  bool stashes() const noexcept { return stash_; }
  After after() const noexcept { return after_; }
  bool awaits() const noexcept { return static_cast<bool>(task_); }
  Task<Effect>& task() noexcept { return task_; }

 private:
  std::vector<Event> events_;
  std::vector<std::unique_ptr<detail::Step<State>>> steps_;
  bool stash_ = false;
  After after_ = After::none;
  Task<Effect> task_;
};

}  // namespace troupe
