#pragma once
// A cluster node: remoting over TCP, membership and placement in Redis, and
// the shard directory that shard regions use — started and stopped together.
//
//   troupe::cluster::ClusterSettings cs;
//   cs.node_id = "node-a";
//   cs.listen_port = 7101;
//   cs.coordination.redis_port = 6380;
//   cs.security.tls = {.cert_file = "node-a.crt", .key_file = "node-a.key", .ca_file = "ca.crt"};
//   auto cluster = troupe::cluster::Cluster::start(system, cs);   // blocks until registered
//   auto payments = troupe::cluster::ShardRegion<Payment>::start(system, journal, cluster.value()->remoting(),
//                                                                cluster.value()->directory(), settings, events, commands);
//   ...
//   (void)cluster.value()->leave();   // graceful: shards handed to the other nodes (E6)
//
// Membership drives the transport: every live member's address (stored in
// Redis with its heartbeat) becomes a peer; a member that leaves or is
// declared dead is removed, its connection closed, and every region forgets
// it as an owner. Shards are placement units of the group
// "shards/<entity type>", one unit per shard, so rebalance_all and relocate
// of the coordinator move shards with the hand-off protocol of
// sharding.hpp. A node that loses its lease stops its shards at once
// (immediate stop), before any other node may take them over.
//
// Ownership: start() returns the only owner; it owns the Remoting and the
// Coordinator and shares the actor system with the caller. Regions started
// on it must be stopped (or the node left) before it is destroyed.
// Thread safety: all members are thread-safe.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/cluster/coordinator.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/sharding.hpp"

namespace troupe::cluster {

struct ClusterSettings {
  std::string node_id;
  std::string listen_host = "127.0.0.1";
  std::uint16_t listen_port = 0;  // 0: any free port
  // The host other nodes dial; empty: listen_host.
  std::string advertise_host;
  std::size_t max_frame_bytes = 16u << 20;
  std::size_t max_outbound_bytes = 64u << 20;
  // Commands sent under a trace carry it to their node (Remoting::Settings::
  // send_traces; off while nodes built before trace ids are members).
  bool send_traces = true;
  // This node's roles (CoordinatorSettings::roles): it owns shards only of
  // the entity types and job queues whose roles (ShardRegionSettings::
  // roles, ClusterJobSettings::roles) include one of them, and units only
  // of the groups whose group_roles do. Each 1 to 64 of [A-Za-z0-9._-].
  std::vector<std::string> roles{};
  // Redis, liveness and placement; node_id, address and roles are filled
  // in from the fields above.
  CoordinatorSettings coordination{};
  // How long start() waits for Redis and registration.
  Duration start_timeout = std::chrono::seconds(30);
  // How many placement units (shards, job queues, workers) leave() moves at
  // once (at least 1).
  std::size_t hand_off_batch = 8;
  // TLS (or insecure = true: plain TCP) and the limits of the cluster port
  // (Remoting::Settings::security).
  TransportSecurity security{};
};

class Cluster {
 public:
  // Starts remoting, registers with Redis and waits for start-up. Errors:
  // invalid_argument (settings), coordination_failed (Redis unreachable,
  // naming host:port), timeout, or the transport's (port in use).
  static Result<std::unique_ptr<Cluster>> start(ActorSystem& system, ClusterSettings settings);
  // An abrupt stop, as a crash looks to the others: no hand-off.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const std::string& node_id() const;
  Remoting& remoting();
  Coordinator& coordinator();
  ShardDirectory& directory();

  // Graceful leave, a planned hand-off no client should notice (SPEC C2):
  //  1. every shard and job queue hosted here moves to another live member,
  //     hand_off_batch at a time (Coordinator::hand_off): its new owner is
  //     chosen first, it stops here as E6 says, and the new owner starts it.
  //     Commands for it wait meanwhile in the shard's bounded buffer (here
  //     or at the new owner) and go to the new owner; this node forwards
  //     whatever still reaches it;
  //  2. the other nodes are told, and route to the new owners from then on;
  //  3. replies owed to other nodes are sent (within the bound), and frames
  //     already on their way are let in (at most 2 heartbeat intervals,
  //     capped at 2 s);
  //  4. the node leaves the membership and remoting stops.
  // Waits up to `bound` in all, and 5 s more to leave when the hand-off
  // used up the bound; `progress` runs as each quarter of the units has
  // moved. Returns what moved. Errors: timeout (naming the step), or what
  // the hand-off or the leave met (the node still leaves).
  Result<HandOffReport> leave(Duration bound = std::chrono::seconds(60),
                              std::function<void(const HandOffReport&)> progress = {});

  // Runs `f` first thing when this object is destroyed, before the
  // coordinator and the transport stop, in the order added: a layer built
  // on the cluster (the singleton) stops what still uses it. Keep it short.
  void at_destroy(std::function<void()> f);

 private:
  struct Impl;
  explicit Cluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::cluster
