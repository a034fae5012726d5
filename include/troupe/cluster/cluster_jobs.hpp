#pragma once
// Durable jobs across a cluster (SPEC J6 on a shared journal): the
// JobService API, with the queue sharded over the nodes and every shard
// owned by one node at a time through placement.
//
//   auto refunds = troupe::cluster::start_job_service(system, cluster->remoting(), cluster->directory(),
//                                                     settings, translator, workers).value();
//   refunds.enqueue({"refund", payload}, /*priority=*/5);   // as on one node
//
// Why sharded. A durable job service writes one journal log. On a journal
// that several nodes share (PostgreSQL), one log per service name would
// have one writer per node: the first wins and every other node's service
// is refused by the journal. Here the queue is `shard_count` queue shards,
// each its own log ("jobs|<name>/<shard>"), each placed by the shard
// directory like an entity shard (directory type "jobs/<name>"). A node
// runs a local JobService for every shard it owns:
//
//   enqueue() on node A ──> a shard A owns (round robin; no network)
//                           journaled there, run by A's FSM workers
//   A owns none yet     ──> a shard owned elsewhere, over the node pair's
//                           connection (ClusterJobSettings::route_timeout)
//   A leaves, or a         each shard stops taking jobs, lets its running
//   rebalance moves     ──> ones finish (stop_bound), stops (queued jobs are
//   a shard away            in its log), is released, and starts on its new
//                           owner, which recovers and runs them
//   A dies / is fenced  ──> after the liveness threshold + takeover margin,
//                           placement moves A's shards to live nodes, which
//                           recover and run every accepted, unfinished job
//
// Guarantees, besides those of JobService:
//   - No accepted job is lost when its node dies: it is in its shard's log,
//     and the shard's next owner runs it (at least once, as J6 on a restart).
//   - A shard runs on one node at a time: its new owner starts it only after
//     the old owner released it or is past liveness threshold + margin (and
//     a node that loses its lease stops its shards first). A job whose
//     outcome was journaled never runs again.
//   - A shard whose service stops on a fault (journal_conflict: another
//     writer in its log) is recovered again from its log while this node
//     owns it; health() reports it until then.
//
// Differences from one node's JobService:
//   - JobIds are unique in the cluster: shard << 40 | the shard's own id.
//   - workers, queue_capacity and the rest of JobSettings apply per hosted
//     shard: a node owning k shards runs up to k * workers jobs at once.
//   - on_outcome runs on the node that finished the job, which after a move
//     is not the node that accepted it. A submit() whose shard moves before
//     the outcome is answered shutting_down; the job runs on the new owner
//     and its outcome goes to that node's on_outcome.
//   - pause()/resume() act on this node's shards; stats() and
//     dead_letters() cover this node's shards (stopped ones included).
//   - stop() stops this node's shards (all at once, within its bound;
//     timeout if one did not stop in time), releases those placement had
//     asked back, and hands none off: do it as part of leaving the cluster
//     (the node does), or the shards it still owns wait for this node to
//     leave before another serves them.
//   - A node that loses its lease stops its shards at once (not in turn),
//     before any other node may take them over.
//
// Ownership and thread safety: the returned JobService is a handle like any
// other; the service shares the actor system, the remoting layer and the
// directory with the caller, who keeps them alive until stop() returned (or
// the actor system shut down). Every member is thread-safe. The service
// owns one thread that starts and stops shards (a start reads the shard's
// log, which blocks).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/sharding.hpp"
#include "troupe/patterns/job_service.hpp"

namespace troupe::cluster {

struct ClusterJobSettings {
  // Queue shards; the same on every node. At most 4096.
  std::uint32_t shard_count = 16;
  // A job sent to another node's shard (this node owns none that runs)
  // must be accepted within this, or the caller gets timeout (it may or may
  // not have been accepted: the usual at-most-once of a request over a
  // network). Also bounds re-routing while shards move.
  Duration route_timeout = std::chrono::seconds(10);
  // How long a shard's service may take to stop when the shard is handed
  // off or the service stops.
  Duration stop_bound = std::chrono::seconds(10);
  // A shard whose service could not start (its log unreadable: journal
  // down) or stopped on a fault is started again after this, while this
  // node owns it.
  Duration restart_delay = std::chrono::seconds(1);
  // The roles a node must hold (ClusterSettings::roles) to own queue
  // shards; empty: any node. The same on every node. A node without one
  // of them runs no shard yet enqueues, sending each job to a shard's
  // owner.
  std::vector<std::string> roles{};
};

// The directory type (and the remoting inbox) of a job service named `name`.
inline std::string job_queue_type(std::string_view name) { return "jobs/" + std::string(name); }

// Starts the service's part on this node; every node of the cluster starts
// it with the same name, settings and shard count. settings.journal is
// required (the cluster's shared journal). invalid_argument for unusable
// settings or a name already in use on this node.
Result<JobService> start_job_service(ActorSystem& system, Remoting& remoting, ShardDirectory& directory,
                                     JobSettings settings, JobTranslator translator, JobWorkers workers,
                                     ClusterJobSettings cluster = {});

}  // namespace troupe::cluster
