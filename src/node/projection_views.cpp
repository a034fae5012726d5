// The projections an application watches (Node::watch_projection): their
// statuses as GET /projections, the overview and /health show them, and
// their /metrics families (doc/node.md, "Projections").

#include <algorithm>

#include "node_impl.hpp"

namespace troupe::node {

namespace {

// "<name>/<source>" split at its first '/' (a projection's name has none).
std::pair<std::string, std::string> split_key(const std::string& key) {
  auto slash = key.find('/');
  if (slash == std::string::npos) return {key, ""};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

constexpr ProjectionState kStates[] = {ProjectionState::running, ProjectionState::failed, ProjectionState::stopped};

}  // namespace

nlohmann::json detail::projection_json(const ProjectionStatus& s) {
  auto [name, source] = split_key(s.key);
  json failure = nullptr;
  if (s.failure) {
    const ProjectionFailure& f = *s.failure;
    failure = {{"persistence_id", f.persistence_id},
               {"seq", f.seq},
               {"offset", f.offset.to_string()},
               {"attempts", f.attempts},
               {"code", std::string(to_string(f.error.code()))},
               {"message", f.error.message()}};
  }
  return {{"key", s.key},
          {"name", name},
          {"source", source},
          {"state", std::string(to_string(s.state))},
          {"offset", s.offset ? json(s.offset->to_string()) : json(nullptr)},
          {"events_applied", s.events_applied},
          {"pages_applied", s.pages_applied},
          {"retries", s.retries},
          {"conflicts", s.conflicts},
          {"lag_ms", s.lag_ms},
          {"lag_bounds_ms", projection_lag_bounds_ms},
          {"lag_counts", s.lag_counts},
          {"lag_sum_ms", s.lag_sum_ms},
          {"caught_up", s.caught_up},
          {"failure", failure}};
}

void Node::watch_projection(std::function<ProjectionStatus()> status) {
  std::string key = status().key;
  std::lock_guard lk(impl_->mu);
  for (auto& [k, existing] : impl_->projections) {
    if (k == key) {
      existing = std::move(status);
      return;
    }
  }
  impl_->projections.emplace_back(std::move(key), std::move(status));
}

void Node::unwatch_projection(std::string_view key) {
  std::lock_guard lk(impl_->mu);
  std::erase_if(impl_->projections, [&](const auto& p) { return p.first == key; });
}

std::vector<ProjectionStatus> Node::Impl::projection_statuses() const {
  std::vector<std::pair<std::string, std::function<ProjectionStatus()>>> ps;
  {
    std::lock_guard lk(mu);
    ps = projections;
  }
  std::vector<ProjectionStatus> out;
  out.reserve(ps.size());
  for (const auto& [key, status] : ps) out.push_back(status());
  return out;
}

void Node::Impl::collect_projections(MetricsWriter& w, const Labels& node_label) const {
  auto statuses = projection_statuses();
  if (statuses.empty()) return;
  auto d = [](std::uint64_t v) { return static_cast<double>(v); };
  auto& lag = w.gauge("troupe_projection_lag_seconds",
                      "How far a projection is behind the journal: 0 when caught up, else the time from the newest "
                      "applied event's storing to its applying.");
  auto& state = w.gauge("troupe_projection_state", "1 for the projection's state (running, failed, stopped), 0 for the others.");
  auto& caught = w.gauge("troupe_projection_caught_up", "1 when the projection's last query found nothing newer.");
  auto& events = w.counter("troupe_projection_events_applied_total", "Events the projection applied to its read model since it started here.");
  auto& pages = w.counter("troupe_projection_pages_applied_total", "Transactions (pages of events) the projection committed since it started here.");
  auto& retries = w.counter("troupe_projection_retries_total", "Failed tries (handler, read model or journal) the projection tried again.");
  auto& conflicts = w.counter("troupe_projection_conflicts_total",
                              "Pages refused because another instance of the projection moved its offset first.");
  auto& event_lag = w.histogram("troupe_projection_event_lag_seconds",
                                "Each applied event's lag, from its storing to the commit of its page.");
  std::vector<double> bounds;
  for (auto b : projection_lag_bounds_ms) bounds.push_back(static_cast<double>(b) / 1000.0);
  for (const auto& s : statuses) {
    auto [name, source] = split_key(s.key);
    Labels l = node_label;
    l.emplace_back("projection", name);
    l.emplace_back("source", source);
    lag.set(l, static_cast<double>(s.lag_ms) / 1000.0);
    for (ProjectionState st : kStates) {
      Labels sl = l;
      sl.emplace_back("state", std::string(to_string(st)));
      state.set(sl, s.state == st ? 1 : 0);
    }
    caught.set(l, s.caught_up ? 1 : 0);
    events.set(l, d(s.events_applied));
    pages.set(l, d(s.pages_applied));
    retries.set(l, d(s.retries));
    conflicts.set(l, d(s.conflicts));
    std::vector<std::uint64_t> cumulative;
    std::uint64_t running = 0;
    for (auto c : s.lag_counts) cumulative.push_back(running += c);
    event_lag.observe(l, bounds, cumulative, static_cast<double>(s.lag_sum_ms) / 1000.0);
  }
}

}  // namespace troupe::node
