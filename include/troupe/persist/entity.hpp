#pragma once
// Event-sourced entities (SPEC E1-E8).
//
// An entity is a state machine addressed by (entity type, entity id) whose
// history lives in a Journal. Its behaviour is a plain class:
//
//   struct Payment {
//     using Command = PaymentCommand;  // usually a std::variant
//     using Event = PaymentEvent;      // usually a std::variant
//     using State = PaymentState;      // any movable type
//     using Effect = troupe::Effect<Event, State>;
//
//     Effect on_command(const State& s, Command& c, troupe::EntityContext<Payment>& ctx);
//     void on_event(State& s, const Event& e);             // or: State on_event(const State&, const Event&)
//     std::optional<troupe::Processing<Event>> processing(const State& s) const;  // optional member
//     State initial_state() const;                         // optional member; else State{}
//     void on_processing_timeout(const State&, troupe::EntityContext<Payment>&);  // optional member
//   };
//
// The command handler decides; the event handler folds a stored event into
// the state and does nothing else (it also runs during recovery).
// on_processing_timeout, if present, runs after a processing deadline's
// timeout event was stored and applied (live only, never during recovery):
// the place to answer a client that was waiting for the episode. A state
// for which processing() returns a value is a *processing* state: see
// Processing in effect.hpp for what the runtime then guarantees.
//
// Entities live in an EntityRegistry<B>: a set of shard actors mapping ids
// to entity actors, started on an id's first command, recovered from the
// journal (latest snapshot, then later events; commands that arrive during
// recovery wait and are handled after it), passivated when idle (E5) and
// stopped gracefully on shutdown (E6).
//
// Replies. A command that expects an answer carries a `ReplyTo<R> reply_to`
// member. The runtime enforces answers at run time: a command handled
// without replying (not answered, not moved into a then_reply step, not
// stashed) is answered at once with ErrorCode::no_reply and a message naming
// the entity and the command, counted in EntityStats::missing_replies and
// logged. Commands the runtime cannot deliver (stash full, recovery failed,
// shutting down, journal failure) are answered with that error through the
// same member; nothing is dropped silently.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/persist/codec.hpp"
#include "troupe/persist/effect.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

// Per entity type settings.
struct EntitySettings {
  // The entity type: persistence ids are "<type_name>|<id>". Non-empty, no '|'.
  std::string type_name{};
  // An entity that handles no message for this long is passivated (E5).
  // Zero: never for idleness.
  Duration idle_timeout = std::chrono::seconds(120);
  // Bound of each entity's stash and of the commands waiting while it
  // recovers or persists (E8). Past it: stash_overflow to the sender.
  std::size_t stash_capacity = 1000;
  // Shard actors that route ids to entities; 0 = 8 per worker thread.
  std::size_t shards = 0;
  // Save a snapshot every this many events (needs a StateCodec); 0 = never.
  // Snapshots are taken only outside processing states.
  std::uint64_t snapshot_every = 0;
  // How long a graceful stop (stop(), or the actor system's shutdown) waits
  // for processing entities; zero = the longest processing timeout any
  // entity of this type declared, plus one second.
  Duration stop_timeout = Duration::zero();
  // Log recovery failures, journal conflicts and missing replies to stderr.
  bool log = true;
};

// Counters of one registry; each exact, the set not a snapshot.
struct EntityStats {
  std::uint64_t incarnations_started = 0;
  std::uint64_t active = 0;               // entity actors alive now
  std::uint64_t passivations = 0;
  std::uint64_t recoveries = 0;           // completed recoveries
  std::uint64_t recovery_failures = 0;
  std::uint64_t events_persisted = 0;
  std::uint64_t snapshots_saved = 0;
  std::uint64_t processing_timeouts = 0;  // deadlines handled (E3)
  std::uint64_t stale_deadlines = 0;      // deadlines of ended episodes, ignored (E2)
  std::uint64_t stops_deferred = 0;       // stop requests that waited for an episode (E6)
  std::uint64_t stash_overflows = 0;      // commands refused by a full stash (E8)
  std::uint64_t missing_replies = 0;
  std::uint64_t journal_conflicts = 0;    // appends rejected: another writer (E7)
  std::uint64_t journal_failures = 0;     // other append errors
  std::uint64_t commands_failed = 0;      // answered with an error by the runtime
  std::uint64_t commands_dropped = 0;     // undeliverable and without a reply target
  std::uint64_t handler_failures = 0;     // command, event or step handlers that threw
};

// An entity in a processing episode now (SPEC E1): since when (the stored
// time of the event that entered it) and when its deadline falls, both wall
// time in ms since the epoch. Plain value type.
struct ProcessingEntity {
  std::string id;
  std::int64_t since_ms = 0;
  std::int64_t deadline_ms = 0;
};

template <class B>
class EntityRegistry;
template <class B>
class EntityContext;

namespace detail {

struct EntityCounters {
  std::atomic<std::uint64_t> handler_failures{0}, incarnations_started{0}, active{0}, passivations{0}, recoveries{0},
      recovery_failures{0}, events_persisted{0}, snapshots_saved{0}, processing_timeouts{0},
      stale_deadlines{0}, stops_deferred{0}, stash_overflows{0}, missing_replies{0}, journal_conflicts{0},
      journal_failures{0}, commands_failed{0}, commands_dropped{0};
  std::atomic<std::int64_t> longest_processing_ns{0};
  EntityStats snapshot() const noexcept;
  void note_processing_timeout(Duration d) noexcept;
};

// The entities of one registry that are in a processing episode now, for
// the node's dashboard ("processing longest") and entity pages. Written by
// the entities at each episode's start and end (one short lock); read by
// anyone. Thread-safe.
class ProcessingBoard {
 public:
  void enter(const std::string& id, std::int64_t since_ms, std::int64_t deadline_ms);
  void leave(const std::string& id);
  std::size_t size() const;
  // Up to `limit` entries, the longest processing (earliest since) first.
  std::vector<ProcessingEntity> longest(std::size_t limit) const;
  std::optional<ProcessingEntity> find(const std::string& id) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::pair<std::int64_t, std::int64_t>> entries_;
};

// src/persist/entity.cpp
void entity_log(const std::string& type_name, std::string_view id, std::string_view what);
std::string demangle(const char* mangled);
std::int64_t wall_ms(WallTime t) noexcept;

inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
}

template <class B>
using CommandOf = typename B::Command;
template <class B>
using EventOf = typename B::Event;
template <class B>
using StateOf = typename B::State;

// The reply target of a command alternative, if it has one.
template <class T>
concept HasReplyTo = requires(T& t) {
  { t.reply_to.pending() } -> std::convertible_to<bool>;
};

// Calls f(reply_to) for the command's reply target, if any; else f().
template <class C, class F>
void with_reply_target(C& c, F&& f) {
  auto one = [&](auto& alt) {
    if constexpr (HasReplyTo<std::remove_cvref_t<decltype(alt)>>) {
      f(&alt.reply_to);
    } else {
      f(static_cast<ReplyTo<int>*>(nullptr));
    }
  };
  if constexpr (IsVariant<C>::value) {
    std::visit(one, c);
  } else {
    one(c);
  }
}

template <class C>
std::string command_name(const C& c) {
  if constexpr (IsVariant<C>::value) {
    return std::visit([](const auto& alt) { return demangle(typeid(alt).name()); }, c);
  } else {
    return demangle(typeid(C).name());
  }
}

template <class B>
struct EntityIn;
template <class B>
struct ShardIn;
template <class B>
class EntityActor;
template <class B>
class EntityShard;

// What every shard and entity of one registry share. Lives as long as any
// of them or any registry handle.
template <class B>
struct RegistryCore {
  using Factory = std::function<B(const std::string& id)>;

  ActorSystem* system = nullptr;
  std::shared_ptr<Journal> journal;
  EntitySettings settings;
  EventCodecs<EventOf<B>> codecs;
  std::optional<StateCodec<StateOf<B>>> state_codec;
  Factory factory;
  std::vector<ActorRef<ShardIn<B>>> shards;
  EntityCounters counters;
  ProcessingBoard processing;

  std::mutex stop_mu;
  std::condition_variable stop_cv;
  std::size_t shards_stopped = 0;
  bool stop_begun = false;
  bool stop_immediate = false;
  std::uint64_t hook_id = 0;

  // Answers a command the runtime cannot deliver with `e` (or counts it
  // dropped if it has no reply target).
  void fail_command(CommandOf<B>& c, const Error& e) {
    bool answered = false;
    with_reply_target(c, [&](auto* rt) {
      if (rt && rt->pending()) {
        rt->fail(e);
        answered = true;
      }
    });
    bump(answered ? counters.commands_failed : counters.commands_dropped);
  }

  std::size_t shard_index(std::string_view id) const noexcept {
    return std::hash<std::string_view>{}(id) % shards.size();
  }

  void begin_stop(bool immediate = false);
  bool wait_stopped(std::chrono::steady_clock::duration bound) {
    std::unique_lock lk(stop_mu);
    return stop_cv.wait_for(lk, bound, [&] { return shards_stopped == shards.size(); });
  }
  void shard_stopped() {
    std::vector<std::function<void()>> run;
    {
      std::lock_guard lk(stop_mu);
      ++shards_stopped;
      stop_cv.notify_all();
      if (shards_stopped == shards.size()) run.swap(stopped_callbacks);
    }
    for (auto& f : run) f();
  }
  // Runs `f` once every shard has stopped: at once (on this thread) if they
  // already have, else on the thread of the last shard to stop.
  void when_stopped(std::function<void()> f) {
    {
      std::lock_guard lk(stop_mu);
      if (shards_stopped < shards.size()) {
        stopped_callbacks.push_back(std::move(f));
        return;
      }
    }
    f();
  }
  std::vector<std::function<void()>> stopped_callbacks;
  Duration graceful_bound() const noexcept {
    if (settings.stop_timeout > Duration::zero()) return settings.stop_timeout;
    return Duration(counters.longest_processing_ns.load(std::memory_order_relaxed)) + std::chrono::seconds(1);
  }
};

// The registry core for a new shard or entity. Their spawners hold it, so it
// is always there; the check keeps that assumption out of every use.
template <class B>
std::shared_ptr<RegistryCore<B>> lock_core(const std::weak_ptr<RegistryCore<B>>& w) {
  auto c = w.lock();
  if (!c) throw std::logic_error("entity registry already destroyed");
  return c;
}

// Messages into an entity actor.
template <class B>
struct EntityIn {
  struct Recovered {
    std::unique_ptr<Result<Recovery>> result;  // boxed: keeps every message into an entity small
  };
  struct Appended {
    Result<void> result;
  };
  struct Deadline {
    std::uint64_t episode;
  };
  struct StopRequest {
    bool shutdown;
    // Stop without waiting for a processing episode or handling what waits
    // (a node that lost its lease: others are about to take over).
    bool immediate = false;
  };
  struct Idle {};
  std::variant<CommandOf<B>, Recovered, Appended, Deadline, StopRequest, Idle> v;
};

// Messages into a shard actor.
template <class B>
struct ShardIn {
  struct Deliver {
    std::string id;
    CommandOf<B> cmd;
  };
  struct Passivate {
    std::string id;
    AnyRef who;
  };
  struct Returned {
    std::string id;
    std::vector<CommandOf<B>> cmds;
  };
  struct EntityDown {
    std::string id;
    AnyRef who;
  };
  struct StopAll {
    bool immediate = false;
  };
  struct IdleTick {};
  std::variant<Deliver, Passivate, Returned, EntityDown, StopAll, IdleTick> v;
};

template <class B>
void RegistryCore<B>::begin_stop(bool immediate) {
  bool first;
  {
    std::lock_guard lk(stop_mu);
    if (stop_begun && (!immediate || stop_immediate)) return;
    first = !stop_begun;
    stop_begun = true;
    stop_immediate = stop_immediate || immediate;
  }
  for (auto& s : shards) {
    // A shard already gone (system shutting down) has no entities left.
    if (s.tell(ShardIn<B>{typename ShardIn<B>::StopAll{immediate}}) != Delivery::delivered && first) shard_stopped();
  }
}

}  // namespace detail

// An entity's window on the runtime, passed to its command handler. Valid
// for the life of the incarnation; use it only from the entity's own
// handlers and the steps and continuations they create.
template <class B>
class EntityContext {
 public:
  using Command = detail::CommandOf<B>;

  const std::string& id() const noexcept;
  std::string persistence_id() const;
  // The sequence number of the last event stored for this entity.
  std::uint64_t last_seq() const noexcept;
  TimePoint now() const;
  WallTime wall_now() const;

  // Sends a command to this incarnation (it queues behind what is waiting).
  void tell_self(Command c);

  // Asks another actor without blocking; when the reply, timeout or error
  // comes, `to_command(Result<R>)` builds a command that this entity then
  // handles like any other (e.g. the settlement gateway's answer).
  template <class R, class M, class Make, class ToCmd>
  void ask(const ActorRef<M>& target, Make&& make, Duration timeout, ToCmd to_command);

 private:
  friend class detail::EntityActor<B>;
  explicit EntityContext(detail::EntityActor<B>* a) noexcept : actor_(a) {}
  detail::EntityActor<B>* actor_;
};

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
  enum class Phase : std::uint8_t { recovering, running, failed };

  std::string pid() const { return core_->settings.type_name + "|" + id_; }
  void log(std::string_view what) const {
    if (core_->settings.log) entity_log(core_->settings.type_name, id_, what);
  }

  void start_recovery() {
    auto self = this->self();
    core_->journal->recover(pid(), [self](Result<Recovery> r) {
      self.tell(In{typename In::Recovered{std::make_unique<Result<Recovery>>(std::move(r))}});
    });
  }

  B make_behavior() {
    if (core_->factory) return core_->factory(id_);
    if constexpr (std::is_default_constructible_v<B>) {
      return B{};
    } else {
      throw std::logic_error("entity type '" + core_->settings.type_name + "' has no factory");
    }
  }
  State initial_state() {
    if constexpr (requires(B& b) { { b.initial_state() } -> std::convertible_to<State>; }) {
      return behavior_.initial_state();
    } else {
      return State{};
    }
  }
  std::optional<Processing<Event>> processing_of(const State& s) {
    if constexpr (requires(B& b, const State& st) { b.processing(st); }) {
      return behavior_.processing(s);
    } else {
      (void)s;
      return std::nullopt;
    }
  }
  void fold(const Event& e) {
    if constexpr (requires(B& b, State& s, const Event& ev) {
                    { b.on_event(s, ev) } -> std::same_as<void>;
                  }) {
      behavior_.on_event(state_, e);
    } else {
      state_ = behavior_.on_event(std::as_const(state_), e);
    }
  }

  // --- commands ------------------------------------------------------------

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
    pending_.push_back(std::move(c));
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
      if (pending_head_ == pending_.size()) break;
      Command c = std::move(pending_[pending_head_++]);
      if (pending_head_ == pending_.size()) {
        pending_.clear();
        pending_head_ = 0;
      }
      handle(c);
    }
    try_finish_stop();
  }

  void handle(Command& c) {
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
    if (eff.stashes()) {
      if (stash_.size() >= core_->settings.stash_capacity) {
        overflow(c, "commands stashed");
      } else {
        stash_.push_back(std::move(c));
      }
    } else {
      enforce_reply(c);
    }
    if (!eff.events().empty()) {
      start_persist(std::move(eff), false);
    } else {
      finish_effect(eff);
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
      case Eff::After::stop:
      case Eff::After::passivate:
        ask_to_stop();
        break;
    }
  }

  void unstash_all() {
    if (stash_.empty()) return;
    // Stashed commands arrived before anything still waiting: they go first.
    std::vector<Command> merged;
    merged.reserve(stash_.size() + pending_size());
    for (auto& c : stash_) merged.push_back(std::move(c));
    for (std::size_t i = pending_head_; i < pending_.size(); ++i) merged.push_back(std::move(pending_[i]));
    stash_.clear();
    pending_ = std::move(merged);
    pending_head_ = 0;
  }

  // --- persisting ------------------------------------------------------------

  void start_persist(Eff&& eff, bool is_timeout) {
    AppendBatch batch;
    batch.persistence_id = pid();
    std::int64_t ts = wall_ms(ctx_.wall_now());
    std::uint64_t seq = seq_;
    batch.events.reserve(eff.events().size());
    for (auto& e : eff.events()) {
      Result<Encoded> enc = [&]() -> Result<Encoded> {
        try {
          return core_->codecs.encode(e);
        } catch (const std::exception& ex) {
          return Error(ErrorCode::invalid_argument, std::string("event encoder threw: ") + ex.what());
        }
      }();
      if (!enc.ok()) {
        // Nothing was stored: the command fails, the entity carries on.
        Error err(enc.error().code(), "entity '" + pid() + "' cannot encode an event: " + enc.error().message());
        log(err.message());
        for (auto& s : eff.steps()) s->fail(err);
        return;
      }
      batch.events.push_back(EventRecord{++seq, ts, std::move(enc->type), enc->version, std::move(enc->payload)});
    }
    inflight_ = std::make_unique<Eff>(std::move(eff));
    inflight_ts_ = ts;
    inflight_timeout_ = is_timeout;
    persisting_ = true;
    auto self = this->self();
    core_->journal->append(std::move(batch), [self](Result<void> r) {
      self.tell(In{typename In::Appended{std::move(r)}});
    });
  }

  void on_appended(Result<void> r) {
    if (!persisting_) return;
    persisting_ = false;
    std::unique_ptr<Eff> eff = std::move(inflight_);
    if (!r.ok()) {
      on_append_failed(std::move(r).error(), *eff);
      return;
    }
    auto n = eff->events().size();
    try {
      for (auto& e : eff->events()) apply(e, ++seq_, inflight_ts_);
    } catch (const std::exception& ex) {
      return event_handler_threw(*eff, ex.what());
    } catch (...) {
      return event_handler_threw(*eff, "unknown exception");
    }
    bump(core_->counters.events_persisted, n);
    since_snapshot_ += n;
    if (inflight_timeout_ && in_processing_) {
      // The timeout event must leave processing (E3). A state that stays
      // would be stuck; count a fresh deadline from now instead.
      log("the processing timeout event did not leave the processing state; re-arming the deadline");
      episode_start_ms_ = wall_ms(ctx_.wall_now());
      arm_deadline();
    }
    finish_effect(*eff);
    if (inflight_timeout_) timeout_hook();
    maybe_snapshot();
    resume();
  }

  void timeout_hook() {
    if constexpr (requires(B& b, const State& st, EntityContext<B>& c) { b.on_processing_timeout(st, c); }) {
      try {
        behavior_.on_processing_timeout(std::as_const(state_), ctx_);
      } catch (const std::exception& ex) {
        bump(core_->counters.handler_failures);
        log(std::string("on_processing_timeout threw: ") + ex.what());
      }
    }
  }

  // The events are stored but folding them threw, so the state in memory is
  // unknown: rebuild it from the journal in place. The mailbox and the
  // waiting commands are kept; they run after the recovery.
  void event_handler_threw(Eff& eff, std::string_view what) {
    bump(core_->counters.handler_failures);
    std::string msg = "the event handler threw (" + std::string(what) + "); recovering from the journal";
    log(msg);
    Error err(ErrorCode::handler_failed, "entity '" + pid() + "': " + msg);
    for (auto& s : eff.steps()) s->fail(err);
    this->cancel_timer(kDeadlineKey);
    if (in_processing_) core_->processing.leave(id_);
    in_processing_ = false;
    due_episode_ = 0;
    seq_ = 0;
    state_ = initial_state();
    phase_ = Phase::recovering;
    start_recovery();
  }

  void on_append_failed(Error e, Eff& eff) {
    bool conflict = e.code() == ErrorCode::journal_conflict;
    bump(conflict ? core_->counters.journal_conflicts : core_->counters.journal_failures);
    Error err(e.code(), "entity '" + pid() + "': " + e.message());
    log(conflict ? "append rejected, another incarnation writes this entity (E7); stopping: " + e.message()
                 : "append failed; stopping: " + e.message());
    for (auto& s : eff.steps()) s->fail(err);
    // This incarnation's state may be behind the journal: it must not go on.
    // Waiting commands get the error; the next command recovers afresh.
    fail_all(err);
    stop_now();
  }

  // Folds a stored event and tracks processing episodes (E1, E4).
  void apply(const Event& e, std::uint64_t seq, std::int64_t ts_ms) {
    fold(e);
    auto p = processing_of(state_);
    if (p && !in_processing_) {
      in_processing_ = true;
      episode_ = seq;
      episode_start_ms_ = ts_ms;
      timeout_ = p->timeout;
      core_->counters.note_processing_timeout(p->timeout);
      core_->processing.enter(
          id_, ts_ms, ts_ms + std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count());
      if (phase_ == Phase::running) arm_deadline();
    } else if (!p && in_processing_) {
      in_processing_ = false;
      core_->processing.leave(id_);
      if (phase_ == Phase::running) this->cancel_timer(kDeadlineKey);
      unstash_all();
    }
  }

  void arm_deadline() {
    // delay = max(0, event_time + timeout - now), on wall time so that it
    // means the same after a crash and a recovery elsewhere (E1).
    WallTime start{std::chrono::milliseconds(episode_start_ms_)};
    Duration left = (start + timeout_) - ctx_.wall_now();
    if (left < Duration::zero()) left = Duration::zero();
    this->start_timer(std::string(kDeadlineKey), left, In{typename In::Deadline{episode_}});
  }

  void on_deadline(std::uint64_t episode) {
    if (!in_processing_ || episode != episode_) {
      bump(core_->counters.stale_deadlines);  // E2: an ended episode's deadline
      return;
    }
    if (persisting_ || phase_ != Phase::running) {
      due_episode_ = episode;  // handled once the append in flight is done
      return;
    }
    auto p = processing_of(state_);
    if (!p) return;
    bump(core_->counters.processing_timeouts);
    start_persist(Eff::persist(std::move(p->timeout_event)), true);
  }

  void maybe_snapshot() {
    auto& st = core_->settings;
    if (!st.snapshot_every || !core_->state_codec || since_snapshot_ < st.snapshot_every || in_processing_) return;
    since_snapshot_ = 0;
    auto& codec = *core_->state_codec;
    ByteWriter w;
    try {
      codec.encode(state_, w);
    } catch (const std::exception& ex) {
      log(std::string("snapshot encoder threw: ") + ex.what());
      return;
    }
    SnapshotRecord rec{seq_, wall_ms(ctx_.wall_now()), codec.type, codec.version, w.take()};
    auto core = core_;
    std::string id = id_;
    core_->journal->save_snapshot(pid(), std::move(rec), [core, id](Result<void> r) {
      if (r.ok()) {
        bump(core->counters.snapshots_saved);
      } else if (core->settings.log) {
        // A lost snapshot only makes the next recovery longer.
        entity_log(core->settings.type_name, id, "snapshot not saved: " + r.error().to_string());
      }
    });
  }

  // --- recovery ----------------------------------------------------------------

  void on_recovered(Result<Recovery> r) {
    if (phase_ != Phase::recovering) return;
    if (!r.ok()) return fail_recovery(std::move(r).error());
    Recovery& rec = *r;
    try {
      if (rec.snapshot) {
        auto& snap = *rec.snapshot;
        if (!core_->state_codec)
          return fail_recovery(Error(ErrorCode::corrupt_record, "a snapshot exists at seq " +
                                                                    std::to_string(snap.seq) +
                                                                    " but no state codec is registered"));
        auto& codec = *core_->state_codec;
        if (snap.type != codec.type)
          return fail_recovery(Error(ErrorCode::corrupt_record, "snapshot at seq " + std::to_string(snap.seq) +
                                                                    " has unknown manifest '" + snap.type + "'"));
        ByteReader rd(snap.payload);
        auto s = codec.decode(snap.version, rd);
        if (!s.ok())
          return fail_recovery(Error(ErrorCode::corrupt_record, "snapshot at seq " + std::to_string(snap.seq) +
                                                                    ": " + s.error().message()));
        state_ = std::move(*s);
        seq_ = snap.seq;
      }
      for (auto& ev : rec.events) {
        if (ev.seq != seq_ + 1)
          return fail_recovery(Error(ErrorCode::corrupt_record, "event " + std::to_string(seq_ + 1) +
                                                                    " is missing (next stored is " +
                                                                    std::to_string(ev.seq) + ")"));
        auto e = core_->codecs.decode(ev.type, ev.version, ev.payload);
        if (!e.ok())
          return fail_recovery(Error(ErrorCode::corrupt_record,
                                     "event " + std::to_string(ev.seq) + ": " + e.error().message()));
        apply(*e, ev.seq, ev.timestamp_ms);
        seq_ = ev.seq;
      }
    } catch (const std::exception& ex) {
      return fail_recovery(Error(ErrorCode::handler_failed, std::string("event handler threw: ") + ex.what()));
    }
    seq_ = std::max(seq_, rec.highest_seq);
    since_snapshot_ = rec.events.size();
    phase_ = Phase::running;
    bump(core_->counters.recoveries);
    if (in_processing_) arm_deadline();  // E1: from the stored event time
    resume();
  }

  void fail_recovery(Error cause) {
    phase_ = Phase::failed;
    bump(core_->counters.recovery_failures);
    recovery_error_ = std::make_unique<Error>(ErrorCode::recovery_failed,
                                              "entity '" + pid() + "' cannot recover: " + cause.to_string());
    log(recovery_error_->message());
    fail_all(*recovery_error_);
    try_finish_stop();
  }

  void fail_all(const Error& e) {
    for (std::size_t i = pending_head_; i < pending_.size(); ++i) core_->fail_command(pending_[i], e);
    for (auto& c : stash_) core_->fail_command(c, e);
    pending_.clear();
    pending_head_ = 0;
    stash_.clear();
  }

  // --- stopping (E5, E6) -------------------------------------------------------

  // Stop and passivate both go through the shard, which first stops
  // forwarding (buffering for the next incarnation), then sends StopRequest.
  void ask_to_stop() {
    if (stop_asked_) return;
    stop_asked_ = true;
    if (shard_.tell(Shard{typename Shard::Passivate{id_, AnyRef(this->self())}}) != Delivery::delivered) stop_now();
  }

  // The shard saw no command for this entity for the idle timeout (E5); the
  // entity itself also saw nothing (replies to its asks, its own timers) and
  // is not busy, so it may go.
  void on_idle() {
    Duration quiet = this->now() - last_activity_;
    bool busy = in_processing_ || persisting_ || !stash_.empty() || pending_size();
    if (quiet >= core_->settings.idle_timeout && !busy) ask_to_stop();
  }

  void on_stop_request(bool shutdown, bool immediate) {
    if (stop_requested_ && (!immediate || immediate_stop_)) return;
    if (immediate) {
      immediate_stop_ = true;
      // The episode is left as stored: its deadline re-arms wherever the
      // entity recovers next (E1).
      (void)this->cancel_timer(kDeadlineKey);
    }
    if (stop_requested_) return try_finish_stop();
    stop_requested_ = true;
    (void)shutdown;
    if (in_processing_ || persisting_) bump(core_->counters.stops_deferred);
    resume();
  }

  void try_finish_stop() {
    if (!stop_requested_ || persisting_) return;
    if (!immediate_stop_) {
      if (in_processing_) return;
      if (phase_ == Phase::recovering) return;  // recovery decides whether this is a processing state
      if (phase_ == Phase::running && pending_size()) return;
    }
    // Whatever is left goes back to the shard, for the next incarnation.
    std::vector<Command> left;
    left.reserve(stash_.size() + pending_size());
    for (auto& c : stash_) left.push_back(std::move(c));
    for (std::size_t i = pending_head_; i < pending_.size(); ++i) left.push_back(std::move(pending_[i]));
    stash_.clear();
    pending_.clear();
    pending_head_ = 0;
    if (!left.empty()) (void)shard_.tell(Shard{typename Shard::Returned{id_, std::move(left)}});
    stop_now();
  }

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
  // waiting commands: pending_[pending_head_..] in arrival order
  std::vector<Command> pending_;
  std::size_t pending_head_ = 0;
  std::vector<Command> stash_;
  std::unique_ptr<Eff> inflight_;
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
};

// Ticks a shard's idle sweep. A periodic timer needs a copyable message,
// which a shard's (carrying commands with reply targets) is not.
template <class B>
class ShardTicker final : public Actor<std::monostate> {
 public:
  ShardTicker(ActorRef<ShardIn<B>> shard, Duration every) : shard_(std::move(shard)), every_(every) {}
  void on_start() { (void)this->start_periodic_timer("tick", every_, std::monostate{}); }
  void receive(std::monostate&) { (void)shard_.tell(ShardIn<B>{typename ShardIn<B>::IdleTick{}}); }

 private:
  ActorRef<ShardIn<B>> shard_;
  Duration every_;
};

// Routes ids to entity actors: starts them on demand, buffers for an id
// while its incarnation stops, restarts it when commands are waiting, and
// finds idle entities (E5). Idle detection lives here, one periodic sweep
// per shard, rather than in a timer per entity: an entity then needs no
// timer state at all unless it is processing.
template <class B>
class EntityShard final : public Actor<ShardIn<B>> {
  using In = ShardIn<B>;
  using Command = CommandOf<B>;
  using EIn = EntityIn<B>;

 public:
  // Weak in the spawn arguments for the same reason as EntityActor's.
  explicit EntityShard(const std::weak_ptr<RegistryCore<B>>& core) : core_(lock_core(core)) {}

  void receive(In& m) {
    std::visit(overloaded{
                   [&](typename In::Deliver& d) { deliver(std::move(d.id), std::move(d.cmd)); },
                   [&](typename In::Passivate& p) { passivate(p.id, p.who); },
                   [&](typename In::Returned& r) { returned(std::move(r.id), std::move(r.cmds)); },
                   [&](typename In::EntityDown& d) { down(d.id, d.who); },
                   [&](typename In::StopAll& s) { stop_all(s.immediate); },
                   [&](typename In::IdleTick&) { sweep(); },
               },
               m.v);
  }

  void on_start() {
    Duration idle = core_->settings.idle_timeout;
    if (idle <= Duration::zero()) return;
    // An entity is passivated within idle_timeout * 1.125 of its last command.
    Duration every = std::max<Duration>(idle / 8, std::chrono::milliseconds(1));
    this->template spawn<ShardTicker<B>>(this->self(), every);
  }

  void on_stop() {
    // Stopped with entities still around (the system shut down without a
    // graceful stop): tell a waiting stop() that this shard is done.
    if (!reported_) {
      reported_ = true;
      core_->shard_stopped();
    }
  }

 private:
  struct Slot {
    ActorRef<EIn> ref;
    TimePoint last_command{};
    bool stopping = false;
    std::vector<Command> buffer;
  };
  using Map = std::unordered_map<std::string, Slot>;

  void deliver(std::string id, Command cmd) {
    if (shutting_down_) {
      core_->fail_command(cmd, Error(ErrorCode::shutting_down, "entity type '" + core_->settings.type_name +
                                                                   "' is stopping; command to '" + id + "' refused"));
      return;
    }
    auto [it, fresh] = slots_.try_emplace(std::move(id));
    if (fresh) {
      it->second.buffer.push_back(std::move(cmd));
      if (start(it)) {
        flush(it->second);
      } else {
        slots_.erase(it);
      }
      return;
    }
    forward(it->second, std::move(cmd));
  }

  void forward(Slot& s, Command&& cmd) {
    if (core_->settings.idle_timeout > Duration::zero()) s.last_command = this->now();
    if (s.stopping || !s.ref) {
      s.buffer.push_back(std::move(cmd));
      return;
    }
    // The incarnation is alive and has not asked to stop; it stops only
    // after our StopRequest (or by failing, when Down restarts it).
    (void)s.ref.tell(EIn{std::move(cmd)});
  }

  // Starts an incarnation for the slot; false (its buffer answered with the
  // error) if it could not be started.
  bool start(typename Map::iterator it) {
    Slot& s = it->second;
    s.stopping = false;
    // The entity runtime answers handler exceptions itself, so supervision
    // (stop) only sees what it cannot: then the incarnation stops, tells us
    // from on_stop, and the next command starts a fresh one.
    try {
      s.ref = this->template spawn<EntityActor<B>>(std::weak_ptr<RegistryCore<B>>(core_), this->self(), it->first);
    } catch (const std::exception& ex) {
      s.ref = {};
      fail_buffer(s, Error(ErrorCode::handler_failed, "entity '" + core_->settings.type_name + "|" + it->first +
                                                          "' cannot start: " + ex.what()));
      return false;
    }
    if (!s.ref) {
      fail_buffer(s, Error(ErrorCode::shutting_down, "the actor system is shutting down"));
      return false;
    }
    return true;
  }

  void passivate(const std::string& id, const AnyRef& who) {
    auto it = slots_.find(id);
    if (it == slots_.end() || it->second.stopping || !(AnyRef(it->second.ref) == who)) return;
    it->second.stopping = true;
    bump(core_->counters.passivations);
    (void)it->second.ref.tell(EIn{typename EIn::StopRequest{shutting_down_}});
  }

  void returned(std::string id, std::vector<Command> cmds) {
    auto [it, fresh] = slots_.try_emplace(std::move(id));
    Slot& s = it->second;
    // They arrived before anything buffered meanwhile: they go first.
    cmds.reserve(cmds.size() + s.buffer.size());
    for (auto& c : s.buffer) cmds.push_back(std::move(c));
    s.buffer = std::move(cmds);
    if (shutting_down_) {
      fail_buffer(s, shutting_down_error(it->first));
      if (fresh) slots_.erase(it);
      finish_if_done();
      return;
    }
    if (fresh) {
      if (start(it)) {
        flush(s);
      } else {
        slots_.erase(it);
      }
    }
  }

  void down(const std::string& id, const AnyRef& who) {
    auto it = slots_.find(id);
    if (it == slots_.end() || !(AnyRef(it->second.ref) == who)) return;
    Slot& s = it->second;
    if (shutting_down_ || s.buffer.empty()) {
      fail_buffer(s, shutting_down_error(id));
      slots_.erase(it);
      finish_if_done();
      return;
    }
    // Commands are waiting: the next incarnation recovers and takes them (E5).
    if (start(it)) {
      flush(s);
    } else {
      slots_.erase(it);
      finish_if_done();
    }
  }

  void flush(Slot& s) {
    auto buf = std::move(s.buffer);
    s.buffer.clear();
    for (auto& c : buf) forward(s, std::move(c));
  }

  // Asks every entity that got no command for the idle timeout whether it
  // is idle too; a busy one declines and is asked again at the next sweep.
  void sweep() {
    TimePoint t = this->now();
    Duration idle = core_->settings.idle_timeout;
    for (auto& [id, s] : slots_) {
      if (!s.stopping && s.ref && t - s.last_command >= idle) (void)s.ref.tell(EIn{typename EIn::Idle{}});
    }
  }

  void stop_all(bool immediate) {
    shutting_down_ = true;
    for (auto& [id, s] : slots_) {
      // An entity already stopping (passivation, or a graceful stop) may be
      // waiting for its episode: an immediate stop still reaches it.
      if (s.stopping && !immediate) continue;
      s.stopping = true;
      (void)s.ref.tell(EIn{typename EIn::StopRequest{true, immediate}});
    }
    finish_if_done();
  }

  void finish_if_done() {
    if (shutting_down_ && slots_.empty() && !reported_) {
      reported_ = true;
      core_->shard_stopped();
    }
  }

  Error shutting_down_error(const std::string& id) const {
    return Error(ErrorCode::shutting_down,
                 "entity '" + core_->settings.type_name + "|" + id + "' stopped with the command undelivered");
  }
  void fail_buffer(Slot& s, const Error& e) {
    for (auto& c : s.buffer) core_->fail_command(c, e);
    s.buffer.clear();
  }

  std::shared_ptr<RegistryCore<B>> core_;
  Map slots_;
  bool shutting_down_ = false;
  bool reported_ = false;
};

}  // namespace detail

// A handle to the entities of one type in one actor system. Copyable and
// cheap (shared state); every member is thread-safe. The registry's actors
// belong to the actor system; the journal is shared with the caller.
template <class B>
class EntityRegistry {
 public:
  using Command = detail::CommandOf<B>;
  using Event = detail::EventOf<B>;
  using State = detail::StateOf<B>;
  using Factory = std::function<B(const std::string& id)>;
  using ShardRef = ActorRef<detail::ShardIn<B>>;
  using ShardMsg = detail::ShardIn<B>;

  // Starts the registry's shards in `system`. `factory` builds the behaviour
  // object of each incarnation (it may hold references to gateways etc.);
  // without one, B is default-constructed. `snapshots` enables snapshots.
  // Errors (invalid_argument): empty or '|'-containing type name, no
  // journal, no event codecs, zero stash capacity, snapshot_every without a
  // state codec, no factory for a B that cannot be default-constructed.
  static Result<EntityRegistry> start(ActorSystem& system, std::shared_ptr<Journal> journal,
                                      EntitySettings settings, EventCodecs<Event> codecs, Factory factory = {},
                                      std::optional<StateCodec<State>> snapshots = std::nullopt) {
    auto bad = [](std::string m) { return Error(ErrorCode::invalid_argument, std::move(m)); };
    if (settings.type_name.empty()) return bad("entity type name is empty");
    if (settings.type_name.find('|') != std::string::npos)
      return bad("entity type name '" + settings.type_name + "' contains '|'");
    if (!journal) return bad("entity type '" + settings.type_name + "': no journal");
    if (codecs.empty()) return bad("entity type '" + settings.type_name + "': no event codecs registered");
    if (settings.stash_capacity == 0) return bad("entity type '" + settings.type_name + "': stash capacity is 0");
    if (settings.snapshot_every && !snapshots)
      return bad("entity type '" + settings.type_name + "': snapshot_every needs a state codec");
    if (!factory && !std::is_default_constructible_v<B>)
      return bad("entity type '" + settings.type_name + "': no factory and the behaviour has no default constructor");
    if (settings.idle_timeout < Duration::zero()) settings.idle_timeout = Duration::zero();
    if (settings.shards == 0) settings.shards = 8 * std::max<std::size_t>(1, system.threads());

    auto core = std::make_shared<detail::RegistryCore<B>>();
    core->system = &system;
    core->journal = std::move(journal);
    core->settings = std::move(settings);
    core->codecs = std::move(codecs);
    core->state_codec = std::move(snapshots);
    core->factory = std::move(factory);
    core->shards.reserve(core->settings.shards);
    for (std::size_t i = 0; i < core->settings.shards; ++i) {
      auto ref = system.spawn<detail::EntityShard<B>>(std::weak_ptr<detail::RegistryCore<B>>(core));
      if (!ref) return Error(ErrorCode::shutting_down, "the actor system is shutting down");
      core->shards.push_back(std::move(ref));
    }
    // Shutdown stops entities gracefully first (E6). The hook holds the core
    // weakly: a registry nobody references any more still stops.
    std::weak_ptr<detail::RegistryCore<B>> weak = core;
    core->hook_id = system.add_shutdown_hook([weak] {
      if (auto c = weak.lock()) {
        c->begin_stop();
        (void)c->wait_stopped(c->graceful_bound());
      }
    });
    return EntityRegistry(std::move(core));
  }

  // Sends `cmd` to entity `id`, starting (recovering) it if needed.
  // Errors: invalid_argument (empty id), shutting_down.
  Result<void> tell(std::string_view id, Command cmd) const {
    if (id.empty()) return Error(ErrorCode::invalid_argument, "empty entity id");
    Delivery d = shard_for(id).tell(ShardMsg{typename ShardMsg::Deliver{std::string(id), std::move(cmd)}});
    if (d == Delivery::delivered) return {};
    return Error(ErrorCode::shutting_down, "entity type '" + core_->settings.type_name + "' no longer takes commands");
  }

  // Asks entity `id`: `make(ReplyTo<R>)` builds the command. From outside
  // actors only (it returns a blocking Future); inside an actor, ask
  // shard_for(id) with envelope(id, command) instead.
  template <class R, class Make>
  Future<R> ask(std::string_view id, Make&& make, Duration timeout) const {
    if (id.empty()) {
      auto* st = new detail::FutureAsk<R>();
      Future<R> f(st);
      st->complete(Error(ErrorCode::invalid_argument, "empty entity id"));
      return f;
    }
    return core_->system->template ask<R>(
        shard_for(id),
        [&](ReplyTo<R> r) {
          return ShardMsg{typename ShardMsg::Deliver{std::string(id), Command(make(std::move(r)))}};
        },
        timeout);
  }

  // The shard actor that routes `id`, and the message that carries a
  // command to `id` through it: for asks and tells from inside actors.
  ShardRef shard_for(std::string_view id) const { return core_->shards[core_->shard_index(id)]; }
  static ShardMsg envelope(std::string id, Command cmd) {
    return ShardMsg{typename ShardMsg::Deliver{std::move(id), std::move(cmd)}};
  }

  // Graceful stop (E6): every entity is asked to stop; non-processing ones
  // stop at once, processing ones when their episode ends (reply or
  // deadline). Later commands are refused with shutting_down. The actor
  // system's shutdown() does this first on its own.
  void begin_stop() const { core_->begin_stop(); }
  // Waits (real time) for every entity to have stopped; true if they did.
  bool wait_stopped(Duration bound) const { return core_->wait_stopped(bound); }
  // Runs `f` once every entity has stopped after begin_stop(): at once if
  // they already have, else on an actor thread (it must not block). For
  // layers that stop registries without blocking a thread (shard hand-off).
  void when_stopped(std::function<void()> f) const { core_->when_stopped(std::move(f)); }
  // Stops every entity at once, processing ones too, without handling what
  // waits for them (those commands are answered shutting_down): for a node
  // that lost its lease and must stop before another node takes over. An
  // append in flight finishes first. The stored episodes re-arm their
  // deadlines wherever the entities recover next (E1). Also upgrades a
  // graceful stop already under way.
  void begin_immediate_stop() const { core_->begin_stop(true); }
  // begin_stop() + wait_stopped(bound); bound zero = settings.stop_timeout
  // (or the longest processing timeout plus one second).
  Result<void> stop(Duration bound = Duration::zero()) const {
    begin_stop();
    Duration b = bound > Duration::zero() ? bound : core_->graceful_bound();
    if (wait_stopped(b)) return {};
    return Error(ErrorCode::timeout, "entity type '" + core_->settings.type_name + "': entities still running after " +
                                         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(b).count()) +
                                         " ms");
  }
  // Gives up the graceful stop at the actor system's shutdown: entities are
  // then stopped wherever they are, as in a crash. For crash tests and
  // emergencies; the journal holds exactly what was acknowledged.
  void abandon() const { core_->system->remove_shutdown_hook(core_->hook_id); }

  EntityStats stats() const { return core_->counters.snapshot(); }
  // Entities in a processing episode now, the longest first (up to `limit`),
  // and one entity's episode if it is in one.
  std::vector<ProcessingEntity> processing(std::size_t limit) const { return core_->processing.longest(limit); }
  std::optional<ProcessingEntity> processing_of(const std::string& id) const { return core_->processing.find(id); }
  std::size_t processing_count() const { return core_->processing.size(); }
  const EntitySettings& settings() const { return core_->settings; }
  Journal& journal() const { return *core_->journal; }

 private:
  explicit EntityRegistry(std::shared_ptr<detail::RegistryCore<B>> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::RegistryCore<B>> core_;
};

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
