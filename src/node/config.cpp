// Node configuration from TOML: see include/troupe/node/config.hpp.

#include "troupe/node/config.hpp"

#include "config_workers.hpp"
#include "troupe/cluster/node_id.hpp"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace troupe::node {

namespace {

Error bad(std::string what) { return Error(ErrorCode::invalid_argument, std::move(what)); }

const char* type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date or time";
  }
}

// "host:port" with a port from 1 to 65535.
Result<std::pair<std::string, std::uint16_t>> host_port(std::string_view text, const std::string& setting) {
  auto colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0)
    return bad(setting + ": expected \"host:port\", got \"" + std::string(text) + "\"");
  unsigned port = 0;
  auto digits = text.substr(colon + 1);
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
  if (ec != std::errc() || end != digits.data() + digits.size() || port == 0 || port > 65535)
    return bad(setting + ": the port in \"" + std::string(text) + "\" is not a number from 1 to 65535");
  return std::pair<std::string, std::uint16_t>{std::string(text.substr(0, colon)), static_cast<std::uint16_t>(port)};
}

// [cluster]'s Redis password: the file named by redis_password_file (its
// first line), or TROUPE_REDIS_PASSWORD, never both; empty when neither.
Result<std::string> redis_password(const std::string& user, const std::string& file) {
  const char* env = std::getenv("TROUPE_REDIS_PASSWORD");
  bool from_env = env != nullptr && *env != '\0';
  if (!file.empty() && from_env)
    return bad("cluster.redis_password_file: TROUPE_REDIS_PASSWORD is set too; give the password one way only");
  std::string pw;
  if (from_env) {
    pw = env;
  } else if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return bad("cluster.redis_password_file: '" + file + "' cannot be read");
    std::getline(in, pw);
    if (!pw.empty() && pw.back() == '\r') pw.pop_back();
    if (pw.empty()) return bad("cluster.redis_password_file: the first line of '" + file + "' is empty");
  }
  if (!user.empty() && pw.empty())
    return bad("cluster.redis_user: user '" + user +
               "' needs a password: set cluster.redis_password_file or TROUPE_REDIS_PASSWORD");
  return pw;
}

}  // namespace

// --- ConfigReader ----------------------------------------------------------------

ConfigReader::ConfigReader(const toml::table* table, std::string name) : table_(table), name_(std::move(name)) {}

bool ConfigReader::has(std::string_view key) const { return table_ && table_->contains(key); }

Result<std::string> ConfigReader::string(std::string_view key, std::string fallback) {
  read_.emplace(key);
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  if (!n) return fallback;
  if (auto v = n->value<std::string>(); v && n->is_string()) return *v;
  return bad(name_ + "." + std::string(key) + ": expected a string, got " + type_name(*n));
}

Result<std::int64_t> ConfigReader::integer(std::string_view key, std::int64_t fallback, std::int64_t min,
                                           std::int64_t max) {
  read_.emplace(key);
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  if (!n) return fallback;
  if (!n->is_integer())
    return bad(name_ + "." + std::string(key) + ": expected an integer, got " + type_name(*n));
  std::int64_t v = n->as_integer()->get();
  if (v < min || v > max)
    return bad(name_ + "." + std::string(key) + ": " + std::to_string(v) + " is out of range (" + std::to_string(min) +
               " to " + std::to_string(max) + ")");
  return v;
}

Result<double> ConfigReader::number(std::string_view key, double fallback, double min, double max) {
  read_.emplace(key);
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  if (!n) return fallback;
  double v = 0;
  if (n->is_floating_point()) {
    v = n->as_floating_point()->get();
  } else if (n->is_integer()) {
    v = static_cast<double>(n->as_integer()->get());
  } else {
    return bad(name_ + "." + std::string(key) + ": expected a number, got " + type_name(*n));
  }
  if (!(v >= min && v <= max)) {
    std::ostringstream o;
    o << name_ << "." << key << ": " << v << " is out of range (" << min << " to " << max << ")";
    return bad(o.str());
  }
  return v;
}

Result<bool> ConfigReader::boolean(std::string_view key, bool fallback) {
  read_.emplace(key);
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  if (!n) return fallback;
  if (!n->is_boolean()) return bad(name_ + "." + std::string(key) + ": expected true or false, got " + type_name(*n));
  return n->as_boolean()->get();
}

Result<std::chrono::milliseconds> ConfigReader::millis(std::string_view key, std::chrono::milliseconds fallback,
                                                       std::chrono::milliseconds min, std::chrono::milliseconds max) {
  auto v = integer(key, fallback.count(), min.count(), max.count());
  if (!v.ok()) return std::move(v).error();
  return std::chrono::milliseconds(*v);
}

Result<std::vector<std::string>> ConfigReader::strings(std::string_view key) {
  read_.emplace(key);
  const toml::node* n = table_ ? table_->get(key) : nullptr;
  std::vector<std::string> out;
  if (!n) return out;
  const std::string setting = name_ + "." + std::string(key);
  if (!n->is_array()) return bad(setting + ": expected an array of strings, got " + type_name(*n));
  for (const auto& e : *n->as_array()) {
    if (!e.is_string()) return bad(setting + ": expected an array of strings, but one element is " + type_name(e));
    out.push_back(e.as_string()->get());
  }
  return out;
}

Result<std::string> ConfigReader::choice(std::string_view key, std::string fallback,
                                         const std::vector<std::string>& choices) {
  auto v = string(key, std::move(fallback));
  if (!v.ok()) return v;
  for (const auto& c : choices)
    if (*v == c) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  return bad(name_ + "." + std::string(key) + ": expected one of " + list + ", got \"" + *v + "\"");
}

Result<void> ConfigReader::finish() const {
  if (!table_) return {};
  for (const auto& [k, v] : *table_) {
    if (!read_.contains(k.str())) return bad(name_ + "." + std::string(k.str()) + ": unknown setting");
  }
  return {};
}

// --- NodeConfig ------------------------------------------------------------------

Result<NodeConfig> NodeConfig::parse(std::string_view text, std::string origin,
                                     const std::vector<std::string>& app_tables) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    return bad(origin + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) + ": " +
               std::string(e.description()));
  }
  NodeConfig c;
  auto fail = [&](Error e) { return Error(e.code(), origin + ": " + e.message()); };
  auto table_of = [&](std::string_view name) -> Result<const toml::table*> {
    const toml::node* n = root.get(name);
    if (!n) return static_cast<const toml::table*>(nullptr);
    if (!n->is_table()) return bad(std::string(name) + ": expected a table ([" + std::string(name) + "]), got " + type_name(*n));
    return n->as_table();
  };
#define TROUPE_TRY(var, expr)              \
  auto var##_r = (expr);                   \
  if (!var##_r.ok()) return fail(std::move(var##_r).error()); \
  auto var = std::move(*var##_r)

  for (const auto& [k, v] : root) {
    std::string key(k.str());
    bool known = key == "node" || key == "admin" || key == "journal" || key == "cluster" || key == "entities" ||
                 key == "jobs" || key == "workers" || key == "log";
    bool app = false;
    for (const auto& a : app_tables) app = app || key == a;
    if (!known && !app) return fail(bad(key + ": unknown setting"));
    if (app) {
      if (!v.is_table()) return fail(bad(key + ": expected a table ([" + key + "]), got " + type_name(v)));
      c.app[key] = std::make_shared<const toml::table>(*v.as_table());
    }
  }

  {
    TROUPE_TRY(t, table_of("node"));
    ConfigReader r(t, "node");
    TROUPE_TRY(id, r.string("id", c.id));
    if (id.empty() || id.size() > 64 || id.find_first_of(" \t\n|/") != std::string::npos)
      return fail(bad("node.id: \"" + id + "\" must be 1 to 64 characters without spaces, '|' or '/'"));
    c.id = id;
    TROUPE_TRY(dir, r.string("data_dir", c.data_dir.string()));
    if (dir.empty()) return fail(bad("node.data_dir: empty"));
    c.data_dir = dir;
    TROUPE_TRY(threads, r.integer("threads", 0, 0, 256));
    c.threads = static_cast<std::size_t>(threads);
    TROUPE_TRY(grace, r.millis("drain_grace_ms", c.drain_grace, std::chrono::milliseconds(0),
                               std::chrono::milliseconds(600'000)));
    c.drain_grace = grace;
    TROUPE_TRY(version, r.string("app_version", c.app_version));
    if (auto v = cluster::validate_app_version(version); !v.ok())
      return fail(bad("node.app_version: " + v.error().message()));
    c.app_version = version;
    TROUPE_TRY(roles, r.strings("roles"));
    if (auto v = detail::check_roles(roles, "node.roles"); !v.ok()) return fail(std::move(v).error());
    c.roles = std::move(roles);
    if (auto f = r.finish(); !f.ok()) return fail(std::move(f).error());
  }
  {
    TROUPE_TRY(t, table_of("admin"));
    TROUPE_TRY(admin, detail::parse_admin(t));
    c.admin = std::move(admin);
  }
  {
    TROUPE_TRY(t, table_of("journal"));
    ConfigReader r(t, "journal");
    TROUPE_TRY(backend, r.choice("backend", c.journal.backend, {"sqlite", "postgres", "memory"}));
    c.journal.backend = backend;
    TROUPE_TRY(path, r.string("path", c.journal.path));
    if (path.empty()) return fail(bad("journal.path: empty"));
    c.journal.path = path;
    TROUPE_TRY(pg, r.string("postgres", c.journal.postgres));
    c.journal.postgres = pg;
    TROUPE_TRY(schema, r.string("schema", c.journal.schema));
    if (schema.empty() || schema.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") != std::string::npos)
      return fail(bad("journal.schema: \"" + schema + "\" must be lower-case letters, digits and '_'"));
    c.journal.schema = schema;
    TROUPE_TRY(writers, r.integer("writer_connections", c.journal.writer_connections, 1, 64));
    c.journal.writer_connections = static_cast<unsigned>(writers);
    TROUPE_TRY(readers, r.integer("reader_connections", c.journal.reader_connections, 1, 64));
    c.journal.reader_connections = static_cast<unsigned>(readers);
    if (backend == "postgres" && pg.empty())
      return fail(bad("journal.postgres: the postgres back end needs a connection string"));
    if (auto f = r.finish(); !f.ok()) return fail(std::move(f).error());
  }
  {
    TROUPE_TRY(whole, table_of("cluster"));
    c.cluster.enabled = whole != nullptr;
    // [cluster.tls] is read on its own; the rest of [cluster] without it.
    const toml::table* tls = nullptr;
    toml::table rest;
    if (whole) {
      rest = *whole;
      if (const toml::node* n = whole->get("tls")) {
        if (!n->is_table()) return fail(bad("cluster.tls: expected a table ([cluster.tls]), got " + std::string(type_name(*n))));
        tls = n->as_table();
        rest.erase("tls");
      }
    }
    const toml::table* t = whole ? &rest : nullptr;
    ConfigReader r(t, "cluster");
    TROUPE_TRY(redis, r.string("redis", "127.0.0.1:6379"));
    TROUPE_TRY(hp, host_port(redis, "cluster.redis"));
    c.cluster.redis_host = hp.first;
    c.cluster.redis_port = hp.second;
    if (r.has("redis_password"))
      return fail(bad("cluster.redis_password: the password does not go in the config; name a file holding it with "
                      "cluster.redis_password_file, or set TROUPE_REDIS_PASSWORD"));
    TROUPE_TRY(ruser, r.string("redis_user", ""));
    if (ruser.find_first_of(" \t\r\n") != std::string::npos)
      return fail(bad("cluster.redis_user: \"" + ruser + "\" must not contain blanks"));
    TROUPE_TRY(rfile, r.string("redis_password_file", ""));
    if (c.cluster.enabled) {
      TROUPE_TRY(rpw, redis_password(ruser, rfile));
      c.cluster.redis_user = ruser;
      c.cluster.redis_password = std::move(rpw);
    }
    TROUPE_TRY(prefix, r.string("key_prefix", c.cluster.key_prefix));
    if (prefix.empty()) return fail(bad("cluster.key_prefix: empty"));
    c.cluster.key_prefix = prefix;
    TROUPE_TRY(lh, r.string("listen_host", c.cluster.listen_host));
    c.cluster.listen_host = lh;
    TROUPE_TRY(lp, r.integer("listen_port", c.cluster.listen_port, 0, 65535));
    c.cluster.listen_port = static_cast<std::uint16_t>(lp);
    TROUPE_TRY(adv, r.string("advertise_host", c.cluster.advertise_host));
    c.cluster.advertise_host = adv;
    using std::chrono::milliseconds;
    TROUPE_TRY(hb, r.millis("heartbeat_ms", c.cluster.heartbeat, milliseconds(10), milliseconds(60'000)));
    c.cluster.heartbeat = hb;
    TROUPE_TRY(lt, r.millis("liveness_threshold_ms", c.cluster.liveness_threshold, milliseconds(30),
                            milliseconds(600'000)));
    c.cluster.liveness_threshold = lt;
    TROUPE_TRY(tm, r.millis("takeover_margin_ms", c.cluster.takeover_margin, milliseconds(0), milliseconds(600'000)));
    c.cluster.takeover_margin = tm;
    TROUPE_TRY(batch, r.integer("hand_off_batch", static_cast<std::int64_t>(c.cluster.hand_off_batch), 1, 1024));
    c.cluster.hand_off_batch = static_cast<std::size_t>(batch);
    TROUPE_TRY(traces, r.boolean("send_traces", c.cluster.send_traces));
    c.cluster.send_traces = traces;
    TROUPE_TRY(insecure, r.boolean("insecure", c.cluster.insecure));
    c.cluster.insecure = insecure;
    TROUPE_TRY(mh, r.integer("max_handshakes", static_cast<std::int64_t>(c.cluster.max_handshakes), 1, 1'000'000));
    c.cluster.max_handshakes = static_cast<std::size_t>(mh);
    TROUPE_TRY(mha, r.integer("max_handshakes_per_address", static_cast<std::int64_t>(c.cluster.max_handshakes_per_address),
                              1, 1'000'000));
    c.cluster.max_handshakes_per_address = static_cast<std::size_t>(mha);
    TROUPE_TRY(hto, r.millis("handshake_timeout_ms", c.cluster.handshake_timeout, milliseconds(10), milliseconds(600'000)));
    c.cluster.handshake_timeout = hto;
    TROUPE_TRY(idle, r.millis("idle_timeout_ms", c.cluster.idle_timeout, milliseconds(1000), milliseconds(3'600'000)));
    c.cluster.idle_timeout = idle;
    if (tls) {
      ConfigReader tr(tls, "cluster.tls");
      TROUPE_TRY(cert, tr.string("cert", ""));
      TROUPE_TRY(key, tr.string("key", ""));
      TROUPE_TRY(ca, tr.string("ca", ""));
      if (cert.empty() || key.empty() || ca.empty())
        return fail(bad("cluster.tls: cert, key and ca are all needed (PEM files)"));
      if (auto f = tr.finish(); !f.ok()) return fail(std::move(f).error());
      c.cluster.tls_cert = cert;
      c.cluster.tls_key = key;
      c.cluster.tls_ca = ca;
    }
    if (lt <= hb)
      return fail(bad("cluster.liveness_threshold_ms: must be longer than cluster.heartbeat_ms (" +
                      std::to_string(lt.count()) + " <= " + std::to_string(hb.count()) + ")"));
    if (auto f = r.finish(); !f.ok()) return fail(std::move(f).error());
    if (whole && tls && insecure)
      return fail(bad("cluster.insecure: true together with [cluster.tls]; choose one"));
    if (whole && !tls && !insecure)
      return fail(bad("cluster: the cluster port needs [cluster.tls] (cert, key, ca: mutual TLS, doc/node.md) or, "
                      "for one machine or a private network, insecure = true (plain TCP: anyone who reaches the "
                      "port is a member)"));
  }
  {
    TROUPE_TRY(t, table_of("entities"));
    ConfigReader r(t, "entities");
    using std::chrono::milliseconds;
    TROUPE_TRY(shards, r.integer("shard_count", c.entities.shard_count, 1, 65536));
    c.entities.shard_count = static_cast<std::uint32_t>(shards);
    TROUPE_TRY(pa, r.millis("passivate_after_ms", c.entities.passivate_after, milliseconds(0),
                            milliseconds(7LL * 24 * 3600 * 1000)));
    c.entities.passivate_after = pa;
    TROUPE_TRY(st, r.millis("stop_timeout_ms", c.entities.stop_timeout, milliseconds(0), milliseconds(3'600'000)));
    c.entities.stop_timeout = st;
    TROUPE_TRY(stash, r.integer("stash_capacity", static_cast<std::int64_t>(c.entities.stash_capacity), 1, 10'000'000));
    c.entities.stash_capacity = static_cast<std::size_t>(stash);
    if (auto f = r.finish(); !f.ok()) return fail(std::move(f).error());
  }
  {
    TROUPE_TRY(t, table_of("jobs"));
    ConfigReader r(t, "jobs");
    // The cluster-wide job service's bound (ClusterJobSettings::shard_count).
    TROUPE_TRY(shards, r.integer("shard_count", c.jobs.shard_count, 1, 4096));
    c.jobs.shard_count = static_cast<std::uint32_t>(shards);
    if (auto f = r.finish(); !f.ok()) return fail(std::move(f).error());
  }
  {
    TROUPE_TRY(logs, detail::parse_log(root.get("log")));
    c.log = std::move(logs);
  }
  {
    TROUPE_TRY(groups, detail::parse_worker_groups(root.get("workers")));
    if (!groups.empty() && !c.cluster.enabled)
      return fail(bad("workers: worker groups are placed through Redis and need a [cluster] table"));
    c.workers = std::move(groups);
  }
#undef TROUPE_TRY
  return c;
}

Result<NodeConfig> NodeConfig::load(const std::filesystem::path& file, const std::vector<std::string>& app_tables) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return bad("config file '" + file.string() + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), file.string(), app_tables);
}

const toml::table* NodeConfig::app_table(const std::string& name) const {
  auto it = app.find(name);
  return it == app.end() ? nullptr : it->second.get();
}

log::Config NodeConfig::log_config() const {
  log::Config lc;
  lc.level = log.level;
  lc.levels = log.levels;
  lc.format = log.format;
  if (!log.file.empty()) {
    std::filesystem::path p(log.file);
    lc.file = (p.is_absolute() ? p : data_dir / p).string();
  }
  lc.fields = {{"node", id}};
  return lc;
}

std::filesystem::path NodeConfig::sqlite_path() const {
  std::filesystem::path p(journal.path);
  return p.is_absolute() ? p : data_dir / p;
}

}  // namespace troupe::node
