#pragma once
// Coroutine command handlers (Effect::await, see troupe/persist/entity.hpp):
// a run is one such handler with the command it keeps. It runs as a handler
// of the entity actor (it resumes in it); its persists go through the same
// append path as an effect's events, one at a time; it belongs to the
// processing episode it last persisted in, and is destroyed if that episode
// ends while it waits (E2). Member definitions of EntityActor; included by
// entity_actor.hpp (include troupe/persist/entity.hpp instead). Not part of
// the public API.

#include <coroutine>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/persist/detail/entity_actor.hpp"

namespace troupe {
namespace detail {

template <class B>
struct EntityActor<B>::Run {
  std::unique_ptr<CommandBox> box;  // the command: the coroutine may refer to it
  Task<Eff> task;                   // until it starts
  HandlerFrame* frame = nullptr;    // while it is suspended
  std::uint64_t episode = 0;        // the processing episode it waits in (0: none)
  bool persisting = false;          // its append is in flight
  bool finished = false;            // it returned; `parked` is its final effect
  std::optional<Eff> parked;        // waits for the append in flight
};

// How the core hands a run's end to the entity.
template <class B>
struct EntityActor<B>::RunDone {
  EntityActor* a;
  void operator()(Result<Eff> r) { a->finish_run(std::move(r)); }
  void dropped() noexcept {
    if (a->run_) a->run_->frame = nullptr;  // the actor stops or restarts
  }
};

// The step that answers a run's co_await ctx.persist() once the events are
// applied (or the append failed).
template <class B>
struct EntityActor<B>::RunPersisted final : Step<State> {
  RunPersisted(EntityActor* actor, Promise<void> p) : a(actor), done(std::move(p)) {}
  void run(const State&) override {
    a->run_persisted(true);
    done.set_value();
  }
  void fail(const Error& e) noexcept override {
    a->run_persisted(false);
    done.set_error(e);
  }
  EntityActor* a;
  Promise<void> done;
};

template <class B>
void EntityActor<B>::begin_run(std::unique_ptr<CommandBox> box, Task<Eff> task) {
  auto run = std::make_unique<Run>();
  run->box = std::move(box);
  run->task = std::move(task);
  if (!run_) return start_run(std::move(run));
  // One handler at a time: this one starts when the one running ends.
  if (waiting_runs_.size() >= core_->settings.stash_capacity) return overflow(run->box->cmd, "coroutine handlers waiting");
  waiting_runs_.push_back(std::move(run));
}

template <class B>
void EntityActor<B>::start_run(std::unique_ptr<Run> run) {
  run->episode = in_processing_ ? episode_ : 0;
  Task<Eff> task = std::move(run->task);
  run_ = std::move(run);
  Run* started = run_.get();
  CellBase& cell = *this->self().cell().get();
  starting_run_ = true;
  HandlerFrame* f = nullptr;
  try {
    f = start_handler(cell, std::move(task), RunDone{this});
  } catch (...) {
    starting_run_ = false;
    throw;
  }
  starting_run_ = false;
  if (f && run_.get() == started) run_->frame = f;
}

// From resume(): the parked append of the run, or the next run.
template <class B>
void EntityActor<B>::continue_runs() {
  if (!run_) {
    auto next = std::move(waiting_runs_.front());
    waiting_runs_.erase(waiting_runs_.begin());
    return start_run(std::move(next));
  }
  Eff eff = std::move(*run_->parked);
  run_->parked.reset();
  if (run_->finished) {
    run_.reset();
  } else {
    run_->persisting = true;
  }
  start_persist(std::move(eff), false);
}

// The coroutine returned (or threw); its frame is gone. Its effect is
// carried out as a command handler's, now or after the append in flight.
// Resumed from the entity's mailbox (not from within resume()), it then
// goes on with what waits.
template <class B>
void EntityActor<B>::finish_run(Result<Eff> r) {
  finish_run_effect(std::move(r));
  if (!starting_run_) resume();
}

template <class B>
void EntityActor<B>::finish_run_effect(Result<Eff> r) {
  Command& c = run_->box->cmd;
  run_->frame = nullptr;
  if (!r.ok()) {
    handler_threw(c, r.error().message());
    run_.reset();
    return;
  }
  Eff eff = std::move(r).value();
  if (eff.awaits()) {
    handler_threw(c, "its coroutine returned Effect::await (return the effect itself)");
    run_.reset();
    return;
  }
  stash_or_check_reply(c, eff);
  if (eff.events().empty()) {
    run_.reset();
    finish_effect(eff);
  } else if (persisting_ || phase_ != Phase::running) {
    run_->finished = true;
    run_->parked.emplace(std::move(eff));
  } else {
    run_.reset();
    start_persist(std::move(eff), false);
  }
}

template <class B>
Future<void> EntityActor<B>::run_persist(std::vector<Event> events) {
  Promise<void> p;
  Future<void> f = p.future();
  if (!run_ || run_->persisting || run_->parked) {
    p.set_error(Error(ErrorCode::invalid_argument,
                      "entity '" + pid() + "': persist() awaited outside its running command handler"));
    return f;
  }
  Eff eff = Eff::persist(std::move(events));
  eff.steps().push_back(std::make_unique<RunPersisted>(this, std::move(p)));
  if (persisting_ || phase_ != Phase::running) {
    run_->parked.emplace(std::move(eff));
  } else {
    run_->persisting = true;
    start_persist(std::move(eff), false);
  }
  return f;
}

template <class B>
void EntityActor<B>::run_persisted(bool ok) {
  if (!run_) return;
  run_->persisting = false;
  if (ok) run_->episode = in_processing_ ? episode_ : 0;
}

// The processing episode `ended` is over: a run waiting in it (not on its
// own append) is destroyed, so what it awaits is never acted on (E2).
template <class B>
void EntityActor<B>::end_of_episode(std::uint64_t ended) {
  if (run_->persisting || run_->episode != ended) return;
  std::string what = "its processing episode ended while handling " + command_name(run_->box->cmd);
  log(what);
  drop_run(std::move(run_), Error(inflight_timeout_ ? ErrorCode::timeout : ErrorCode::no_reply,
                                  "entity '" + pid() + "': " + what));
}

template <class B>
void EntityActor<B>::drop_run(std::unique_ptr<Run> run, const Error& e) {
  if (run->frame) cancel_handler(*run->frame);
  if (run->parked) {
    for (auto& s : run->parked->steps()) s->fail(e);
  }
  with_reply_target(run->box->cmd, [&](auto* rt) {
    if (rt && rt->pending()) core_->fail_command(run->box->cmd, e);
  });
}

template <class B>
void EntityActor<B>::drop_runs(const Error& e) {
  if (run_) drop_run(std::move(run_), e);
  auto waiting = std::move(waiting_runs_);
  waiting_runs_.clear();
  for (auto& r : waiting) drop_run(std::move(r), e);
}

// co_await ctx.persist(...): the run's append, awaited as a future (so it
// resumes through the entity's mailbox, like any other await).
template <class B>
class [[nodiscard]] EntityPersist {
 public:
  EntityPersist(EntityActor<B>* a, std::vector<EventOf<B>> events) : a_(a), events_(std::move(events)) {}
  bool await_ready() const noexcept { return false; }
  template <class P>
  bool await_suspend(std::coroutine_handle<P> h) {
    HandlerFrame* home = home_of(h);
    Future<void> f = home ? a_->run_persist(std::move(events_))
                          : failed("persist() awaited outside a coroutine command handler");
    inner_.emplace(std::move(f));
    if (inner_->await_ready()) return false;
    inner_->await_suspend(h);
    return true;
  }
  Result<void> await_resume() { return inner_->await_resume(); }

 private:
  static Future<void> failed(std::string why) {
    Promise<void> p;
    Future<void> f = p.future();
    p.set_error(Error(ErrorCode::invalid_argument, std::move(why)));
    return f;
  }
  EntityActor<B>* a_;
  std::vector<EventOf<B>> events_;
  std::optional<FutureAwaiter<void>> inner_;
};

}  // namespace detail

template <class B>
detail::EntityPersist<B> EntityContext<B>::persist(typename B::Event e) {
  std::vector<typename B::Event> es;
  es.push_back(std::move(e));
  return detail::EntityPersist<B>(actor_, std::move(es));
}
template <class B>
detail::EntityPersist<B> EntityContext<B>::persist(std::vector<typename B::Event> events) {
  return detail::EntityPersist<B>(actor_, std::move(events));
}
template <class B>
template <class R, class M, class Make>
auto EntityContext<B>::ask(const ActorRef<M>& target, Make&& make, Duration timeout) {
  return actor_->template ask<R>(target, std::forward<Make>(make), timeout);
}
template <class B>
const typename B::State& EntityContext<B>::state() const noexcept {
  return actor_->state_;
}

}  // namespace troupe
