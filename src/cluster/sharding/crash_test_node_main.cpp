// The node process of the crash tests, killed with SIGKILL by them
// (crash_test_protocol.hpp). Two roles:
//
//   crash_test_node --id c1 --role gateway [--hold]
//     Remoting only; publishes the gateway actor. With --hold it never
//     answers a Charge: the asks stay in flight until the process dies.
//
//   crash_test_node --id c1 --role lock --redis-port P --marker FILE --lease-ms L
//                   [--lease-margin-ms M] [--heartbeat-ms 200] [--threshold-ms 1000] [--margin-ms 300]
//     Joins the cluster (Redis coordinator, remoting) and starts the cluster
//     lock; then waits for the key in FILE.key, locks it with a block that
//     never finishes and reports the hold in FILE.
//
// Prints "READY <port>" once started, and then runs until killed.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "crash_test_protocol.hpp"
#include "troupe/cluster/cluster.hpp"
#include "troupe/cluster/cluster_lock.hpp"
#include "troupe/core.hpp"

namespace {

using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::crash;

std::string arg(int argc, char** argv, const char* name, const char* fallback = nullptr) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  if (!fallback) {
    std::fprintf(stderr, "crash_test_node: missing %s\n", name);
    std::exit(2);
  }
  return fallback;
}
bool flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return true;
  return false;
}
std::chrono::milliseconds ms(int argc, char** argv, const char* name, const char* fallback) {
  return std::chrono::milliseconds(std::atoi(arg(argc, argv, name, fallback).c_str()));
}

void ready(std::uint16_t port) {
  std::printf("READY %u\n", static_cast<unsigned>(port));
  std::fflush(stdout);
}

[[noreturn]] void run_until_killed() {
  for (;;) pause();
}

struct Gateway : Actor<GatewayMsg> {
  Gateway(std::string n, bool h) : node(std::move(n)), hold(h) {}
  std::string node;
  bool hold;
  std::vector<ReplyTo<std::string>> held;
  void receive(GatewayMsg& m) {
    if (auto* c = std::get_if<Charge>(&m)) {
      if (hold) {
        held.push_back(std::move(c->reply_to));
      } else {
        c->reply_to.reply(node + " charged " + std::to_string(c->amount));
      }
    } else if (auto* h = std::get_if<HeldCharges>(&m)) {
      h->reply_to.reply(static_cast<std::int64_t>(held.size()));
    }
  }
};

int gateway(const std::string& id, bool hold) {
  SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  ActorSystem system(std::move(cfg));
  Remoting::Settings rs;
  rs.security.insecure = true;
  rs.node_id = id;
  auto remoting = Remoting::start(system, rs);
  if (!remoting.ok()) {
    std::fprintf(stderr, "crash_test_node %s: %s\n", id.c_str(), remoting.error().to_string().c_str());
    return 1;
  }
  auto gw = system.spawn<Gateway>(id, hold);
  if (auto p = remoting.value()->publish<GatewayMsg>(kGateway, gw, gateway_codecs()); !p.ok()) {
    std::fprintf(stderr, "crash_test_node %s: %s\n", id.c_str(), p.error().to_string().c_str());
    return 1;
  }
  ready(remoting.value()->port());
  run_until_killed();
}

int lock_node(const std::string& id, int argc, char** argv) {
  const std::string marker = arg(argc, argv, "--marker");
  SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  ActorSystem system(std::move(cfg));

  ClusterSettings cs;
  cs.security.insecure = true;
  cs.node_id = id;
  cs.coordination.redis_port = static_cast<std::uint16_t>(std::atoi(arg(argc, argv, "--redis-port").c_str()));
  cs.coordination.key_prefix = kLockClusterPrefix;
  cs.coordination.heartbeat_interval = ms(argc, argv, "--heartbeat-ms", "200");
  cs.coordination.liveness_threshold = ms(argc, argv, "--threshold-ms", "1000");
  cs.coordination.takeover_margin = ms(argc, argv, "--margin-ms", "300");
  cs.coordination.sync_interval = std::chrono::seconds(1);
  cs.coordination.command_timeout = std::chrono::milliseconds(500);
  auto cluster = Cluster::start(system, cs);
  if (!cluster.ok()) {
    std::fprintf(stderr, "crash_test_node %s: %s\n", id.c_str(), cluster.error().to_string().c_str());
    return 1;
  }
  KeyedLockSettings ls;
  ls.name = kLockName;
  ls.wait_timeout = std::chrono::seconds(20);
  ls.lease = ms(argc, argv, "--lease-ms", "4000");
  ClusterLockSettings cls;
  cls.shard_count = kLockShards;
  cls.lease_margin = ms(argc, argv, "--lease-margin-ms", "500");
  auto lock = start_keyed_lock(system, cluster.value()->remoting(), cluster.value()->directory(), ls, cls);
  if (!lock.ok()) {
    std::fprintf(stderr, "crash_test_node %s: lock: %s\n", id.c_str(), lock.error().to_string().c_str());
    return 1;
  }
  ready(cluster.value()->remoting().port());

  std::string key;
  while (key.empty()) {
    std::ifstream(key_file(marker)) >> key;
    if (key.empty()) usleep(5'000);
  }
  // Held until the process dies: the promise is never set.
  Promise<int> never;
  auto held = lock.value().lock(key, [&](const LockLease& lease) {
    auto now = std::chrono::steady_clock::now().time_since_epoch();
    std::string tmp = marker + ".tmp";
    std::ofstream(tmp) << lease.token() << " " << std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()
                       << "\n"
                       << std::flush;
    std::filesystem::rename(tmp, marker);
    return never.future();
  });
  run_until_killed();
}

}  // namespace

int main(int argc, char** argv) {
  std::string id = arg(argc, argv, "--id");
  std::string role = arg(argc, argv, "--role");
  if (role == "gateway") return gateway(id, flag(argc, argv, "--hold"));
  if (role == "lock") return lock_node(id, argc, argv);
  std::fprintf(stderr, "crash_test_node: unknown role '%s'\n", role.c_str());
  return 2;
}
