// The node's roles and its [[workers]] tables (worker groups, SPEC W9):
// see include/troupe/node/config.hpp and doc/node.md "Worker groups".

#include "config_workers.hpp"

#include <set>

#include "troupe/cluster/placement_source.hpp"

namespace troupe::node::detail {

namespace {

Error bad(std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); }

bool role_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

// cluster::validate_group's rule (a group becomes part of Redis key names),
// checked here so that parsing a config links nothing of the cluster (the
// config fuzzer links config.cpp and this file alone). A node test holds
// the two to the same answers.
Result<void> check_group(const std::string& group, const std::string& setting) {
  bool ok = !group.empty() && group.size() <= cluster::max_group_length;
  for (char c : group) ok = ok && (role_char(c) || c == '/');
  if (!ok)
    return bad(setting + ": \"" + group + "\" is not a group name: 1 to " +
               std::to_string(cluster::max_group_length) + " of A-Z a-z 0-9 . _ / -");
  // The entity types' and job queues' shards are the coordinator's groups
  // "shards/<type>": a worker group of that name would sync them away.
  if (group.rfind("shards/", 0) == 0)
    return bad(setting + ": \"" + group + "\": names under \"shards/\" are the entity types' and job queues' shards");
  return {};
}

// "file:PATH", "http://..." or "webhook".
Result<void> check_source(const std::string& source, const std::string& setting) {
  if (source == "webhook") return {};
  if (source.rfind("file:", 0) == 0) {
    if (source.size() == 5) return bad(setting + ": \"file:\" needs a path (\"file:/etc/app/units.txt\")");
    return {};
  }
  if (source.rfind("http://", 0) == 0) {
    if (source.size() == 7) return bad(setting + ": \"http://\" needs a host (\"http://host:port/path\")");
    return {};
  }
  if (source.rfind("https://", 0) == 0)
    return bad(setting + ": \"" + source +
               "\": https is not supported; use http:// (for example through a local proxy)");
  return bad(setting + ": \"" + source +
             "\" is not a source: expected \"file:PATH\", \"http://host:port/path\" or "
             "\"webhook\"");
}

}  // namespace

Result<void> check_roles(const std::vector<std::string>& roles, const std::string& setting) {
  std::set<std::string> seen;
  for (const auto& r : roles) {
    bool ok = !r.empty() && r.size() <= 64;
    for (char c : r) ok = ok && role_char(c);
    if (!ok) return bad(setting + ": \"" + r + "\" is not a role name: 1 to 64 of A-Z a-z 0-9 . _ -");
    if (!seen.insert(r).second) return bad(setting + ": \"" + r + "\" is named twice");
  }
  return {};
}

Result<std::vector<WorkerGroupConfig>> parse_worker_groups(const toml::node* n) {
  std::vector<WorkerGroupConfig> out;
  if (!n) return out;
  const toml::array* arr = n->as_array();
  if (!arr || !arr->is_array_of_tables())
    return bad("workers: expected tables ([[workers]] with group, type and source)");
  std::set<std::string> groups;
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const toml::table* t = (*arr)[i].as_table();
    std::string name = "workers[" + std::to_string(i) + "]";
    ConfigReader r(t, name);
    WorkerGroupConfig g;
    auto group = r.string("group", "");
    if (!group.ok()) return std::move(group).error();
    if (group->empty()) return bad(name + ".group: missing (every [[workers]] table names its group)");
    if (auto v = check_group(*group, name + ".group"); !v.ok()) return std::move(v).error();
    g.group = *group;
    if (!groups.insert(g.group).second)
      return bad(name + ".group: \"" + g.group + "\" is declared twice (one [[workers]] table per group)");
    // From here on the group names the table.
    name = "workers[group=" + g.group + "]";
    r = ConfigReader(t, name);
    (void)r.string("group", "");
    auto type = r.string("type", "");
    if (!type.ok()) return std::move(type).error();
    if (type->empty()) return bad(name + ".type: missing (the worker type the application registers)");
    g.type = *type;
    auto source = r.string("source", "");
    if (!source.ok()) return std::move(source).error();
    if (source->empty())
      return bad(name + ".source: missing (\"file:PATH\", \"http://host:port/path\" or \"webhook\")");
    if (auto v = check_source(*source, name + ".source"); !v.ok()) return std::move(v).error();
    g.source = *source;
    using std::chrono::milliseconds;
    auto interval = r.millis("sync_interval_ms", g.sync_interval, milliseconds(10), milliseconds(3'600'000));
    if (!interval.ok()) return std::move(interval).error();
    g.sync_interval = *interval;
    auto timeout = r.millis("source_timeout_ms", g.source_timeout, milliseconds(10), milliseconds(600'000));
    if (!timeout.ok()) return std::move(timeout).error();
    g.source_timeout = *timeout;
    auto body = r.integer("max_body_bytes", static_cast<std::int64_t>(g.max_body_bytes), 1, 256LL << 20);
    if (!body.ok()) return std::move(body).error();
    g.max_body_bytes = static_cast<std::size_t>(*body);
    auto roles = r.strings("roles");
    if (!roles.ok()) return std::move(roles).error();
    if (auto v = check_roles(*roles, name + ".roles"); !v.ok()) return std::move(v).error();
    g.roles = std::move(*roles);
    if (auto f = r.finish(); !f.ok()) return std::move(f).error();
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace troupe::node::detail
