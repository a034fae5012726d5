// The node's views for people: GET /cluster (members, shard placement,
// the worker groups' units, this node's job workers) and GET
// /api/overview, the dashboard's one document (health, entity types,
// processing entities, members' loads, pattern totals and the sampled
// series).

#include <algorithm>
#include <cmath>
#include <limits>

#include "node_impl.hpp"
#include "troupe/version.hpp"

namespace troupe::node {

namespace {

json number_or_null(double v) { return std::isnan(v) ? json(nullptr) : json(v); }

}  // namespace

std::string_view Node::version() noexcept { return troupe::version(); }

nlohmann::json Node::cluster_view() const {
  json members = json::array();
  if (cluster_) {
    auto& coord = cluster_->coordinator();
    const bool fenced = coord.is_fenced();
    for (const auto& m : coord.members()) {
      // members() lists the members live at this node's last heartbeat;
      // one past the threshold there, or this node once it is fenced (its
      // own view is then no longer current), is not alive.
      const bool self = m.id == config_.id;
      const bool alive = m.heartbeat_age <= config_.cluster.liveness_threshold && !(self && fenced);
      members.push_back({{"id", m.id},
                         {"address", m.address.host + ":" + std::to_string(m.address.port)},
                         {"alive", alive},
                         {"self", self},
                         {"heartbeat_age_ms", std::chrono::duration_cast<std::chrono::milliseconds>(m.heartbeat_age).count()},
                         {"app_version", m.app_version}});
    }
  } else {
    members.push_back(
        {{"id", config_.id}, {"address", nullptr}, {"alive", true}, {"self", true}, {"app_version", config_.app_version}});
  }
  json shards;
  json job_workers = json::array();
  {
    std::lock_guard lk(impl_->mu);
    if (cluster_) {
      shards = impl_->shard_map;
    } else {
      shards = json::array();
      for (const auto& t : impl_->types) shards.push_back({{"type", t.type}, {"shard", 0}, {"owner", config_.id}, {"epoch", 0}});
    }
    for (const auto& [name, service] : impl_->jobs) {
      // The job service's worker slots running here: settings().workers for
      // one node's service; for a cluster-wide one, that many per queue
      // shard hosted. The service counts busy and free slots, not which:
      // the first `active` show as running.
      const JobStats st = service.stats();
      for (std::uint64_t i = 0; i < st.active + st.idle; ++i)
        job_workers.push_back({{"service", name},
                               {"slot", "worker-" + std::to_string(i)},
                               {"state", i < st.active ? "running" : "idle"},
                               {"owner", config_.id}});
    }
  }
  json out = {{"node", config_.id},
              {"mode", cluster_ ? "cluster" : "single"},
              {"time_ms", detail::wall_ms()},
              {"members", members},
              {"shards", shards},
              {"job_workers", job_workers}};
  impl_->fill_workers(out, std::numeric_limits<std::size_t>::max());
  return out;
}

nlohmann::json Node::overview() const {
  json out = cluster_view();
  impl_->fill_workers(out, detail::WorkerMap::kOverviewUnits);
  json h = health();
  out["health"] = {{"status", h["status"]}, {"services", h["services"]}};
  auto sys = system_->stats();
  out["version"] = version();
  out["uptime_s"] = std::chrono::duration<double>(Clock::now() - impl_->started).count();
  out["time_ms"] = detail::wall_ms();
  out["ready"] = ready();
  out["draining"] = draining();
  json projections = json::array();
  for (const auto& s : impl_->projection_statuses()) projections.push_back(detail::projection_json(s));
  out["projections"] = std::move(projections);
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
  auto now = detail::wall_ms();
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
    m["admin"] = (config_.admin.tls() ? "https://" : "http://") + config_.admin.host + ":" + std::to_string(admin_port());
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
