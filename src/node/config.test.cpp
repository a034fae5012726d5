// The node's TOML configuration: defaults, every table, and the bad configs
// a person writes (unknown keys, wrong types, out-of-range values), each
// refused with a message that names the setting.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "troupe/node/config.hpp"

namespace {

using troupe::node::ConfigReader;
using troupe::node::NodeConfig;

std::string error_of(std::string_view text, const std::vector<std::string>& app = {}) {
  auto c = NodeConfig::parse(text, "node.toml", app);
  if (c.ok()) return "(accepted)";
  EXPECT_EQ(c.error().code(), troupe::ErrorCode::invalid_argument);
  return c.error().message();
}

TEST(NodeConfig, AnEmptyFileGivesTheDocumentedDefaults) {
  auto c = NodeConfig::parse("", "node.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->id, "node-1");
  EXPECT_EQ(c->admin.port, 8081);
  EXPECT_EQ(c->journal.backend, "sqlite");
  EXPECT_EQ(c->sqlite_path(), std::filesystem::path("troupe-data") / "journal.db");
  EXPECT_FALSE(c->cluster.enabled);
  EXPECT_EQ(c->entities.shard_count, 64u);
  EXPECT_EQ(c->entities.passivate_after, std::chrono::minutes(2));
  EXPECT_EQ(c->jobs.shard_count, 16u);
  EXPECT_EQ(c->cluster.hand_off_batch, 8u);
  EXPECT_TRUE(c->cluster.send_traces);
}

TEST(NodeConfig, EveryTableIsRead) {
  auto c = NodeConfig::parse(R"(
[node]
id = "n2"
data_dir = "/tmp/x"
threads = 2
[admin]
host = "0.0.0.0"
port = 9000
[journal]
backend = "postgres"
postgres = "host=127.0.0.1 port=5433 dbname=troupe"
writer_connections = 1
reader_connections = 3
[cluster]
redis = "10.0.0.5:6380"
listen_port = 7200
heartbeat_ms = 500
liveness_threshold_ms = 2000
takeover_margin_ms = 250
hand_off_batch = 3
send_traces = false
max_handshakes = 100
max_handshakes_per_address = 4
handshake_timeout_ms = 1500
idle_timeout_ms = 8000
[cluster.tls]
cert = "/etc/troupe/n2.crt"
key = "/etc/troupe/n2.key"
ca = "/etc/troupe/ca.crt"
[entities]
shard_count = 128
passivate_after_ms = 5000
stop_timeout_ms = 10000
stash_capacity = 50
[jobs]
shard_count = 32
)",
                             "node.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->id, "n2");
  EXPECT_EQ(c->threads, 2u);
  EXPECT_EQ(c->admin.host, "0.0.0.0");
  EXPECT_EQ(c->admin.port, 9000);
  EXPECT_EQ(c->journal.backend, "postgres");
  EXPECT_EQ(c->journal.writer_connections, 1u);
  EXPECT_EQ(c->journal.reader_connections, 3u);
  EXPECT_TRUE(c->cluster.enabled);
  EXPECT_EQ(c->cluster.redis_host, "10.0.0.5");
  EXPECT_EQ(c->cluster.redis_port, 6380);
  EXPECT_EQ(c->cluster.listen_port, 7200);
  EXPECT_EQ(c->cluster.heartbeat, std::chrono::milliseconds(500));
  EXPECT_EQ(c->cluster.hand_off_batch, 3u);
  EXPECT_FALSE(c->cluster.insecure);
  EXPECT_EQ(c->cluster.tls_cert, "/etc/troupe/n2.crt");
  EXPECT_EQ(c->cluster.tls_key, "/etc/troupe/n2.key");
  EXPECT_EQ(c->cluster.tls_ca, "/etc/troupe/ca.crt");
  EXPECT_EQ(c->cluster.max_handshakes, 100u);
  EXPECT_EQ(c->cluster.max_handshakes_per_address, 4u);
  EXPECT_EQ(c->cluster.handshake_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(c->cluster.idle_timeout, std::chrono::milliseconds(8000));
  EXPECT_FALSE(c->cluster.send_traces);
  EXPECT_EQ(c->entities.shard_count, 128u);
  EXPECT_EQ(c->entities.stash_capacity, 50u);
  EXPECT_EQ(c->jobs.shard_count, 32u);
}

// proves: X1
TEST(NodeConfig, AnUnknownKeyIsRefusedByItsFullName) {
  EXPECT_EQ(error_of("[cluster]\nredis_prt = 1\n"), "node.toml: cluster.redis_prt: unknown setting");
  EXPECT_EQ(error_of("[admin]\nport = 1\nhots = \"x\"\n"), "node.toml: admin.hots: unknown setting");
  EXPECT_EQ(error_of("[databse]\nx = 1\n"), "node.toml: databse: unknown setting");
  EXPECT_EQ(error_of("verbose = true\n"), "node.toml: verbose: unknown setting");
}

// proves: X1
// The Redis password comes from a file or the environment, never the TOML,
// and a config that gives it two ways or a user without one is refused.
TEST(NodeConfig, TheRedisUserAndPasswordComeFromAFileOrTheEnvironmentOneWayOnly) {
  ::unsetenv("TROUPE_REDIS_PASSWORD");
  auto file = std::filesystem::temp_directory_path() / ("troupe-redis-pw-" + std::to_string(::getpid()));
  {
    std::ofstream out(file);
    out << "s3cret-pw\nsecond line ignored\n";
  }
  const std::string with_file =
      "[cluster]\ninsecure = true\nredis_user = \"troupe\"\nredis_password_file = \"" + file.string() + "\"\n";
  auto c = NodeConfig::parse(with_file, "node.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->cluster.redis_user, "troupe");
  EXPECT_EQ(c->cluster.redis_password, "s3cret-pw");

  ::setenv("TROUPE_REDIS_PASSWORD", "from-env", 1);
  auto env_only = NodeConfig::parse("[cluster]\ninsecure = true\nredis_user = \"troupe\"\n", "node.toml");
  ASSERT_TRUE(env_only.ok()) << env_only.error().to_string();
  EXPECT_EQ(env_only->cluster.redis_password, "from-env");
  EXPECT_EQ(error_of(with_file),
            "node.toml: cluster.redis_password_file: TROUPE_REDIS_PASSWORD is set too; give the password one way only");
  ::unsetenv("TROUPE_REDIS_PASSWORD");

  EXPECT_EQ(error_of("[cluster]\ninsecure = true\nredis_password = \"s3cret\"\n"),
            "node.toml: cluster.redis_password: the password does not go in the config; name a file holding it "
            "with cluster.redis_password_file, or set TROUPE_REDIS_PASSWORD");
  EXPECT_EQ(error_of("[cluster]\ninsecure = true\nredis_user = \"troupe\"\n"),
            "node.toml: cluster.redis_user: user 'troupe' needs a password: set cluster.redis_password_file or "
            "TROUPE_REDIS_PASSWORD");
  EXPECT_EQ(error_of("[cluster]\ninsecure = true\nredis_password_file = \"/nonexistent/pw\"\n"),
            "node.toml: cluster.redis_password_file: '/nonexistent/pw' cannot be read");
  {
    std::ofstream out(file, std::ios::trunc);
    out << "\n";
  }
  EXPECT_NE(error_of(with_file).find("the first line of '" + file.string() + "' is empty"), std::string::npos);
  std::filesystem::remove(file);
  // A password alone (no user) is the default user's: AUTH <password>.
  ::setenv("TROUPE_REDIS_PASSWORD", "only-pw", 1);
  auto no_user = NodeConfig::parse("[cluster]\ninsecure = true\n", "node.toml");
  ::unsetenv("TROUPE_REDIS_PASSWORD");
  ASSERT_TRUE(no_user.ok());
  EXPECT_EQ(no_user->cluster.redis_user, "");
  EXPECT_EQ(no_user->cluster.redis_password, "only-pw");
}

TEST(NodeConfig, AWrongTypeNamesTheSettingAndBothTypes) {
  EXPECT_EQ(error_of("[admin]\nport = \"8081\"\n"), "node.toml: admin.port: expected an integer, got a string");
  EXPECT_EQ(error_of("[node]\nid = 7\n"), "node.toml: node.id: expected a string, got an integer");
  EXPECT_EQ(error_of("admin = 3\n"), "node.toml: admin: expected a table ([admin]), got an integer");
}

TEST(NodeConfig, AnAppVersionIsReadAndOneOutsideItsCharactersIsRefused) {
  auto c = NodeConfig::parse("[node]\napp_version = \"2026.11.27+build5\"\n", "node.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->app_version, "2026.11.27+build5");
  EXPECT_EQ(NodeConfig::parse("", "node.toml")->app_version, "") << "none by default";
  EXPECT_EQ(error_of("[node]\napp_version = \"2.3 beta\"\n"),
            "node.toml: node.app_version: app version '2.3 beta' has a character outside [A-Za-z0-9._+-] at 3");
}

TEST(NodeConfig, OutOfRangeAndUnusableValuesAreRefused) {
  EXPECT_EQ(error_of("[admin]\nport = 70000\n"), "node.toml: admin.port: 70000 is out of range (0 to 65535)");
  EXPECT_EQ(error_of("[journal]\nwriter_connections = 0\n"),
            "node.toml: journal.writer_connections: 0 is out of range (1 to 64)");
  EXPECT_EQ(error_of("[journal]\nreader_connections = 65\n"),
            "node.toml: journal.reader_connections: 65 is out of range (1 to 64)");
  EXPECT_EQ(error_of("[journal]\nbackend = \"mysql\"\n"),
            "node.toml: journal.backend: expected one of sqlite, postgres, memory, got \"mysql\"");
  EXPECT_EQ(error_of("[journal]\nbackend = \"postgres\"\n"),
            "node.toml: journal.postgres: the postgres back end needs a connection string");
  EXPECT_EQ(error_of("[cluster]\nredis = \"localhost\"\n"),
            "node.toml: cluster.redis: expected \"host:port\", got \"localhost\"");
  EXPECT_EQ(error_of("[cluster]\nredis = \"h:0\"\n"),
            "node.toml: cluster.redis: the port in \"h:0\" is not a number from 1 to 65535");
  EXPECT_EQ(error_of("[cluster]\nheartbeat_ms = 3000\n"),
            "node.toml: cluster.liveness_threshold_ms: must be longer than cluster.heartbeat_ms (3000 <= 3000)");
  EXPECT_EQ(error_of("[cluster]\nhand_off_batch = 0\n"),
            "node.toml: cluster.hand_off_batch: 0 is out of range (1 to 1024)");
  EXPECT_EQ(error_of("[entities]\nshard_count = 0\n"),
            "node.toml: entities.shard_count: 0 is out of range (1 to 65536)");
  EXPECT_EQ(error_of("[node]\nid = \"a b\"\n"),
            "node.toml: node.id: \"a b\" must be 1 to 64 characters without spaces, '|' or '/'");
}

TEST(NodeConfig, JobsShardCountTakesOneTo4096AndRefusesAnythingElseNamingTheSetting) {
  for (std::uint32_t n : {1u, 16u, 256u, 4096u}) {
    auto c = NodeConfig::parse("[jobs]\nshard_count = " + std::to_string(n) + "\n", "node.toml");
    ASSERT_TRUE(c.ok()) << c.error().to_string();
    EXPECT_EQ(c->jobs.shard_count, n);
  }
  EXPECT_EQ(error_of("[jobs]\nshard_count = 0\n"), "node.toml: jobs.shard_count: 0 is out of range (1 to 4096)");
  EXPECT_EQ(error_of("[jobs]\nshard_count = 4097\n"),
            "node.toml: jobs.shard_count: 4097 is out of range (1 to 4096)");
  EXPECT_EQ(error_of("[jobs]\nshard_count = -3\n"), "node.toml: jobs.shard_count: -3 is out of range (1 to 4096)");
  EXPECT_EQ(error_of("[jobs]\nshard_count = \"16\"\n"),
            "node.toml: jobs.shard_count: expected an integer, got a string");
  EXPECT_EQ(error_of("[jobs]\nshard_count = 1.5\n"), "node.toml: jobs.shard_count: expected an integer, got a number");
  EXPECT_EQ(error_of("[jobs]\nshards = 8\n"), "node.toml: jobs.shards: unknown setting");
  EXPECT_EQ(error_of("jobs = 8\n"), "node.toml: jobs: expected a table ([jobs]), got an integer");
  // Every message is one line.
  EXPECT_EQ(error_of("[jobs]\nshard_count = 0\n").find('\n'), std::string::npos);
}

// proves: X1
TEST(NodeConfig, ATomlSyntaxErrorGivesItsLineAndColumn) {
  auto msg = error_of("[node]\nid = \"unterminated\n");
  EXPECT_EQ(msg.rfind("node.toml:2:", 0), 0u) << msg;
}

TEST(NodeConfig, ApplicationTablesAreHandedOverAndReadWithTheSameChecks) {
  auto c = NodeConfig::parse("[payment]\nport = 8080\ngateway = \"127.0.0.1:8090\"\nrate = 0.5\ntypo = 1\n",
                             "svc.toml", {"payment"});
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  ConfigReader r(c->app_table("payment"), "payment");
  EXPECT_EQ(*r.integer("port", 1, 0, 65535), 8080);
  EXPECT_EQ(*r.string("gateway", ""), "127.0.0.1:8090");
  EXPECT_DOUBLE_EQ(*r.number("rate", 0, 0, 1), 0.5);
  EXPECT_EQ(*r.integer("missing", 42, 0, 100), 42);
  auto bad = r.number("port", 0, 0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "payment.port: 8080 is out of range (0 to 1)");
  auto rest = r.finish();
  ASSERT_FALSE(rest.ok());
  EXPECT_EQ(rest.error().message(), "payment.typo: unknown setting");
  // Without the application's say-so the table is unknown.
  EXPECT_EQ(error_of("[payment]\nport = 1\n"), "node.toml: payment: unknown setting");
}

// proves: X1
TEST(NodeConfig, TheLogTableSetsLevelsPerComponentFormatAndFile) {
  auto c = NodeConfig::parse(R"(
[node]
id = "pay-1"
data_dir = "/tmp/pay"
[log]
level = "warn"
format = "json"
file = "node.log"
[log.levels]
cluster = "debug"
app = "trace"
)",
                             "node.toml");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(c->log.level, troupe::log::Level::warn);
  EXPECT_EQ(c->log.format, troupe::log::Format::json);
  using L = std::vector<std::pair<troupe::log::Component, troupe::log::Level>>;
  EXPECT_EQ(c->log.levels, (L{{troupe::log::Component::app, troupe::log::Level::trace},
                              {troupe::log::Component::cluster, troupe::log::Level::debug}}))
      << "in key order";
  auto lc = c->log_config();
  EXPECT_EQ(lc.file, "/tmp/pay/node.log") << "a relative file is under node.data_dir";
  ASSERT_EQ(lc.fields.size(), 1u);
  EXPECT_EQ(lc.fields[0], (std::pair<std::string, std::string>{"node", "pay-1"}));

  auto d = NodeConfig::parse("", "node.toml");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->log.level, troupe::log::Level::info);
  EXPECT_EQ(d->log.format, troupe::log::Format::text);
  EXPECT_EQ(d->log_config().file, "") << "stderr by default";

  EXPECT_EQ(error_of("[log]\nlevel = \"loud\"\n"),
            "node.toml: log.level: expected trace, debug, info, warn, error or off, got \"loud\"");
  EXPECT_EQ(error_of("[log]\nformat = \"xml\"\n"), "node.toml: log.format: expected one of text, json, got \"xml\"");
  EXPECT_EQ(error_of("[log.levels]\nclusterr = \"debug\"\n"),
            "node.toml: log.levels.clusterr: unknown component (core, net, persist, patterns, cluster, node, app)");
  EXPECT_EQ(error_of("[log.levels]\ncluster = 3\n"), "node.toml: log.levels.cluster: expected a string, got an integer");
  EXPECT_EQ(error_of("[log]\ncolour = true\n"), "node.toml: log.colour: unknown setting");
  EXPECT_EQ(error_of("log = 1\n"), "node.toml: log: expected a table ([log])");
}

TEST(NodeConfig, AFileThatCannotBeReadIsNamed) {
  auto c = NodeConfig::load("/nonexistent/dir/node.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message(), "config file '/nonexistent/dir/node.toml' cannot be read");
}

// The cluster port is TLS or, said explicitly, plain TCP: never plain by default.
TEST(NodeConfig, AClusterNeedsTlsOrAnExplicitInsecure) {
  const std::string need =
      "node.toml: cluster: the cluster port needs [cluster.tls] (cert, key, ca: mutual TLS, doc/node.md) or, for one "
      "machine or a private network, insecure = true (plain TCP: anyone who reaches the port is a member)";
  EXPECT_EQ(error_of("[cluster]\n"), need);
  EXPECT_EQ(error_of("[cluster]\ninsecure = false\n"), need);
  EXPECT_EQ(error_of("[cluster]\ninsecure = true\n[cluster.tls]\ncert = \"c\"\nkey = \"k\"\nca = \"a\"\n"),
            "node.toml: cluster.insecure: true together with [cluster.tls]; choose one");
  EXPECT_EQ(error_of("[cluster]\n[cluster.tls]\ncert = \"c\"\nkey = \"k\"\n"),
            "node.toml: cluster.tls: cert, key and ca are all needed (PEM files)");
  EXPECT_EQ(error_of("[cluster]\n[cluster.tls]\ncert = \"c\"\nkey = \"k\"\nca = \"a\"\ncrl = \"x\"\n"),
            "node.toml: cluster.tls.crl: unknown setting");
  EXPECT_EQ(error_of("[cluster]\ntls = 1\n"), "node.toml: cluster.tls: expected a table ([cluster.tls]), got an integer");
  EXPECT_EQ(error_of("[cluster]\ninsecure = true\nmax_handshakes = 0\n"),
            "node.toml: cluster.max_handshakes: 0 is out of range (1 to 1000000)");
  auto plain = NodeConfig::parse("[cluster]\ninsecure = true\n", "node.toml");
  ASSERT_TRUE(plain.ok()) << plain.error().to_string();
  EXPECT_TRUE(plain->cluster.insecure);
  EXPECT_TRUE(plain->cluster.tls_cert.empty());
  // Without [cluster], nothing is asked.
  EXPECT_TRUE(NodeConfig::parse("[node]\nid = \"x\"\n", "node.toml").ok());
}

}  // namespace
