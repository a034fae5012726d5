#pragma once
// The shard actors of a registry: each routes its ids to entity actors,
// starts an incarnation on an id's first command, buffers an id's commands
// while its incarnation stops and hands them to the next one (passivation,
// E5), sweeps for idle entities, and stops them all on a graceful or
// immediate stop (E6). Included by entity_actor.hpp (include
// troupe/persist/entity.hpp instead); not part of the public API.

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/persist/detail/entity_actor.hpp"

namespace troupe::detail {

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

}  // namespace troupe::detail
