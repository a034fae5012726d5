#pragma once
// The cluster singleton (SPEC R3): one actor that runs exactly once in the
// cluster, on one member with an eligible role, moved when that member dies
// or leaves, and a proxy on any node that routes messages to it wherever it
// runs.
//
//   struct Settler : troupe::Actor<SettleMsg> {
//     Settler(troupe::cluster::SingletonStart s, std::shared_ptr<troupe::Journal> journal)
//         : journal_(troupe::FencedJournal::open(journal, {"settler", s.epoch})) {}   // fenced by its epoch
//     void receive(SettleMsg& m);
//   };
//   auto s = troupe::cluster::start_singleton<Settler>(system, *cluster, {.name = "settler", .roles = {"batch"}},
//                                                       settle_codecs(), journal).value();
//   (void)s.proxy().tell(RunSettlement{day});   // from any node, wherever it runs now
//   auto st = s.proxy().ask<Status>([](troupe::ReplyTo<Status> r) { return GetStatus{std::move(r)}; }, 2s);
//
// Placement. The singleton is the one unit of the placement group
// "singleton/<name>" (Coordinator): every node that calls start_singleton
// serves the group and keeps the unit in the desired set, so it is placed
// on one live member holding one of `roles` (any member when empty) and
// taken over from a dead member past liveness_threshold + takeover_margin.
// It never runs twice: a new owner starts it only after the old owner
// stopped and released it, or once the old owner is past threshold +
// margin, by which time a cut-off owner has fenced itself and stopped it
// (the coordinator's hand-off and self-fencing rules). Each start carries
// the unit's placement epoch, a fencing token that grows with every move:
// an instance that writes through a FencedJournal (or raises a fence in
// any store) under it locks out every earlier instance's writes.
//
// Stopping. Cluster::leave (or Coordinator::hand_off) moves the singleton:
// the proxies are told it is leaving, the instance is stopped like
// ActorRef::stop (after the messages already in its mailbox), and once it
// has stopped the new owner starts it. A fenced node stops it at once.
//
// The proxy. Each node has one per singleton name. It learns where the
// instance runs from the instance's node (told when it starts, asked while
// unknown) and sends messages there over the cluster transport: in order
// from one proxy. While the instance moves (its node said it is leaving, or
// its node left the live members) the proxy holds messages in a bounded
// buffer and flushes them, in order, to the new instance. A message told
// while `buffer` messages wait already is refused at once with
// buffer_overflow and counted (stats().refused); never dropped silently.
// Delivery is at most once, like any tell: a message already sent to a node
// that crashes before the proxy notices, or that reaches the old node just
// after it stopped the instance, is a dead letter there. Use an ask (held
// like a tell, within its timeout) and an idempotent handler when the
// caller must know.
//
// Ownership: start_singleton and singleton_proxy return handles; the actors
// live in the actor system and the cluster's coordinator serves the group
// until the cluster leaves or is destroyed. The actors use the cluster, so
// destroying the cluster stops them first (Cluster::at_destroy). Thread safety: every member of the
// handles is thread-safe.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/cluster/cluster.hpp"
#include "troupe/cluster/detail/singleton_agent.hpp"
#include "troupe/cluster/singleton_settings.hpp"
#include "troupe/cluster/messages.hpp"
#include "troupe/core/actor_system.hpp"

namespace troupe::cluster {

// The placement group of singleton `name`.
inline std::string singleton_group(std::string_view name) { return "singleton/" + std::string(name); }

// Checks the settings: invalid_argument naming the first bad one.
Result<void> validate(const SingletonSettings& s);

template <class M>
class SingletonProxy;
template <class M>
class ClusterSingleton;

namespace detail::singleton {
// Makes the handles (their constructors are private).
struct Access {
  template <class M>
  static SingletonProxy<M> proxy(std::shared_ptr<Shared> s, ActorRef<AgentMsg<M>> a) {
    return SingletonProxy<M>(std::move(s), std::move(a));
  }
  template <class M>
  static ClusterSingleton<M> singleton(SingletonProxy<M> p) {
    return ClusterSingleton<M>(std::move(p));
  }
};
}  // namespace detail::singleton

// A proxy to one singleton: a cheap, copyable handle. Thread-safe.
template <class M>
class SingletonProxy {
 public:
  SingletonProxy() = default;

  // Sends `m` to the instance, now or, while it moves, once it runs again.
  // Errors: buffer_overflow (`buffer` messages wait already; counted in
  // stats().refused), shutting_down (the proxy or its system stopped).
  Result<void> tell(M m) const {
    detail::singleton::Send<M> s;
    s.msg = std::make_shared<M>(std::move(m));
    return admit(std::move(s));
  }

  // Request/response with the instance, wherever it runs: `make(ReplyTo<R>)`
  // builds the request (its codec registered with its reply's). Held like a
  // tell while the instance moves. The future completes with the answer, or
  // with timeout (`timeout` after this call, however long it was held),
  // buffer_overflow, unreachable (the instance's node was lost while the
  // request was out: it may or may not have been handled), shutting_down.
  template <class R, class Make>
  Future<R> ask(Make make, Duration timeout) const {
    ActorSystem& sys = *shared_->system;
    auto [outer, target] = sys.template ask_with<R>([](ReplyTo<R> rt) { return rt; }, timeout);
    auto answer = std::make_shared<ReplyTo<R>>(std::move(target));
    detail::singleton::Send<M> s;
    using AskFn = std::function<void(const RemoteRef<M>*, const ActorRef<M>*)>;
    s.ask = std::make_shared<AskFn>([make = std::move(make), timeout, answer, &sys](const RemoteRef<M>* remote,
                                                                                   const ActorRef<M>* local) {
      auto pass_on = [answer](Result<R> r) {
        if (!r.ok())
          answer->fail(std::move(r).error());
        else if constexpr (std::is_void_v<R>)
          answer->reply();
        else
          answer->reply(std::move(r.value()));
      };
      if (remote) {
        remote->template ask<R>(make, timeout).then(std::move(pass_on));
        return;
      }
      auto [inner, request] = sys.template ask_with<R>(make, timeout);
      // Refused: the request's target is dropped unanswered, which
      // completes `inner` with no_reply.
      if (*local) (void)local->tell(M(std::move(request)));
      std::move(inner).then(std::move(pass_on));
    });
    if (auto r = admit(std::move(s)); !r.ok()) answer->fail(std::move(r).error());
    return std::move(outer);
  }

  SingletonStats stats() const { return shared_->stats(); }
  const std::string& name() const { return shared_->settings.name; }

  // Stops this node's side of the singleton: the proxy (what it holds is
  // dropped) and, if it runs here, the instance, without a hand-off (the
  // unit stays placed here until this node leaves or dies). For shutting
  // down; destroying the cluster does it too. Waits up to 5 s for the
  // stop. Idempotent.
  void stop() const { detail::singleton::stop_agent<M>(agent_, *shared_); }
  explicit operator bool() const noexcept { return shared_ != nullptr; }

 private:
  template <class>
  friend class ClusterSingleton;
  friend struct detail::singleton::Access;
  Result<void> admit(detail::singleton::Send<M> s) const {
    auto& sh = *shared_;
    if (sh.queued.fetch_add(1, std::memory_order_acq_rel) >= sh.settings.buffer) {
      sh.queued.fetch_sub(1, std::memory_order_acq_rel);
      std::uint64_t n = sh.refused.fetch_add(1, std::memory_order_relaxed) + 1;
      return Error(ErrorCode::buffer_overflow, "singleton '" + sh.settings.name + "': " +
                                                   std::to_string(sh.settings.buffer) +
                                                   " messages wait for its instance already (refused so far: " +
                                                   std::to_string(n) + ")");
    }
    if (agent_.tell(std::move(s)) != Delivery::delivered) {
      sh.queued.fetch_sub(1, std::memory_order_acq_rel);
      return Error(ErrorCode::shutting_down, "singleton '" + sh.settings.name + "': its proxy has stopped");
    }
    return {};
  }
  SingletonProxy(std::shared_ptr<detail::singleton::Shared> s, ActorRef<detail::singleton::AgentMsg<M>> a)
      : shared_(std::move(s)), agent_(std::move(a)) {}
  std::shared_ptr<detail::singleton::Shared> shared_;
  ActorRef<detail::singleton::AgentMsg<M>> agent_;
};

// This node's side of a singleton it can host: its proxy, and whether the
// instance runs here. Copyable handle; thread-safe.
template <class M>
class ClusterSingleton {
 public:
  ClusterSingleton() = default;
  const SingletonProxy<M>& proxy() const noexcept { return proxy_; }
  // The epoch the instance runs under on this node; 0 when it runs elsewhere.
  std::uint64_t running_here() const noexcept {
    return proxy_.shared_->running_epoch.load(std::memory_order_acquire);
  }
  SingletonStats stats() const { return proxy_.stats(); }
  // SingletonProxy::stop.
  void stop() const { proxy_.stop(); }

 private:
  friend struct detail::singleton::Access;
  explicit ClusterSingleton(SingletonProxy<M> p) : proxy_(std::move(p)) {}
  SingletonProxy<M> proxy_;
};

// A proxy on a node that does not host the singleton (or before it does).
// settings.roles is not used. Errors: invalid_argument (settings, or a
// proxy for `name` already on this node).
template <class M>
Result<SingletonProxy<M>> singleton_proxy(ActorSystem& system, Cluster& cluster, SingletonSettings settings,
                                          MessageCodecs<M> codecs) {
  if (auto v = validate(settings); !v.ok()) return std::move(v).error();
  auto shared = std::make_shared<detail::singleton::Shared>(std::move(settings), cluster.node_id(), system);
  auto agent = detail::singleton::spawn_agent<M>(system, cluster, shared,
                                                 std::make_shared<const MessageCodecs<M>>(std::move(codecs)), {});
  if (!agent.ok()) return std::move(agent).error();
  return detail::singleton::Access::proxy<M>(std::move(shared), std::move(agent.value()));
}

// Starts singleton `settings.name` on this node's side: A runs here when
// the placement puts it here, constructed as A(SingletonStart, args...);
// every node that may host it calls this with the same name and roles.
// `codecs` carry A's messages from the proxies. Blocks until the group's
// roles are stored in Redis (never call it inside an actor's handler).
// Errors: invalid_argument
// (settings; the name in use on this node; other roles declared for the
// group by a live member), or what the coordinator met (coordination_failed).
template <class A, class... Args>
Result<ClusterSingleton<typename A::message_type>> start_singleton(ActorSystem& system, Cluster& cluster,
                                                                   SingletonSettings settings,
                                                                   MessageCodecs<typename A::message_type> codecs,
                                                                   Args... args) {
  using M = typename A::message_type;
  static_assert(std::constructible_from<A, SingletonStart, Args&...>,
                "a singleton actor is constructed as A(SingletonStart, args...)");
  if (auto v = validate(settings); !v.ok()) return std::move(v).error();
  auto shared = std::make_shared<detail::singleton::Shared>(std::move(settings), cluster.node_id(), system);
  detail::singleton::MakeInstance<M> make = [&system, args = std::make_tuple(std::move(args)...)](
                                                SingletonStart start) {
    std::string name = "singleton/" + start.name + "/" + std::to_string(start.epoch);
    return std::apply(
        [&](auto&... a) {
          return system.spawn<A>(SpawnOptions{.name = std::move(name)}, std::move(start), a...);
        },
        args);
  };
  auto agent = detail::singleton::spawn_agent<M>(system, cluster, shared,
                                                 std::make_shared<const MessageCodecs<M>>(std::move(codecs)),
                                                 std::move(make));
  if (!agent.ok()) return std::move(agent).error();
  auto served = detail::singleton::serve(cluster, *shared, detail::singleton::reconciler_for(agent.value()));
  if (!served.ok()) {
    agent.value().stop();
    return std::move(served).error();
  }
  return detail::singleton::Access::singleton<M>(
      detail::singleton::Access::proxy<M>(std::move(shared), std::move(agent.value())));
}

}  // namespace troupe::cluster
