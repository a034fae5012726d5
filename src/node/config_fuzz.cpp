// libFuzzer target for the node's TOML configuration (scripts/fuzz runs it).
//
// The input is the text of a configuration file: whatever an operator, a
// template engine or a damaged disk could leave there. NodeConfig::parse
// must answer with a configuration or an error value, never a crash, an
// exception or undefined behaviour (ASan/UBSan). Beyond that it checks:
//   - an error is invalid_argument with a message that starts with the
//     file's name (the operator has to find the line);
//   - an accepted configuration holds what the file comment of
//     include/troupe/node/config.hpp promises: ranges, non-empty paths,
//     a liveness threshold longer than the heartbeat;
//   - parsing is a function of the text: a second parse agrees;
//   - the application's table ([app] is declared one) reads through every
//     ConfigReader accessor without a crash, and finish() names the keys
//     nobody read.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/node/config.hpp"

namespace {

using troupe::ErrorCode;
using troupe::node::ConfigReader;
using troupe::node::NodeConfig;

void check(bool ok) {
  if (!ok) std::abort();
}

void check_error(const troupe::Error& e, std::string_view origin) {
  check(e.code() == ErrorCode::invalid_argument);
  check(e.message().size() > origin.size() && e.message().compare(0, origin.size(), origin) == 0);
}

void check_config(const NodeConfig& c) {
  check(!c.id.empty() && c.id.size() <= 64);
  check(!c.data_dir.empty());
  check(c.threads <= 256);
  check(!c.admin.host.empty());
  check(c.journal.backend == "sqlite" || c.journal.backend == "postgres" || c.journal.backend == "memory");
  check(!c.journal.path.empty() && !c.journal.schema.empty());
  check(c.journal.backend != "postgres" || !c.journal.postgres.empty());
  check(c.cluster.redis_port != 0 && !c.cluster.key_prefix.empty());
  check(c.cluster.liveness_threshold > c.cluster.heartbeat);
  check(c.cluster.heartbeat.count() >= 10 && c.cluster.takeover_margin.count() >= 0);
  check(c.entities.shard_count >= 1 && c.entities.shard_count <= 65536);
  check(c.entities.stash_capacity >= 1 && c.jobs.shard_count >= 1 && c.jobs.shard_count <= 4096);
  (void)c.sqlite_path();
}

// Reads every key of the application's table with each accessor.
void read_app(const NodeConfig& c) {
  const toml::table* t = c.app_table("app");
  if (t == nullptr) return;
  std::vector<std::string> keys;
  for (const auto& [k, v] : *t) keys.emplace_back(k.str());
  ConfigReader r(t, "app");
  std::size_t i = 0;
  for (const auto& k : keys) {
    switch (i++ % 6) {
      case 0: (void)r.string(k, "x"); break;
      case 1: (void)r.integer(k, 0, -5, 1'000'000); break;
      case 2: (void)r.number(k, 0.5, -1.0, 1e9); break;
      case 3: (void)r.boolean(k, false); break;
      case 4: (void)r.millis(k, std::chrono::milliseconds(5), std::chrono::milliseconds(0), std::chrono::hours(1)); break;
      default: (void)r.choice(k, "a", {"a", "b"}); break;
    }
    check(r.has(k));
  }
  auto done = r.finish();
  check(done.ok());  // every key was read
  ConfigReader unread(t, "app");
  check(unread.finish().ok() == keys.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string origin = "fuzz.toml";
  const std::vector<std::string> app_tables{"app"};
  auto first = NodeConfig::parse(text, origin, app_tables);
  auto second = NodeConfig::parse(text, origin, app_tables);
  check(first.ok() == second.ok());
  if (!first.ok()) {
    check_error(first.error(), origin);
    check(first.error().message() == second.error().message());
    return 0;
  }
  check_config(*first);
  check(first->id == second->id && first->journal.backend == second->journal.backend &&
        first->cluster.enabled == second->cluster.enabled && first->app.size() == second->app.size());
  read_app(*first);
  return 0;
}
