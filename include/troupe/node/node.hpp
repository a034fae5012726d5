#pragma once
// troupe::node::Node: what a person runs. One object that reads a
// NodeConfig and brings up, in order, the actor system, the journal
// (SQLite, PostgreSQL or memory), the cluster when [cluster] is configured
// (remoting, Redis membership and placement, the shard directory), and the
// admin HTTP server: the JSON API, Prometheus /metrics and the dashboard
// (doc/node.md, doc/dashboard.md).
//
//   auto cfg = troupe::node::NodeConfig::load("payment.toml", {"payment"});
//   auto node = troupe::node::Node::start(std::move(*cfg));     // exits with a message on error
//   auto payments = (*node)->serve_entities<Payment>({.type = "payment", .events = codecs(), ...});
//   auto refunds = (*node)->start_jobs(refund_settings, translator, workers);  // durable; sharded in a cluster
//   (*node)->mark_ready();
//   (*node)->wait_for_stop_signal();   // SIGINT / SIGTERM: graceful drain, then return; SIGHUP: reload TLS
//
// Entity types are served the same way on one node and in a cluster:
// serve_entities starts an EntityRegistry on a single node and a
// ShardRegion in a cluster, behind one Entities<B> handle. Job services
// likewise: start_jobs gives one JobService handle either way.
//
// Health: /health, troupe_service_up and the dashboard report every
// watched service (watch_health; watch_jobs and start_jobs watch theirs),
// so a service that stopped on a fault is loud, not an idle queue.
//
// Ownership: start() returns the only owner. The node owns the actor
// system, the journal, the cluster and the admin server, and stops them in
// the reverse order (drain first) when destroyed. Entities handles, locks,
// process managers and job services the application registers must not
// outlive it.
// Thread safety: every member is thread-safe unless its comment says
// otherwise.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "troupe/cluster/cluster.hpp"
#include "troupe/cluster/sharding.hpp"
#include "troupe/core.hpp"
#include "troupe/node/config.hpp"
#include "troupe/net/http.hpp"
#include "troupe/node/metrics.hpp"
#include "troupe/node/workers.hpp"
#include "troupe/patterns.hpp"
#include "troupe/persist.hpp"
#include "troupe/persist/postgres_journal.hpp"

namespace troupe::node {

// Answers with one entity's state as JSON, or an error (not_found for an
// entity that has no events). Called on an admin server thread; may answer
// later from any thread.
using Describe = std::function<void(const std::string& id, std::function<void(Result<nlohmann::json>)> done)>;

// What the node reports about one entity type. Copies share the functions.
struct EntityTypeView {
  std::string type;
  std::uint32_t shard_count = 0;
  std::function<EntityStats()> stats;
  std::function<std::uint64_t()> shards_hosted;
  std::function<std::uint64_t()> shards_started;  // here, since start: moves and takeovers
  std::function<std::vector<ProcessingEntity>(std::size_t)> processing;
  std::function<std::optional<ProcessingEntity>(const std::string&)> processing_of;
  std::function<std::size_t()> processing_count;
  Describe describe;  // may be empty
};

// How to serve one entity type: its name, codecs and factory; the entity
// settings come from the node's [entities] table.
template <class B>
struct EntityTypeOptions {
  using Command = troupe::detail::CommandOf<B>;
  using Event = troupe::detail::EventOf<B>;
  std::string type;
  EventCodecs<Event> events;
  // Commands on the wire: needed in a cluster, ignored on a single node.
  cluster::MessageCodecs<Command> commands;
  std::function<B(const std::string&)> factory;
  // Processing timeout the stop waits for; zero: the node's stop_timeout.
  Duration stop_timeout = Duration::zero();
  // In a cluster, the node roles ([node] roles) that may host the type's
  // shards (SPEC W8); empty: any node. A node without one of them hosts
  // none of its shards and still sends to the type. Every node serving the
  // type must name the same roles. Ignored on a single node.
  std::vector<std::string> roles;
};

// One entity type served by the node: a local registry or a shard region.
// A handle; copies share the type. Thread-safe.
template <class B>
class Entities {
 public:
  using Command = troupe::detail::CommandOf<B>;

  // Asks entity `id` (wherever it lives): `make(ReplyTo<R>)` builds the command.
  template <class R, class Make>
  Future<R> ask(std::string_view id, Make&& make, Duration timeout) const {
    return std::visit([&](const auto& impl) { return impl.template ask<R>(id, std::forward<Make>(make), timeout); },
                      impl_);
  }
  Result<void> tell(std::string_view id, Command cmd) const {
    return std::visit([&](const auto& impl) { return impl.tell(id, std::move(cmd)); }, impl_);
  }
  EntityStats stats() const {
    return std::visit(
        [](const auto& impl) {
          if constexpr (requires { impl.stats().entities; }) {
            return impl.stats().entities;
          } else {
            return impl.stats();
          }
        },
        impl_);
  }

  explicit Entities(EntityRegistry<B> r) : impl_(std::move(r)) {}
  explicit Entities(cluster::ShardRegion<B> r) : impl_(std::move(r)) {}

 private:
  std::variant<EntityRegistry<B>, cluster::ShardRegion<B>> impl_;
};

// One slice of a projection, started on this node (serve_projection).
// Copies share the slice. Thread-safe when its two functions are (those of
// RunningSlice::of are: Projection's members are).
struct RunningSlice {
  std::function<ProjectionStatus()> status;  // thread-safe and quick
  std::function<void()> stop;                // stops it here; the stored offset stays
  template <class Handler>
  static RunningSlice of(Projection<Handler> p) {
    return {[p] { return p.status(); }, [p] { p.stop(); }};
  }
};

// A projection split in slices (e.g. one per tag), each run by one node.
// What serve_projection takes; a value type, moved into the node.
struct ProjectionSlices {
  // 1 to 100 of A-Z a-z 0-9 . _ -; in a cluster the slices are the units
  // of the group "projections/<name>".
  std::string name;
  std::vector<std::string> slices;  // 1 to 4096 distinct unit names
  // Starts `slice` here: called once per slice a node is given, on the
  // coordinator's thread in a cluster (it must not block: Projection::start
  // does not). An error is logged; the slice then does not run here until
  // it is placed again.
  std::function<Result<RunningSlice>(const std::string& slice)> start;
  // In a cluster, the node roles that may run the slices; empty: any node.
  std::vector<std::string> roles;
};

class Node {
 public:
  // Brings the node up. Errors name what failed: the setting for bad
  // values, journal_failed with the database's message (PostgreSQL
  // unreachable: "journal.postgres: ..."), coordination_failed naming
  // cluster.redis, the admin port in use, a [[workers]] group whose type
  // `workers` does not register. Nothing is left running on error.
  // `workers`: the worker types the config's [[workers]] groups name
  // (troupe/node/workers.hpp).
  static Result<std::unique_ptr<Node>> start(NodeConfig config, WorkerTypes workers = {});
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Serves entity type B on this node (registry) or across the cluster
  // (shard region). invalid_argument for a type already served or bad codecs.
  // Not thread-safe: call during start-up, from one thread, before drain().
  template <class B>
  Result<Entities<B>> serve_entities(EntityTypeOptions<B> options, Describe describe = {}) {
    EntitySettings es;
    es.type_name = options.type;
    es.idle_timeout = config_.entities.passivate_after;
    es.stash_capacity = config_.entities.stash_capacity;
    es.stop_timeout = options.stop_timeout > Duration::zero() ? options.stop_timeout
                                                              : Duration(config_.entities.stop_timeout);
    EntityTypeView view;
    view.type = options.type;
    view.describe = std::move(describe);
    if (cluster_) {
      cluster::ShardRegionSettings rs;
      rs.entity = es;
      rs.shard_count = config_.entities.shard_count;
      rs.roles = std::move(options.roles);
      auto r = cluster::ShardRegion<B>::start(*system_, journal_, cluster_->remoting(), cluster_->directory(), rs,
                                              std::move(options.events), std::move(options.commands),
                                              std::move(options.factory));
      if (!r.ok()) return std::move(r).error();
      auto region = *r;
      view.shard_count = region.shard_count();
      view.stats = [region] { return region.stats().entities; };
      view.shards_hosted = [region] { return region.stats().shards_hosted; };
      view.shards_started = [region] { return region.stats().shards_started; };
      view.processing = [region](std::size_t n) { return region.processing(n); };
      view.processing_of = [region](const std::string& id) { return region.processing_of(id); };
      view.processing_count = [region] { return region.processing_count(); };
      stoppers_.push_back([region] { (void)region.stop(); });
      add_entity_type(std::move(view));
      return Entities<B>(std::move(region));
    }
    auto r = EntityRegistry<B>::start(*system_, journal_, es, std::move(options.events), std::move(options.factory));
    if (!r.ok()) return std::move(r).error();
    auto reg = *r;
    view.shard_count = 1;
    view.stats = [reg] { return reg.stats(); };
    view.shards_hosted = [] { return std::uint64_t{1}; };
    view.shards_started = [] { return std::uint64_t{1}; };
    view.processing = [reg](std::size_t n) { return reg.processing(n); };
    view.processing_of = [reg](const std::string& id) { return reg.processing_of(id); };
    view.processing_count = [reg] { return reg.processing_count(); };
    stoppers_.push_back([reg] { (void)reg.stop(); });
    add_entity_type(std::move(view));
    return Entities<B>(std::move(reg));
  }

  // Starts a durable job service on the node's journal, watched as
  // watch_jobs(settings.name, ...) does, and returns it.
  //
  // Why: a durable JobService writes one journal log ("jobs|<name>"), which
  // takes one writer. On a single node that is JobService::start. In a
  // cluster the nodes share one journal (PostgreSQL), so one such service
  // per node would collide: the first node's appends win and every other
  // node's service stops on a journal_conflict. Clustered, this starts
  // troupe::cluster::start_job_service instead, which splits the queue into
  // `jobs.shard_count` queue shards (config), each its own log, each run by
  // the one node placement gives it. Every node calls start_jobs with the
  // same name and settings.
  //
  // settings.journal is set to journal(); invalid_argument if the caller set
  // another journal. Otherwise the errors of JobService::start (or of
  // start_job_service: invalid_argument for bad settings or a name in use).
  // On a single node it blocks while it reads the service's log.
  //
  // Stopping: on a single node the actor system's shutdown stops the
  // service (when the node is destroyed). In a cluster, drain() first
  // leaves the cluster, which hands this node's queue shards to the other
  // members (the directory stops each one; its jobs are in its log), and
  // then stops what is left of the service here. Do not stop it yourself
  // before drain(): that would stop its shards without handing them off.
  // Not thread-safe: call during start-up, from one thread, before drain()
  // (like serve_entities).
  Result<JobService> start_jobs(JobSettings settings, JobTranslator translator, JobWorkers workers);

  // Starts an outbox dispatcher (troupe/persist/outbox_dispatcher.hpp) on
  // the node's journal, which runs the side effects the node's entities
  // store with their events, and reports it in /metrics (troupe_outbox_*).
  // settings.owner defaults to the node's id; in a cluster every node runs
  // one, and they split the records of the shared journal between them.
  // Errors: those of OutboxDispatcher::start; invalid_argument for a second
  // one. Not thread-safe: call during start-up, like serve_entities.
  Result<OutboxDispatcher> start_outbox(OutboxHandlers handlers, OutboxSettings settings = {});

  // Reported in /metrics, /api/overview and the dashboard. watch_jobs also
  // watches the service's health() as "jobs/<name>" (watch_health).
  void watch_lock(std::string name, KeyedLock lock);
  void watch_process_manager(std::string name, std::function<ProcessStats()> stats);
  void watch_jobs(std::string name, JobService jobs);
  // Something whose failure the node must report: `check` answers ok while
  // `service` works, or an error (code and message) saying why it does
  // not. While any watched check answers an error, GET /health is 503 and
  // names it, troupe_service_up{service} is 0, and the dashboard shows it
  // in red (/api/overview "health"). A check runs at every /health,
  // /metrics and /api/overview request, on the admin server's thread,
  // without the node's locks held: it must be thread-safe and quick, and
  // must not block. A check that throws counts as failing (handler_failed).
  // Watching a name again replaces its check.
  void watch_health(std::string service, std::function<Result<void>()> check);
  // A rate the dashboard charts (per second over each second): `total`
  // returns a running count. "messages" and "events" are built in.
  void add_rate(std::string name, std::function<std::uint64_t()> total);
  // The latency the dashboard charts (p50 and p99 over each second).
  void set_latency(std::string name, std::shared_ptr<Histogram> histogram);
  // A count shown as a tile on the dashboard.
  void add_counter(std::string name, std::function<std::uint64_t()> value);

  // A projection (troupe/persist/projection.hpp) the node reports: in
  // /metrics (troupe_projection_*, labelled with its name and source), in
  // GET /projections, on the dashboard's Projections panel, and in /health
  // as "projection/<key>", down while it has stopped on a failure (with the
  // failing event's coordinates). `status` must be thread-safe and quick
  // (Projection::status is); it runs on the admin server's thread. Keyed
  // by status().key ("<name>/<source>"): watching a key again replaces it;
  // unwatch_projection forgets it (a slice that moved to another node).
  void watch_projection(std::function<ProjectionStatus()> status);
  template <class Handler>
  void watch_projection(Projection<Handler> p) {
    watch_projection([p] { return p.status(); });
  }
  void unwatch_projection(std::string_view key);
  // Runs a sliced projection: on a single node every slice here; in a
  // cluster each slice on one node, placed like worker units (the group
  // "projections/<name>", rebalanced by POST /rebalance, moved on a drain
  // or a node's death). Each running slice is watched (watch_projection)
  // while it runs here. invalid_argument for a bad name, no or repeated
  // slices, a name served already; a single node's first start error.
  // Not thread-safe: call during start-up, like serve_entities.
  Result<void> serve_projection(ProjectionSlices projection);

  // The application is serving: /ready answers 200 from now on (until a drain).
  void mark_ready();
  // Graceful leave: /ready turns 503, shards are handed to the other nodes
  // (cluster) and entity types stop, processing entities finishing their
  // episode (E6). Idempotent; later calls return the first outcome.
  Result<void> drain();
  // Reads the cluster's TLS files again ([cluster.tls]): new connections
  // use them, established ones stay up. SIGHUP during wait_for_stop_signal()
  // calls it; a change of the files is noticed within seconds anyway.
  // Errors: invalid_argument without [cluster] or TLS, or unusable files
  // (the old ones stay in use).
  Result<void> reload_tls();
  // Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and so in every thread
  // it starts afterwards. A program calls it first thing in main(), before
  // Node::start creates threads: a signal must reach wait_for_stop_signal,
  // not kill the process in some worker thread that left it unblocked.
  static void block_stop_signals();
  // Blocks until SIGINT or SIGTERM (or a POST /drain), then drains (SIGHUP
  // meanwhile reloads the TLS files): /ready
  // answers 503 at once, both ports go on serving for config.drain_grace,
  // then drain(). One line on stderr when the drain starts and one when it
  // is done. Call from the main thread after block_stop_signals().
  void wait_for_stop_signal();
  // Asks wait_for_stop_signal() to return (as a signal would).
  void request_stop();

  ActorSystem& system() noexcept { return *system_; }
  const std::shared_ptr<Journal>& journal() const noexcept { return journal_; }
  cluster::Cluster* cluster() noexcept { return cluster_.get(); }
  const NodeConfig& config() const noexcept { return config_; }
  Metrics& metrics() noexcept { return *metrics_; }
  std::uint16_t admin_port() const noexcept;
  bool ready() const noexcept;
  bool draining() const noexcept;

  // JSON documents the admin API serves (exposed for tests and tools).
  // Their "workers" (the worker groups' units) are the last bulk read from
  // Redis; the admin routes read anew first when it is over a second old.
  nlohmann::json overview() const;
  nlohmann::json cluster_view() const;
  // troupe's version: the CMake project's, compiled in.
  static std::string_view version() noexcept;
  // GET /health's body: "status" ("ok", or "unhealthy" while any watched
  // check fails), "node", and "services": each watched service by name,
  // {"up": true} or {"up": false, "code": ..., "message": ...}.
  nlohmann::json health() const;

  struct Impl;

 private:
  explicit Node(NodeConfig config);
  void add_entity_type(EntityTypeView view);

  NodeConfig config_;
  std::unique_ptr<ActorSystem> system_;
  std::shared_ptr<Journal> journal_;
  std::unique_ptr<cluster::Cluster> cluster_;
  std::shared_ptr<Metrics> metrics_;
  std::vector<std::function<void()>> stoppers_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::node
