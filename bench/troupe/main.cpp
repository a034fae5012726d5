// troupe side of the Savina-style workloads; see bench/common/report.hpp for
// the contract shared with bench/peers/caf. Each workload is written the way
// a troupe user would write it: typed actors, variant protocols, no tricks.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "common/journal_append.hpp"
#include "common/lock.hpp"
#include "common/remote.hpp"
#include "common/report.hpp"
#include "troupe/core.hpp"

namespace troupe_bench {
void journal_append(long entities);     // journal_append.cpp: SqliteJournal
void journal_append_pg(long entities);  // journal_append.cpp: PostgresJournal
void recovery();                     // entities.cpp
void entity_memory();                // entities.cpp
bool lock(const std::string& workload);  // lock.cpp: lock_uncontended, _contended, _spread
bool lock_cluster(const std::string& workload);  // lock_cluster.cpp: lock_cluster, lock_cluster_contended
int lock_cluster_server(const std::string& workload, const char* fd_arg);  // lock_cluster.cpp: the owner node
void process_manager();                  // process_manager.cpp
void projection_throughput();            // projections.cpp
void jobs(const std::string& workload);  // jobs.cpp: jobs_{memory,durable,durable_fsync}_c{1,50}[_prio]
void jobs_cluster(const std::string& workload);  // jobs_cluster.cpp: jobs_cluster_c50 (three nodes)
void failover();                         // cluster.cpp
void rebalance();                        // cluster.cpp
void payments(const std::string& workload);  // payments.cpp
void remote_tell(const std::string& workload);  // remote.cpp: remote_tell, remote_tell_tls
void remote_ask(const std::string& workload);   // remote.cpp: remote_ask, remote_ask_tls
int remote_server(const std::string& workload, const char* fd_arg);  // remote.cpp: the second process
bool worker_placement(const std::string& workload);  // workers.cpp: workers_sync, _failover, _rebalance
// workers_node.cpp: a node process of the workers_* rows
int workers_node(const std::string& node_id, const std::string& units_file, const char* fd_arg);
}  // namespace troupe_bench

namespace {

using troupe::Actor;
using troupe::ActorRef;
using troupe::ActorSystem;
using troupe::ReplyTo;

troupe::SystemConfig config() {
  troupe::SystemConfig cfg;
  cfg.threads = 2;
  return cfg;
}

// --- ping_pong -----------------------------------------------------------------

using PongMsg = std::variant<ActorRef<long>, long>;  // partner, then balls

struct Pong : Actor<PongMsg> {
  ActorRef<long> ping;
  void receive(PongMsg& m) {
    if (auto* n = std::get_if<long>(&m)) {
      ping.tell(*n);
    } else {
      ping = std::get<ActorRef<long>>(m);
    }
  }
};

struct Ping : Actor<long> {
  Ping(ActorRef<PongMsg> p, long n, std::promise<void>* d) : pong(std::move(p)), total(n), done(d) {}
  ActorRef<PongMsg> pong;
  long total;
  std::promise<void>* done;
  void receive(long& n) {
    if (n == total) {
      done->set_value();
    } else {
      pong.tell(n + 1);
    }
  }
};

void ping_pong() {
  const long n = bench::kPingPongRoundTrips / bench::scale();
  ActorSystem sys(config());
  std::promise<void> done;
  auto pong = sys.spawn<Pong>();
  auto ping = sys.spawn<Ping>(pong, n, &done);
  pong.tell(ActorRef<long>(ping));
  bench::Stopwatch sw;
  pong.tell(0L);
  done.get_future().wait();
  double s = sw.seconds();
  bench::report("ping_pong", static_cast<double>(n) / s, "round trips/s");
  bench::report("ping_pong_latency", s * 1e9 / static_cast<double>(n), "ns");
}

// --- counting ------------------------------------------------------------------

struct Retrieve {
  std::promise<long>* result;
};
using CounterMsg = std::variant<int, Retrieve>;

struct Counter : Actor<CounterMsg> {
  long count = 0;
  void receive(CounterMsg& m) {
    if (auto* v = std::get_if<int>(&m)) {
      count += *v;
    } else {
      std::get<Retrieve>(m).result->set_value(count);
    }
  }
};

struct Go {};

struct Producer : Actor<Go> {
  Producer(ActorRef<CounterMsg> c, long n, std::promise<long>* r) : counter(std::move(c)), total(n), result(r) {}
  ActorRef<CounterMsg> counter;
  long total;
  std::promise<long>* result;
  void receive(Go&) {
    for (long i = 0; i < total; ++i) counter.tell(1);
    counter.tell(Retrieve{result});
  }
};

void counting() {
  const long n = bench::kCountingMessages / bench::scale();
  ActorSystem sys(config());
  std::promise<long> result;
  auto counter = sys.spawn<Counter>();
  auto producer = sys.spawn<Producer>(counter, n, &result);
  bench::Stopwatch sw;
  producer.tell(Go{});
  long got = result.get_future().get();
  double s = sw.seconds();
  if (got != n) {
    std::fprintf(stderr, "counting: expected %ld, got %ld\n", n, got);
    std::exit(1);
  }
  bench::report("counting", static_cast<double>(n) / s, "msgs/s");
  bench::report("counting_peak_rss", static_cast<double>(bench::proc_status_kb("VmHWM")) / 1024.0, "MB");
}

// --- fan_in --------------------------------------------------------------------

struct Sink : Actor<int> {
  Sink(long n, std::promise<void>* d) : expected(n), done(d) {}
  long expected;
  long got = 0;
  std::promise<void>* done;
  void receive(int&) {
    if (++got == expected) done->set_value();
  }
};

struct Sender : Actor<Go> {
  Sender(ActorRef<int> s, long n) : sink(std::move(s)), count(n) {}
  ActorRef<int> sink;
  long count;
  void receive(Go&) {
    for (long i = 0; i < count; ++i) sink.tell(static_cast<int>(i));
  }
};

void fan_in(int senders) {
  const long per = bench::kFanInPerSender / bench::scale();
  ActorSystem sys(config());
  std::promise<void> done;
  auto sink = sys.spawn<Sink>(per * senders, &done);
  std::vector<ActorRef<Go>> ss;
  for (int i = 0; i < senders; ++i) ss.push_back(sys.spawn<Sender>(sink, per));
  bench::Stopwatch sw;
  for (auto& s : ss) s.tell(Go{});
  done.get_future().wait();
  double s = sw.seconds();
  std::string name = "fan_in_" + std::to_string(senders);
  bench::report(name.c_str(), static_cast<double>(per * senders) / s, "msgs/s");
}

// --- skynet --------------------------------------------------------------------

struct SkynetRoot : Actor<long> {
  explicit SkynetRoot(std::promise<long>* r) : result(r) {}
  std::promise<long>* result;
  void receive(long& sum) { result->set_value(sum); }
};

struct Skynet : Actor<long> {
  Skynet(ActorRef<long> p, long first, long count) : parent(std::move(p)), num(first), size(count) {}
  ActorRef<long> parent;
  long num;
  long size;
  long sum = 0;
  int pending = 10;
  void on_start() {
    if (size == 1) {
      parent.tell(num);
      stop();
      return;
    }
    long child = size / 10;
    for (long i = 0; i < 10; ++i) spawn<Skynet>(self(), num + i * child, child);
  }
  void receive(long& v) {
    sum += v;
    if (--pending == 0) {
      parent.tell(sum);
      stop();
    }
  }
};

void skynet() {
  long leaves = bench::kSkynetLeaves;
  for (long s = bench::scale(); s >= 10; s /= 10) leaves /= 10;
  ActorSystem sys(config());
  std::promise<long> result;
  auto root = sys.spawn<SkynetRoot>(&result);
  bench::Stopwatch sw;
  sys.spawn<Skynet>(ActorRef<long>(root), 0L, leaves);
  long sum = result.get_future().get();
  double s = sw.seconds();
  long expect = leaves * (leaves - 1) / 2;
  if (sum != expect) {
    std::fprintf(stderr, "skynet: expected %ld, got %ld\n", expect, sum);
    std::exit(1);
  }
  bench::report("skynet", s * 1e3, "ms");
}

// --- thread_ring ---------------------------------------------------------------

struct RingSetup;
using RingNodeMsg = std::variant<RingSetup, long>;  // setup (next node), then the token
struct RingSetup {
  ActorRef<RingNodeMsg> next;
};

struct Ring : Actor<RingNodeMsg> {
  explicit Ring(std::promise<void>* d) : done(d) {}
  ActorRef<RingNodeMsg> next;
  std::promise<void>* done;
  void receive(RingNodeMsg& m) {
    if (auto* t = std::get_if<long>(&m)) {
      if (*t == 0) {
        done->set_value();
      } else {
        next.tell(*t - 1);
      }
    } else {
      next = std::move(std::get<RingSetup>(m).next);
    }
  }
};

void thread_ring() {
  const long hops = bench::kRingHops / bench::scale();
  ActorSystem sys(config());
  std::promise<void> done;
  std::vector<ActorRef<RingNodeMsg>> ring;
  for (int i = 0; i < bench::kRingSize; ++i) ring.push_back(sys.spawn<Ring>(&done));
  for (int i = 0; i < bench::kRingSize; ++i) ring[i].tell(RingSetup{ring[(i + 1) % bench::kRingSize]});
  sys.wait_idle();
  bench::Stopwatch sw;
  ring[0].tell(hops);
  done.get_future().wait();
  double s = sw.seconds();
  bench::report("thread_ring", static_cast<double>(hops) / s, "hops/s");
}

// --- ask -----------------------------------------------------------------------

struct Request {
  ReplyTo<long> reply;
  long value;
};

struct Server : Actor<Request> {
  void receive(Request& r) { r.reply(r.value + 1); }
};

struct Client : Actor<Go> {
  Client(ActorRef<Request> s, long n, std::promise<void>* d) : server(std::move(s)), total(n), done(d) {}
  ActorRef<Request> server;
  long total;
  long sent = 0;
  std::promise<void>* done;
  void receive(Go&) { next(); }
  void next() {
    long v = sent++;
    ask<long>(
        server, [v](ReplyTo<long> r) { return Request{std::move(r), v}; }, std::chrono::seconds(10),
        [this, v](troupe::Result<long> r) {
          if (!r || *r != v + 1) {
            std::fprintf(stderr, "ask: bad reply\n");
            std::exit(1);
          }
          if (sent == total) {
            done->set_value();
          } else {
            next();
          }
        });
  }
};

// `row`: kAskPairs asks of a Server by a client of type C.
template <class C>
void ask_bench(const char* row) {
  const long n = bench::kAskPairs / bench::scale();
  ActorSystem sys(config());
  std::promise<void> done;
  auto server = sys.spawn<Server>();
  auto client = sys.spawn<C>(server, n, &done);
  bench::Stopwatch sw;
  client.tell(Go{});
  done.get_future().wait();
  double s = sw.seconds();
  bench::report(row, static_cast<double>(n) / s, "pairs/s");
}

// --- ask_coroutine ---------------------------------------------------------------

// The ask workload written as a coroutine handler: one handler awaits each
// reply in turn, resuming in the client actor as the continuation form does.
struct CoroutineClient : Actor<Go> {
  CoroutineClient(ActorRef<Request> s, long n, std::promise<void>* d) : server(std::move(s)), total(n), done(d) {}
  ActorRef<Request> server;
  long total;
  std::promise<void>* done;
  troupe::Task<> receive(Go) {
    for (long v = 0; v < total; ++v) {
      troupe::Result<long> r = co_await ask<long>(
          server, [v](ReplyTo<long> rt) { return Request{std::move(rt), v}; }, std::chrono::seconds(10));
      if (!r || *r != v + 1) {
        std::fprintf(stderr, "ask_coroutine: bad reply\n");
        std::exit(1);
      }
    }
    done->set_value();
  }
};

// --- idle_memory ---------------------------------------------------------------

struct Idle : Actor<int> {
  int state = 0;
  void receive(int& v) { state += v; }
};

void idle_memory() {
  const long n = bench::kIdleActors / bench::scale();
  ActorSystem sys(config());
  std::vector<ActorRef<int>> refs;
  refs.reserve(static_cast<std::size_t>(n));
  sys.wait_idle();
  long before = bench::proc_status_kb("VmRSS");
  for (long i = 0; i < n; ++i) refs.push_back(sys.spawn<Idle>());
  sys.wait_idle();
  long after = bench::proc_status_kb("VmRSS");
  bench::report("idle_memory", static_cast<double>(after - before) * 1024.0 / static_cast<double>(n),
                "bytes/actor");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_troupe <workload>\n");
    return 2;
  }
  std::string w = argv[1];
  if (argc == 4 && w == bench::remote::kServerArg) {
    if (bench::lock::shape(argv[2]) != nullptr) return troupe_bench::lock_cluster_server(argv[2], argv[3]);
    return troupe_bench::remote_server(argv[2], argv[3]);
  }
  if (argc == 5 && w == "workers_node") return troupe_bench::workers_node(argv[2], argv[3], argv[4]);
  if (w == "ping_pong") {
    ping_pong();
  } else if (w == "counting") {
    counting();
  } else if (w == "fan_in_4") {
    fan_in(4);
  } else if (w == "fan_in_16") {
    fan_in(16);
  } else if (w == "skynet") {
    skynet();
  } else if (w == "thread_ring") {
    thread_ring();
  } else if (w == "ask") {
    ask_bench<Client>("ask");
  } else if (w == "ask_coroutine") {
    ask_bench<CoroutineClient>("ask_coroutine");
  } else if (w == "idle_memory") {
    idle_memory();
  } else if (w == "recovery") {
    troupe_bench::recovery();
  } else if (w == "entity_memory") {
    troupe_bench::entity_memory();
  } else if (w == "process_manager") {
    troupe_bench::process_manager();
  } else if (w == "projection_throughput") {
    troupe_bench::projection_throughput();
  } else if (w == "failover") {
    troupe_bench::failover();
  } else if (w == "rebalance") {
    troupe_bench::rebalance();
  } else if (w == "payments" || w == "payments_1node" || w == "payments_1node_pg" || w == "payments_3node" ||
             w == "projection_lag_p99" || w == "projection_lag_3node_p99") {
    troupe_bench::payments(w);  // payments: payments_1node then payments_3node
  } else if (w == "remote_tell" || w == "remote_tell_tls") {
    troupe_bench::remote_tell(w);
  } else if (w == "remote_ask" || w == "remote_ask_tls") {
    troupe_bench::remote_ask(w);
  } else if (w.rfind("jobs_cluster_", 0) == 0) {
    troupe_bench::jobs_cluster(w);
  } else if (w.rfind("jobs_", 0) == 0) {
    troupe_bench::jobs(w);
  } else if (troupe_bench::lock(w) || troupe_bench::lock_cluster(w) || troupe_bench::worker_placement(w)) {
    // done
  } else if (long pg_entities = bench::journal_entities(w, bench::kJournalPgPrefix); pg_entities > 0) {
    troupe_bench::journal_append_pg(pg_entities);  // journal_append_pg_1, _100, _10000
  } else if (long entities = bench::journal_entities(w); entities > 0) {
    troupe_bench::journal_append(entities);  // journal_append_1, _100, _10000
  } else {
    std::fprintf(stderr, "bench_troupe: unknown workload '%s'\n", w.c_str());
    return 2;
  }
  return 0;
}
