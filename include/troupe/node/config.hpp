#pragma once
// A node's configuration, read from a TOML file. Every setting has a
// default (doc/node.md lists them); a file may be empty.
//
//   [node]
//   id = "node-1"                 # this node's id in the cluster
//   data_dir = "troupe-data"      # the SQLite journal lives here
//   threads = 0                   # actor worker threads; 0 = one per core
//   drain_grace_ms = 3000         # SIGTERM / POST /drain: /ready 503 at once, serve this long, then hand off
//   app_version = "2.3.1"         # shown to the other members and on the admin API
//   roles = ["manager", "devices"]  # what this node hosts and does; none: it syncs worker groups
//
//   [admin]                       # the admin HTTP API and the dashboard
//   host = "127.0.0.1"
//   port = 8081                   # 0 = any free port
//   token_file = ""               # a bearer token every route but /health needs
//   read_open = false             # with token_file: GETs need no token
//   max_connections = 1024        # and per address: max_connections_per_address = 64
//   [admin.tls]                   # absent: plain HTTP
//   cert = "admin.crt"            # PEM, with key = "admin.key"
//
//   [journal]
//   backend = "sqlite"            # sqlite | postgres | memory
//   path = "journal.db"           # sqlite: relative to node.data_dir
//   postgres = ""                 # postgres: a libpq connection string
//   schema = "public"             # postgres: the schema holding the tables
//
//   [cluster]                     # absent: a single node, no Redis
//   redis = "127.0.0.1:6379"
//   listen_host = "127.0.0.1"
//   listen_port = 7101
//   heartbeat_ms = 1000
//   liveness_threshold_ms = 3000
//   takeover_margin_ms = 500
//   hand_off_batch = 8            # shards, job queues and workers a drain moves at once
//   send_traces = true            # commands carry their trace id to other nodes (doc/wire.md)
//   insecure = false              # true: plain TCP (one machine, a private network); else [cluster.tls] is needed
//   max_handshakes = 256          # connections in handshake, in all; past it new ones are closed at once
//   max_handshakes_per_address = 16  # the same, from one remote address
//   handshake_timeout_ms = 2000   # TCP accept to HELLO accepted, TLS handshake included
//   idle_timeout_ms = 5000        # a connection that received nothing this long is closed
//   [cluster.tls]                 # mutual TLS 1.3 between nodes (doc/node.md); SIGHUP or a file change reloads
//   cert = "node-1.crt"           # this node's certificate chain; its DNS SAN (or CN) is node.id
//   key = "node-1.key"
//   ca = "ca.crt"                 # a peer's certificate must chain to this CA
//
//   [entities]
//   shard_count = 64              # shards per entity type, the same on every node
//   passivate_after_ms = 120000   # an idle entity leaves memory after this
//   stop_timeout_ms = 30000       # how long a graceful stop waits for processing entities
//   stash_capacity = 1000
//
//   [jobs]                        # job services started with Node::start_jobs
//   shard_count = 16              # in a cluster: queue shards per service, the same on every node
//
//   [log]                         # the log facade (troupe/core/log.hpp)
//   level = "info"                # trace | debug | info | warn | error | off
//   format = "text"               # text | json (one JSON object per line)
//   file = ""                     # empty: stderr; relative to node.data_dir
//   [log.levels]                  # per component: core net persist patterns cluster node app
//   cluster = "debug"
//
//   [[workers]]                   # a worker group (workers.hpp); needs [cluster]
//   group = "devices"
//   type = "device"               # a worker type the application registers
//   source = "file:devices.txt"   # | "http://host:port/path" | "webhook"
//   sync_interval_ms = 10000
//   roles = ["devices"]           # node roles that may host it; none: any node
//
// Tables the node does not know belong to the application: parse() refuses
// them unless their names are passed as `app_tables`, and hands them over in
// NodeConfig::app for the application to read with ConfigReader. A key the
// node or ConfigReader does not know, or a value of the wrong type or out of
// range, is an error naming the setting ("journal.backend: ...").

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <toml++/toml.h>

#include "troupe/core/log.hpp"
#include "troupe/core/result.hpp"

namespace troupe::node {

// Reads one TOML table's keys with types and ranges; remembers what was
// read so finish() can name the keys nobody asked for. Errors (a Result)
// name the setting as "<table>.<key>". Used by the node for its own tables
// and by applications for theirs. Not thread-safe; borrows the table.
class ConfigReader {
 public:
  ConfigReader(const toml::table* table, std::string name);

  Result<std::string> string(std::string_view key, std::string fallback);
  Result<std::int64_t> integer(std::string_view key, std::int64_t fallback, std::int64_t min, std::int64_t max);
  Result<double> number(std::string_view key, double fallback, double min, double max);
  Result<bool> boolean(std::string_view key, bool fallback);
  Result<std::chrono::milliseconds> millis(std::string_view key, std::chrono::milliseconds fallback,
                                           std::chrono::milliseconds min, std::chrono::milliseconds max);
  // An array of strings (empty if absent).
  Result<std::vector<std::string>> strings(std::string_view key);
  // One of `choices`.
  Result<std::string> choice(std::string_view key, std::string fallback, const std::vector<std::string>& choices);
  bool has(std::string_view key) const;
  // invalid_argument naming the first key of the table that was not read.
  Result<void> finish() const;

 private:
  const toml::table* table_;
  std::string name_;
  std::set<std::string, std::less<>> read_;
};

// The admin API's [admin] table (doc/node.md, "Admin API security" and
// "Limits"). Plain value.
struct AdminConfig {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8081;
  // A file holding the bearer token (surrounding white space ignored), read
  // again when it changes. Empty: no token, every route is open to whoever
  // reaches the port. Must be readable and not empty when set.
  std::filesystem::path token_file;
  bool read_open = false;  // with token_file: GET and HEAD need no token
  // [admin.tls]: PEM files of the admin API's certificate chain and key;
  // both set = the admin port speaks HTTPS only, and the files are read
  // again when they change.
  std::filesystem::path tls_cert;
  std::filesystem::path tls_key;
  std::chrono::milliseconds tls_handshake_timeout{10'000};
  bool tls() const noexcept { return !tls_cert.empty(); }
  // Limits on the admin port (http::ServerSettings).
  std::size_t max_connections = 1024;
  std::size_t max_connections_per_address = 64;
  std::chrono::milliseconds idle_timeout{60'000};
  std::chrono::milliseconds request_read_timeout{10'000};
};

struct JournalConfig {
  std::string backend = "sqlite";  // sqlite | postgres | memory
  std::string path = "journal.db";
  std::string postgres;  // libpq connection string
  std::string schema = "public";  // postgres: the schema holding the tables
  // postgres: connections; 0 keeps PostgresJournalOptions' defaults.
  unsigned writer_connections = 0;
  unsigned reader_connections = 0;
};

struct ClusterConfig {
  bool enabled = false;  // a [cluster] table is present
  std::string redis_host = "127.0.0.1";
  std::uint16_t redis_port = 6379;
  // redis_user, and the password read from redis_password_file or
  // TROUPE_REDIS_PASSWORD at parse time (never written in the TOML).
  std::string redis_user;
  std::string redis_password;
  std::string key_prefix = "troupe";
  std::string listen_host = "127.0.0.1";
  std::uint16_t listen_port = 7101;
  std::string advertise_host;  // empty: listen_host
  std::chrono::milliseconds heartbeat{1000};
  std::chrono::milliseconds liveness_threshold{3000};
  std::chrono::milliseconds takeover_margin{500};
  std::size_t hand_off_batch = 8;
  bool send_traces = true;  // ClusterSettings::send_traces
  bool insecure = false;    // plain TCP between nodes, chosen explicitly
  std::string tls_cert, tls_key, tls_ca;  // [cluster.tls]: PEM paths, all three or none
  std::size_t max_handshakes = 256;
  std::size_t max_handshakes_per_address = 16;
  std::chrono::milliseconds handshake_timeout{2000};
  std::chrono::milliseconds idle_timeout{5000};
};

struct EntitiesConfig {
  std::uint32_t shard_count = 64;
  std::chrono::milliseconds passivate_after{120'000};
  std::chrono::milliseconds stop_timeout{30'000};
  std::size_t stash_capacity = 1000;
};

struct JobsConfig {
  // Queue shards of each cluster-wide job service (Node::start_jobs in a
  // cluster); ignored on a single node.
  std::uint32_t shard_count = 16;
};

// The [log] table: what the node gives troupe::log::configure at start.
struct LogConfig {
  log::Level level = log::Level::info;
  std::vector<std::pair<log::Component, log::Level>> levels;  // [log.levels]
  log::Format format = log::Format::text;
  std::string file;  // empty: stderr
};

// One [[workers]] table: a worker group (doc/node.md, "Worker groups").
struct WorkerGroupConfig {
  std::string group;  // cluster::validate_group
  std::string type;   // a worker type the application registers (WorkerTypes)
  // Where the desired units come from: "file:PATH", "http://host[:port]/path"
  // or "webhook" (POST /workers/{group}/sync bodies).
  std::string source;
  // How often a manager node reads the source (file, http).
  std::chrono::milliseconds sync_interval{10'000};
  // Bound on one read of an http source.
  std::chrono::milliseconds source_timeout{5'000};
  // The largest POST /workers/{group}/sync body taken (413 past it).
  std::size_t max_body_bytes = 1u << 20;
  // Node roles that may host the group; empty: any node.
  std::vector<std::string> roles;
};

// The whole configuration. Value type (copies share the application's tables).
struct NodeConfig {
  std::string id = "node-1";
  std::filesystem::path data_dir = "troupe-data";
  std::size_t threads = 0;
  // An operator's drain (SIGTERM, SIGINT, POST /drain): /ready answers 503
  // at once, and the node goes on serving both its ports for this long
  // before it hands anything off, so that balancers stop sending first.
  std::chrono::milliseconds drain_grace{3000};
  // The application's version, shown to the other members and on the
  // admin API: empty, or 1 to 64 of A-Z a-z 0-9 . _ + -.
  std::string app_version;
  // What this node hosts and does ("manager": it syncs worker groups).
  // Each 1 to 64 of A-Z a-z 0-9 . _ -. Empty: it hosts only what names no
  // roles, and syncs worker groups as a manager does.
  std::vector<std::string> roles;
  AdminConfig admin;
  JournalConfig journal;
  ClusterConfig cluster;
  EntitiesConfig entities;
  JobsConfig jobs;
  LogConfig log;
  std::vector<WorkerGroupConfig> workers;  // [[workers]] tables, in file order
  // The application's tables, by name (each a toml::table).
  std::map<std::string, std::shared_ptr<const toml::table>> app;

  // Parses TOML text; `origin` names it in errors (a file name). Errors:
  // invalid_argument with "<origin>: <setting>: <what is wrong>", or the
  // TOML syntax error with its line and column.
  static Result<NodeConfig> parse(std::string_view text, std::string origin,
                                  const std::vector<std::string>& app_tables = {});
  // Reads and parses a file (invalid_argument if it cannot be read).
  static Result<NodeConfig> load(const std::filesystem::path& file, const std::vector<std::string>& app_tables = {});

  // The application table `name` (empty if the file had none), for a ConfigReader.
  const toml::table* app_table(const std::string& name) const;
  // The SQLite journal's file: journal.path under data_dir unless absolute.
  std::filesystem::path sqlite_path() const;
  // What troupe::log::configure gets: [log], the log file under data_dir
  // unless absolute, and the node id as field `node` on every line.
  log::Config log_config() const;
};

}  // namespace troupe::node
