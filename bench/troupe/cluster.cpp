// The cluster workloads, troupe only (no peer runs the same cluster):
//   failover   seconds from kill -9 of one of three nodes to every entity it
//              hosted answering again from a survivor, default coordinator
//              settings (heartbeat 1 s, liveness threshold 3 s, margin 0.5 s);
//   rebalance  seconds from rebalance_all to the new node hosting its share,
//              1,000 shards (one entity each) going from 3 nodes to 4.
// Each run starts its own PostgreSQL (postgres_test_server), redis-server and
// node processes (cluster_test_node) on 127.0.0.1, and drives them from this
// process through the nodes' "ctl" actors, as the multi-process tests do.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/sharding/cluster_test_protocol.hpp"
#include "cluster/sharding/node_process.hpp"
#include "common/report.hpp"
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

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "bench_troupe: cluster: %s\n", what.c_str());
  std::exit(1);
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

bool port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  close(fd);
  return ok;
}

// PostgreSQL, Redis and a directory of its own for one run; all stopped and
// removed when it goes.
class Servers {
 public:
  Servers() {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-bench-cluster-XXXXXX").string();
    if (!mkdtemp(pattern.data())) die("mkdtemp");
    dir_ = pattern;
    pg_state_ = dir_ + "/pg.state";
    if (std::system((std::string(TROUPE_BENCH_PG_SERVER) + " start " + pg_state_ + " >&2").c_str()) != 0)
      die("PostgreSQL did not start");
    std::ifstream in(pg_state_);
    std::getline(in, conninfo_);
    redis_port_ = free_port();
    redis_pid_ = fork();
    if (redis_pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      std::string port = std::to_string(redis_port_);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--dir", dir_.c_str(),
             "--save", "", "--appendonly", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    auto until = std::chrono::steady_clock::now() + 20s;
    while (!port_open(redis_port_)) {
      if (std::chrono::steady_clock::now() > until) die("redis-server did not start");
      std::this_thread::sleep_for(20ms);
    }
  }
  ~Servers() {
    if (redis_pid_ > 0) {
      kill(redis_pid_, SIGKILL);
      waitpid(redis_pid_, nullptr, 0);
    }
    (void)std::system((std::string(TROUPE_BENCH_PG_SERVER) + " stop " + pg_state_ + " >&2").c_str());
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  const std::string& conninfo() const { return conninfo_; }
  int redis_port() const { return redis_port_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, pg_state_, conninfo_;
  int redis_port_ = 0;
  pid_t redis_pid_ = -1;
};

class Driver {
 public:
  Driver(Servers& s, int shards) : servers_(s), shards_(shards) {
    SystemConfig cfg;
    cfg.threads = 2;
    cfg.log_dead_letters = false;
    system_ = std::make_unique<ActorSystem>(std::move(cfg));
    Remoting::Settings rs;
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

}  // namespace

void failover() {
  Servers servers;
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

void rebalance() {
  constexpr std::uint32_t kShards = 1000;
  Servers servers;
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
