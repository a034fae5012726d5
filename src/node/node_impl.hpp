#pragma once
// Node::Impl, the node's state behind include/troupe/node/node.hpp, shared
// by the files that implement the node: node.cpp (start and stop),
// admin_routes.cpp, sampler.cpp, node_metrics.cpp, cluster_views.cpp,
// projection_views.cpp and watched_services.cpp, worker_groups*.cpp. Private to the node.
//
// Threads: the actor system's workers; the journal's; the cluster's
// (transport io, coordinator); the admin server's io thread, which runs
// every handler (handlers only read counters and answer at once, or start
// an ask whose completion answers from another thread); the rebalance
// worker, started by the first POST /rebalance, which runs one rebalance at
// a time; the coordinator's thread, which ends the worker map's reads from
// Redis and answers the requests that waited for them; and one sampler
// thread that once a second turns running totals into the dashboard's
// series and refreshes the cluster's shard map from Redis.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "load_wire.hpp"
#include "metered_journal.hpp"
#include "one_job_executor.hpp"
#include "troupe/core/log.hpp"
#include "troupe/node/node.hpp"
#include "worker_groups.hpp"

namespace troupe::node {

namespace detail {

using load_wire::NodeLoad;

// Milliseconds since the epoch, for the times the admin API shows.
inline std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The last load each member reported, with when it arrived. Thread-safe.
struct LoadBoard {
  std::mutex mu;
  std::map<std::string, std::pair<NodeLoad, Clock::time_point>> last;
};

// The remoting inbox every member receives the others' load reports on.
inline constexpr const char* kLoadInbox = "troupe.node.load";

// The worker map: the worker groups' units as last read from Redis (a
// bulk read per group), shared by the admin handlers and the read's
// completion on the coordinator thread. Thread-safe (mu).
struct WorkerMap {
  // How long a read answers every request: the dashboard polls once a
  // second, so this bounds the reads to about one a second per node.
  static constexpr std::chrono::milliseconds kFresh{1000};
  // The dashboard polls the overview once a second: it carries this many
  // units (the map's first, by group then unit) and the total; GET /cluster
  // carries them all.
  static constexpr std::size_t kOverviewUnits = 500;
  std::mutex mu;
  nlohmann::json units = nlohmann::json::array();  // {group, unit, owner, epoch, since[, handing_off_from]}
  std::string error;                               // the last read's failure; empty when it succeeded
  std::chrono::steady_clock::time_point read_at{};  // when the last read ended (epoch: never)
  bool reading = false;
  bool closed = false;  // the node is stopping: run no more waiters
  std::vector<std::function<void()>> waiters;  // to run when the read in flight ends
};

// One projection's status as GET /projections and the overview show it
// (projection_views.cpp).
nlohmann::json projection_json(const ProjectionStatus& s);

}  // namespace detail

using json = nlohmann::json;
using detail::Clock;
using detail::NodeLoad;

struct Node::Impl {
  Node* node = nullptr;
  Clock::time_point started = Clock::now();
  std::shared_ptr<detail::MeteredJournal> metered;
  std::unique_ptr<http::Server> admin;

  mutable std::mutex mu;  // guards everything below
  std::vector<EntityTypeView> types;
  std::vector<std::pair<std::string, KeyedLock>> locks;
  std::vector<std::pair<std::string, std::function<ProcessStats()>>> managers;
  std::vector<std::pair<std::string, JobService>> jobs;
  std::optional<OutboxDispatcher> outbox;  // start_outbox
  // Directory types of cluster-wide job queues ("jobs/<name>"): rebalanced
  // with the entity types.
  std::vector<std::string> job_queues;
  std::vector<std::pair<std::string, std::function<Result<void>()>>> health_checks;
  std::vector<std::pair<std::string, std::function<std::uint64_t()>>> rates;
  std::vector<std::pair<std::string, std::function<std::uint64_t()>>> counters;
  // watch_projection: (key, status), in the order watched.
  std::vector<std::pair<std::string, std::function<ProjectionStatus()>>> projections;
  // serve_projection's coordinator groups ("projections/<name>"): rebalanced
  // with the entity types.
  std::vector<std::string> projection_groups;
  std::string latency_name;
  std::shared_ptr<Histogram> latency;

  // The series: one point a second, the last kPoints.
  static constexpr std::size_t kPoints = 120;
  std::deque<std::int64_t> t_ms;
  std::map<std::string, std::deque<double>> rate_points;
  std::deque<double> p50, p99;
  std::map<std::string, std::uint64_t> last_totals;
  std::vector<std::uint64_t> last_latency;
  double messages_per_s = 0;
  // The cluster's shard map, refreshed by the sampler: (type, shard) -> (owner, epoch).
  json shard_map = json::array();
  // Members seen in the last sample, and how many have gone since start
  // (left or declared dead: a failover moves a dead member's shards).
  std::set<std::string> last_members;
  std::uint64_t members_departed = 0;
  // Members' load reports (cluster only).
  std::shared_ptr<detail::LoadBoard> loads = std::make_shared<detail::LoadBoard>();
  std::shared_ptr<const cluster::MessageCodecs<NodeLoad>> load_codec =
      std::make_shared<const cluster::MessageCodecs<NodeLoad>>(load_wire::load_codecs());

  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::once_flag drain_once;
  Result<void> drain_result;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop_requested = false;
  bool sampler_stop = false;
  std::thread sampler;
  detail::OneJobExecutor rebalancer;  // runs POST /rebalance, one at a time
  // The [[workers]] groups; null when the config declares none.
  std::unique_ptr<detail::WorkerGroups> workers;
  std::shared_ptr<detail::WorkerMap> worker_map = std::make_shared<detail::WorkerMap>();

  void push_point(std::deque<double>& d, double v) {
    d.push_back(v);
    while (d.size() > kPoints) d.pop_front();
  }

  // The sampler's round (sampler.cpp): the series, this node's load sent
  // to the other members, the shard map read from Redis.
  void sample();
  void report_load();
  void refresh_shard_map();
  // Every watched service's health, in the order watched. The checks run
  // without `mu` held (a check may take locks of its own).
  std::vector<std::pair<std::string, Result<void>>> check_health() const;
  void run_sampler();

  // Runs `k` once the worker map is fresh: at once from the cache, or when
  // a bulk read started now (or already in flight) ends, on the thread
  // that ends it. Never blocks (cluster_views.cpp).
  void with_worker_map(std::function<void()> k);
  // Puts the cached worker map into `doc`: "workers" (the first `limit`
  // units, by group then unit), "workers_total", and "workers_error" when
  // the last read failed (the units are then the last ones read). Alone:
  // no units (worker_map.cpp).
  void fill_workers(json& doc, std::size_t limit) const;

  http::Router routes();                 // admin_routes.cpp
  void add_worker_routes(http::Router& r);  // worker_groups_routes.cpp
  void collect(MetricsWriter& w) const;  // node_metrics.cpp
  // The watched projections' statuses, read without `mu` held, in the
  // order watched; and their /metrics families (projection_views.cpp).
  std::vector<ProjectionStatus> projection_statuses() const;
  void collect_projections(MetricsWriter& w, const Labels& node_label) const;
};

}  // namespace troupe::node
