#pragma once
// The worker host behind troupe/node/workers.hpp: one actor per worker
// group on a node, which spawns one child actor per unit the node runs,
// forwards spec changes, and carries out graceful stops (WorkerStop, then a
// bounded wait, then a forced stop). Included by workers.hpp; not for
// direct use.
//
// Ownership: the host actor lives in the node's actor system; its workers
// are its children and stop with it. WorkerHostOf owns only a reference.
// Thread safety: WorkerHostOf's members tell the host messages, so they may
// be called from any thread (the coordinator's, in practice). The host's
// state is touched only inside the host actor.

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/future.hpp"
#include "troupe/node/workers.hpp"  // the contract; it includes this file at its end

namespace troupe::node::detail {

struct HostStart {
  std::string unit;
  std::string spec;
  std::uint64_t epoch = 0;
};
struct HostUpdate {
  std::string unit;
  std::string spec;
  std::uint64_t epoch = 0;
};
struct HostStop {
  std::string unit;
  bool immediate = false;
  std::shared_ptr<Promise<void>> done;  // shared: a message stays copyable
};
// A worker terminated; `incarnation` tells which launch of the unit it was.
struct HostDown {
  std::string unit;
  std::uint64_t incarnation = 0;
  ExitReason reason = ExitReason::normal;
  std::string detail;
};
// The stop of `incarnation` is past its deadline.
struct HostDeadline {
  std::string unit;
  std::uint64_t incarnation = 0;
};
// Launch a worker that stopped on its own again.
struct HostRestart {
  std::string unit;
  std::uint64_t incarnation = 0;
};
// The node lost its lease: workers being stopped stop now.
struct HostFenced {};
using HostMsg = std::variant<HostStart, HostUpdate, HostStop, HostDown, HostDeadline, HostRestart, HostFenced>;

// How long a worker that stopped on its own (or threw) waits before it is
// launched again with its unit's latest spec.
inline constexpr Duration kWorkerRestartDelay = std::chrono::seconds(1);

template <class A, class Spec, class... Args>
class WorkerHost final : public Actor<HostMsg> {
 public:
  using WorkerMsg = typename A::message_type;

  WorkerHost(WorkerHostSettings s, SpecDecoder<Spec> decode, std::tuple<Args...> args)
      : s_(std::move(s)), decode_(std::move(decode)), args_(std::move(args)) {}

  void receive(HostMsg& m) {
    std::visit([this](auto& msg) { handle(msg); }, m);
  }

  void on_stop() {
    // The actor system is shutting down: the workers stop with this actor.
    for (auto& [unit, u] : units_)
      for (auto& w : u.waiters) w->set_value();
    units_.clear();
  }

 private:
  struct Unit {
    ActorRef<WorkerMsg> ref;  // empty: not running (a spec that does not decode, or waiting to restart)
    std::string spec;
    std::uint64_t epoch = 0;
    std::uint64_t incarnation = 0;
    bool stopping = false;
    std::vector<std::shared_ptr<Promise<void>>> waiters;
  };

  std::string where(const std::string& unit) const {
    return "worker group '" + s_.group + "' unit '" + unit + "'";
  }
  void log(bool error, const std::string& text) const {
    if (s_.log) s_.log(error, text);
  }

  void handle(HostStart& m) {
    auto it = units_.find(m.unit);
    if (it != units_.end() && it->second.ref) it->second.ref.stop();  // a stale incarnation (not expected)
    Unit& u = units_[m.unit];
    u = Unit{};
    u.spec = std::move(m.spec);
    u.epoch = m.epoch;
    launch(m.unit, u);
  }

  void handle(HostUpdate& m) {
    auto it = units_.find(m.unit);
    if (it == units_.end() || it->second.stopping) return;
    Unit& u = it->second;
    u.epoch = m.epoch;
    if (!u.ref) {
      u.spec = std::move(m.spec);
      launch(m.unit, u);
      return;
    }
    auto spec = decode_(m.spec);
    if (!spec.ok()) {
      log(true, where(m.unit) + ": the new spec does not decode, the worker keeps its old one: " +
                    spec.error().message());
      return;
    }
    u.spec = std::move(m.spec);
    u.ref.tell(WorkerSpecChanged<Spec>{std::move(*spec), m.epoch});
  }

  void handle(HostStop& m) {
    auto it = units_.find(m.unit);
    if (it == units_.end()) {
      m.done->set_value();
      return;
    }
    Unit& u = it->second;
    if (!u.ref) {  // not running: nothing to wait for
      cancel_timer("restart/" + m.unit);
      for (auto& w : u.waiters) w->set_value();
      m.done->set_value();
      units_.erase(it);
      return;
    }
    u.waiters.push_back(std::move(m.done));
    if (m.immediate) {
      u.stopping = true;
      u.ref.stop();
      return;
    }
    if (u.stopping) return;
    u.stopping = true;
    u.ref.tell(WorkerStop{now() + s_.stop_timeout});
    start_timer("stop/" + m.unit, s_.stop_timeout, HostDeadline{m.unit, u.incarnation});
  }

  void handle(HostDeadline& m) {
    auto it = units_.find(m.unit);
    if (it == units_.end() || it->second.incarnation != m.incarnation || !it->second.ref) return;
    log(false,
        where(m.unit) + ": the worker did not stop within " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(s_.stop_timeout).count()) +
            " ms of being asked (busy); stopping it");
    it->second.ref.stop();
  }

  void handle(HostFenced&) {
    for (auto& [unit, u] : units_) {
      if (!u.stopping || !u.ref) continue;
      cancel_timer("stop/" + unit);
      u.ref.stop();
    }
  }

  void handle(HostDown& m) {
    auto it = units_.find(m.unit);
    if (it == units_.end() || it->second.incarnation != m.incarnation) return;
    Unit& u = it->second;
    u.ref = {};
    if (u.stopping) {
      cancel_timer("stop/" + m.unit);
      for (auto& w : u.waiters) w->set_value();
      units_.erase(it);
      return;
    }
    log(true, where(m.unit) + ": the worker stopped on its own (" + std::string(to_string(m.reason)) +
                  (m.detail.empty() ? "" : ": " + m.detail) + "); it starts again in " +
                  std::to_string(
                      std::chrono::duration_cast<std::chrono::milliseconds>(kWorkerRestartDelay).count()) +
                  " ms");
    start_timer("restart/" + m.unit, kWorkerRestartDelay, HostRestart{m.unit, m.incarnation});
  }

  void handle(HostRestart& m) {
    auto it = units_.find(m.unit);
    if (it == units_.end() || it->second.incarnation != m.incarnation || it->second.ref ||
        it->second.stopping)
      return;
    launch(m.unit, it->second);
  }

  // Starts the unit's worker with its current spec; on a spec that does not
  // decode (or a constructor that throws) the unit stays without a worker.
  void launch(const std::string& unit, Unit& u) {
    u.incarnation = ++next_incarnation_;
    auto spec = decode_(u.spec);
    if (!spec.ok()) {
      log(true,
          where(unit) + ": the spec does not decode, the worker is not started: " + spec.error().message());
      return;
    }
    WorkerStart<Spec> start{s_.group, unit, std::move(*spec), u.epoch};
    try {
      u.ref = std::apply(
          [&](auto&... a) {
            return this->template spawn<A>(SpawnOptions{.name = "worker/" + s_.group + "/" + unit},
                                           std::move(start), a...);
          },
          args_);
    } catch (const std::exception& ex) {
      log(true, where(unit) + ": the worker's constructor threw, the worker is not started: " + ex.what());
      return;
    }
    if (!u.ref) return;  // the system is shutting down
    watch(u.ref, [unit, inc = u.incarnation](const Down& d) {
      return HostMsg(HostDown{unit, inc, d.reason, d.detail});
    });
  }

  WorkerHostSettings s_;
  SpecDecoder<Spec> decode_;
  std::tuple<Args...> args_;
  std::map<std::string, Unit> units_;
  std::uint64_t next_incarnation_ = 0;
};

// The node's handle on one host actor.
class WorkerHostOf final : public WorkerHostRef {
 public:
  explicit WorkerHostOf(ActorRef<HostMsg> ref) : ref_(std::move(ref)) {}
  ~WorkerHostOf() override { ref_.stop(); }
  void start(const std::string& unit, const std::string& spec, std::uint64_t epoch) override {
    ref_.tell(HostStart{unit, spec, epoch});
  }
  void update(const std::string& unit, const std::string& spec, std::uint64_t epoch) override {
    ref_.tell(HostUpdate{unit, spec, epoch});
  }
  Future<void> stop(const std::string& unit, bool immediate) override {
    auto p = std::make_shared<Promise<void>>();
    auto f = p->future();
    // A host that is gone took its workers with it: nothing left to wait for.
    if (ref_.tell(HostStop{unit, immediate, p}) != Delivery::delivered) p->set_value();
    return f;
  }
  void fenced() override {
    (void)ref_.tell(HostFenced{});  // not delivered: the host is gone, and its workers with it
  }

 private:
  ActorRef<HostMsg> ref_;
};

template <class A, class Spec, class... Args>
std::unique_ptr<WorkerHostRef> spawn_worker_host(ActorSystem& system, WorkerHostSettings settings,
                                                 SpecDecoder<Spec> decode, std::tuple<Args...> args) {
  std::string name = "workers/" + settings.group;
  auto ref = system.spawn<WorkerHost<A, Spec, Args...>>(
      SpawnOptions{.name = std::move(name), .supervision = Supervision::resume()}, std::move(settings),
      std::move(decode), std::move(args));
  return std::make_unique<WorkerHostOf>(std::move(ref));
}

}  // namespace troupe::node::detail
