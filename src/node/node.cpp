// troupe::node::Node: see include/troupe/node/node.hpp.
//
// Threads: the actor system's workers; the journal's; the cluster's
// (transport io, coordinator); the admin server's io thread, which runs
// every handler (handlers only read counters and answer at once, or start
// an ask whose completion answers from another thread); and one sampler
// thread that once a second turns running totals into the dashboard's
// series and refreshes the cluster's shard map from Redis.

#include "troupe/node/node.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "dashboard/assets.hpp"
#include "load_wire.hpp"
#include "troupe/cluster/cluster_jobs.hpp"

namespace troupe::node {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The q-quantile of the observations between two cumulative snapshots,
// interpolated linearly inside the bucket it falls in. NaN when empty.
double quantile_ms(const std::vector<double>& bounds, const std::vector<std::uint64_t>& before,
                   const std::vector<std::uint64_t>& after, double q) {
  std::uint64_t total = after.back() - (before.empty() ? 0 : before.back());
  if (total == 0) return std::nan("");
  double rank = q * static_cast<double>(total);
  std::uint64_t prev_cum = 0;
  for (std::size_t i = 0; i < after.size(); ++i) {
    std::uint64_t cum = after[i] - (before.empty() ? 0 : before[i]);
    if (static_cast<double>(cum) >= rank) {
      double lo = i == 0 ? 0.0 : bounds[i - 1];
      double hi = i < bounds.size() ? bounds[i] : bounds.back() * 2;
      std::uint64_t in = cum - prev_cum;
      double frac = in == 0 ? 1.0 : (rank - static_cast<double>(prev_cum)) / static_cast<double>(in);
      return (lo + (hi - lo) * std::clamp(frac, 0.0, 1.0)) * 1000.0;
    }
    prev_cum = cum;
  }
  return bounds.back() * 1000.0;
}

json number_or_null(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

// Counts and times the journal's appends for /metrics; forwards everything.
class MeteredJournal final : public ForwardingJournal {
 public:
  // What the appends add up to. Shared with their callbacks: the back end,
  // destroyed after this object's own members, may still complete appends.
  struct Meters {
    explicit Meters(std::shared_ptr<Histogram> l) : latency(std::move(l)) {}
    std::shared_ptr<Histogram> latency;
    std::atomic<std::uint64_t> events{0}, appends{0}, failures{0};
  };

  MeteredJournal(std::shared_ptr<Journal> inner, std::shared_ptr<Histogram> latency)
      : ForwardingJournal(std::move(inner)), meters_(std::make_shared<Meters>(std::move(latency))) {}

  void append(AppendBatch batch, Callback<void> done) override {
    meters_->events.fetch_add(batch.events.size(), std::memory_order_relaxed);
    meters_->appends.fetch_add(1, std::memory_order_relaxed);
    auto start = Clock::now();
    inner().append(std::move(batch), [m = meters_, start, done = std::move(done)](Result<void> r) mutable {
      m->latency->observe_seconds(std::chrono::duration<double>(Clock::now() - start).count());
      if (!r.ok()) m->failures.fetch_add(1, std::memory_order_relaxed);
      done(std::move(r));
    });
  }
  // Group commits of the back end, when it reports them: {transactions, events}.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> commits() const {
    const JournalStats st = journal_stats();
    if (!st.transactions || !st.events_written) return std::nullopt;
    return std::pair{*st.transactions, *st.events_written};
  }
  const Meters& meters() const noexcept { return *meters_; }

 private:
  std::shared_ptr<Meters> meters_;
};

// The load report between nodes: load_wire.hpp.
using load_wire::load_codecs;
using load_wire::NodeLoad;

// The last load each member reported, with when it arrived. Thread-safe.
struct LoadBoard {
  std::mutex mu;
  std::map<std::string, std::pair<NodeLoad, Clock::time_point>> last;
};

// Receives the members' load reports into the board.
class LoadReceiver final : public Actor<NodeLoad> {
 public:
  explicit LoadReceiver(std::shared_ptr<LoadBoard> board) : board_(std::move(board)) {}
  void receive(NodeLoad& m) {
    std::lock_guard lk(board_->mu);
    board_->last[m.node] = {m, Clock::now()};
  }

 private:
  std::shared_ptr<LoadBoard> board_;
};

constexpr const char* kLoadInbox = "troupe.node.load";

}  // namespace

struct Node::Impl {
  Node* node = nullptr;
  Clock::time_point started = Clock::now();
  std::shared_ptr<MeteredJournal> metered;
  std::unique_ptr<http::Server> admin;

  mutable std::mutex mu;  // guards everything below
  std::vector<EntityTypeView> types;
  std::vector<std::pair<std::string, KeyedLock>> locks;
  std::vector<std::pair<std::string, std::function<ProcessStats()>>> managers;
  std::vector<std::pair<std::string, JobService>> jobs;
  // Directory types of cluster-wide job queues ("jobs/<name>"): rebalanced
  // with the entity types.
  std::vector<std::string> job_queues;
  std::vector<std::pair<std::string, std::function<Result<void>()>>> health_checks;
  std::vector<std::pair<std::string, std::function<std::uint64_t()>>> rates;
  std::vector<std::pair<std::string, std::function<std::uint64_t()>>> counters;
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
  std::shared_ptr<LoadBoard> loads = std::make_shared<LoadBoard>();
  std::shared_ptr<const cluster::MessageCodecs<NodeLoad>> load_codec =
      std::make_shared<const cluster::MessageCodecs<NodeLoad>>(load_codecs());
  void report_load();

  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::once_flag drain_once;
  Result<void> drain_result;
  std::mutex stop_mu;
  std::condition_variable stop_cv;
  bool stop_requested = false;
  bool sampler_stop = false;
  std::thread sampler;
  std::vector<std::thread> rebalancers;  // under mu

  void push_point(std::deque<double>& d, double v) {
    d.push_back(v);
    while (d.size() > kPoints) d.pop_front();
  }

  void sample();
  void refresh_shard_map();
  // Every watched service's health, in the order watched. The checks run
  // without `mu` held (a check may take locks of its own).
  std::vector<std::pair<std::string, Result<void>>> check_health() const;
  void run_sampler() {
    std::unique_lock lk(stop_mu);
    while (!sampler_stop) {
      stop_cv.wait_for(lk, std::chrono::seconds(1), [&] { return sampler_stop; });
      if (sampler_stop) break;
      lk.unlock();
      sample();
      report_load();
      refresh_shard_map();
      lk.lock();
    }
  }

  http::Router routes();
  void collect(MetricsWriter& w) const;
};

void Node::Impl::sample() {
  auto sys = node->system_->stats();
  std::vector<std::pair<std::string, std::uint64_t>> totals;
  totals.emplace_back("messages", sys.messages_taken);
  std::vector<std::pair<std::string, std::function<std::uint64_t()>>> rs;
  std::vector<EntityTypeView> ts;
  std::shared_ptr<Histogram> lat;
  {
    std::lock_guard lk(mu);
    rs = rates;
    ts = types;
    lat = latency;
  }
  std::uint64_t events = 0;
  for (const auto& t : ts) events += t.stats().events_persisted;
  totals.emplace_back("events", events);
  for (const auto& [name, f] : rs) totals.emplace_back(name, f());
  std::vector<std::uint64_t> cum = lat ? lat->cumulative() : std::vector<std::uint64_t>{};

  std::lock_guard lk(mu);
  bool first = t_ms.empty() && last_totals.empty();
  for (const auto& [name, total] : totals) {
    auto it = last_totals.find(name);
    double rate = (it == last_totals.end() || total < it->second) ? 0.0 : static_cast<double>(total - it->second);
    last_totals[name] = total;
    if (!first) push_point(rate_points[name], rate);
    if (name == "messages") messages_per_s = rate;
  }
  if (first) {
    last_latency = cum;
    return;
  }
  t_ms.push_back(wall_ms());
  while (t_ms.size() > kPoints) t_ms.pop_front();
  // One latency point per time point, null (NaN) when nothing was observed,
  // so every series lines up with t_ms.
  if (lat && last_latency.size() == cum.size()) {
    push_point(p50, quantile_ms(lat->bounds(), last_latency, cum, 0.50));
    push_point(p99, quantile_ms(lat->bounds(), last_latency, cum, 0.99));
  } else {
    push_point(p50, std::nan(""));
    push_point(p99, std::nan(""));
  }
  last_latency = cum;
}

void Node::Impl::report_load() {
  auto* c = node->cluster_.get();
  if (!c) return;
  {
    std::set<std::string> now;
    for (const auto& m : c->coordinator().members()) now.insert(m.id);
    std::lock_guard lk(mu);
    for (const auto& id : last_members)
      if (!now.contains(id)) ++members_departed;
    last_members = std::move(now);
  }
  NodeLoad load;
  load.node = node->config_.id;
  load.admin = "http://" + node->config_.admin.host + ":" + std::to_string(node->admin_port());
  load.mailbox_depth = node->system_->stats().mailbox_depth;
  load.draining = draining.load();
  {
    std::lock_guard lk(mu);
    for (const auto& t : types) {
      load.shards += t.shards_hosted();
      load.entities_active += t.stats().active;
    }
    load.messages_per_s_milli = static_cast<std::uint64_t>(messages_per_s * 1000.0);
  }
  for (const auto& m : c->coordinator().members()) {
    if (m.id == load.node) continue;
    // One-way and best effort: a member that misses a report shows the
    // previous one, and none after a few seconds.
    (void)c->remoting().remote<NodeLoad>(m.id, kLoadInbox, load_codec).tell(load);
  }
}

void Node::Impl::refresh_shard_map() {
  auto* c = node->cluster_.get();
  if (!c) return;
  std::vector<EntityTypeView> ts;
  {
    std::lock_guard lk(mu);
    ts = types;
  }
  json map = json::array();
  for (const auto& t : ts) {
    std::vector<Future<std::optional<cluster::Assignment>>> asks;
    for (std::uint32_t s = 0; s < t.shard_count; ++s)
      asks.push_back(c->coordinator().assignment(cluster::detail::shard_group(t.type), std::to_string(s)));
    for (std::uint32_t s = 0; s < t.shard_count; ++s) {
      if (!asks[s].wait_for(std::chrono::seconds(2))) continue;
      auto a = asks[s].get();
      if (!a.ok() || !a->has_value()) continue;
      map.push_back({{"type", t.type}, {"shard", s}, {"owner", (*a)->owner}, {"epoch", (*a)->epoch}});
    }
  }
  std::lock_guard lk(mu);
  shard_map = std::move(map);
}

void Node::Impl::collect(MetricsWriter& w) const {
  const Labels node_label{{"node", node->config_.id}};
  auto sys = node->system_->stats();
  auto with = [&](Labels extra) {
    Labels l = node_label;
    l.insert(l.end(), extra.begin(), extra.end());
    return l;
  };
  auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  w.gauge("troupe_up", "1 while the node runs.").set(node_label, 1);
  w.gauge("troupe_ready", "1 while the node takes work (see /ready).").set(node_label, ready.load() ? 1 : 0);
  w.gauge("troupe_actors", "Actors alive.").set(node_label, d(sys.actors_live));
  w.gauge("troupe_mailbox_depth", "User messages waiting in mailboxes (or being handled).").set(node_label, d(sys.mailbox_depth));
  w.gauge("troupe_runnable_actors", "Actors with messages, waiting for a worker thread.").set(node_label, d(sys.runnable_actors));
  w.counter("troupe_messages_delivered_total", "User messages accepted into mailboxes.").set(node_label, d(sys.messages_delivered));
  w.counter("troupe_messages_processed_total", "User messages taken from mailboxes by their actors.").set(node_label, d(sys.messages_taken));
  w.counter("troupe_dead_letters_total", "Messages that found no live recipient.").set(node_label, d(sys.dead_letters));
  w.counter("troupe_mailbox_overflows_total", "Messages refused by a full bounded mailbox.").set(node_label, d(sys.mailbox_overflows));
  w.counter("troupe_handler_failures_total", "Message handlers that threw.").set(node_label, d(sys.handler_failures));
  w.gauge("troupe_timers_pending", "Timers waiting to fire.").set(node_label, d(sys.timers_pending));

  std::vector<EntityTypeView> ts;
  std::vector<std::pair<std::string, KeyedLock>> ls;
  std::vector<std::pair<std::string, std::function<ProcessStats()>>> ms;
  std::vector<std::pair<std::string, JobService>> js;
  {
    std::lock_guard lk(mu);
    ts = types;
    ls = locks;
    ms = managers;
    js = jobs;
  }
  for (const auto& t : ts) {
    auto st = t.stats();
    Labels l = with({{"type", t.type}});
    w.gauge("troupe_entities_active", "Entities in memory, per type.").set(l, d(st.active));
    w.counter("troupe_entities_passivated_total", "Entities passivated (left memory when idle), per type.").set(l, d(st.passivations));
    w.counter("troupe_entities_started_total", "Entity incarnations started, per type.").set(l, d(st.incarnations_started));
    w.gauge("troupe_entities_processing", "Entities in a processing episode now, per type.").set(l, d(t.processing_count()));
    w.counter("troupe_events_persisted_total", "Events stored, per entity type.").set(l, d(st.events_persisted));
    w.counter("troupe_processing_timeouts_total", "Processing deadlines handled, per type.").set(l, d(st.processing_timeouts));
    w.counter("troupe_stale_deadlines_total", "Deadlines of ended episodes, ignored, per type.").set(l, d(st.stale_deadlines));
    w.counter("troupe_entity_commands_failed_total", "Commands the runtime answered with an error, per type.").set(l, d(st.commands_failed));
    w.counter("troupe_journal_conflicts_total", "Appends refused because another writer holds the entity, per type.").set(l, d(st.journal_conflicts));
    w.gauge("troupe_shards_hosted", "Shards of the type hosted on this node.").set(l, d(t.shards_hosted()));
    w.counter("troupe_shards_started_total",
              "Shards of the type started on this node: at start, by a move or by a takeover from a dead member.")
        .set(l, d(t.shards_started()));
  }
  if (metered) {
    Labels l = with({{"backend", std::string(metered->name())}});
    w.counter("troupe_journal_appends_total", "Append calls (one entity's batch each).").set(l, d(metered->meters().appends.load()));
    w.counter("troupe_journal_events_total", "Events handed to the journal.").set(l, d(metered->meters().events.load()));
    w.counter("troupe_journal_append_failures_total", "Appends that failed.").set(l, d(metered->meters().failures.load()));
    if (auto c = metered->commits()) {
      w.counter("troupe_journal_transactions_total", "Write transactions committed (group commits).").set(l, d(c->first));
      w.counter("troupe_journal_transaction_events_total", "Events written by those transactions: over transactions, the batch size.").set(l, d(c->second));
    }
  }
  for (const auto& [name, lock] : ls) {
    auto st = lock.stats();
    Labels l = with({{"lock", name}});
    w.counter("troupe_lock_grants_total", "Keyed lock blocks started.").set(l, d(st.grants));
    w.counter("troupe_lock_waits_total", "Lock requests that queued behind a holder.").set(l, d(st.waits));
    w.counter("troupe_lock_acquire_timeouts_total", "Lock requests answered acquire_timeout.").set(l, d(st.acquire_timeouts));
    w.counter("troupe_lock_lease_expiries_total", "Lock holders that ran past their lease.").set(l, d(st.lease_expiries));
    w.gauge("troupe_lock_waiting", "Lock requests queued now.").set(l, d(st.waiting));
    w.gauge("troupe_lock_keys", "Keys with lock state now.").set(l, d(st.live_keys));
  }
  for (const auto& [name, f] : ms) {
    auto st = f();
    Labels l = with({{"manager", name}});
    w.gauge("troupe_process_running", "Processes running now.").set(l, d(st.running));
    w.gauge("troupe_process_buffered", "Requests waiting for a process slot.").set(l, d(st.buffered));
    w.counter("troupe_process_refused_total", "Requests refused at once (buffer full).").set(l, d(st.refused));
    w.counter("troupe_process_completed_total", "Processes that completed.").set(l, d(st.completed));
    w.counter("troupe_process_failed_total", "Processes that failed.").set(l, d(st.failed));
  }
  for (const auto& [name, service] : js) {
    auto st = service.stats();
    Labels l = with({{"service", name}});
    auto& depth = w.gauge("troupe_jobs_queued", "Jobs ready to run, per priority.");
    if (st.queued_by_priority.empty()) depth.set(with({{"service", name}, {"priority", "0"}}), 0);
    for (const auto& lv : st.queued_by_priority)
      depth.set(with({{"service", name}, {"priority", std::to_string(lv.priority)}}), d(lv.depth));
    w.gauge("troupe_jobs_active", "Worker slots running a job.").set(l, d(st.active));
    w.gauge("troupe_jobs_waiting_retry", "Jobs waiting out a back-off.").set(l, d(st.waiting_retry));
    auto& outcomes = w.counter("troupe_jobs_outcomes_total", "Jobs finished, by final outcome.");
    outcomes.set(with({{"service", name}, {"outcome", "succeeded"}}), d(st.succeeded));
    outcomes.set(with({{"service", name}, {"outcome", "failed"}}), d(st.failed));
    outcomes.set(with({{"service", name}, {"outcome", "timed_out"}}), d(st.timed_out));
    w.counter("troupe_jobs_retried_total", "Job attempts retried.").set(l, d(st.retried));
    w.counter("troupe_jobs_refused_total", "Jobs refused at submit (queue full).").set(l, d(st.refused));
  }
  auto health = check_health();
  if (!health.empty()) {
    auto& up = w.gauge("troupe_service_up", "1 while a watched service works, 0 while it reports a failure (see /health).");
    for (const auto& [name, r] : health) up.set(with({{"service", name}}), r.ok() ? 1 : 0);
  }
  if (auto* c = node->cluster_.get()) {
    auto members = c->coordinator().members();
    w.gauge("troupe_cluster_members", "Live members of the cluster, as this node sees them.").set(node_label, d(members.size()));
    w.gauge("troupe_cluster_fenced", "1 while this node has lost its lease.").set(node_label, c->coordinator().is_fenced() ? 1 : 0);
    std::uint64_t departed = 0;
    {
      std::lock_guard lk(mu);
      departed = members_departed;
    }
    w.counter("troupe_cluster_members_departed_total",
              "Members that left or were declared dead since this node started (each a failover or a drain).")
        .set(node_label, d(departed));
    std::map<std::string, std::uint64_t> per_owner;
    json map;
    {
      std::lock_guard lk(mu);
      map = shard_map;
    }
    for (const auto& m : members) per_owner[m.id] = 0;
    for (const auto& e : map) per_owner[e["owner"].get<std::string>()] += 1;
    auto& f = w.gauge("troupe_cluster_shards", "Shards per owner node, as last read from the placement store.");
    for (const auto& [owner, n] : per_owner) f.set(with({{"owner", owner}}), d(n));
  } else {
    w.gauge("troupe_cluster_members", "Live members of the cluster, as this node sees them.").set(node_label, 1);
  }
  std::uint64_t recoveries = 0;
  for (const auto& t : ts) recoveries += t.stats().recoveries;
  w.counter("troupe_entity_recoveries_total", "Entity recoveries completed (after passivation, restart or failover).").set(node_label, d(recoveries));
}

// --- the admin API -----------------------------------------------------------------

namespace {

http::Response json_response(int status, const json& j) { return http::Response::json(status, j.dump()); }

}  // namespace

http::Router Node::Impl::routes() {
  http::Router r;
  r.add("GET", "/health", [this](http::Request&, http::Responder out) {
    json doc = node->health();
    out.respond(json_response(doc["status"] == "ok" ? 200 : 503, doc));
  });
  r.add("GET", "/ready", [this](http::Request&, http::Responder out) {
    json checks = json::object();
    bool ok = ready.load() && !draining.load();
    checks["started"] = ready.load() ? "ok" : "starting";
    checks["draining"] = draining.load();
    if (auto* c = node->cluster_.get()) {
      bool fenced = c->coordinator().is_fenced();
      checks["cluster"] = fenced ? "fenced: the node lost its lease in Redis" : "ok";
      ok = ok && !fenced;
    }
    out.respond(json_response(ok ? 200 : 503, {{"ready", ok}, {"node", node->config_.id}, {"checks", checks}}));
  });
  r.add("GET", "/metrics", [this](http::Request&, http::Responder out) {
    http::Response resp;
    resp.content_type = "text/plain; version=0.0.4; charset=utf-8";
    resp.body = node->metrics_->scrape();
    out.respond(std::move(resp));
  });
  r.add("GET", "/cluster", [this](http::Request&, http::Responder out) {
    out.respond(json_response(200, node->cluster_view()));
  });
  r.add("GET", "/api/overview", [this](http::Request&, http::Responder out) {
    out.respond(json_response(200, node->overview()));
  });
  r.add("GET", "/entities/{type}/{id}", [this](http::Request& req, http::Responder out) {
    std::string type = req.params["type"];
    std::string id = req.params["id"];
    std::optional<EntityTypeView> view;
    {
      std::lock_guard lk(mu);
      for (const auto& t : types)
        if (t.type == type) view = t;
    }
    if (!view) {
      out.respond(http::Response::error(404, "not_found", "no entity type '" + type + "' on this node"));
      return;
    }
    if (id.empty()) {
      out.respond(http::Response::error(400, "invalid_argument", "empty entity id"));
      return;
    }
    json base = {{"type", type}, {"id", id}};
    if (auto p = view->processing_of(id)) {
      base["processing"] = {{"since_ms", p->since_ms}, {"deadline_ms", p->deadline_ms},
                            {"age_ms", std::max<std::int64_t>(0, wall_ms() - p->since_ms)}};
    } else {
      base["processing"] = nullptr;
    }
    if (!view->describe) {
      base["state"] = nullptr;
      out.respond(json_response(200, base));
      return;
    }
    auto shared = std::make_shared<http::Responder>(std::move(out));
    view->describe(id, [shared, base](Result<json> state) mutable {
      if (!state.ok()) {
        int status = state.error().code() == ErrorCode::invalid_argument ? 400
                     : state.error().message().find("not found") != std::string::npos ? 404
                                                                                        : 503;
        shared->respond(http::Response::error(status, std::string(to_string(state.error().code())), state.error().message()));
        return;
      }
      base["state"] = std::move(*state);
      shared->respond(json_response(200, base));
    });
  });
  r.add("POST", "/rebalance", [this](http::Request&, http::Responder out) {
    auto* c = node->cluster_.get();
    if (!c) {
      out.respond(http::Response::error(409, "not_clustered",
                                        "this node runs alone (no [cluster] in its config): there is nothing to rebalance"));
      return;
    }
    std::vector<std::string> names;
    {
      std::lock_guard lk(mu);
      for (const auto& t : types) names.push_back(t.type);
      names.insert(names.end(), job_queues.begin(), job_queues.end());
    }
    // rebalance_all waits on Redis: off the io thread, on a thread the
    // node joins before it stops the cluster.
    std::lock_guard lk(mu);
    rebalancers.emplace_back([c, names, out = std::move(out)]() mutable {
      json moves = json::array();
      for (const auto& type : names) {
        auto f = c->coordinator().rebalance_all(cluster::detail::shard_group(type));
        auto done = f.get();
        if (!done.ok()) {
          out.respond(http::Response::error(503, std::string(to_string(done.error().code())), done.error().message()));
          return;
        }
        for (const auto& m : *done)
          moves.push_back({{"type", type}, {"shard", m.unit}, {"from", m.from}, {"to", m.to}, {"epoch", m.epoch}});
      }
      out.respond(json_response(200, {{"moves", moves.size()}, {"moved", moves}}));
    });
  });
  r.add("POST", "/drain", [this](http::Request&, http::Responder out) {
    bool was = draining.exchange(true);
    out.respond(json_response(202, {{"node", node->config_.id}, {"draining", true}, {"already", was}}));
    if (!was) node->request_stop();
  });
  auto asset = [](http::Request& req, http::Responder out) {
    auto a = detail::dashboard_asset(req.path);
    if (!a) {
      out.respond(http::Response::error(404, "not_found", "no such page"));
      return;
    }
    http::Response resp;
    resp.content_type = std::string(a->content_type);
    resp.body = std::string(a->body);
    resp.headers.emplace_back("Cache-Control", "no-cache");
    out.respond(std::move(resp));
  };
  r.add("GET", "/", asset);
  r.add("GET", "/app.js", asset);
  r.add("GET", "/style.css", asset);
  return r;
}

// --- Node ----------------------------------------------------------------------------

Node::Node(NodeConfig config) : config_(std::move(config)), metrics_(std::make_shared<Metrics>()) {}

Result<std::unique_ptr<Node>> Node::start(NodeConfig config) {
  std::unique_ptr<Node> node(new Node(std::move(config)));
  node->impl_ = std::make_unique<Impl>();
  node->impl_->node = node.get();
  const NodeConfig& c = node->config_;

  std::error_code ec;
  std::filesystem::create_directories(c.data_dir, ec);
  if (ec) return Error(ErrorCode::invalid_argument, "node.data_dir: cannot create '" + c.data_dir.string() + "': " + ec.message());

  SystemConfig sc;
  sc.threads = c.threads;
  node->system_ = std::make_unique<ActorSystem>(sc);

  std::shared_ptr<Journal> inner;
  if (c.journal.backend == "sqlite") {
    SqliteJournalOptions o;
    o.path = c.sqlite_path().string();
    auto j = SqliteJournal::open(o);
    if (!j.ok()) return Error(j.error().code(), "journal.path: " + j.error().message());
    inner = std::move(*j);
  } else if (c.journal.backend == "postgres") {
    PostgresJournalOptions o;
    o.conninfo = c.journal.postgres;
    o.schema = c.journal.schema;
    if (c.journal.writer_connections != 0) o.writer_connections = c.journal.writer_connections;
    if (c.journal.reader_connections != 0) o.reader_connections = c.journal.reader_connections;
    // This process writes as the node's next incarnation: a previous process
    // of the same node that is still alive (paused, partitioned) can no
    // longer write what it did not fence otherwise (SPEC E9).
    o.owner = c.id;
    auto j = PostgresJournal::open(o);
    if (!j.ok()) return Error(j.error().code(), "journal.postgres: " + j.error().message());
    inner = std::move(*j);
  } else {
    inner = std::make_shared<MemoryJournal>();
  }
  auto append_latency = node->metrics_->histogram("troupe_journal_append_seconds",
                                                  "Time from an append to its durable acknowledgement.");
  node->impl_->metered = std::make_shared<MeteredJournal>(std::move(inner), std::move(append_latency));
  node->journal_ = node->impl_->metered;

  if (c.cluster.enabled) {
    cluster::ClusterSettings cs;
    cs.node_id = c.id;
    cs.listen_host = c.cluster.listen_host;
    cs.listen_port = c.cluster.listen_port;
    cs.advertise_host = c.cluster.advertise_host;
    cs.coordination.redis_host = c.cluster.redis_host;
    cs.coordination.redis_port = c.cluster.redis_port;
    cs.coordination.key_prefix = c.cluster.key_prefix;
    cs.coordination.heartbeat_interval = c.cluster.heartbeat;
    cs.coordination.liveness_threshold = c.cluster.liveness_threshold;
    cs.coordination.takeover_margin = c.cluster.takeover_margin;
    cs.coordination.epoch_floor = [journal = node->journal_] {
      auto h = journal_sync::highest_fence(*journal);
      return h.ok() ? *h : 0;
    };
    cs.start_timeout = std::max<Duration>(c.cluster.liveness_threshold + c.cluster.takeover_margin + std::chrono::seconds(5),
                                          std::chrono::seconds(10));
    auto cl = cluster::Cluster::start(*node->system_, cs);
    if (!cl.ok()) {
      node->system_->shutdown();
      return Error(cl.error().code(), "cluster.redis (" + c.cluster.redis_host + ":" + std::to_string(c.cluster.redis_port) +
                                          "): " + cl.error().message());
    }
    node->cluster_ = std::move(*cl);
    auto receiver = node->system_->spawn<LoadReceiver>(node->impl_->loads);
    auto published = node->cluster_->remoting().publish(kLoadInbox, receiver, load_codecs());
    if (!published.ok()) {
      node->cluster_.reset();
      node->system_->shutdown();
      return std::move(published).error();
    }
  }

  Impl* impl = node->impl_.get();
  node->metrics_->add_collector([impl](MetricsWriter& w) { impl->collect(w); });

  http::ServerSettings hs;
  hs.host = c.admin.host;
  hs.port = c.admin.port;
  auto server = http::Server::start(hs, impl->routes());
  if (!server.ok()) {
    node->cluster_.reset();
    node->system_->shutdown();
    return Error(server.error().code(), "admin.port: " + server.error().message());
  }
  impl->admin = std::move(*server);
  impl->sampler = std::thread([impl] { impl->run_sampler(); });
  return node;
}

Node::~Node() {
  if (!impl_) return;
  (void)drain();
  {
    std::lock_guard lk(impl_->stop_mu);
    impl_->sampler_stop = true;
  }
  impl_->stop_cv.notify_all();
  if (impl_->sampler.joinable()) impl_->sampler.join();
  if (impl_->admin) impl_->admin->stop();
  std::vector<std::thread> rebalancers;
  {
    std::lock_guard lk(impl_->mu);
    rebalancers.swap(impl_->rebalancers);
  }
  for (auto& t : rebalancers) t.join();
  cluster_.reset();
  if (system_) system_->shutdown();
  {
    std::lock_guard lk(impl_->mu);
    impl_->types.clear();
    impl_->locks.clear();
    impl_->managers.clear();
    impl_->jobs.clear();
    impl_->health_checks.clear();
    impl_->rates.clear();
    impl_->counters.clear();
  }
  stoppers_.clear();
  journal_.reset();
  impl_->metered.reset();
}

void Node::add_entity_type(EntityTypeView view) {
  std::lock_guard lk(impl_->mu);
  impl_->types.push_back(std::move(view));
}

void Node::watch_lock(std::string name, KeyedLock lock) {
  std::lock_guard lk(impl_->mu);
  impl_->locks.emplace_back(std::move(name), std::move(lock));
}
void Node::watch_process_manager(std::string name, std::function<ProcessStats()> stats) {
  std::lock_guard lk(impl_->mu);
  impl_->managers.emplace_back(std::move(name), std::move(stats));
}
void Node::watch_jobs(std::string name, JobService jobs) {
  watch_health("jobs/" + name, [jobs] { return jobs.health(); });
  std::lock_guard lk(impl_->mu);
  impl_->jobs.emplace_back(std::move(name), std::move(jobs));
}
void Node::watch_health(std::string service, std::function<Result<void>()> check) {
  std::lock_guard lk(impl_->mu);
  for (auto& [name, existing] : impl_->health_checks) {
    if (name == service) {
      existing = std::move(check);
      return;
    }
  }
  impl_->health_checks.emplace_back(std::move(service), std::move(check));
}

std::vector<std::pair<std::string, Result<void>>> Node::Impl::check_health() const {
  std::vector<std::pair<std::string, std::function<Result<void>()>>> checks;
  {
    std::lock_guard lk(mu);
    checks = health_checks;
  }
  std::vector<std::pair<std::string, Result<void>>> out;
  out.reserve(checks.size());
  for (auto& [name, check] : checks) {
    try {
      out.emplace_back(name, check());
    } catch (...) {
      out.emplace_back(name, Error::from_exception(std::current_exception(), "its health check threw"));
    }
  }
  return out;
}

nlohmann::json Node::health() const {
  bool up = true;
  json services = json::object();
  for (const auto& [name, r] : impl_->check_health()) {
    if (r.ok()) {
      services[name] = {{"up", true}};
      continue;
    }
    up = false;
    services[name] = {{"up", false}, {"code", std::string(to_string(r.error().code()))}, {"message", r.error().message()}};
  }
  return {{"status", up ? "ok" : "unhealthy"}, {"node", config_.id}, {"services", services}};
}

Result<JobService> Node::start_jobs(JobSettings settings, JobTranslator translator, JobWorkers workers) {
  if (settings.journal && settings.journal != journal_)
    return Error(ErrorCode::invalid_argument,
                 "job service '" + settings.name +
                     "': settings.journal: start_jobs runs the service on the node's journal; leave it empty");
  settings.journal = journal_;
  std::string name = settings.name;
  Result<JobService> started = [&]() -> Result<JobService> {
    if (!cluster_) return JobService::start(*system_, std::move(settings), std::move(translator), std::move(workers));
    cluster::ClusterJobSettings cs;
    cs.shard_count = config_.jobs.shard_count;
    return cluster::start_job_service(*system_, cluster_->remoting(), cluster_->directory(), std::move(settings),
                                      std::move(translator), std::move(workers), cs);
  }();
  if (!started.ok()) return started;
  if (cluster_) {
    // Runs in drain() after the cluster's leave, which has handed the
    // queue shards off: this stops the rest (routing, the keeper thread)
    // while the directory and remoting it uses still exist. The node
    // destroys the cluster before it shuts the actor system down, so the
    // service's own shutdown hook would come too late.
    stoppers_.push_back([service = *started] { (void)service.stop(); });
    // The first node up placed every queue shard on itself: a node that
    // joins takes its share now, so each node runs its own shards and
    // enqueues without a network hop. A moved shard is handed off (its
    // running jobs finish first, the rest wait in its log).
    const std::string type = cluster::job_queue_type(name);
    {
      std::lock_guard lk(impl_->mu);
      impl_->job_queues.push_back(type);
    }
    auto moved = cluster_->coordinator().rebalance_all(cluster::detail::shard_group(type));
    std::move(moved).then([id = config_.id, type](Result<std::vector<cluster::Move>> r) {
      if (!r.ok())
        std::fprintf(stderr, "troupe: node '%s': balancing the queue shards of '%s' failed: %s\n", id.c_str(),
                     type.c_str(), r.error().to_string().c_str());
    });
  }
  watch_jobs(name, *started);
  return started;
}
void Node::add_rate(std::string name, std::function<std::uint64_t()> total) {
  std::lock_guard lk(impl_->mu);
  impl_->rates.emplace_back(std::move(name), std::move(total));
}
void Node::set_latency(std::string name, std::shared_ptr<Histogram> histogram) {
  std::lock_guard lk(impl_->mu);
  impl_->latency_name = std::move(name);
  impl_->latency = std::move(histogram);
  impl_->last_latency.clear();
}
void Node::add_counter(std::string name, std::function<std::uint64_t()> value) {
  std::lock_guard lk(impl_->mu);
  impl_->counters.emplace_back(std::move(name), std::move(value));
}

void Node::mark_ready() { impl_->ready.store(true); }
bool Node::ready() const noexcept { return impl_->ready.load() && !impl_->draining.load(); }
bool Node::draining() const noexcept { return impl_->draining.load(); }
std::uint16_t Node::admin_port() const noexcept { return impl_->admin ? impl_->admin->port() : 0; }

Result<void> Node::drain() {
  std::call_once(impl_->drain_once, [this] {
    impl_->draining.store(true);
    if (cluster_) {
      auto r = cluster_->leave();
      if (!r.ok()) impl_->drain_result = std::move(r).error();
    }
    for (auto& stop : stoppers_) stop();
  });
  return impl_->drain_result;
}

void Node::request_stop() {
  {
    std::lock_guard lk(impl_->stop_mu);
    impl_->stop_requested = true;
  }
  impl_->stop_cv.notify_all();
}

namespace {
std::atomic<Node*> g_signalled_node{nullptr};
}  // namespace

void Node::block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void Node::wait_for_stop_signal() {
  // A thread takes the signals with sigwait (no handler), so it may take
  // the node's locks safely. They are blocked everywhere if the program
  // called block_stop_signals() before starting the node.
  block_stop_signals();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  g_signalled_node.store(this);
  std::thread waiter([set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (Node* n = g_signalled_node.load()) n->request_stop();
  });
  {
    std::unique_lock lk(impl_->stop_mu);
    impl_->stop_cv.wait(lk, [&] { return impl_->stop_requested; });
  }
  g_signalled_node.store(nullptr);
  (void)drain();
  // Wake the waiter if no signal came (a POST /drain).
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

nlohmann::json Node::cluster_view() const {
  json members = json::array();
  json workers = json::array();
  if (cluster_) {
    for (const auto& m : cluster_->coordinator().members()) {
      members.push_back({{"id", m.id},
                         {"address", m.address.host + ":" + std::to_string(m.address.port)},
                         {"alive", true},
                         {"self", m.id == config_.id},
                         {"heartbeat_age_ms", std::chrono::duration_cast<std::chrono::milliseconds>(m.heartbeat_age).count()}});
    }
  } else {
    members.push_back({{"id", config_.id}, {"address", nullptr}, {"alive", true}, {"self", true}});
  }
  json shards;
  {
    std::lock_guard lk(impl_->mu);
    if (cluster_) {
      shards = impl_->shard_map;
    } else {
      shards = json::array();
      for (const auto& t : impl_->types) shards.push_back({{"type", t.type}, {"shard", 0}, {"owner", config_.id}, {"epoch", 0}});
    }
    for (const auto& [name, service] : impl_->jobs) {
      // The worker slots running here: settings().workers for one node's
      // service; for a cluster-wide one, that many per queue shard hosted.
      const JobStats st = service.stats();
      for (std::uint64_t i = 0; i < st.active + st.idle; ++i)
        workers.push_back({{"group", "jobs/" + name}, {"unit", "worker-" + std::to_string(i)}, {"owner", config_.id}});
    }
  }
  return {{"node", config_.id},
          {"mode", cluster_ ? "cluster" : "single"},
          {"members", members},
          {"shards", shards},
          {"workers", workers}};
}

nlohmann::json Node::overview() const {
  json out = cluster_view();
  json h = health();
  out["health"] = {{"status", h["status"]}, {"services", h["services"]}};
  auto sys = system_->stats();
  out["version"] = "0.1.0";
  out["uptime_s"] = std::chrono::duration<double>(Clock::now() - impl_->started).count();
  out["time_ms"] = wall_ms();
  out["ready"] = ready();
  out["draining"] = draining();
  std::lock_guard lk(impl_->mu);
  std::uint64_t active = 0, hosted = 0;
  json types = json::array();
  std::vector<std::pair<std::string, ProcessingEntity>> processing;
  for (const auto& t : impl_->types) {
    auto st = t.stats();
    active += st.active;
    hosted += t.shards_hosted();
    types.push_back({{"type", t.type},
                     {"active", st.active},
                     {"passivations", st.passivations},
                     {"processing", t.processing_count()},
                     {"shards_hosted", t.shards_hosted()},
                     {"events_persisted", st.events_persisted}});
    for (auto& p : t.processing(20)) processing.emplace_back(t.type, std::move(p));
  }
  out["entity_types"] = types;
  std::sort(processing.begin(), processing.end(),
            [](const auto& a, const auto& b) { return a.second.since_ms < b.second.since_ms; });
  if (processing.size() > 20) processing.resize(20);
  json proc = json::array();
  auto now = wall_ms();
  for (const auto& [type, p] : processing)
    proc.push_back({{"type", type}, {"id", p.id}, {"since_ms", p.since_ms}, {"deadline_ms", p.deadline_ms},
                    {"age_ms", std::max<std::int64_t>(0, now - p.since_ms)}});
  out["processing"] = proc;
  std::map<std::string, std::pair<NodeLoad, Clock::time_point>> loads;
  {
    std::lock_guard lb(impl_->loads->mu);
    loads = impl_->loads->last;
  }
  for (auto& m : out["members"]) {
    if (!m["self"].get<bool>()) {
      auto it = loads.find(m["id"].get<std::string>());
      // A report older than a few seconds is not this member's load any more.
      if (it == loads.end() || Clock::now() - it->second.second > std::chrono::seconds(5)) {
        m["admin"] = it == loads.end() ? json(nullptr) : json(it->second.first.admin);
        m["shards"] = nullptr;
        m["entities_active"] = nullptr;
        m["mailbox_depth"] = nullptr;
        m["messages_per_s"] = nullptr;
        m["draining"] = false;
      } else {
        const auto& l = it->second.first;
        m["admin"] = l.admin;
        m["shards"] = l.shards;
        m["entities_active"] = l.entities_active;
        m["mailbox_depth"] = l.mailbox_depth;
        m["messages_per_s"] = static_cast<double>(l.messages_per_s_milli) / 1000.0;
        m["draining"] = l.draining;
      }
      continue;
    }
    m["admin"] = "http://" + config_.admin.host + ":" + std::to_string(admin_port());
    m["shards"] = hosted;
    m["entities_active"] = active;
    m["mailbox_depth"] = sys.mailbox_depth;
    m["messages_per_s"] = impl_->messages_per_s;
    m["draining"] = draining();
  }
  json counters = json::object();
  for (const auto& [name, f] : impl_->counters) counters[name] = f();
  out["counters"] = counters;
  json patterns = json::object();
  if (!impl_->locks.empty()) {
    LockStats sum;
    for (const auto& [n, l] : impl_->locks) {
      auto s = l.stats();
      sum.grants += s.grants;
      sum.waits += s.waits;
      sum.acquire_timeouts += s.acquire_timeouts;
      sum.lease_expiries += s.lease_expiries;
    }
    patterns["locks"] = {{"grants", sum.grants}, {"waits", sum.waits}, {"acquire_timeouts", sum.acquire_timeouts},
                         {"lease_expiries", sum.lease_expiries}};
  }
  if (!impl_->managers.empty()) {
    ProcessStats sum;
    for (const auto& [n, f] : impl_->managers) {
      auto s = f();
      sum.running += s.running;
      sum.buffered += s.buffered;
      sum.refused += s.refused;
    }
    patterns["process_manager"] = {{"running", sum.running}, {"buffered", sum.buffered}, {"refused", sum.refused}};
  }
  if (!impl_->jobs.empty()) {
    json levels = json::array();
    std::uint64_t queued = 0, act = 0, ok = 0, failed = 0, timed_out = 0;
    for (const auto& [n, j] : impl_->jobs) {
      auto s = j.stats();
      queued += s.queued;
      act += s.active;
      ok += s.succeeded;
      failed += s.failed;
      timed_out += s.timed_out;
      for (const auto& lv : s.queued_by_priority) levels.push_back({{"priority", lv.priority}, {"depth", lv.depth}});
    }
    patterns["jobs"] = {{"queued", queued}, {"active", act}, {"succeeded", ok}, {"failed", failed},
                        {"timed_out", timed_out}, {"queued_by_priority", levels}};
  }
  out["patterns"] = patterns;
  json rates = json::object();
  for (const auto& [name, d] : impl_->rate_points) rates[name] = json(std::vector<double>(d.begin(), d.end()));
  json p50 = json::array(), p99 = json::array();
  for (double v : impl_->p50) p50.push_back(number_or_null(v));
  for (double v : impl_->p99) p99.push_back(number_or_null(v));
  out["series"] = {{"interval_s", 1},
                   {"t_ms", std::vector<std::int64_t>(impl_->t_ms.begin(), impl_->t_ms.end())},
                   {"rates", rates},
                   {"latency_name", impl_->latency_name},
                   {"latency_ms", {{"p50", p50}, {"p99", p99}}}};
  return out;
}

}  // namespace troupe::node
