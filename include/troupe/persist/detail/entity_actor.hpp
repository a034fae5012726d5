#pragma once
// One incarnation of one entity: the actor a shard spawns for an id. It
// recovers, then takes commands in arrival order, one at a time: the
// behaviour's command handler decides, and the runtime carries out the
// Effect (persist, fold, then-steps, stash / unstash / stop). The command
// path is defined here, inline; storing effects (entity_persist.hpp),
// processing episodes (entity_episode.hpp), recovery (entity_recovery.hpp)
// stopping (entity_stop.hpp) and coroutine handlers (entity_handler.hpp)
// are defined in the headers included at the end. Included by registry_core.hpp (include troupe/persist/entity.hpp
// instead); not part of the public API.

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/persist/detail/registry_core.hpp"

namespace troupe {
namespace detail {

// One incarnation of one entity. Spawned and watched by its shard.
template <class B>
class EntityActor final : public Actor<EntityIn<B>> {
  using In = EntityIn<B>;
  using Command = CommandOf<B>;
  using Event = EventOf<B>;
  using State = StateOf<B>;
  using Eff = Effect<Event, State>;
  using Shard = ShardIn<B>;

 public:
  // The entity owns its id and a share of the core: a stopping shard's
  // object is gone before its children have stopped. The spawn arguments
  // (which the actor's cell keeps) hold the core weakly: the core holds
  // references to the cells, and a strong one back would be a cycle.
  EntityActor(const std::weak_ptr<RegistryCore<B>>& core, ActorRef<Shard> shard, std::string id)
      : core_(lock_core(core)), shard_(std::move(shard)), id_(std::move(id)), behavior_(make_behavior()),
        state_(initial_state()) {}

  void on_start() {
    bump(core_->counters.incarnations_started);
    bump(core_->counters.active);
    last_activity_ = this->now();
    start_recovery();
  }

  void on_stop() {
    core_->counters.active.fetch_sub(1, std::memory_order_relaxed);
    if (in_processing_) core_->processing.leave(id_);  // stopped mid-episode: it resumes on recovery
    // Every way an incarnation ends comes through here; the shard then
    // frees the id's slot or starts the next incarnation for what waits.
    if (!shard_.terminated()) (void)shard_.tell(Shard{typename Shard::EntityDown{id_, AnyRef(this->self())}});
  }

  void receive(In& m) {
    if (m.v.index() != kIdleIndex) last_activity_ = this->now();
    std::visit(overloaded{
                   [&](Command& c) { intake(std::move(c)); },
                   [&](typename In::Recovered& r) { on_recovered(std::move(*r.result)); },
                   [&](typename In::Appended& a) { on_appended(std::move(a.result)); },
                   [&](typename In::Deadline& d) { on_deadline(d.episode); },
                   [&](typename In::StopRequest& s) { on_stop_request(s.shutdown, s.immediate); },
                   [&](typename In::Idle&) { on_idle(); },
               },
               m.v);
  }

 private:
  friend class EntityContext<B>;
  friend class EntityPersist<B>;
  enum class Phase : std::uint8_t { recovering, running, failed };
  // The command being handled, at an address that stays put for a
  // coroutine handler that keeps it (entity_handler.hpp).
  struct CommandBox : Pooled {
    explicit CommandBox(Command&& c) : cmd(std::move(c)) {}
    Command cmd;
  };
  struct Run;
  struct RunDone;
  struct RunPersisted;

  std::string pid() const { return core_->settings.type_name + "|" + id_; }
  void log(std::string_view what) const {
    if (core_->settings.log) entity_log(core_->settings.type_name, id_, what);
  }

  B make_behavior() {
    if (core_->factory) return core_->factory(id_);
    if constexpr (std::is_default_constructible_v<B>) {
      return B{};
    } else {
      throw std::logic_error("entity type '" + core_->settings.type_name + "' has no factory");
    }
  }
  State initial_state() { return initial_state_of(behavior_); }
  std::optional<Processing<Event>> processing_of(const State& s) { return declared_processing(behavior_, s); }
  void fold(const Event& e) { fold_event(behavior_, state_, e); }

  // --- commands: the path of every command, defined here --------------------

  // Every command enters here, in arrival order.
  void intake(Command&& c) {
    if (phase_ == Phase::failed) {
      core_->fail_command(c, *recovery_error_);
      return;
    }
    if (pending_size() >= core_->settings.stash_capacity) {
      overflow(c, "commands waiting for recovery or a persist");
      return;
    }
    pending_.push_back(Waiting{std::move(c), TraceRef::current()});
    resume();
  }

  void overflow(Command& c, std::string_view where) {
    bump(core_->counters.stash_overflows);
    core_->fail_command(c, Error(ErrorCode::stash_overflow,
                                 "entity '" + pid() + "': " + std::to_string(core_->settings.stash_capacity) +
                                     " " + std::string(where) + " already (stash bound)"));
  }

  std::size_t pending_size() const noexcept { return pending_.size() - pending_head_; }

  // Handles waiting work while nothing holds the entity back.
  void resume() {
    while (phase_ == Phase::running && !persisting_ && !immediate_stop_) {
      if (due_episode_) {
        std::uint64_t ep = std::exchange(due_episode_, 0);
        on_deadline(ep);
        continue;
      }
      if (run_ ? run_->parked.has_value() : !waiting_runs_.empty()) [[unlikely]] {
        continue_runs();
        continue;
      }
      if (pending_head_ == pending_.size()) break;
      Waiting w = std::move(pending_[pending_head_++]);
      if (pending_head_ == pending_.size()) {
        pending_.clear();
        pending_head_ = 0;
      }
      // Each command runs under the trace it arrived with (SPEC X4); `w`
      // keeps the trace for the scope, the box the command.
      BorrowedTraceScope scope(w.trace);
      std::unique_ptr<CommandBox> box(new CommandBox(std::move(w.cmd)));
      handle(box);
    }
    try_finish_stop();
  }

  void handle(std::unique_ptr<CommandBox>& box) {
    Command& c = box->cmd;
    TROUPE_LOG(log::Component::persist, log::Level::debug, "command", {{"entity", pid()}, {"command", command_name(c)}});
    // A throwing handler changed nothing (it sees the state as const): that
    // command fails, the entity and everything queued behind it carry on.
    std::optional<Eff> got;
    try {
      got.emplace(behavior_.on_command(std::as_const(state_), c, ctx_));
    } catch (const std::exception& ex) {
      return handler_threw(c, ex.what());
    } catch (...) {
      return handler_threw(c, "unknown exception");
    }
    Eff& eff = *got;
    if (eff.awaits()) [[unlikely]] return begin_run(std::move(box), std::move(eff.task()));
    stash_or_check_reply(c, eff);
    if (!eff.events().empty()) {
      start_persist(std::move(eff), false);
    } else {
      finish_effect(eff);
    }
  }

  // After a handler decided: keep the command if its effect stashes, else
  // make sure it was answered.
  void stash_or_check_reply(Command& c, Eff& eff) {
    if (eff.stashes()) {
      if (stash_.size() >= core_->settings.stash_capacity) {
        overflow(c, "commands stashed");
      } else {
        stash_.push_back(Waiting{std::move(c), TraceRef::current()});
      }
    } else {
      enforce_reply(c);
    }
  }

  void handler_threw(Command& c, std::string_view what) {
    bump(core_->counters.handler_failures);
    std::string msg = "handling " + command_name(c) + " threw: " + std::string(what);
    log(msg);
    core_->fail_command(c, Error(ErrorCode::handler_failed, "entity '" + pid() + "': " + msg));
  }

  void enforce_reply(Command& c) {
    with_reply_target(c, [&](auto* rt) {
      if (!rt || !rt->pending()) return;
      bump(core_->counters.missing_replies);
      std::string what = "handled " + command_name(c) + " without replying";
      log(what);
      rt->fail(Error(ErrorCode::no_reply, "entity '" + pid() + "' " + what));
    });
  }

  void finish_effect(Eff& eff) {
    for (auto& s : eff.steps()) {
      try {
        s->run(state_);
      } catch (const std::exception& ex) {
        bump(core_->counters.handler_failures);
        log(std::string("a then step threw: ") + ex.what());
      } catch (...) {
        bump(core_->counters.handler_failures);
        log("a then step threw an unknown exception");
      }
    }
    switch (eff.after()) {
      case Eff::After::none:
        break;
      case Eff::After::unstash_all:
        unstash_all();
        break;
      case Eff::After::passivate:
        if (core_->settings.log) entity_note(core_->settings.type_name, id_, "passivated after a terminal state");
        ask_to_stop();
        break;
      case Eff::After::stop:
        ask_to_stop();
        break;
    }
  }

  void unstash_all() {
    if (stash_.empty()) return;
    // Stashed commands arrived before anything still waiting: they go first.
    std::vector<Waiting> merged;
    merged.reserve(stash_.size() + pending_size());
    for (auto& c : stash_) merged.push_back(std::move(c));
    for (std::size_t i = pending_head_; i < pending_.size(); ++i) merged.push_back(std::move(pending_[i]));
    stash_.clear();
    pending_ = std::move(merged);
    pending_head_ = 0;
  }

  // --- coroutine handlers (entity_handler.hpp) --------------------------------

  void begin_run(std::unique_ptr<CommandBox> box, Task<Eff> task);
  void start_run(std::unique_ptr<Run> run);
  void continue_runs();
  void finish_run(Result<Eff> r);
  void finish_run_effect(Result<Eff> r);
  Future<void> run_persist(std::vector<Event> events);
  void run_persisted(bool ok);
  void end_of_episode(std::uint64_t ended);
  void drop_run(std::unique_ptr<Run> run, const Error& e);
  void drop_runs(const Error& e);

  // --- persisting (entity_persist.hpp) ---------------------------------------

  void start_persist(Eff&& eff, bool is_timeout);
  void on_appended(Result<void> r);
  void event_handler_threw(Eff& eff, std::string_view what);
  void on_append_failed(Error e, Eff& eff);
  void maybe_snapshot();

  // --- processing episodes (entity_episode.hpp) --------------------------------

  void apply(const Event& e, std::uint64_t seq, std::int64_t ts_ms);
  void arm_deadline();
  void on_deadline(std::uint64_t episode);
  void timeout_hook();

  // --- recovery (entity_recovery.hpp) -----------------------------------------

  void start_recovery();
  void on_recovered(Result<Recovery> r);
  void fail_recovery(Error cause);
  void fail_all(const Error& e);

  // --- stopping, E5 and E6 (entity_stop.hpp) ----------------------------------

  void ask_to_stop();
  void on_idle();
  void on_stop_request(bool shutdown, bool immediate);
  void try_finish_stop();
  void stop_now() { this->stop(); }

  static constexpr std::string_view kDeadlineKey = "troupe.processing";
  static constexpr std::size_t kIdleIndex = 5;  // EntityIn::Idle's index in the variant

  std::shared_ptr<RegistryCore<B>> core_;
  ActorRef<Shard> shard_;
  std::string id_;
  EntityContext<B> ctx_{this};
  B behavior_;
  State state_;
  std::uint64_t seq_ = 0;
  std::uint64_t since_snapshot_ = 0;
  // processing episode: identified by the seq of the event that entered it
  std::uint64_t episode_ = 0;
  std::int64_t episode_start_ms_ = 0;
  Duration timeout_{};
  std::uint64_t due_episode_ = 0;
  // A command waiting for its turn, with the trace it arrived under.
  struct Waiting {
    Command cmd;
    TraceRef trace;
  };
  // waiting commands: pending_[pending_head_..] in arrival order
  std::vector<Waiting> pending_;
  std::size_t pending_head_ = 0;
  std::vector<Waiting> stash_;
  std::unique_ptr<Run> run_;                       // the coroutine handler in progress
  std::vector<std::unique_ptr<Run>> waiting_runs_;  // coroutine handlers not started yet
  std::unique_ptr<Eff> inflight_;
  TraceRef inflight_trace_;  // the trace the append in flight was made under
  TraceRef episode_trace_;   // the trace of the event that began the processing episode
  std::int64_t inflight_ts_ = 0;
  std::unique_ptr<Error> recovery_error_;
  TimePoint last_activity_{};
  Phase phase_ = Phase::recovering;
  bool persisting_ = false;
  bool inflight_timeout_ = false;
  bool in_processing_ = false;
  bool stop_asked_ = false;
  bool stop_requested_ = false;
  bool immediate_stop_ = false;
  bool starting_run_ = false;  // a coroutine handler runs its first part
};

}  // namespace detail

// --- EntityContext members -----------------------------------------------------

template <class B>
const std::string& EntityContext<B>::id() const noexcept {
  return actor_->id_;
}
template <class B>
std::string EntityContext<B>::persistence_id() const {
  return actor_->pid();
}
template <class B>
std::uint64_t EntityContext<B>::last_seq() const noexcept {
  return actor_->seq_;
}
template <class B>
TimePoint EntityContext<B>::now() const {
  return actor_->now();
}
template <class B>
WallTime EntityContext<B>::wall_now() const {
  return actor_->wall_now();
}
template <class B>
void EntityContext<B>::tell_self(Command c) {
  (void)actor_->self().tell(detail::EntityIn<B>{std::move(c)});
}
template <class B>
template <class R, class M, class Make, class ToCmd>
void EntityContext<B>::ask(const ActorRef<M>& target, Make&& make, Duration timeout, ToCmd to_command) {
  auto* a = actor_;
  a->template ask<R>(target, std::forward<Make>(make), timeout,
                     [a, f = std::move(to_command)](Result<R> r) mutable { a->intake(Command(f(std::move(r)))); });
}

}  // namespace troupe

// The rest of the entity actor's members, and the shard that spawns it.
#include "troupe/persist/detail/entity_episode.hpp"   // IWYU pragma: export
#include "troupe/persist/detail/entity_handler.hpp"   // IWYU pragma: export
#include "troupe/persist/detail/entity_persist.hpp"   // IWYU pragma: export
#include "troupe/persist/detail/entity_recovery.hpp"  // IWYU pragma: export
#include "troupe/persist/detail/entity_stop.hpp"      // IWYU pragma: export
#include "troupe/persist/detail/entity_shard.hpp"     // IWYU pragma: export
