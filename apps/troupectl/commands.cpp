// troupectl's commands: see commands.hpp and doc/troupectl.md. Here: the
// --node URL, each command, and the command line. The requests go through
// node_api.cpp, the tables are drawn in views.cpp, and rolling-update lives
// in rolling_update.cpp.

#include "commands.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <variant>

#include "json_fields.hpp"
#include "node_api.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"
#include "troupe/node/node.hpp"

namespace troupe::ctl {

using json = nlohmann::json;

namespace detail {

// --- URLs and encoding ----------------------------------------------------------------

Result<NodeUrl> parse_node_url(std::string_view url) {
  auto bad = [&](std::string why) {
    return Error(ErrorCode::invalid_argument, "--node '" + std::string(url) + "': " + std::move(why));
  };
  auto parsed = http::parse_url(url, /*https_too=*/true);
  if (!parsed.ok()) return bad(parsed.error().message());
  NodeUrl out;
  out.host = std::move(parsed->host);
  out.port = parsed->port;
  out.tls = parsed->tls;
  if (parsed->has_path) {
    std::string_view path = parsed->target;
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    if (path.find_first_of("?#") != std::string_view::npos) return bad("no query or fragment allowed");
    out.prefix = std::string(path);
  }
  return out;
}

std::string compact_ranges(std::vector<std::int64_t> numbers) {
  std::sort(numbers.begin(), numbers.end());
  numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
  std::string out;
  for (std::size_t i = 0; i < numbers.size();) {
    std::size_t j = i;
    while (j + 1 < numbers.size() && numbers[j + 1] == numbers[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(numbers[i]);
    if (j > i) out += '-' + std::to_string(numbers[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace detail

// --- the commands -----------------------------------------------------------------------

namespace {

using detail::Failure;
using detail::join;
using detail::NodeApi;
using detail::Outcome;
using detail::usage;

std::string pretty(const json& j) { return j.dump(2) + '\n'; }

// Runs `call` and hands its document to `show`, or passes the failure on.
template <class Show>
Outcome<std::string> fetch_and(const NodeApi& api, std::string method, const std::string& path, Show&& show) {
  auto doc = api.call(std::move(method), path);
  if (auto* f = std::get_if<Failure>(&doc)) return *f;
  return show(std::get<json>(doc));
}

Outcome<std::string> status(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/api/overview", [&](const json& j) -> Outcome<std::string> {
    return o.json ? pretty(j) : detail::render_status(j);
  });
}

Outcome<std::string> members(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/api/overview", [&](const json& j) -> Outcome<std::string> {
    if (o.json)
      return pretty({{"node", detail::field(j, "node")}, {"members", detail::array_field(j, "members")}});
    return detail::render_members(j);
  });
}

Outcome<std::string> shards(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/cluster", [&](const json& j) -> Outcome<std::string> {
    json summary = detail::summarize_shards(j, o.type);
    if (!o.type.empty() && summary["types"].empty()) {
      std::vector<std::string> known;
      json all = detail::summarize_shards(j, "");
      for (const auto& t : all["types"]) known.push_back(t["type"].get<std::string>());
      return Failure{exit_node_error,
                     "no shards of type '" + o.type + "' in the shard map of " + detail::cell(j, "node") +
                         (known.empty() ? " (it is empty)" : " (types: " + join(known) + ")")};
    }
    return o.json ? pretty(summary) : detail::render_shards(summary);
  });
}

Outcome<std::string> workers(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/cluster", [&](const json& j) -> Outcome<std::string> {
    if (o.json) {
      json doc = {{"node", detail::field(j, "node")},
                  {"time_ms", detail::field(j, "time_ms")},
                  {"workers", detail::array_field(j, "workers")}};
      if (detail::field(j, "workers_error").is_string()) doc["workers_error"] = detail::field(j, "workers_error");
      return pretty(doc);
    }
    return detail::render_workers(j);
  });
}

Outcome<std::string> job_workers(const Options& o, const NodeApi& api) {
  return fetch_and(api, "GET", "/cluster", [&](const json& j) -> Outcome<std::string> {
    if (o.json)
      return pretty({{"node", detail::field(j, "node")}, {"job_workers", detail::array_field(j, "job_workers")}});
    return detail::render_job_workers(j);
  });
}

Outcome<std::string> rebalance(const Options& o, const NodeApi& api) {
  return fetch_and(api, "POST", "/rebalance", [&](const json& j) -> Outcome<std::string> {
    return o.json ? pretty(j) : detail::render_rebalance(j);
  });
}

Outcome<std::string> entity(const Options& o, const NodeApi& api) {
  if (o.type.empty() || o.id.empty()) return usage("entity: TYPE and ID must not be empty");
  std::string path = "/entities/" + http::percent_encode(o.type) + "/" + http::percent_encode(o.id);
  return fetch_and(api, "GET", path, [&](const json& j) -> Outcome<std::string> {
    return o.json ? pretty(j) : detail::render_entity(j);
  });
}

Outcome<std::string> drain(const Options& o, const NodeApi& api, double timeout_s) {
  std::optional<NodeApi> other;
  if (!o.drain_node.empty()) {
    auto doc = api.call("GET", "/api/overview");
    if (auto* f = std::get_if<Failure>(&doc)) return *f;
    const json& ov = std::get<json>(doc);
    const json* member = nullptr;
    std::vector<std::string> ids;
    for (const auto& m : detail::array_field(ov, "members")) {
      ids.push_back(detail::cell(m, "id"));
      if (detail::field(m, "id") == o.drain_node) member = &m;
    }
    if (!member)
      return Failure{exit_node_error, "'" + o.drain_node + "' is not a member (" + detail::cell(ov, "node") +
                                          " sees: " + join(ids) + ")"};
    const json& self = detail::field(*member, "self");
    if (!(self.is_boolean() && self.get<bool>())) {
      // Only the node itself is sure to know its admin URL; a member that
      // does not advertise one has to be drained at its own address.
      if (!detail::field(*member, "admin").is_string())
        return Failure{exit_node_error, detail::cell(ov, "node") + " does not know the admin URL of '" +
                                            o.drain_node + "': run troupectl --node <its admin URL> drain"};
      auto at = NodeApi::at(detail::reachable_admin(*member), timeout_s, o);
      if (auto* f = std::get_if<Failure>(&at)) return *f;
      // The token was given for an https node: it never goes out in clear
      // text to a URL read from the cluster.
      if (api.tls() && !std::get<NodeApi>(at).tls() && !o.token.empty())
        return Failure{exit_node_error, "'" + o.drain_node + "' advertises a plain http admin URL (" +
                                            std::get<NodeApi>(at).url() +
                                            "); the admin token is not sent in clear text: run troupectl --node "
                                            "<its https admin URL> drain"};
      other.emplace(std::move(std::get<NodeApi>(at)));
    }
  }
  const NodeApi& target = other ? *other : api;
  return fetch_and(target, "POST", "/drain", [&](const json& j) -> Outcome<std::string> {
    if (o.json) return pretty(j);
    const json& already = detail::field(j, "already");
    std::string who = detail::cell(j, "node");
    if (already.is_boolean() && already.get<bool>()) return "node " + who + " was already draining\n";
    return "node " + who +
           " is draining: /ready answers 503 from now on, and it stops once its work is handed over\n";
  });
}

}  // namespace

int run(const Options& given, std::ostream& out, std::ostream& err) {
  Options o = given;
  const double timeout_s = o.timeout_s.value_or(o.command == Command::rebalance ? 60.0 : 10.0);
  Outcome<std::string> result = Failure{};
  Outcome<std::string> token = o.token;
  if (!o.token_file.empty()) token = detail::read_token_file(o.token_file);
  if (auto* bad_token = std::get_if<Failure>(&token)) {
    result = *bad_token;
  } else if (o.token = std::get<std::string>(token); !(timeout_s > 0)) {
    result = usage("--timeout-s must be positive");
  } else if (auto api = NodeApi::at(o.node, timeout_s, o); auto* f = std::get_if<Failure>(&api)) {
    result = *f;
  } else {
    const NodeApi& node = std::get<NodeApi>(api);
    switch (o.command) {
      case Command::status:
        result = status(o, node);
        break;
      case Command::members:
        result = members(o, node);
        break;
      case Command::shards:
        result = shards(o, node);
        break;
      case Command::workers:
        result = workers(o, node);
        break;
      case Command::job_workers:
        result = job_workers(o, node);
        break;
      case Command::rebalance:
        result = rebalance(o, node);
        break;
      case Command::drain:
        result = drain(o, node, timeout_s);
        break;
      case Command::entity:
        result = entity(o, node);
        break;
      case Command::rolling_update:
        result = detail::rolling_update(o, node, out);
        break;
    }
  }
  if (auto* f = std::get_if<Failure>(&result)) {
    err << "troupectl: " << f->message << '\n';
    return f->exit_code;
  }
  out << std::get<std::string>(result);
  return exit_ok;
}

namespace {

void add_rolling_update_options(CLI::App& sub, RollingUpdateOptions& r) {
  sub.add_option(
         "--restart", r.restart,
         "the shell command that restarts one node: {node} is replaced by its id, {admin} by its admin URL")
      ->required();
  sub.add_option("--nodes", r.nodes, "the nodes to restart, in order [every member, the one at --node last]")
      ->delimiter(',');
  sub.add_option("--admin", r.admin, "NODE=URL: a node's admin URL [as the members view advertises it]")
      ->delimiter(',');
  sub.add_option("--exit-timeout", r.exit_timeout_s,
                 "seconds the restart command may run (drain, exit, start)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--ready-timeout", r.ready_timeout_s,
                 "seconds after the restart command until a new process answers /ready 200")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_option("--shards-timeout", r.shards_timeout_s,
                 "seconds after the rebalance until the node hosts the shards it was given")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub.add_flag("--dry-run", r.dry_run, "print the plan (order, admin URLs, commands) and restart nothing");
}

}  // namespace

int run_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Options o;
  double timeout_s = 0;
  CLI::App app{"Looks at and steers a running troupe node through its admin HTTP API.", "troupectl"};
  // Global options may also follow the command: troupectl members --json.
  app.fallthrough();
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupectl " + std::string(troupe::node::Node::version()));
  app.footer(
      "Exit codes: 0 ok; 1 the node answered with an error (or the member or type asked for is not there);\n"
      "2 the node could not be reached or answered too late, or bad usage; 3 the node wants an admin token\n"
      "(--token-file FILE or TROUPE_TOKEN) or refused the one given.");
  app.add_option("--node", o.node, "the node's admin API, http://host:port or https://host:port")
      ->envname("TROUPE_NODE")
      ->capture_default_str();
  app.add_flag("--json", o.json,
               "print JSON (the node's document, or what the table shows) instead of a table");
  app.add_option("--ca", o.ca_file, "https nodes: the CA (PEM) their certificates chain to [the system's]");
  app.add_option("--token-file", o.token_file,
                 "a file holding the node's admin token (its [admin] token_file); wins over TROUPE_TOKEN");
  if (const char* env = std::getenv("TROUPE_TOKEN")) o.token = env;
  auto* timeout =
      app.add_option("--timeout-s", timeout_s, "seconds to wait for each answer [10; rebalance: 60]")
          ->check(CLI::PositiveNumber);

  struct Sub {
    const char* name;
    const char* help;
    Command command;
  };
  const Sub subs[] = {
      {"status", "the node: mode, state, health, uptime, entity types, counters, patterns", Command::status},
      {"members", "the members of the cluster and their load", Command::members},
      {"shards", "which member owns which shards, per entity type", Command::shards},
      {"workers", "the worker map: which member runs each unit of every worker group, from Redis",
       Command::workers},
      {"job-workers", "this node's job services' worker slots and what each is doing", Command::job_workers},
      {"rebalance", "spread the shards evenly over the live members (cluster only)", Command::rebalance},
      {"drain", "make a node leave gracefully: stop taking work, hand over its shards, stop", Command::drain},
      {"entity", "one entity: its state and whether it is in a processing episode", Command::entity},
      {"rolling-update", "restart every node in turn, each back, ready and hosting shards before the next",
       Command::rolling_update},
  };
  for (const auto& s : subs) {
    auto* sub = app.add_subcommand(s.name, s.help);
    Command c = s.command;
    sub->callback([&o, c] { o.command = c; });
    if (c == Command::shards) sub->add_option("--type", o.type, "only this entity type");
    if (c == Command::drain)
      sub->add_option("NODE", o.drain_node, "the member to drain, by id (default: the node at --node)");
    if (c == Command::rolling_update) add_rolling_update_options(*sub, o.roll);
    if (c == Command::entity) {
      sub->add_option("TYPE", o.type, "the entity type")->required();
      sub->add_option("ID", o.id, "the entity id")->required();
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a misspelt command as "a subcommand is required"; name it.
    if (app.get_subcommands().empty() && !app.remaining().empty() && e.get_exit_code() != 0) {
      err << "troupectl: unknown command '" << app.remaining().front()
          << "' (commands: status, members, shards, workers, job-workers, rebalance, drain, entity, "
             "rolling-update)\n"
          << "Run with --help for more information.\n";
      return exit_unreachable_or_usage;
    }
    int code = app.exit(e, out, err);
    return code == 0 ? exit_ok : exit_unreachable_or_usage;
  }
  if (timeout->count() > 0) o.timeout_s = timeout_s;
  return run(o, out, err);
}

}  // namespace troupe::ctl
