// The node's sampler thread: once a second it turns running totals into
// the dashboard's series (rates, latency quantiles), sends this node's load
// to the other members, and reads the cluster's shard map from Redis (one
// bulk read per entity type).

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "node_impl.hpp"
#include "troupe/cluster/cluster_jobs.hpp"

namespace troupe::node {

namespace {

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

}  // namespace

void Node::Impl::run_sampler() {
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
  t_ms.push_back(detail::wall_ms());
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
  load.admin = (node->config_.admin.tls() ? "https://" : "http://") + node->config_.admin.host + ":" + std::to_string(node->admin_port());
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
    (void)c->remoting().remote<NodeLoad>(m.id, detail::kLoadInbox, load_codec).tell(load);
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
  // One bulk read per type (doc/redis.md, "Bulk reads"), all sent before
  // the first is awaited: a round trip per type, not per shard.
  std::vector<Future<std::vector<cluster::Assignment>>> reads;
  for (const auto& t : ts) reads.push_back(c->coordinator().placements(cluster::detail::shard_group(t.type)));
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (!reads[i].wait_for(std::chrono::seconds(2))) continue;
    auto placed = reads[i].get();
    if (!placed.ok()) continue;
    std::vector<std::pair<std::uint32_t, const cluster::Assignment*>> shards;
    for (const auto& a : *placed) {
      std::uint32_t s = 0;
      auto [end, ec] = std::from_chars(a.unit.data(), a.unit.data() + a.unit.size(), s);
      if (ec == std::errc() && end == a.unit.data() + a.unit.size() && s < ts[i].shard_count) shards.emplace_back(s, &a);
    }
    std::sort(shards.begin(), shards.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [s, a] : shards)
      map.push_back({{"type", ts[i].type}, {"shard", s}, {"owner", a->owner}, {"epoch", a->epoch}});
  }
  std::lock_guard lk(mu);
  shard_map = std::move(map);
}

}  // namespace troupe::node
