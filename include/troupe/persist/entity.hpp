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
//     std::vector<std::string> tags(const Event& e) const;  // optional member: tags stored with
//                                                            // each event, for queries (event_query.hpp)
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
// Coroutine handlers. A command may be handled by a coroutine: the command
// handler returns Effect::await(task) for a troupe::Task<Effect> that may
// `co_await ctx.persist(event)` (stored and folded, in one append, like an
// effect's events), `co_await ctx.ask<R>(...)` and `co_await` any Future,
// and returns the Effect that ends it. It resumes in the entity; the
// command it was given stays alive until it ends. Meanwhile the entity keeps
// handling commands (a processing state stashes them or answers reads, as
// ever). A handler suspended in a processing episode belongs to it: if the
// episode ends first (its deadline stored the timeout event, or another
// command's event left it), the handler is destroyed, so what it awaited is
// never acted on (E2), and its command, if unanswered, gets an error. A
// stop destroys a handler that waits outside an episode (a stop waits for
// an episode, E6). One handler runs at a time; another command handled by
// a coroutine meanwhile starts when it ends. doc/coroutines.md.
//
// Replies. A command that expects an answer carries a `ReplyTo<R> reply_to`
// member. The runtime enforces answers at run time: a command handled
// without replying (not answered, not moved into a then_reply step, not
// stashed) is answered at once with ErrorCode::no_reply and a message naming
// the entity and the command, counted in EntityStats::missing_replies and
// logged. Commands the runtime cannot deliver (stash full, recovery failed,
// shutting down, journal failure) are answered with that error through the
// same member; nothing is dropped silently.
//
// This header is the contract. The machinery behind it is in
// troupe/persist/detail/: the registry's shared core and its messages
// (registry_core.hpp), the entity actor and its command path
// (entity_actor.hpp), storing effects (entity_persist.hpp), processing
// episodes (entity_episode.hpp), recovery (entity_recovery.hpp), stopping
// (entity_stop.hpp), the shards that route ids and buffer across
// incarnations (entity_shard.hpp), and the calls into a behaviour class
// (entity_behaviour.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
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
  // Log recovery failures, journal conflicts and missing replies (warn), and
  // processing timeouts, deferred stops and passivations after a terminal
  // state (info), component persist (doc/logging.md).
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
template <class B>
struct RegistryCore;
template <class B>
struct ShardIn;
template <class B>
class EntityActor;
template <class B>
class EntityPersist;
}  // namespace detail

// An entity's window on the runtime, passed to its command handler. Valid
// for the life of the incarnation; use it only from the entity's own
// handlers and the steps and continuations they create.
template <class B>
class EntityContext {
 public:
  using Command = typename B::Command;

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

  // In a coroutine handler (Effect::await) only. `co_await ctx.persist(e)`
  // stores the events in one append and folds them; yields the append's
  // Result<void> (on a failure the entity stops, as for any effect).
  // `co_await ctx.ask<R>(target, make, timeout)` yields the reply. Both
  // resume in this entity.
  detail::EntityPersist<B> persist(typename B::Event e);
  detail::EntityPersist<B> persist(std::vector<typename B::Event> events);
  template <class R, class M, class Make>
  auto ask(const ActorRef<M>& target, Make&& make, Duration timeout);
  // The entity's state now (what a handler's `const State&` also shows).
  const typename B::State& state() const noexcept;

 private:
  friend class detail::EntityActor<B>;
  explicit EntityContext(detail::EntityActor<B>* a) noexcept : actor_(a) {}
  detail::EntityActor<B>* actor_;
};

// A handle to the entities of one type in one actor system. Copyable and
// cheap (shared state); every member is thread-safe. The registry's actors
// belong to the actor system; the journal is shared with the caller.
template <class B>
class EntityRegistry {
 public:
  using Command = typename B::Command;
  using Event = typename B::Event;
  using State = typename B::State;
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
                                      std::optional<StateCodec<State>> snapshots = std::nullopt);

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

}  // namespace troupe

// The machinery: the registry's core, which includes the entity actor and
// the shards in turn.
#include "troupe/persist/detail/registry_core.hpp"  // IWYU pragma: export
