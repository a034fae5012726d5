#pragma once
// The agent behind troupe/cluster/singleton.hpp: one actor per singleton
// name on a node. It is the node's proxy (a bounded buffer while the
// instance moves, routing to the instance's node otherwise) and, on a node
// that may host the singleton, its keeper (starts the instance when the
// coordinator places the unit here, stops it when the unit leaves). Agents
// talk to each other over remoting under "singleton-ctl/<name>": Query
// (where does it run?), Here (it runs on this node under this epoch),
// Leaving (it stops here). Included by singleton.hpp; not for direct use.
//
// Ownership: the agent lives in the actor system; the instance is an actor
// of the system the agent watches. Shared is held by the handles and the
// agent. Thread safety: Shared's counters are atomics, its owner is under a
// mutex; everything else is touched only inside the agent.

#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/cluster/cluster.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/singleton_settings.hpp"
#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/future.hpp"

namespace troupe::cluster::detail::singleton {

// What the handles and the agent share.
struct Shared {
  Shared(SingletonSettings s, std::string n, ActorSystem& sys)
      : settings(std::move(s)), node(std::move(n)), system(&sys) {}
  const SingletonSettings settings;
  const std::string node;
  ActorSystem* const system;
  std::atomic<std::size_t> queued{0};
  std::atomic<std::uint64_t> delivered{0}, refused{0}, lost{0}, moves{0};
  std::atomic<std::uint64_t> running_epoch{0};
  std::atomic<bool> published{false};  // the agent's control name is its own
  // Set once the agent has stopped (it no longer touches the cluster).
  std::promise<void> stopped;
  std::shared_future<void> stopped_future = stopped.get_future().share();
  mutable std::mutex mu;
  AnyRef stopping_instance;  // under mu: the instance the agent stopped last
  std::string owner;  // under mu
  std::uint64_t owner_epoch = 0;

  SingletonStats stats() const {
    SingletonStats s;
    s.waiting = queued.load(std::memory_order_acquire);
    s.delivered = delivered.load(std::memory_order_relaxed);
    s.refused = refused.load(std::memory_order_relaxed);
    s.lost = lost.load(std::memory_order_relaxed);
    s.moves = moves.load(std::memory_order_relaxed);
    std::lock_guard lock(mu);
    s.owner = owner;
    s.epoch = owner_epoch;
    return s;
  }
};

// Between agents (over remoting).
struct Query {
  std::string from;
};
struct Here {
  std::string node;
  std::uint64_t epoch = 0;
};
struct Leaving {
  std::string node;
  std::uint64_t epoch = 0;
};
// From the handles and the coordinator.
// A tell (msg), or an ask: `ask` sends the request itself, to the
// instance's node (remote) or to the instance here (local), and carries
// the answer back to the asker.
// Shared pointers keep the agent's messages copyable (its timers copy
// them) whatever M is.
template <class M>
struct Send {
  std::shared_ptr<M> msg;
  std::shared_ptr<std::function<void(const RemoteRef<M>* remote, const ActorRef<M>* local)>> ask;
};
struct Start {
  std::uint64_t epoch = 0;
};
struct Stop {
  std::shared_ptr<Promise<void>> done;  // shared: a message stays copyable
};
struct InstanceDown {
  std::uint64_t epoch = 0;
  ExitReason reason = ExitReason::normal;
};
struct Relaunch {
  std::uint64_t epoch = 0;
};
struct Tick {};
template <class M>
using AgentMsg = std::variant<Query, Here, Leaving, Send<M>, Start, Stop, InstanceDown, Relaunch, Tick>;

template <class M>
using MakeInstance = std::function<ActorRef<M>(SingletonStart)>;

// The codecs of Query, Here and Leaving (singleton.cpp).
void encode(const Query& q, ByteWriter& w);
void encode(const Here& h, ByteWriter& w);
void encode(const Leaving& l, ByteWriter& w);
Result<Query> decode_query(ByteReader& r);
Result<Here> decode_here(ByteReader& r);
Result<Leaving> decode_leaving(ByteReader& r);
std::string ctl_name(const std::string& name);
std::string instance_name(const std::string& name);
// The live members other than this node, as the coordinator sees them.
std::vector<std::string> other_members(Cluster& cluster);
bool is_member(Cluster& cluster, const std::string& node);
// Declares the group's roles, serves it through `r` and keeps its one unit
// in the desired set (singleton.cpp).
Result<void> serve(Cluster& cluster, const Shared& shared, Reconciler r);
void log_line(bool warning, const std::string& text);

// How long an instance that stopped on its own waits before it runs again.
inline constexpr Duration kRelaunchDelay = std::chrono::milliseconds(500);

template <class M>
MessageCodecs<AgentMsg<M>> ctl_codecs() {
  MessageCodecs<AgentMsg<M>> c;
  (void)c.template add<Query>("troupe.singleton.Query", [](const Query& q, ByteWriter& w) { encode(q, w); },
                              decode_query);
  (void)c.template add<Here>("troupe.singleton.Here", [](const Here& h, ByteWriter& w) { encode(h, w); },
                             decode_here);
  (void)c.template add<Leaving>("troupe.singleton.Leaving",
                                [](const Leaving& l, ByteWriter& w) { encode(l, w); }, decode_leaving);
  return c;
}

template <class M>
class Agent final : public Actor<AgentMsg<M>> {
 public:
  using Msg = AgentMsg<M>;

  Agent(std::shared_ptr<Shared> shared, Cluster* cluster, std::shared_ptr<const MessageCodecs<M>> codecs,
        std::shared_ptr<const MessageCodecs<Msg>> ctl, MakeInstance<M> make)
      : sh_(std::move(shared)),
        cluster_(cluster),
        codecs_(std::move(codecs)),
        ctl_(std::move(ctl)),
        make_(std::move(make)) {}

  void on_start() {
    (void)this->start_periodic_timer("tick", sh_->settings.resolve_interval, Msg(Tick{}));
  }

  void receive(Msg& m) {
    std::visit([this](auto& x) { handle(x); }, m);
  }

  void on_stop() {
    if (instance_) {
      {
        std::lock_guard lock(sh_->mu);
        sh_->stopping_instance = instance_;
      }
      instance_.stop();
      (void)cluster_->remoting().unpublish(instance_name(sh_->settings.name));
    }
    for (auto& w : waiters_) w->set_value();
    waiters_.clear();
    // What it held goes nowhere now: counted, not kept waiting.
    sh_->lost.fetch_add(buffer_.size(), std::memory_order_relaxed);
    sh_->queued.fetch_sub(buffer_.size(), std::memory_order_acq_rel);
    buffer_.clear();
    sh_->running_epoch.store(0, std::memory_order_release);
    if (sh_->published.load(std::memory_order_acquire))
      (void)cluster_->remoting().unpublish(ctl_name(sh_->settings.name));
    sh_->stopped.set_value();
  }

 private:
  // --- the proxy ---
  void handle(Send<M>& s) {
    if (owner_.empty()) {
      buffer_.push_back(std::move(s));
      return;
    }
    if (!deliver(s)) buffer_.push_back(std::move(s));
  }

  // Sends one message to the instance; false (and the owner forgotten) when
  // its node cannot be reached: the message is then still the caller's. An
  // ask is handed to its node however that goes: its asker hears the error.
  bool deliver(Send<M>& s) {
    if (owner_ == sh_->node) {
      if (s.ask) {
        (*s.ask)(nullptr, &instance_);
        sh_->delivered.fetch_add(1, std::memory_order_relaxed);
      } else if (!instance_ || instance_.tell(std::move(*s.msg)) != Delivery::delivered) {
        sh_->lost.fetch_add(1, std::memory_order_relaxed);
      } else {
        sh_->delivered.fetch_add(1, std::memory_order_relaxed);
      }
      sh_->queued.fetch_sub(1, std::memory_order_acq_rel);
      return true;
    }
    if (!remote_ || remote_.node() != owner_)
      remote_ = cluster_->remoting().template remote<M>(owner_, instance_name(sh_->settings.name), codecs_);
    if (s.ask) {
      (*s.ask)(&remote_, nullptr);
    } else if constexpr (std::is_copy_constructible_v<M>) {
      if (!remote_.tell(*s.msg).ok()) {
        forget_owner();
        return false;
      }
    } else if (!remote_.tell(std::move(*s.msg)).ok()) {  // a message that cannot be copied is not held again
      forget_owner();
      sh_->lost.fetch_add(1, std::memory_order_relaxed);
      sh_->queued.fetch_sub(1, std::memory_order_acq_rel);
      return true;
    }
    sh_->delivered.fetch_add(1, std::memory_order_relaxed);
    sh_->queued.fetch_sub(1, std::memory_order_acq_rel);
    return true;
  }

  void flush() {
    while (!owner_.empty() && !buffer_.empty()) {
      if (!deliver(buffer_.front())) return;
      buffer_.pop_front();
    }
  }

  void set_owner(const std::string& node, std::uint64_t epoch) {
    if (owner_ == node && owner_epoch_ == epoch) return;
    owner_ = node;
    owner_epoch_ = epoch;
    sh_->moves.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard lock(sh_->mu);
      sh_->owner = node;
      sh_->owner_epoch = epoch;
    }
    flush();
  }

  void forget_owner() {
    owner_.clear();
    std::lock_guard lock(sh_->mu);
    sh_->owner.clear();
  }

  // One node's Here and Leaving come in the order it sent them (one
  // connection per node pair), so a Here after a Leaving of the same epoch
  // is news: the node runs it again under that epoch (it was fenced for a
  // moment and kept the unit). Across nodes the epoch orders them: a Here
  // below the one known is stale.
  void handle(Here& h) {
    if (h.epoch < owner_epoch_) return;
    set_owner(h.node, h.epoch);
  }

  void handle(Leaving& l) {
    if (owner_ == l.node && owner_epoch_ <= l.epoch) forget_owner();
  }

  void handle(Query& q) {
    if (instance_ && !stopping_) tell_ctl(q.from, Msg(Here{sh_->node, epoch_}));
  }

  void handle(Tick&) {
    if (!owner_.empty() && owner_ != sh_->node && !is_member(*cluster_, owner_)) forget_owner();
    if (!owner_.empty()) return;
    for (const auto& node : other_members(*cluster_)) tell_ctl(node, Msg(Query{sh_->node}));
  }

  void tell_ctl(const std::string& node, Msg m) {
    if (node == sh_->node) {
      (void)this->self().tell(std::move(m));
      return;
    }
    auto it = peers_.find(node);
    if (it == peers_.end())
      it = peers_.emplace(node, cluster_->remoting().template remote<Msg>(node, ctl_name(sh_->settings.name), ctl_))
               .first;
    (void)it->second.tell(std::move(m));
  }

  void broadcast(const Msg& m) {
    for (const auto& node : other_members(*cluster_)) tell_ctl(node, m);
    Msg local = m;
    receive(local);
  }

  // --- the keeper ---
  void handle(Start& s) {
    if (instance_) {  // not expected: the coordinator stops before it starts again
      log_line(true, "singleton '" + sh_->settings.name + "': started again under epoch " +
                         std::to_string(s.epoch) + " while running under " + std::to_string(epoch_));
      return;
    }
    epoch_ = s.epoch;
    stopping_ = false;
    launch();
  }

  void launch() {
    if (!make_) return;
    instance_ = make_(SingletonStart{sh_->settings.name, sh_->node, epoch_});
    if (!instance_) return;  // the system is shutting down
    this->watch(instance_,
                [e = epoch_](const Down& d) { return Msg(InstanceDown{e, d.reason}); });
    (void)cluster_->remoting().publish(instance_name(sh_->settings.name), instance_, *codecs_);
    sh_->running_epoch.store(epoch_, std::memory_order_release);
    broadcast(Msg(Here{sh_->node, epoch_}));
  }

  void handle(Stop& s) {
    stopping_ = true;
    this->cancel_timer("relaunch");
    if (!instance_) {
      s.done->set_value();
      return;
    }
    waiters_.push_back(std::move(s.done));
    if (waiters_.size() > 1) return;
    // Proxies hold messages from now on; the instance handles what it has.
    (void)cluster_->remoting().unpublish(instance_name(sh_->settings.name));
    broadcast(Msg(Leaving{sh_->node, epoch_}));
    instance_.stop();
  }

  void handle(InstanceDown& d) {
    if (d.epoch != epoch_ || !instance_) return;
    instance_ = {};
    sh_->running_epoch.store(0, std::memory_order_release);
    if (stopping_) {
      for (auto& w : waiters_) w->set_value();
      waiters_.clear();
      return;
    }
    // It runs here again soon under the same epoch: the proxies keep it as
    // the owner (what they send meanwhile is a dead letter here).
    (void)cluster_->remoting().unpublish(instance_name(sh_->settings.name));
    log_line(true, "singleton '" + sh_->settings.name + "': its instance stopped on its own (" +
                       std::string(to_string(d.reason)) + "); it starts again in " +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kRelaunchDelay).count()) +
                       " ms");
    this->start_timer("relaunch", kRelaunchDelay, Msg(Relaunch{epoch_}));
  }

  void handle(Relaunch& r) {
    if (stopping_ || instance_ || r.epoch != epoch_) return;
    launch();
  }

  std::shared_ptr<Shared> sh_;
  Cluster* cluster_;
  std::shared_ptr<const MessageCodecs<M>> codecs_;
  std::shared_ptr<const MessageCodecs<Msg>> ctl_;
  MakeInstance<M> make_;

  // proxy
  std::string owner_;
  std::uint64_t owner_epoch_ = 0;
  std::deque<Send<M>> buffer_;
  RemoteRef<M> remote_;
  std::map<std::string, RemoteRef<Msg>> peers_;
  // keeper
  ActorRef<M> instance_;
  std::uint64_t epoch_ = 0;
  bool stopping_ = false;
  std::vector<std::shared_ptr<Promise<void>>> waiters_;
};

// Stops an agent and waits (up to 5 s) until it no longer uses the cluster.
// Stops an agent and waits (up to 5 s in all) until it no longer uses the
// cluster and the instance it ran has stopped.
template <class M>
void stop_agent(const ActorRef<AgentMsg<M>>& agent, Shared& shared) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  agent.stop();
  if (shared.stopped_future.wait_until(until) != std::future_status::ready) return;
  AnyRef instance;
  {
    std::lock_guard lock(shared.mu);
    instance = shared.stopping_instance;
  }
  while (instance && !instance.terminated() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

template <class M>
Result<ActorRef<AgentMsg<M>>> spawn_agent(ActorSystem& system, Cluster& cluster, std::shared_ptr<Shared> shared,
                                          std::shared_ptr<const MessageCodecs<M>> codecs, MakeInstance<M> make) {
  auto ctl = std::make_shared<const MessageCodecs<AgentMsg<M>>>(ctl_codecs<M>());
  std::string name = shared->settings.name;
  auto sh = shared;
  auto ref = system.spawn<Agent<M>>(SpawnOptions{.name = "singleton-agent/" + name, .supervision = Supervision::resume()},
                                    std::move(shared), &cluster, std::move(codecs), ctl, std::move(make));
  if (!ref) return Error(ErrorCode::shutting_down, "singleton '" + name + "': the actor system is shutting down");
  if (auto p = cluster.remoting().publish(ctl_name(name), ref, *ctl); !p.ok()) {
    ref.stop();
    return Error(ErrorCode::invalid_argument, "singleton '" + name + "' is in use on this node: " + p.error().message());
  }
  sh->published.store(true, std::memory_order_release);
  // The cluster may go first (a node's shutdown destroys it before the
  // actor system): the agent stops before it.
  cluster.at_destroy([ref, sh] { stop_agent<M>(ref, *sh); });
  return ref;
}

template <class M>
Reconciler reconciler_for(ActorRef<AgentMsg<M>> agent) {
  Reconciler r;
  r.start = [agent](const std::string&, const std::string&, std::uint64_t epoch) {
    (void)agent.tell(Start{epoch});
  };
  r.update = [](const std::string&, const std::string&, std::uint64_t) {};
  r.stop = [agent](const std::string&) {
    auto p = std::make_shared<Promise<void>>();
    auto f = p->future();
    // An agent that is gone took its instance's watch with it; its system is
    // stopping, and the instance with it.
    if (agent.tell(Stop{p}) != Delivery::delivered) p->set_value();
    return f;
  };
  return r;
}

}  // namespace troupe::cluster::detail::singleton
