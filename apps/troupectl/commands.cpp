// troupectl's commands: see commands.hpp and doc/troupectl.md. Here: the
// --node URL, the requests to the node's admin API, each command, and the
// command line. The tables they print are drawn in views.cpp.

#include "commands.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <variant>

#include "json_fields.hpp"
#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"

namespace troupe::ctl {

using json = nlohmann::json;

namespace detail {

// --- URLs and encoding ----------------------------------------------------------------

Result<NodeUrl> parse_node_url(std::string_view url) {
  auto bad = [&](std::string why) {
    return Error(ErrorCode::invalid_argument, "--node '" + std::string(url) + "': " + std::move(why));
  };
  auto parsed = http::parse_url(url);
  if (!parsed.ok()) {
    std::string why = parsed.error().message();
    if (url.find("://") != std::string_view::npos && url.substr(0, 7) != "http://")
      why += " (the admin API has no TLS; put a proxy in front for that)";
    return bad(std::move(why));
  }
  NodeUrl out;
  out.host = std::move(parsed->host);
  out.port = parsed->port;
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

// --- talking to the node ----------------------------------------------------------------

namespace {

using detail::NodeUrl;

// Why a command could not print its result: the exit code and the line
// for stderr (without the "troupectl: " prefix).
struct Failure {
  int exit_code = exit_node_error;
  std::string message;
};
template <class T>
using Outcome = std::variant<T, Failure>;

Failure usage(std::string message) { return {exit_unreachable_or_usage, std::move(message)}; }

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// "10s", "0.25s": the timeout as the user gave it.
std::string seconds_text(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%gs", s);
  return buf;
}

// The transport's reason without its "cannot connect to host:port: " lead,
// which the one-liner already says in its own words.
std::string reason_of(const Error& e, const std::string& where) {
  std::string m = e.message();
  for (std::string_view lead : {"client: ", "cannot connect to ", "request to "}) {
    if (m.rfind(lead, 0) == 0) {
      m.erase(0, lead.size());
      break;
    }
  }
  if (auto at = m.find(where + ": "); at != std::string::npos) m.erase(0, at + where.size() + 2);
  if (auto at = m.find(where + " failed: "); at != std::string::npos) m.erase(0, at + where.size() + 9);
  // asio's messages are capitalised ("Connection refused"); the one-liner is not.
  if (m.size() > 1 && m[0] >= 'A' && m[0] <= 'Z' && m[1] >= 'a' && m[1] <= 'z')
    m[0] = static_cast<char>(m[0] - 'A' + 'a');
  return m;
}

// One node's admin API, at one URL.
class NodeApi {
 public:
  NodeApi(std::string url, NodeUrl parsed, double timeout_s)
      : url_(std::move(url)), parsed_(std::move(parsed)), timeout_s_(timeout_s) {}

  static Outcome<NodeApi> at(std::string url, double timeout_s) {
    while (url.size() > 1 && url.back() == '/') url.pop_back();
    auto parsed = detail::parse_node_url(url);
    if (!parsed.ok()) return usage(parsed.error().message());
    return NodeApi(std::move(url), std::move(*parsed), timeout_s);
  }

  const std::string& url() const noexcept { return url_; }

  // The JSON document of a 2xx answer.
  Outcome<json> call(std::string method, const std::string& path) const {
    auto timeout = std::chrono::duration_cast<Duration>(std::chrono::duration<double>(timeout_s_));
    http::ClientSettings cs;
    cs.host = parsed_.host;
    cs.port = parsed_.port;
    cs.max_connections = 1;
    cs.request_timeout = timeout;
    cs.connect_timeout = std::min<Duration>(timeout, std::chrono::seconds(5));
    const std::string where = http::authority(parsed_.host, parsed_.port);
    auto client = http::Client::create(cs);
    if (!client.ok()) return unreachable(reason_of(client.error(), where));
    http::ClientRequest req;
    req.method = std::move(method);
    req.target = parsed_.prefix + path;
    req.headers.emplace_back("Accept", "application/json");
    auto resp = (*client)->request_sync(std::move(req));
    if (!resp.ok()) {
      if (resp.error().code() == ErrorCode::timeout)
        return Failure{exit_unreachable_or_usage,
                       "the node at " + url_ + " did not answer within " + seconds_text(timeout_s_)};
      return unreachable(reason_of(resp.error(), where));
    }
    return decode(*resp);
  }

 private:
  Failure unreachable(const std::string& why) const {
    return {exit_unreachable_or_usage, "cannot reach the node at " + url_ + " (" + why + ")"};
  }

  Outcome<json> decode(const http::Response& r) const {
    json body = json::parse(r.body, nullptr, false);
    if (r.status >= 200 && r.status < 300) {
      if (body.is_discarded())
        return Failure{exit_node_error, "the node at " + url_ + " answered HTTP " + std::to_string(r.status) +
                                            " with a body that is not JSON" + content_type(r)};
      return body;
    }
    const json& e = detail::field(body, "error");
    if (e.is_object() && e.contains("message") && e.contains("code")) {
      return Failure{exit_node_error, text_of(e["message"]) + " (" + text_of(e["code"]) + ", HTTP " +
                                          std::to_string(r.status) + ")"};
    }
    // Not a troupe node's error document (a proxy, another server).
    std::string excerpt = r.body.substr(0, 200);
    std::replace(excerpt.begin(), excerpt.end(), '\n', ' ');
    std::replace(excerpt.begin(), excerpt.end(), '\r', ' ');
    return Failure{exit_node_error, "the node at " + url_ + " answered HTTP " + std::to_string(r.status) +
                                        " " + std::string(http::reason_phrase(r.status)) +
                                        (excerpt.empty() ? "" : ": " + excerpt)};
  }

  static std::string content_type(const http::Response& r) {
    return r.content_type.empty() ? "" : " (" + r.content_type + ")";
  }

  std::string url_;
  NodeUrl parsed_;
  double timeout_s_;
};

std::string pretty(const json& j) { return j.dump(2) + '\n'; }

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

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
    if (o.json)
      return pretty({{"node", detail::field(j, "node")}, {"workers", detail::array_field(j, "workers")}});
    return detail::render_workers(j);
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

// The admin URL a member advertises, usable from here: a node listening on
// every interface advertises 0.0.0.0 (or ::), which means "my own address",
// so that is taken from the member's cluster address instead.
std::string reachable_admin(const json& member) {
  std::string admin = detail::cell(member, "admin");
  auto parsed = detail::parse_node_url(admin);
  if (!parsed.ok() || (parsed->host != "0.0.0.0" && parsed->host != "::")) return admin;
  std::string address = detail::cell(member, "address");
  auto colon = address.rfind(':');
  if (address == "—" || colon == std::string::npos || colon == 0) return admin;
  std::string host = address.substr(0, colon);  // "[::1]" stays bracketed, as a URL wants it
  return "http://" + host + ":" + std::to_string(parsed->port) + parsed->prefix;
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
      auto at = NodeApi::at(reachable_admin(*member), timeout_s);
      if (auto* f = std::get_if<Failure>(&at)) return *f;
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

int run(const Options& o, std::ostream& out, std::ostream& err) {
  const double timeout_s = o.timeout_s.value_or(o.command == Command::rebalance ? 60.0 : 10.0);
  Outcome<std::string> result = Failure{};
  if (!(timeout_s > 0)) {
    result = usage("--timeout-s must be positive");
  } else if (auto api = NodeApi::at(o.node, timeout_s); auto* f = std::get_if<Failure>(&api)) {
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
      case Command::rebalance:
        result = rebalance(o, node);
        break;
      case Command::drain:
        result = drain(o, node, timeout_s);
        break;
      case Command::entity:
        result = entity(o, node);
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

int run_command_line(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Options o;
  double timeout_s = 0;
  CLI::App app{"Looks at and steers a running troupe node through its admin HTTP API.", "troupectl"};
  // Global options may also follow the command: troupectl members --json.
  app.fallthrough();
  app.require_subcommand(1);
  app.set_version_flag("--version", "troupectl 0.1.0");
  app.footer(
      "Exit codes: 0 ok; 1 the node answered with an error (or the member or type asked for is not there);\n"
      "2 the node could not be reached or answered too late, or bad usage.");
  app.add_option("--node", o.node, "the node's admin API, http://host:port")
      ->envname("TROUPE_NODE")
      ->capture_default_str();
  app.add_flag("--json", o.json,
               "print JSON (the node's document, or what the table shows) instead of a table");
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
      {"workers", "which member runs which worker of each worker group", Command::workers},
      {"rebalance", "spread the shards evenly over the live members (cluster only)", Command::rebalance},
      {"drain", "make a node leave gracefully: stop taking work, hand over its shards, stop", Command::drain},
      {"entity", "one entity: its state and whether it is in a processing episode", Command::entity},
  };
  for (const auto& s : subs) {
    auto* sub = app.add_subcommand(s.name, s.help);
    Command c = s.command;
    sub->callback([&o, c] { o.command = c; });
    if (c == Command::shards) sub->add_option("--type", o.type, "only this entity type");
    if (c == Command::drain)
      sub->add_option("NODE", o.drain_node, "the member to drain, by id (default: the node at --node)");
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
          << "' (commands: status, members, shards, workers, rebalance, drain, entity)\n"
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
