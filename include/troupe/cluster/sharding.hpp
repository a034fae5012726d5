#pragma once
// Cluster sharding: the entities of one type spread over the nodes of a
// cluster (SPEC E5, E6, E7 across nodes).
//
// Every node runs a ShardRegion for each entity type. An entity id maps to
// one of `shard_count` shards by a stable hash (FNV-1a 64 of the id, the
// same on every node and build); a ShardDirectory says which node owns each
// shard (in a cluster, the Redis coordinator: one owner per shard, an epoch
// per move). A command sent to any node's region reaches the entity on the
// shard's owner:
//
//   - owned here: the shard's entities live in a local entity registry
//     (started on demand, recovered from the journal, passivated when idle,
//     stopped gracefully) exactly as on a single node;
//   - owned elsewhere: the command is encoded with the type's
//     MessageCodecs and sent over the node pair's connection; an ask's
//     answer comes back to the asker;
//   - not yet known, being allocated, or being handed off: the command waits
//     in the shard's bounded buffer (buffer_overflow past it), in arrival
//     order, and goes on once the owner is known and ready.
//
// Hand-off (a rebalance move, or this node leaving): the old owner stops the
// shard's entities with the graceful stop of E6 (processing entities finish
// their episode first), then tells the directory it released the shard;
// only then does the new owner start it. Commands that reach the old owner
// meanwhile wait in its buffer and are forwarded to the new owner after the
// release, in order. A node that loses its lease (self-fencing) stops its
// shards at once, before any other node may take them over. That rests on
// timing (a paused process does not stop itself), so the journal enforces
// it too (SPEC E9): a shard's entities write through a FencedJournal with
// fence "<type>/<shard>" at the placement epoch; the new owner raises the
// fence before its first read, after which the journal refuses every append
// of the old owner, which then stops. The primary key (E7) refuses a second
// writer of one sequence number in any case.
//
// Failover (SPEC C1): when the owner dies or leaves while an ask is out to
// it (its connection is lost, or membership removes it), the ask is either
//   - re-sent, if its message type was registered idempotent
//     (MessageOptions::idempotent in its MessageCodecs registration): the
//     shard is located again and the ask waits in the shard's buffer, like
//     any new command, until the directory names an owner that can be
//     reached, then goes there — as long as its asker still waits (the ask's
//     own timeout bounds every retry; an ask whose asker gave up is dropped,
//     never delivered late);
//   - or answered `unreachable`, "may or may not have been handled".
// A command whose send finds the owner gone from the address book was not
// sent at all: a tell or an ask, idempotent or not, waits for the next
// owner (a node that handed its shards off and left is seldom known gone
// by every sender at once), and the commands behind it wait for the shard
// to be located again, which is retried with a growing pause (25 ms up to
// 0.5 s) while the directory still names the departed node. Tells are never re-sent: a tell out on a lost
// connection is lost, as a tell to a local actor that stops may be.
//
// Order: commands from one sender to one entity arrive in the order sent —
// they share one path (buffer, local registry, or the one connection to
// the owner; a forwarding node forwards in arrival order). A node keeps its
// view of a remote shard's owner until that node leaves the cluster, so a
// sender's path does not change under it while a move is in flight: after a
// move, traffic from nodes that knew the old owner is forwarded by it.
// Re-sent asks keep their order among themselves (the asks of one lost
// connection are re-sent in the order they were sent) and go ahead of
// anything sent after they were re-sent. What they may not keep: their
// place before a later command of the same sender that was already on its
// way elsewhere (a non-idempotent ask answered `unreachable`, or a command
// sent to the same owner after the connection broke and before the loss was
// seen, which waits in the transport's queue for a reconnection). A re-sent
// ask may also be handled twice — by the owner that died (or whose
// connection broke) and by the next one — which is what idempotent means.
//
// Thread safety: all members of ShardRegion are thread-safe. Ownership: a
// region shares the actor system, the journal, the remoting layer and the
// directory with the caller, who keeps them alive until stop() returned.
//
// The pieces a region is built from have headers of their own:
// shard_directory.hpp (the id -> shard hash and the directory) and
// shard_region_settings.hpp (settings and stats). The machinery behind
// ShardRegion is in detail/region_*.hpp.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "troupe/cluster/detail/region_core.hpp"
#include "troupe/cluster/detail/region_hosting.hpp"
#include "troupe/cluster/detail/region_placement.hpp"
#include "troupe/cluster/detail/region_routing.hpp"
#include "troupe/cluster/messages.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/shard_directory.hpp"
#include "troupe/cluster/shard_region_settings.hpp"
#include "troupe/persist/entity.hpp"
#include "troupe/persist/fenced_journal.hpp"

namespace troupe::cluster {

// The entities of one type on this node's share of the cluster. A copyable
// handle to shared state; see the file comment for ownership and threads.
template <class B>
class ShardRegion {
 public:
  using Command = troupe::detail::CommandOf<B>;
  using Event = troupe::detail::EventOf<B>;
  using State = troupe::detail::StateOf<B>;
  using Factory = std::function<B(const std::string&)>;

  // Errors (invalid_argument): what EntityRegistry::start refuses, a zero
  // shard count or buffer, no message codecs, a type already attached to
  // the directory or published on this node.
  static Result<ShardRegion> start(ActorSystem& system, std::shared_ptr<Journal> journal, Remoting& remoting,
                                   ShardDirectory& directory, ShardRegionSettings settings,
                                   EventCodecs<Event> event_codecs, MessageCodecs<Command> codecs, Factory factory = {},
                                   std::optional<StateCodec<State>> snapshots = std::nullopt) {
    auto core = detail::open_region<B>(system, std::move(journal), remoting, directory, std::move(settings),
                                       std::move(event_codecs), std::move(codecs), std::move(factory),
                                       std::move(snapshots));
    if (!core.ok()) return std::move(core).error();
    return ShardRegion(std::move(core).value());
  }

  // Sends `cmd` to entity `id` wherever it lives. Errors: invalid_argument
  // (empty id). Later failures (no node can take the shard, buffer full,
  // stopping) answer the command's reply target, or count it refused.
  Result<void> tell(std::string_view id, Command cmd) const {
    if (id.empty()) return Error(ErrorCode::invalid_argument, "empty entity id");
    core_->route(std::string(id), std::move(cmd), 0);
    return {};
  }

  // Asks entity `id` wherever it lives: `make(ReplyTo<R>)` builds the
  // command. Completes with the reply, the entity's or the runtime's error,
  // timeout, or unreachable (the owner's connection was lost meanwhile).
  template <class R, class Make>
  Future<R> ask(std::string_view id, Make&& make, Duration timeout) const {
    auto [future, request] = core_->system->template ask_with<R>(std::forward<Make>(make), timeout);
    Command cmd(std::move(request));
    if (id.empty()) {
      core_->refuse(cmd, Error(ErrorCode::invalid_argument, "empty entity id"));
      return std::move(future);
    }
    core_->route(std::string(id), std::move(cmd), 0);
    return std::move(future);
  }

  // The shard an id belongs to (the same on every node).
  std::uint32_t shard_of(std::string_view id) const noexcept {
    return cluster::shard_of(id, core_->settings.shard_count);
  }

  // Stops every shard hosted here gracefully (E6: processing entities finish
  // their episode), releases them to the directory and detaches; waits up
  // to `bound` for all shards at once (zero: the entity stop_timeout, or
  // 31 s without one). Later commands are refused with shutting_down.
  // timeout if entities still run after it. In a cluster, leave the
  // cluster first (Cluster::leave): that hands the shards to other nodes;
  // this only stops what is still here.
  Result<void> stop(Duration bound = Duration::zero()) const { return core_->stop(bound); }

  ShardRegionStats stats() const { return core_->stats(); }
  // Entities of the shards hosted on this node in a processing episode now,
  // the longest first (up to `limit`); one entity's episode if it is in one
  // here; how many there are.
  std::vector<ProcessingEntity> processing(std::size_t limit) const { return core_->processing(limit); }
  std::optional<ProcessingEntity> processing_of(const std::string& id) const { return core_->processing_of(id); }
  std::size_t processing_count() const { return core_->processing_count(); }
  // Shards of this type (the same on every node).
  std::uint32_t shard_count() const noexcept { return core_->settings.shard_count; }
  const ShardRegionSettings& settings() const { return core_->settings; }

 private:
  explicit ShardRegion(std::shared_ptr<detail::RegionCore<B>> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::RegionCore<B>> core_;
};

}  // namespace troupe::cluster
