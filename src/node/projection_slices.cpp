// Node::serve_projection: a projection's slices run here (a single node) or
// placed across the cluster as the units of the group
// "projections/<name>", one owner each (doc/node.md, "Projections").

#include <set>

#include "node_impl.hpp"
#include "troupe/cluster/placement_source.hpp"

namespace troupe::node {

namespace {

// The slices of one projection running on this node, shared by the
// reconciler's callbacks (coordinator thread). Thread-safe (mu).
struct SliceHost {
  std::string name;
  std::function<Result<RunningSlice>(const std::string&)> start;
  std::mutex mu;
  std::map<std::string, std::pair<std::string, RunningSlice>> running;  // slice -> (status key, slice)
};

Result<void> validate(const ProjectionSlices& p) {
  auto bad = [&](std::string why) {
    return Error(ErrorCode::invalid_argument, "projection '" + p.name + "': " + std::move(why));
  };
  if (p.name.empty() || p.name.size() > 100) return bad("a name is 1 to 100 characters");
  for (char c : p.name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-')
      return bad("a name holds only A-Z a-z 0-9 . _ -");
  if (p.slices.empty() || p.slices.size() > 4096) return bad("1 to 4096 slices");
  std::set<std::string> seen;
  for (const auto& s : p.slices) {
    if (auto r = cluster::validate_unit(s); !r.ok()) return bad("slice '" + s + "': " + r.error().message());
    if (!seen.insert(s).second) return bad("slice '" + s + "' is named twice");
  }
  if (!p.start) return bad("no start function");
  return {};
}

}  // namespace

Result<void> Node::serve_projection(ProjectionSlices p) {
  if (auto r = validate(p); !r.ok()) return r;
  const std::string group = "projections/" + p.name;
  {
    std::lock_guard lk(impl_->mu);
    for (const auto& g : impl_->projection_groups)
      if (g == group) return Error(ErrorCode::invalid_argument, "projection '" + p.name + "' is served already");
  }
  auto host = std::make_shared<SliceHost>();
  host->name = p.name;
  host->start = std::move(p.start);
  auto start_here = [this, host](const std::string& slice) -> Result<void> {
    auto r = host->start(slice);
    if (!r.ok()) {
      log::error(log::Component::node, "a projection's slice did not start",
                 {{"projection", host->name}, {"slice", slice}, {"error", r.error().to_string()}});
      return std::move(r).error();
    }
    std::string key = r->status().key;
    {
      std::lock_guard lk(host->mu);
      host->running[slice] = {key, *r};
    }
    watch_projection(r->status);
    return {};
  };
  auto stop_here = [this, host](const std::string& slice) {
    std::optional<std::pair<std::string, RunningSlice>> it;
    {
      std::lock_guard lk(host->mu);
      if (auto f = host->running.find(slice); f != host->running.end()) {
        it = std::move(f->second);
        host->running.erase(f);
      }
    }
    if (!it) return;
    unwatch_projection(it->first);
    it->second.stop();
  };

  if (!cluster_) {
    for (const auto& slice : p.slices) {
      if (auto r = start_here(slice); !r.ok()) {
        for (const auto& s : p.slices) stop_here(s);
        return Error(r.error().code(), "projection '" + p.name + "' slice '" + slice + "': " + r.error().message());
      }
    }
  } else {
    auto& co = cluster_->coordinator();
    if (!p.roles.empty()) {
      if (auto r = co.declare_roles(group, p.roles).get(); !r.ok())
        return Error(r.error().code(), "projection '" + p.name + "': " + r.error().message());
    }
    cluster::Reconciler rec;
    rec.start = [start_here](const std::string& slice, const std::string&, std::uint64_t) { (void)start_here(slice); };
    rec.update = [](const std::string&, const std::string&, std::uint64_t) {};
    // Done at once: the slice's last page here may still be committing
    // when its new owner starts it; the stored offset's compare-and-set
    // lets only one of the two move it (doc/node.md, "Projections").
    rec.stop = [stop_here](const std::string& slice) {
      stop_here(slice);
      Promise<void> done;
      done.set_value();
      return done.future();
    };
    if (auto r = co.serve(group, std::move(rec)); !r.ok())
      return Error(r.error().code(), "projection '" + p.name + "': " + r.error().message());
    cluster::DesiredSet desired;
    for (const auto& s : p.slices) desired[s] = p.name;
    // Every node syncs the same fixed set: the first places the slices,
    // the others find them placed.
    co.sync(group, [desired] { return Result<cluster::DesiredSet>(desired); }, true)
        .then([name = p.name](Result<cluster::SyncReport> r) {
          if (!r.ok()) {
            log::warn(log::Component::node, "placing a projection's slices failed; tried again at the next round",
                      {{"projection", name}, {"error", r.error().to_string()}});
            return;
          }
          for (const auto& [unit, e] : r->failed)
            log::warn(log::Component::node, "a projection's slice could not be placed",
                      {{"projection", name}, {"slice", unit}, {"error", e.to_string()}});
        });
  }
  std::lock_guard lk(impl_->mu);
  impl_->projection_groups.push_back(group);
  return {};
}

}  // namespace troupe::node
