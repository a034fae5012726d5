#pragma once
// What the shards and entities of one EntityRegistry share: its settings,
// journal, codecs and counters, the board of entities in a processing
// episode, the shard actors and the graceful stop (E6); the messages into an
// entity actor and a shard actor; and EntityRegistry::start, which builds it
// all. Included at the end of troupe/persist/entity.hpp (include that
// instead); not part of the public API.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/log.hpp"
#include "troupe/persist/entity.hpp"
#include "troupe/persist/detail/entity_behaviour.hpp"
#include "troupe/persist/detail/entity_outbox.hpp"

namespace troupe {
namespace detail {

// The counters behind EntityStats: bumped (relaxed) by the registry's
// actors, read by anyone. Thread-safe.
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

// The graceful stop of one registry (E6): whether a stop was asked for and
// of which kind, how many of the registry's shards have stopped, and what
// waits for all of them. Each call names the registry's shard count. All
// members are thread-safe (src/persist/entity.cpp).
class RegistryStop {
 public:
  // Records a stop request. Empty if it changes nothing (a stop is under
  // way and this one is not an upgrade to immediate); else whether it is
  // the first request.
  std::optional<bool> begin(bool immediate);
  // One more shard has stopped; the last one runs what waits for them all.
  void shard_stopped(std::size_t shards);
  // Waits (real time) until every shard has stopped; true if they did.
  bool wait_stopped(std::chrono::steady_clock::duration bound, std::size_t shards);
  // Runs `f` once every shard has stopped: at once (on this thread) if they
  // already have, else on the thread of the last shard to stop.
  void when_stopped(std::function<void()> f, std::size_t shards);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t stopped_ = 0;
  bool begun_ = false;
  bool immediate_ = false;
  std::vector<std::function<void()>> callbacks_;
};

// src/persist/entity.cpp
// How long a graceful stop waits: settings.stop_timeout, or else the longest
// processing timeout declared so far plus one second.
Duration graceful_stop_bound(const EntitySettings& settings, const EntityCounters& counters) noexcept;
void entity_log(const std::string& type_name, std::string_view id, std::string_view what);
// A line of the seed-000 kind (processing timed out, stop deferred,
// passivated), at info, component persist, under the current trace.
void entity_note(const std::string& type_name, std::string_view id, std::string_view what,
                 std::int64_t ms_field = -1);
// The trace an event was stored under (EventRecord::trace_id), to run what
// it starts under again after a recovery; empty for none or unreadable.
TraceRef stored_trace(const std::string& trace_id);
std::int64_t wall_ms(WallTime t) noexcept;
// Checks EntityRegistry::start's arguments (see there) and fills in the
// settings' defaults; `threads` is the actor system's worker count.
Result<void> check_registry_settings(EntitySettings& settings, bool has_journal, bool has_codecs,
                                     bool has_state_codec, bool can_build_behaviour, std::size_t threads);

inline void bump(std::atomic<std::uint64_t>& c, std::uint64_t n = 1) noexcept {
  c.fetch_add(n, std::memory_order_relaxed);
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

  RegistryStop stopping;
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
    return stopping.wait_stopped(bound, shards.size());
  }
  void shard_stopped() { stopping.shard_stopped(shards.size()); }
  void when_stopped(std::function<void()> f) { stopping.when_stopped(std::move(f), shards.size()); }
  Duration graceful_bound() const noexcept { return graceful_stop_bound(settings, counters); }
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
  std::optional<bool> first = stopping.begin(immediate);
  if (!first) return;
  for (auto& s : shards) {
    // A shard already gone (system shutting down) has no entities left.
    if (s.tell(ShardIn<B>{typename ShardIn<B>::StopAll{immediate}}) != Delivery::delivered && *first) shard_stopped();
  }
}

}  // namespace detail

template <class B>
Result<EntityRegistry<B>> EntityRegistry<B>::start(ActorSystem& system, std::shared_ptr<Journal> journal,
                                                   EntitySettings settings, EventCodecs<Event> codecs,
                                                   Factory factory,
                                                   std::optional<StateCodec<State>> snapshots) {
  bool can_build = static_cast<bool>(factory) || std::is_default_constructible_v<B>;
  if (auto ok = detail::check_registry_settings(settings, journal != nullptr, !codecs.empty(),
                                                snapshots.has_value(), can_build, system.threads());
      !ok.ok()) {
    return std::move(ok).error();
  }
  if constexpr (detail::HasSideEffects<B>) {
    if (!journal->stores_outbox())
      return Error(ErrorCode::invalid_argument, "entity type '" + settings.type_name + "' has side effects, and the " +
                                                    std::string(journal->name()) + " journal keeps no outbox");
  }
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

}  // namespace troupe

// The entity actor, and through it the shard actor.
#include "troupe/persist/detail/entity_actor.hpp"  // IWYU pragma: export
