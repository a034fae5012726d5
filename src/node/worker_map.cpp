// The node's worker map: which member runs which unit of every worker
// group, read from Redis with the coordinator's bulk reads (the group
// names, then each worker group's placements, all sent at once) and cached
// for a second. Shard groups ("shards/<type>", entity types and cluster job
// queues) are left out: /cluster "shards" shows them.

#include "node_impl.hpp"
#include "troupe/cluster/detail/region_core.hpp"

namespace troupe::node {

namespace {

bool is_shard_group(const std::string& group) {
  static const std::string prefix = cluster::detail::shard_group("");
  return group.starts_with(prefix);
}

std::int64_t millis(WallTime t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// A read's end: the cache takes the units (or keeps the last ones and the
// error), and the requests that waited run, unless the node is stopping.
void finish_read(const std::shared_ptr<detail::WorkerMap>& map, std::optional<json> units, std::string error) {
  std::vector<std::function<void()>> waiting;
  {
    std::lock_guard lk(map->mu);
    if (units) map->units = std::move(*units);
    map->error = std::move(error);
    map->read_at = std::chrono::steady_clock::now();
    map->reading = false;
    waiting.swap(map->waiters);
    if (map->closed) return;
  }
  for (auto& k : waiting) k();
}

// The placements of several groups, gathered as their reads end (on the
// coordinator thread, in any order).
struct Gather {
  std::mutex mu;
  std::size_t left = 0;
  std::map<std::string, std::vector<cluster::Assignment>> by_group;
  std::string error;
};

json units_json(const std::map<std::string, std::vector<cluster::Assignment>>& by_group) {
  json units = json::array();
  for (const auto& [group, placed] : by_group)
    for (const auto& a : placed) {
      json u = {{"group", group}, {"unit", a.unit}, {"owner", a.owner}, {"epoch", a.epoch},
                {"since", millis(a.updated)}};
      if (!a.handing_off_from.empty()) u["handing_off_from"] = a.handing_off_from;
      units.push_back(std::move(u));
    }
  return units;
}

}  // namespace

void Node::Impl::with_worker_map(std::function<void()> k) {
  auto* c = node->cluster_.get();
  if (c == nullptr) return k();  // alone: no worker groups
  auto map = worker_map;
  {
    std::unique_lock lk(map->mu);
    if (map->closed) return;
    const bool fresh = map->read_at != std::chrono::steady_clock::time_point{} &&
                       std::chrono::steady_clock::now() - map->read_at < detail::WorkerMap::kFresh;
    if (fresh && !map->reading) {
      lk.unlock();
      return k();
    }
    map->waiters.push_back(std::move(k));
    if (map->reading) return;
    map->reading = true;
  }
  // Each reply ends on the coordinator thread, which outlives these
  // continuations (its destructor joins it), so they may hold it.
  cluster::Coordinator& coord = c->coordinator();
  coord.groups().then([map, &coord](Result<std::vector<std::string>> groups) {
    if (!groups.ok()) return finish_read(map, std::nullopt, groups.error().to_string());
    auto gather = std::make_shared<Gather>();
    std::vector<std::string> wanted;
    for (auto& g : *groups)
      if (!is_shard_group(g)) wanted.push_back(std::move(g));
    if (wanted.empty()) return finish_read(map, json::array(), "");
    gather->left = wanted.size();
    for (const auto& g : wanted) {
      coord.placements(g).then([map, gather, g](Result<std::vector<cluster::Assignment>> r) {
        {
          std::lock_guard lk(gather->mu);
          if (r.ok())
            gather->by_group[g] = std::move(*r);
          else if (gather->error.empty())
            gather->error = "group '" + g + "': " + r.error().to_string();
          if (--gather->left != 0) return;
        }
        if (!gather->error.empty()) return finish_read(map, std::nullopt, gather->error);
        finish_read(map, units_json(gather->by_group), "");
      });
    }
  });
}

void Node::Impl::fill_workers(json& doc, std::size_t limit) const {
  if (!node->cluster_) {
    doc["workers"] = json::array();
    doc["workers_total"] = 0;
    return;
  }
  auto& map = *worker_map;
  std::lock_guard lk(map.mu);
  const std::size_t total = map.units.size();
  if (total <= limit) {
    doc["workers"] = map.units;
  } else {
    doc["workers"] = json(std::vector<json>(map.units.begin(), map.units.begin() + static_cast<std::ptrdiff_t>(limit)));
  }
  doc["workers_total"] = total;
  if (!map.error.empty()) doc["workers_error"] = map.error;
}

}  // namespace troupe::node
