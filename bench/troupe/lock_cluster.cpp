// lock_cluster / lock_cluster_contended: troupe's cluster-wide lock (SPEC L6)
// taken from one node and owned by another, so every acquire and release
// crosses TCP, beside the Redis lock (bench/peers/redis_lock). What both
// sides share and how they measure: bench/common/lock.hpp.
//
// Two cluster nodes, two processes, on the redis-server bench/run starts
// (TROUPE_BENCH_REDIS_PORT; Redis holds membership and placement only, no
// lock traffic goes through it):
//   owner   `bench_troupe remote_server <workload> <fd>`, started by the
//           bench process (bench::remote::ServerProcess): joins the cluster
//           alone, starts the lock and places every lock shard on itself
//           (the only member, so the least-loaded one), then announces its
//           port. It runs until the bench process kills it.
//   caller  the bench process: joins the cluster, starts the same lock,
//           checks that every lock shard is owned by the other node, and
//           runs the callers. A caller's lock() sends Acquire to the owner,
//           runs the block here on the Grant, and sends Release; its future
//           completes once the block has run and the release is sent (the
//           owner does not answer a release).
// Both nodes are actor systems with 2 threads, as in every troupe workload.
// Checked: every lock shard is owned by the owner node before the clock
// starts, and afterwards the caller's transport sent at least two frames
// (Acquire, Release) and received at least one (Grant) per pair counted.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/lock.hpp"
#include "common/remote.hpp"
#include "lock_callers.hpp"
#include "troupe/cluster/cluster.hpp"
#include "troupe/cluster/cluster_lock.hpp"
#include "troupe/cluster/transport.hpp"
#include "troupe/core.hpp"

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;
using bench::lock::Clock;
using troupe::ActorSystem;
using troupe::KeyedLock;
using troupe::cluster::Cluster;

constexpr const char* kCallerNode = "lock-caller";
constexpr const char* kOwnerNode = "lock-owner";
constexpr const char* kLockName = "bench";

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_troupe: lock_cluster: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

std::uint16_t redis_port() {
  const char* s = std::getenv("TROUPE_BENCH_REDIS_PORT");
  const long port = s ? std::atol(s) : 0;
  if (port <= 0 || port > 65535) die("TROUPE_BENCH_REDIS_PORT is not set (bench/run sets it)");
  return static_cast<std::uint16_t>(port);
}

troupe::SystemConfig config() {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  cfg.log_dead_letters = false;
  return cfg;
}

std::unique_ptr<Cluster> join(ActorSystem& sys, const char* id) {
  troupe::cluster::ClusterSettings cs;
  cs.security.insecure = true;
  cs.node_id = id;
  cs.coordination.redis_port = redis_port();
  cs.coordination.key_prefix = "bench-lock";
  auto c = Cluster::start(sys, cs);
  if (!c.ok()) die(std::string(id) + ": " + c.error().to_string());
  return std::move(c.value());
}

KeyedLock start_lock(ActorSystem& sys, Cluster& cluster) {
  auto l = troupe::cluster::start_keyed_lock(
      sys, cluster.remoting(), cluster.directory(),
      {.name = kLockName, .wait_timeout = 60s, .lease = std::chrono::milliseconds(bench::lock::kLeaseMs)});
  if (!l.ok()) die("start_keyed_lock: " + l.error().to_string());
  return std::move(l.value());
}

// The owner of every lock shard, as this node's directory sees it (locating
// an unplaced shard places it on the least-loaded live member).
std::vector<std::string> owners(Cluster& cluster) {
  const std::uint32_t shards = troupe::cluster::ClusterLockSettings{}.shard_count;
  std::vector<std::promise<std::string>> found(shards);
  for (std::uint32_t s = 0; s < shards; ++s) {
    cluster.directory().locate(troupe::cluster::lock_type(kLockName), s,
                               [p = &found[s]](troupe::Result<troupe::cluster::ShardDirectory::Location> r) {
                                 p->set_value(r.ok() ? r.value().owner : "error: " + r.error().to_string());
                               });
  }
  std::vector<std::string> out;
  for (auto& f : found) {
    auto fut = f.get_future();
    if (fut.wait_for(30s) != std::future_status::ready) die("locating a lock shard took over 30 s");
    out.push_back(fut.get());
  }
  return out;
}

}  // namespace

int lock_cluster_server(const std::string& workload, const char* fd_arg) {
  if (bench::lock::shape(workload.c_str()) == nullptr) die("no lock workload '" + workload + "'");
  ActorSystem sys(config());
  auto cluster = join(sys, kOwnerNode);
  KeyedLock lock = start_lock(sys, *cluster);
  for (const std::string& o : owners(*cluster))
    if (o != kOwnerNode) die("a lock shard was placed on " + o + ", not on the owner node");
  if (!bench::remote::announce_port(fd_arg, cluster->remoting().port())) return 1;
  // Serves until the bench process kills it (nothing here to flush).
  while (true) std::this_thread::sleep_for(1h);
}

bool lock_cluster(const std::string& workload) {
  const bench::lock::Shape* shape = bench::lock::shape(workload.c_str());
  if (shape == nullptr) return false;
  // First, on this (main) thread, as ServerProcess requires; killed last.
  bench::remote::ServerProcess owner(shape->name);
  ActorSystem sys(config());
  auto cluster = join(sys, kCallerNode);
  KeyedLock lock = start_lock(sys, *cluster);
  for (const std::string& o : owners(*cluster))
    if (o != kOwnerNode) die("a lock shard is owned by " + o + ", not by the owner node: not every lock would "
                             "cross the network");
  // Connected before the clock starts: the owner is a member in this node's
  // view (its address known) and one lock has made the round trip.
  const auto until = Clock::now() + 30s;
  while (cluster->coordinator().members().size() < 2) {
    if (Clock::now() > until) die("the owner node did not appear among the members within 30 s");
    std::this_thread::sleep_for(10ms);
  }
  if (auto r = lock.lock("probe", [](const troupe::LockLease&) { return 0; }).get(); !r.ok())
    die("first lock: " + r.error().to_string());

  const std::vector<std::string> keys = bench::lock::key_names(shape->keys);
  bench::lock::Meter meter(shape->callers);
  const double seconds = lock_callers::drive(lock, keys, shape->callers, meter, shape->name);
  // Every pair crossed the network: an Acquire and a Release sent, a Grant
  // received (the counts cover the warm-up too, so they can only be larger).
  const troupe::cluster::TransportStats net = cluster->remoting().transport().stats();
  if (net.frames_sent < 2 * meter.pairs() || net.frames_received < meter.pairs())
    die(std::to_string(meter.pairs()) + " pairs in the window but only " + std::to_string(net.frames_sent) +
        " frames sent and " + std::to_string(net.frames_received) + " received: not every lock crossed the network");
  if (!meter.report(shape->name, seconds)) die("no pair completed within the window");
  // As a node stops: leave (this one hosts no lock shard), then the lock and
  // the actor system, and the node last.
  if (auto left = cluster->leave(10s); !left.ok()) die("leave: " + left.error().to_string());
  lock.stop();
  sys.shutdown();
  cluster.reset();
  return true;
}

}  // namespace troupe_bench
