#pragma once
// Worker types for a node's worker groups (SPEC W9, doc/node.md "Worker
// groups"). A worker group is a set of placement units (one per device,
// tenant, feed...) that the cluster runs exactly once each, somewhere: the
// node's config declares the group ([[workers]]: its worker type, the
// source of its units, its sync interval and roles); the application
// registers the worker types, each an actor type with a typed spec.
//
//   struct DeviceSpec { std::string model; int rate = 1; };
//   using DeviceMsg = std::variant<troupe::node::WorkerSpecChanged<DeviceSpec>, troupe::node::WorkerStop, Tick>;
//   struct DeviceWorker : troupe::Actor<DeviceMsg> {
//     explicit DeviceWorker(troupe::node::WorkerStart<DeviceSpec> s, Fleet* fleet);
//     void receive(DeviceMsg& m);   // on WorkerStop: stop() now, or once the reading in flight is done
//   };
//   troupe::node::WorkerTypes types;
//   types.add<DeviceWorker, DeviceSpec>("device", decode_device_spec, fleet);
//   auto node = troupe::node::Node::start(std::move(config), std::move(types));
//
// Each unit this node owns runs as one worker actor: spawned with its
// WorkerStart (unit id, decoded spec, placement epoch) and any extra
// arguments given to add(); told WorkerSpecChanged when its spec changes;
// told WorkerStop when the unit leaves this node (moved, removed, the node
// leaving). A spec that does not decode is an error value: it is logged and
// the unit is not started (a later good spec starts it).
//
// Stopping, E6-style: a worker that is idle calls Actor::stop() when told
// WorkerStop; a worker that is busy says so by stopping later, once its
// work is done. The node waits for that up to WorkerStop::deadline (the
// node's [entities] stop_timeout_ms), then stops the actor itself (as
// ActorRef::stop does: after the messages already queued). Only once the
// actor has stopped is the unit released to its next owner, so no unit
// runs twice. A node that lost its lease (fenced) stops its workers at once.
//
// Ownership: WorkerTypes is a value the application fills and hands to
// Node::start, which keeps it. Thread safety: WorkerTypes is not
// thread-safe (fill it on one thread before Node::start); the messages are
// plain values.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "troupe/core/actor.hpp"
#include "troupe/core/clock.hpp"
#include "troupe/core/result.hpp"

namespace troupe::node {

// A worker's start: the first argument of its constructor.
template <class Spec>
struct WorkerStart {
  std::string group;
  std::string unit;
  Spec spec;
  std::uint64_t epoch = 0;  // the placement epoch this node runs the unit under
};

// Told to a worker whose unit's spec changed (same owner, same epoch).
template <class Spec>
struct WorkerSpecChanged {
  Spec spec;
  std::uint64_t epoch = 0;
};

// Told to a worker whose unit leaves this node. Stop now (Actor::stop), or,
// when busy, once the work in hand is done and before `deadline`; past it
// the node stops the worker.
struct WorkerStop {
  TimePoint deadline{};
};

// Turns a unit's spec text (the rest of its line in the source) into the
// worker's Spec, or an error saying what is wrong with it.
template <class Spec>
using SpecDecoder = std::function<Result<Spec>(std::string_view)>;

namespace detail {

// What one group's worker host (an actor spawned per group) is asked to do.
// Implemented by WorkerHostOf<A, Spec> in troupe/node/detail/worker_host.hpp.
// Thread-safe: each call tells the host actor a message.
class WorkerHostRef {
 public:
  virtual ~WorkerHostRef() = default;
  virtual void start(const std::string& unit, const std::string& spec, std::uint64_t epoch) = 0;
  virtual void update(const std::string& unit, const std::string& spec, std::uint64_t epoch) = 0;
  // Completes once the unit's worker has stopped (or was never running).
  // `immediate`: stop without waiting for a busy worker (the node is fenced).
  virtual Future<void> stop(const std::string& unit, bool immediate) = 0;
  // The node lost its lease: every worker already told to stop stops now,
  // without waiting for its work (its unit may be taken over soon).
  virtual void fenced() = 0;
};

// How a host logs and bounds stops.
struct WorkerHostSettings {
  std::string group;
  Duration stop_timeout = std::chrono::seconds(30);
  // Log lines: (error?, text). Called on actor threads.
  std::function<void(bool error, const std::string&)> log;
};

// A registered worker type, type-erased: spawns one group's host.
struct WorkerTypeEntry {
  std::string name;
  std::function<std::unique_ptr<WorkerHostRef>(ActorSystem&, WorkerHostSettings)> spawn_host;
};

template <class A, class Spec, class... Args>
std::unique_ptr<WorkerHostRef> spawn_worker_host(ActorSystem& system, WorkerHostSettings settings,
                                                 SpecDecoder<Spec> decode, std::tuple<Args...> args);

}  // namespace detail

// The worker types an application offers its node's [[workers]] groups, by
// name. Value type; not thread-safe (see the top of this file).
class WorkerTypes {
 public:
  // Registers worker type `name` (1 to 64 of A-Z a-z 0-9 . _ -): actor A,
  // constructed as A(WorkerStart<Spec>, args...), whose message type can be
  // built from WorkerSpecChanged<Spec> and from WorkerStop; `decode` reads a
  // unit's spec. invalid_argument for a bad or taken name or no decoder.
  template <class A, class Spec, class... Args>
    requires std::constructible_from<typename A::message_type, WorkerSpecChanged<Spec>> &&
             std::constructible_from<typename A::message_type, WorkerStop> &&
             std::constructible_from<A, WorkerStart<Spec>, Args&...>
  Result<void> add(std::string name, SpecDecoder<Spec> decode, Args... args) {
    if (auto v = check_new_name(name); !v.ok()) return v;
    if (!decode) return Error(ErrorCode::invalid_argument, "worker type '" + name + "': no spec decoder");
    auto entry = std::make_shared<detail::WorkerTypeEntry>();
    entry->name = name;
    entry->spawn_host = [decode = std::move(decode), args = std::make_tuple(std::move(args)...)](
                            ActorSystem& system, detail::WorkerHostSettings s) {
      return detail::spawn_worker_host<A, Spec>(system, std::move(s), decode, args);
    };
    types_.emplace(std::move(name), std::move(entry));
    return {};
  }

  bool contains(std::string_view name) const { return types_.find(name) != types_.end(); }
  // The registered names, sorted.
  std::vector<std::string> names() const;
  // The entry for `name`, or null.
  std::shared_ptr<const detail::WorkerTypeEntry> find(std::string_view name) const;

 private:
  Result<void> check_new_name(const std::string& name) const;
  std::map<std::string, std::shared_ptr<const detail::WorkerTypeEntry>, std::less<>> types_;
};

}  // namespace troupe::node

#include "troupe/node/detail/worker_host.hpp"  // IWYU pragma: export
