#pragma once
// What the files of the cluster-wide keyed lock share on one node: the
// token layout, the messages of its actors, its counters, and Core, the
// state the node's clients, its host and its inbox share (the route to each
// shard's owner, the keys this node's callers hold). The files:
//   cluster_lock.cpp           start_keyed_lock, the KeyedLock backend, the wire inbox
//   cluster_lock_client.cpp    the caller's side: routes requests, runs blocks, leases
//   cluster_lock_host.hpp/.cpp the owner's side: a hosted shard's grants and queue
//   cluster_lock_takeover.cpp  a new owner asking who holds what, its grace, departed nodes
// Private to src/cluster/sharding. See include/troupe/cluster/cluster_lock.hpp
// for the contract, doc/lock.md for the protocol.

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cluster_lock_wire.hpp"
#include "troupe/cluster/cluster_lock.hpp"

namespace troupe::cluster::detail::cluster_lock {

using troupe::detail::LockKeyCell;
using troupe::detail::LockRequest;

// A token: the shard's placement epoch << kEpochShift | a per-shard count.
inline constexpr int kEpochShift = 40;
inline constexpr std::uint64_t kMaxEpoch = (std::uint64_t{1} << (64 - kEpochShift)) - 1;

inline std::uint64_t epoch_of(std::uint64_t token) noexcept { return token >> kEpochShift; }

// --- the messages between nodes (cluster_lock_wire.hpp) ---------------------------

using lock_wire::Acquire;
using lock_wire::Deny;
using lock_wire::Grant;
using lock_wire::HoldReport;
using lock_wire::Query;
using lock_wire::QueryReply;
using lock_wire::Release;
using lock_wire::Wire;
using lock_wire::wire_codecs;

// --- actor messages ---------------------------------------------------------------

struct Submit {
  std::unique_ptr<LockRequest> req;
};
struct Routed {
  std::uint64_t req = 0;
  Result<std::string> owner;
};
struct FromWire {
  std::string from;
  Wire msg;
};
struct Finished {
  std::unique_ptr<LockRequest> req;
};
struct NodeLeft {
  std::string node;
};
struct Tick {};
using ClientMsg = std::variant<Submit, Routed, FromWire, Finished, NodeLeft, Tick>;

struct HostStart {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct HostStop {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct Located {
  std::string from;
  Acquire acquire;
  Result<std::string> owner;
};
struct QueryDone {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
struct GraceOver {
  std::uint32_t shard = 0;
  std::uint64_t epoch = 0;
};
using HostMsg = std::variant<HostStart, HostStop, FromWire, Located, NodeLeft, QueryDone, GraceOver>;

// --- what a node shares between its clients, its host and its inbox ----------------

struct Counters {
  std::atomic<std::uint64_t> grants{0}, acquire_timeouts{0}, lease_expiries{0}, block_failures{0}, live_holds{0},
      waiting{0};
};

inline void bump(std::atomic<std::uint64_t>& c, std::int64_t by = 1) noexcept {
  c.fetch_add(static_cast<std::uint64_t>(by), std::memory_order_relaxed);
}

// Shared by the node's clients, host and inbox. Owned by the KeyedLock's
// backend and by the actors until they stop; the inbox and the directory's
// callbacks hold it weakly. Thread safety: the routing table, the hold
// table and the hosted shards' stats each have their mutex; the rest is set
// before the actors start and read-only after.
struct Core {
  ActorSystem* system = nullptr;
  Remoting* remoting = nullptr;
  ShardDirectory* directory = nullptr;
  KeyedLockSettings settings;
  ClusterLockSettings cluster;
  std::string type;  // also the inbox name
  std::string self;
  std::shared_ptr<const MessageCodecs<Wire>> codecs;
  ActorRef<HostMsg> host;
  std::vector<ActorRef<ClientMsg>> clients;
  std::size_t client_mask = 0;
  Counters counters;
  std::atomic<bool> stopped{false};

  // Where each shard lives, as far as this node knows.
  std::mutex route_mu;
  std::vector<std::string> owners;

  // The keys this node's callers hold, by shard and token; read by the
  // queries of new owners. `queried` is the latest epoch a new owner asked
  // about each shard: a grant drawn under an older epoch that arrives
  // after that question is refused (the new owner does not know it).
  struct Hold {
    std::string key;
    std::string owner;  // where its Release goes
  };
  std::mutex holds_mu;
  std::map<std::uint32_t, std::map<std::uint64_t, Hold>> holds;
  std::vector<std::uint64_t> queried;

  // Stats of the KeyedLocks of the shards hosted here, and of retired ones.
  std::mutex hosted_mu;
  std::map<std::uint32_t, KeyedLock> hosted_locks;
  LockStats retired{};

  std::uint32_t shard_of_key(std::string_view key) const { return cluster::shard_of(key, cluster.shard_count); }

  std::string owner_of(std::uint32_t shard) {
    std::lock_guard lk(route_mu);
    return owners[shard];
  }
  void set_owner(std::uint32_t shard, const std::string& node) {
    std::lock_guard lk(route_mu);
    owners[shard] = node;
  }
  void forget_owner(std::uint32_t shard, const std::string& node) {
    std::lock_guard lk(route_mu);
    if (owners[shard] == node) owners[shard].clear();
  }
  void forget_node(std::string_view node) {
    std::lock_guard lk(route_mu);
    for (auto& o : owners)
      if (o == node) o.clear();
  }

  const ActorRef<ClientMsg>& client_for(std::string_view key) const {
    return clients[std::hash<std::string_view>{}(key) & client_mask];
  }

  // Sends `m` to the lock on `node`; to this node without the network.
  Result<void> send(const std::string& node, Wire m) {
    if (node == self) {
      dispatch(self, std::move(m));
      return {};
    }
    return remoting->remote<Wire>(node, type, codecs).tell(std::move(m));
  }

  // What arrives from a node (or this one): to the host, a client, or
  // answered here (a query reads the hold table).
  void dispatch(const std::string& from, Wire m) {
    if (auto* q = std::get_if<Query>(&m)) return answer_query(from, *q);
    if (auto* g = std::get_if<Grant>(&m)) {
      const auto& c = client_for(g->key);
      (void)c.tell(FromWire{from, std::move(m)});
      return;
    }
    if (auto* d = std::get_if<Deny>(&m)) {
      const auto& c = client_for(d->key);
      (void)c.tell(FromWire{from, std::move(m)});
      return;
    }
    (void)host.tell(FromWire{from, std::move(m)});
  }

  void answer_query(const std::string& from, const Query& q) {
    if (q.shard >= cluster.shard_count) return;
    QueryReply reply{q.shard, q.epoch, {}};
    {
      // Under the lock until sent: a Release of one of these holds, made
      // after the owner changed below, goes out after this reply.
      std::lock_guard lk(holds_mu);
      queried[q.shard] = std::max(queried[q.shard], q.epoch);
      if (auto it = holds.find(q.shard); it != holds.end()) {
        for (auto& [token, h] : it->second) {
          if (epoch_of(token) >= q.epoch) continue;
          h.owner = from;
          reply.holds.push_back(HoldReport{h.key, token});
        }
      }
      set_owner(q.shard, from);
      (void)send(from, std::move(reply));
    }
  }

  // Records a grant this node's caller is about to use; false if a newer
  // owner of its shard has asked about holds since it was drawn.
  bool add_hold(std::uint32_t shard, std::uint64_t token, const std::string& key, const std::string& owner) {
    std::lock_guard lk(holds_mu);
    if (epoch_of(token) < queried[shard]) return false;
    holds[shard][token] = Hold{key, owner};
    bump(counters.live_holds);
    return true;
  }
  // Forgets a hold and tells its owner it is free.
  void end_hold(std::uint32_t shard, std::uint64_t token) {
    std::lock_guard lk(holds_mu);
    auto it = holds.find(shard);
    if (it == holds.end()) return;
    auto h = it->second.find(token);
    if (h == it->second.end()) return;
    Release r{shard, h->second.key, token};
    std::string owner = std::move(h->second.owner);
    it->second.erase(h);
    if (it->second.empty()) holds.erase(it);
    bump(counters.live_holds, -1);
    (void)send(owner, std::move(r));
  }
};

// The actors, spawned by start_keyed_lock. Each holds the core until it
// stops; both answer an empty reference when the system is shutting down.
ActorRef<ClientMsg> spawn_client(ActorSystem& system, std::string name, const std::weak_ptr<Core>& core);
ActorRef<HostMsg> spawn_host(ActorSystem& system, std::string name, const std::weak_ptr<Core>& core);

}  // namespace troupe::cluster::detail::cluster_lock
