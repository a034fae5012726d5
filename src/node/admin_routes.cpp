// The node's admin API (doc/node.md, "Admin API"): the routes the admin server
// serves, from /health and /metrics to POST /rebalance and the dashboard's
// files. Handlers run on the server's io thread and answer at once, or
// answer later from an ask's completion or the rebalance worker.

#include <algorithm>
#include <limits>

#include "dashboard/assets.hpp"
#include "node_impl.hpp"
#include "troupe/cluster/cluster_jobs.hpp"

namespace troupe::node {

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
  // Both documents are built here, on this thread; the worker map in them
  // is refreshed from Redis first when the cached one is over a second old,
  // and the answer goes from that read's completion (never blocking here).
  r.add("GET", "/cluster", [this](http::Request&, http::Responder out) {
    auto doc = std::make_shared<json>(node->cluster_view());
    auto shared = std::make_shared<http::Responder>(std::move(out));
    with_worker_map([this, doc, shared] {
      fill_workers(*doc, std::numeric_limits<std::size_t>::max());
      shared->respond(json_response(200, *doc));
    });
  });
  r.add("GET", "/api/overview", [this](http::Request&, http::Responder out) {
    auto doc = std::make_shared<json>(node->overview());
    auto shared = std::make_shared<http::Responder>(std::move(out));
    with_worker_map([this, doc, shared] {
      fill_workers(*doc, detail::WorkerMap::kOverviewUnits);
      shared->respond(json_response(200, *doc));
    });
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
                            {"age_ms", std::max<std::int64_t>(0, detail::wall_ms() - p->since_ms)}};
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
  r.add("GET", "/projections", [this](http::Request&, http::Responder out) {
    json list = json::array();
    for (const auto& s : projection_statuses()) list.push_back(detail::projection_json(s));
    out.respond(json_response(200, {{"node", node->config_.id}, {"projections", list}}));
  });
  r.add("POST", "/rebalance", [this](http::Request&, http::Responder out) {
    auto* c = node->cluster_.get();
    if (!c) {
      out.respond(http::Response::error(409, "not_clustered",
                                        "this node runs alone (no [cluster] in its config): there is nothing to rebalance"));
      return;
    }
    // (the name a move is reported under, the coordinator's group)
    std::vector<std::pair<std::string, std::string>> names;
    {
      std::lock_guard lk(mu);
      for (const auto& t : types) names.emplace_back(t.type, cluster::detail::shard_group(t.type));
      for (const auto& q : job_queues) names.emplace_back(q, cluster::detail::shard_group(q));
      for (const auto& g : projection_groups) names.emplace_back(g, g);
    }
    for (const auto& g : node->config_.workers) names.emplace_back("workers/" + g.group, g.group);
    // rebalance_all waits on Redis: off the io thread, on the one worker
    // the node joins before it stops the cluster. The Responder moves into
    // the job only if the worker takes it; otherwise it answers here.
    auto shared = std::make_shared<http::Responder>(std::move(out));
    bool taken = rebalancer.try_run([c, names, shared] {
      json moves = json::array();
      for (const auto& [type, group] : names) {
        auto f = c->coordinator().rebalance(group);
        auto done = f.get();
        if (!done.ok()) {
          shared->respond(http::Response::error(503, std::string(to_string(done.error().code())), done.error().message()));
          return;
        }
        for (const auto& m : done->moves)
          moves.push_back({{"type", type}, {"shard", m.unit}, {"from", m.from}, {"to", m.to}, {"epoch", m.epoch}});
        // Mixed versions hold for every type alike: the others would wait too.
        if (done->outcome == cluster::RebalanceOutcome::versions_mixed) {
          shared->respond(json_response(
              200, {{"outcome", to_string(done->outcome)},
                    {"versions", done->live_versions},
                    {"message", (moves.empty() ? "nothing moved: " : "the rest did not move: ") +
                                    done->waiting_reason() + "; rebalancing waits until one version remains"},
                    {"moves", moves.size()},
                    {"moved", moves}}));
          return;
        }
      }
      shared->respond(json_response(200, {{"outcome", to_string(cluster::RebalanceOutcome::rebalanced)},
                                          {"moves", moves.size()},
                                          {"moved", moves}}));
    });
    if (!taken)
      shared->respond(http::Response::error(
          409, "rebalance_running", "a rebalance is already running on this node: try again when it has answered"));
  });
  r.add("POST", "/drain", [this](http::Request&, http::Responder out) {
    bool was = draining.exchange(true);
    out.respond(json_response(202, {{"node", node->config_.id}, {"draining", true}, {"already", was}}));
    if (!was) node->request_stop();
  });
  add_worker_routes(r);
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
  for (const auto& a : detail::dashboard_assets()) r.add("GET", std::string(a.path), asset);
  return r;
}

}  // namespace troupe::node
