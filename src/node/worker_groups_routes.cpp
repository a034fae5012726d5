// The admin API's worker-group routes (doc/node.md, "Worker groups"):
// GET /workers, GET /workers/{group} and POST /workers/{group}/sync.
// Handlers run on the admin server's io thread; a sync answers later, from
// the thread that completes the coordinator's round.

#include "node_impl.hpp"

namespace troupe::node {

void Node::Impl::add_worker_routes(http::Router& r) {
  auto no_groups = [this](http::Responder& out) {
    out.respond(http::Response::error(
        404, "not_found",
        "node '" + node->config_.id + "' has no worker groups ([[workers]] in its config)"));
  };
  r.add("GET", "/workers", [this, no_groups](http::Request&, http::Responder out) {
    if (!workers) return no_groups(out);
    out.respond(http::Response::json(200, workers->view(nullptr)->dump()));
  });
  r.add("GET", "/workers/{group}", [this, no_groups](http::Request& req, http::Responder out) {
    if (!workers) return no_groups(out);
    const std::string group = req.params["group"];
    auto v = workers->view(&group);
    if (!v) {
      out.respond(http::Response::error(404, "not_found",
                                        "no worker group '" + group + "' is configured on this node"));
      return;
    }
    out.respond(http::Response::json(200, v->dump()));
  });
  r.add("POST", "/workers/{group}/sync", [this, no_groups](http::Request& req, http::Responder out) {
    if (!workers) return no_groups(out);
    auto shared = std::make_shared<http::Responder>(std::move(out));
    workers->sync_now(req.params["group"], req.body, [shared](int status, json body) {
      shared->respond(http::Response::json(status, body.dump()));
    });
  });
}

}  // namespace troupe::node
