// The node's worker groups at run time: hosts served through the
// coordinator's Reconciler, the syncs of manager nodes, and the state the
// admin API shows (src/node/worker_groups.hpp; routes in
// worker_groups_routes.cpp).

#include "worker_groups.hpp"

#include <algorithm>

#include "node_impl.hpp"

namespace troupe::node {

std::vector<std::string> WorkerTypes::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : types_) out.push_back(name);
  return out;
}

std::shared_ptr<const detail::WorkerTypeEntry> WorkerTypes::find(std::string_view name) const {
  auto it = types_.find(name);
  return it == types_.end() ? nullptr : it->second;
}

Result<void> WorkerTypes::check_new_name(const std::string& name) const {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                c == '_' || c == '-');
  if (!ok)
    return Error(ErrorCode::invalid_argument, "worker type \"" + name + "\": 1 to 64 of A-Z a-z 0-9 . _ -");
  if (contains(name))
    return Error(ErrorCode::invalid_argument, "worker type \"" + name + "\" is registered already");
  return {};
}

namespace detail {

namespace {

// A periodic nudge to sync one group.
struct SyncTick {
  std::string group;
};

bool has_any(const std::vector<std::string>& mine, const std::vector<std::string>& wanted) {
  for (const auto& w : wanted)
    if (std::find(mine.begin(), mine.end(), w) != mine.end()) return true;
  return false;
}

json report_json(const cluster::SyncReport& r) {
  json failed = json::array();
  for (const auto& [unit, e] : r.failed)
    failed.push_back({{"unit", unit}, {"code", to_string(e.code())}, {"message", e.message()}});
  return {{"desired", r.desired}, {"assigned", r.assigned},   {"unassigned", r.unassigned},
          {"updated", r.updated}, {"unchanged", r.unchanged}, {"failed", std::move(failed)}};
}

json error_json(const Error& e) { return {{"code", to_string(e.code())}, {"message", e.message()}}; }

}  // namespace

struct WorkerGroups::Shared {
  std::string node_id;
  std::vector<std::string> roles;
  Duration stop_timeout{};
  WorkerTypes types;
  std::vector<std::shared_ptr<WorkerGroupState>> groups;
  std::atomic<bool> fenced{false};
  std::atomic<bool> started{false};  // the coordinator's start-up has finished

  mutable std::mutex mu;  // guards the two below
  cluster::Coordinator* coordinator = nullptr;
  ActorRef<SyncTick> ticker;

  std::shared_ptr<WorkerGroupState> find(const std::string& group) const {
    for (const auto& g : groups)
      if (g->config.group == group) return g;
    return nullptr;
  }

  void log(bool error, const std::string& text) const {
    if (error) {
      log::error(log::Component::node, text);
    } else {
      log::warn(log::Component::node, text);
    }
  }

  // Asks the coordinator for a sync round of `g` now; `done` gets its report.
  void round(const std::shared_ptr<WorkerGroupState>& g,
             std::function<void(Result<cluster::SyncReport>)> done) {
    Future<cluster::SyncReport> f = [&]() -> Future<cluster::SyncReport> {
      std::lock_guard lk(mu);
      if (!coordinator) {
        Promise<cluster::SyncReport> p;
        p.set_error(Error(ErrorCode::shutting_down, "the node is stopping: no more syncs"));
        return p.future();
      }
      {
        std::lock_guard glk(g->mu);
        g->syncing = true;
      }
      // One round: the node times them (the ticker for file and http
      // sources, each POST for a webhook), so a webhook's set is never
      // re-applied by a manager that was posted an older one.
      return coordinator->sync(g->config.group, g->source, /*periodic=*/false);
    }();
    std::move(f).then([g, done = std::move(done)](Result<cluster::SyncReport> r) {
      {
        std::lock_guard lk(g->mu);
        g->last_sync_ms = wall_ms();
        g->last_sync = r;
      }
      if (done) done(std::move(r));
    });
  }
};

namespace {

// Sends each synced file or http group a SyncTick every sync_interval.
class SyncTicker final : public Actor<SyncTick> {
 public:
  SyncTicker(std::weak_ptr<WorkerGroups::Shared> shared, std::vector<std::pair<std::string, Duration>> every)
      : shared_(std::move(shared)), every_(std::move(every)) {}
  void on_start() {
    for (const auto& [group, d] : every_) (void)start_periodic_timer("sync/" + group, d, SyncTick{group});
  }
  void receive(SyncTick& t);

 private:
  std::weak_ptr<WorkerGroups::Shared> shared_;
  std::vector<std::pair<std::string, Duration>> every_;
};

}  // namespace

// Out of line: Shared is complete only here.
void SyncTicker::receive(SyncTick& t) {
  auto s = shared_.lock();
  if (!s) return;
  if (auto g = s->find(t.group)) s->round(g, {});
}

WorkerGroups::WorkerGroups(const NodeConfig& config, WorkerTypes types)
    : shared_(std::make_shared<Shared>()) {
  shared_->node_id = config.id;
  shared_->roles = config.roles;
  shared_->stop_timeout = config.entities.stop_timeout;
  shared_->types = std::move(types);
  // A node that declares no roles is a manager: when no node declares
  // any, every node syncs.
  manager_ = config.roles.empty() || has_any(config.roles, {"manager"});
  for (const auto& gc : config.workers) {
    auto g = std::make_shared<WorkerGroupState>();
    g->config = gc;
    g->served = gc.roles.empty() || has_any(config.roles, gc.roles);
    g->synced = manager_;
    shared_->groups.push_back(std::move(g));
  }
}

WorkerGroups::~WorkerGroups() { stop(); }

Result<void> WorkerGroups::check_types(const NodeConfig& config, const WorkerTypes& types) {
  for (const auto& g : config.workers) {
    if (types.contains(g.type)) continue;
    std::string known;
    for (const auto& n : types.names()) known += (known.empty() ? "" : ", ") + n;
    return Error(ErrorCode::invalid_argument,
                 "workers[group=" + g.group + "].type: no worker type \"" + g.type +
                     "\" is registered (registered: " + (known.empty() ? "none" : known) + ")");
  }
  return {};
}

std::size_t WorkerGroups::max_body_bytes() const noexcept {
  std::size_t m = 0;
  for (const auto& g : shared_->groups) m = std::max(m, g->config.max_body_bytes);
  return m;
}

void WorkerGroups::prepare(cluster::ClusterSettings& cs) {
  // A fenced node must stop its workers before anyone may take their units
  // over (threshold + margin): no waiting for busy workers then.
  std::weak_ptr<Shared> weak = shared_;
  auto user_fenced = std::move(cs.coordination.on_fenced);
  cs.coordination.on_fenced = [weak, user_fenced] {
    if (auto s = weak.lock()) {
      s->fenced.store(true);
      // Workers already told to stop (a move, a drain) stop now too: their
      // units may be taken over threshold + margin after the lease ran out.
      for (const auto& g : s->groups) {
        std::shared_ptr<WorkerHostRef> host;
        {
          std::lock_guard lk(g->mu);
          host = g->host;
        }
        if (host) host->fenced();
      }
    }
    if (user_fenced) user_fenced();
  };
  auto user_unfenced = std::move(cs.coordination.on_unfenced);
  cs.coordination.on_unfenced = [weak, user_unfenced] {
    if (auto s = weak.lock()) s->fenced.store(false);
    if (user_unfenced) user_unfenced();
  };
  // Placement gives a group that names roles only to members holding one
  // (the node's roles go to the cluster with its other settings).
  for (const auto& g : shared_->groups) cs.coordination.group_roles[g->config.group] = g->config.roles;
}

Result<void> WorkerGroups::start(ActorSystem& system, cluster::Coordinator& coordinator) {
  std::vector<std::pair<std::string, Duration>> ticks;
  for (const auto& g : shared_->groups) {
    const auto& src = g->config.source;
    if (src.rfind("file:", 0) == 0) {
      g->source = cluster::from_file(src.substr(5));
    } else if (src.rfind("http://", 0) == 0) {
      g->source = cluster::from_http(src, g->config.source_timeout);
    } else {
      // Weak: the group owns its source.
      g->source = [wg = std::weak_ptr<WorkerGroupState>(g)]() -> Result<cluster::DesiredSet> {
        auto gs = wg.lock();
        if (!gs) return Error(ErrorCode::shutting_down, "the node is stopping");
        std::lock_guard lk(gs->mu);
        if (!gs->posted) return Error(ErrorCode::not_ready, "no desired set was posted to this node yet");
        return *gs->posted;
      };
    }
    if (!g->served) continue;
    auto entry = shared_->types.find(g->config.type);
    WorkerHostSettings hs;
    hs.group = g->config.group;
    hs.stop_timeout = shared_->stop_timeout;
    std::weak_ptr<Shared> weak = shared_;
    // Weak: the group owns the host, whose actor owns this function.
    hs.log = [weak, wg = std::weak_ptr<WorkerGroupState>(g)](bool error, const std::string& text) {
      if (auto gs = wg.lock(); gs && error) gs->worker_errors.fetch_add(1);
      if (auto s = weak.lock()) s->log(error, text);
    };
    std::shared_ptr<WorkerHostRef> host = entry->spawn_host(system, std::move(hs));
    {
      std::lock_guard lk(g->mu);  // the fencing hook reads it on the coordinator thread
      g->host = host;
    }
    cluster::Reconciler rec;
    rec.start = [host](const std::string& unit, const std::string& spec, std::uint64_t epoch) {
      host->start(unit, spec, epoch);
    };
    rec.update = [host](const std::string& unit, const std::string& spec, std::uint64_t epoch) {
      host->update(unit, spec, epoch);
    };
    rec.stop = [host, weak](const std::string& unit) {
      auto s = weak.lock();
      return host->stop(unit, !s || s->fenced.load());
    };
    if (auto r = coordinator.serve(g->config.group, std::move(rec)); !r.ok())
      return Error(r.error().code(), "workers[group=" + g->config.group + "]: " + r.error().message());
  }
  {
    std::lock_guard lk(shared_->mu);
    shared_->coordinator = &coordinator;
  }
  coordinator.started().then([weak = std::weak_ptr<Shared>(shared_)](Result<void> r) {
    if (auto s = weak.lock(); s && r.ok()) s->started.store(true);
  });
  for (const auto& g : shared_->groups) {
    if (!g->synced || g->config.source == "webhook") continue;
    shared_->round(g, {});
    ticks.emplace_back(g->config.group, g->config.sync_interval);
  }
  if (!ticks.empty()) {
    auto ticker = system.spawn<SyncTicker>(SpawnOptions{.name = "workers/sync"},
                                           std::weak_ptr<Shared>(shared_), std::move(ticks));
    std::lock_guard lk(shared_->mu);
    shared_->ticker = ticker;
  }
  return {};
}

void WorkerGroups::stop() {
  std::lock_guard lk(shared_->mu);
  shared_->coordinator = nullptr;
  shared_->ticker.stop();
  shared_->ticker = {};
}

std::optional<json> WorkerGroups::view(const std::string* group) const {
  const Shared& s = *shared_;
  json doc = {{"node", s.node_id}, {"roles", s.roles}, {"manager", manager_}};
  {
    std::lock_guard lk(s.mu);
    if (s.coordinator) {
      auto first = s.coordinator->is_first_manager();
      if (first.ok()) {
        doc["is_first_manager"] = *first;
      } else if (first.error().code() == ErrorCode::not_ready) {
        doc["is_first_manager"] = "not_ready";
      } else {
        doc["is_first_manager"] = error_json(first.error());
      }
    } else {
      doc["is_first_manager"] = "not_ready";
    }
  }
  doc["started"] = s.started.load();
  json groups = json::array();
  for (const auto& g : s.groups) {
    if (group && g->config.group != *group) continue;
    const auto& c = g->config;
    json j = {{"group", c.group},         {"type", c.type},
              {"source", c.source},       {"sync_interval_ms", c.sync_interval.count()},
              {"roles", c.roles},         {"served_here", g->served},
              {"synced_here", g->synced}, {"worker_errors", g->worker_errors.load()}};
    if (c.source == "webhook") j["max_body_bytes"] = c.max_body_bytes;
    std::map<std::string, std::uint64_t> running;
    {
      std::lock_guard lk(s.mu);
      if (s.coordinator && g->served) running = s.coordinator->running(c.group);
    }
    j["running_here"] = running.size();
    if (group) j["units"] = running;
    {
      std::lock_guard lk(g->mu);
      if (!g->last_sync) {
        j["last_sync"] = nullptr;
      } else if (g->last_sync->ok()) {
        j["last_sync"] = {{"at_ms", g->last_sync_ms}, {"report", report_json(**g->last_sync)}};
      } else {
        j["last_sync"] = {{"at_ms", g->last_sync_ms}, {"error", error_json(g->last_sync->error())}};
      }
    }
    groups.push_back(std::move(j));
  }
  if (group) {
    if (groups.empty()) return std::nullopt;
    json one = std::move(groups[0]);
    for (auto& [k, v] : doc.items()) one[k] = v;
    return one;
  }
  doc["groups"] = std::move(groups);
  return doc;
}

void WorkerGroups::sync_now(const std::string& group, const std::string& body,
                            std::function<void(int, json)> done) {
  auto fail = [&](int status, std::string code, std::string message) {
    done(status, {{"group", group}, {"error", {{"code", std::move(code)}, {"message", std::move(message)}}}});
  };
  auto g = shared_->find(group);
  if (!g) return fail(404, "not_found", "no worker group '" + group + "' is configured on this node");
  if (!manager_) {
    std::string roles;
    for (const auto& r : shared_->roles) roles += (roles.empty() ? "" : ", ") + r;
    return fail(409, "not_manager",
                "node '" + shared_->node_id + "' is not a manager (its roles: " + roles +
                    "): only nodes with the role \"manager\" sync worker groups; send this to one of them");
  }
  if (g->config.source == "webhook") {
    if (body.size() > g->config.max_body_bytes)
      return fail(413, "payload_too_large",
                  "the body has " + std::to_string(body.size()) + " bytes; group '" + group +
                      "' takes at most " + std::to_string(g->config.max_body_bytes) +
                      " (workers max_body_bytes)");
    auto set = cluster::parse_desired_set(body, "POST /workers/" + group + "/sync");
    if (!set.ok()) return fail(400, std::string(to_string(set.error().code())), set.error().message());
    std::lock_guard lk(g->mu);
    g->posted = std::move(*set);
  } else if (body.find_first_not_of(" \t\r\n") != std::string::npos) {
    return fail(400, "invalid_argument",
                "group '" + group + "' reads its units from " + g->config.source +
                    ": POST an empty body to read it now (a body is for source = \"webhook\")");
  }
  shared_->round(g, [group, done = std::move(done)](Result<cluster::SyncReport> r) {
    if (r.ok()) return done(200, {{"group", group}, {"report", report_json(*r)}});
    auto code = r.error().code();
    int status = code == ErrorCode::shutting_down || code == ErrorCode::coordination_failed ||
                         code == ErrorCode::not_ready
                     ? 503
                 : code == ErrorCode::timeout ? 504
                                              : 502;
    done(status, {{"group", group}, {"error", error_json(r.error())}});
  });
}

}  // namespace detail

}  // namespace troupe::node
