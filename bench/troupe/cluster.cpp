// The cluster workloads, troupe only (no peer runs the same cluster):
//   failover   seconds from kill -9 of one of three nodes to every entity it
//              hosted answering again from a survivor, default coordinator
//              settings (heartbeat 1 s, liveness threshold 3 s, margin 0.5 s);
//   rebalance  seconds from rebalance_all to the new node hosting its share,
//              1,000 shards (one entity each) going from 3 nodes to 4.
// Each run starts its own PostgreSQL (postgres_test_server), redis-server and
// node processes (cluster_test_node) on 127.0.0.1, and drives them from this
// process through the nodes' "ctl" actors, as the multi-process tests do.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/sharding/cluster_test_protocol.hpp"
#include "cluster/sharding/node_process.hpp"
#include "common/report.hpp"
#include "processes.hpp"
#include "troupe/cluster/remote.hpp"
#include "troupe/cluster/sharding.hpp"
#include "troupe/core.hpp"

#if defined(TROUPE_BENCH_CLUSTER_NODE) && defined(TROUPE_BENCH_PG_SERVER)

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;
using namespace troupe;
using namespace troupe::cluster;
using namespace troupe::cluster::proc;

[[noreturn]] void die(const std::string& what) { proc::fail(what); }

using proc::Servers;

class Driver {
 public:
  Driver(Servers& s, int shards) : servers_(s), shards_(shards) {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_dead_letters = false;
    system_ = std::make_unique<ActorSystem>(std::move(cfg));
    Remoting::Settings rs;
    rs.security.insecure = true;
    rs.node_id = "driver";
    auto r = Remoting::start(*system_, rs);
    if (!r.ok()) die(r.error().to_string());
    remoting_ = std::move(r.value());
  }
  ~Driver() {
    nodes_.clear();
    remoting_->stop();
    system_->shutdown();
  }

  void start(const std::string& id) {
    std::vector<std::string> args = {"--redis-port", std::to_string(servers_.redis_port()), "--postgres",
                                     servers_.conninfo(), "--schema", "bench", "--history",
                                     servers_.dir() + "/" + id + ".log", "--shards", std::to_string(shards_)};
    auto n = std::make_unique<NodeProcess>(TROUPE_BENCH_CLUSTER_NODE, id, args);
    remoting_->set_peer(id, "127.0.0.1", n->port());
    nodes_[id] = std::move(n);
  }
  void kill9(const std::string& id) { nodes_[id]->kill9(); }

  RemoteRef<CtlMsg> ctl(const std::string& node) { return remoting_->remote<CtlMsg>(node, "ctl", codecs_); }
  std::string stats(const std::string& node) {
    auto st = ctl(node).ask<std::string>([](ReplyTo<std::string> r) { return CtlStats{std::move(r)}; }, 10s).get();
    return st.ok() ? st.value() : "error: " + st.error().to_string();
  }
  void await_members(std::size_t n) {
    auto until = std::chrono::steady_clock::now() + 60s;
    for (auto& [id, p] : nodes_) {
      if (!p->running()) continue;
      while (stats(id).find("members=" + std::to_string(n)) == std::string::npos) {
        if (std::chrono::steady_clock::now() > until) die(id + " never saw " + std::to_string(n) + " members");
        std::this_thread::sleep_for(20ms);
      }
    }
  }
  Result<std::string> where(const std::string& via, const std::string& e, Duration t) {
    return ctl(via).ask<std::string>([&](ReplyTo<std::string> r) { return CtlWhere{e, std::move(r)}; }, t).get();
  }
  // Deposits 1 into each entity, many in flight; dies on an error.
  void deposit_all(const std::string& via, const std::vector<std::string>& ids) {
    std::vector<Future<std::int64_t>> pending;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      pending.push_back(ctl(via).ask<std::int64_t>(
          [&](ReplyTo<std::int64_t> r) { return CtlDeposit{ids[i], 1, std::move(r)}; }, 60s));
      if (pending.size() == 200 || i + 1 == ids.size()) {
        for (auto& f : pending)
          if (auto r = f.get(); !r.ok()) die("deposit: " + r.error().to_string());
        pending.clear();
      }
    }
  }
  static std::string owner(const std::string& w) { return w.substr(0, w.find(' ')); }

 private:
  Servers& servers_;
  int shards_;
  std::unique_ptr<ActorSystem> system_;
  std::unique_ptr<Remoting> remoting_;
  std::shared_ptr<const MessageCodecs<CtlMsg>> codecs_ = std::make_shared<const MessageCodecs<CtlMsg>>(ctl_codecs());
  std::map<std::string, std::unique_ptr<NodeProcess>> nodes_;
};

void run_failover() {
  Servers servers(TROUPE_BENCH_PG_SERVER);
  Driver d(servers, 30);
  for (auto id : {"n1", "n2", "n3"}) d.start(id);
  d.await_members(3);
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i) ids.push_back("f-" + std::to_string(i));
  d.deposit_all("n1", ids);
  std::vector<std::string> victims;
  for (auto& e : ids) {
    auto w = d.where("n1", e, 10s);
    if (!w.ok()) die("where: " + w.error().to_string());
    if (Driver::owner(w.value()) == "n3") victims.push_back(e);
  }
  if (victims.empty()) die("n3 hosts no entity");
  auto t0 = std::chrono::steady_clock::now();
  d.kill9("n3");
  for (auto& e : victims) {
    for (;;) {
      auto w = d.where("n1", e, 500ms);
      if (w.ok() && Driver::owner(w.value()) != "n3") break;
      if (std::chrono::steady_clock::now() - t0 > 60s) die(e + " never came back");
    }
  }
  bench::report("failover", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), "s");
}

void run_rebalance() {
  constexpr std::uint32_t kShards = 1000;
  Servers servers(TROUPE_BENCH_PG_SERVER);
  Driver d(servers, kShards);
  for (auto id : {"n1", "n2", "n3"}) d.start(id);
  d.await_members(3);
  // One entity in every shard, so every shard is allocated (on n1..n3).
  std::vector<std::string> ids(kShards);
  std::uint32_t found = 0;
  for (long k = 0; found < kShards; ++k) {
    std::string id = "s-" + std::to_string(k);
    auto s = shard_of(id, kShards);
    if (ids[s].empty()) {
      ids[s] = id;
      ++found;
    }
  }
  d.deposit_all("n1", ids);
  d.start("n4");
  d.await_members(4);
  auto t0 = std::chrono::steady_clock::now();
  auto moved = d.ctl("n1").ask<std::int64_t>([](ReplyTo<std::int64_t> r) { return CtlRebalance{std::move(r)}; }, 60s).get();
  if (!moved.ok()) die("rebalance: " + moved.error().to_string());
  // Done when n4 hosts its share (the hand-offs are over) and every entity
  // answers.
  while (d.stats("n4").find("hosted=" + std::to_string(kShards / 4) + " ") == std::string::npos) {
    if (std::chrono::steady_clock::now() - t0 > 120s) die("n4 never reached its share: " + d.stats("n4"));
    std::this_thread::sleep_for(5ms);
  }
  for (auto& e : ids)
    if (auto w = d.where("n2", e, 30s); !w.ok()) die("after rebalance: " + w.error().to_string());
  bench::report("rebalance", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), "s");
  bench::report("rebalance_moves", static_cast<double>(moved.value()), "shards");
}

}  // namespace

// Both throw on failure; guarded() stops what they started, then exits 1.
void failover() { proc::guarded("failover", run_failover); }
void rebalance() { proc::guarded("rebalance", run_rebalance); }

}  // namespace troupe_bench

#else

namespace troupe_bench {
void failover() {
  std::fprintf(stderr, "bench_troupe: failover needs the test binaries (configure with TROUPE_BUILD_TESTS=ON)\n");
  std::exit(2);
}
void rebalance() { failover(); }
}  // namespace troupe_bench

#endif
