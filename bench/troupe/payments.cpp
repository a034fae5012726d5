// The payments workload, troupe only: payments/s end to end through the
// payment service example (examples/payment), each payment one POST
// /payments answered with its outcome: HTTP -> process manager -> customer
// lock -> payment entity -> journal -> gateway (its own HTTP process,
// answering in 1 ms) -> journal -> reply.
//   payments_1node{,_p50,_p99}  one payment_service, SQLite journal in a
//                               temporary directory (default durability);
//   payments_1node_pg{,_p50,_p99}  the same node with the PostgreSQL
//                               journal, in the fresh database of bench/run's
//                               own server (TROUPE_BENCH_PG_CONNINFO, fsync
//                               and synchronous_commit on);
//   payments_3node{,_p50,_p99}  three payment_service nodes in a cluster,
//                               placement in redis-server, journal in
//                               PostgreSQL (both our own, on 127.0.0.1);
//   projection_lag_p99, projection_lag_3node_p99  the read side's lag (the
//                               service's own projections) under the load
//                               of payments_1node and payments_3node.
// The load is payment_loadgen, closed loop: a fixed number of payments in
// flight, each answer sending the next; 3 s of warm-up, then 12 s measured.
// Throughput counts every payment answered with an outcome (completed, or
// failed as the gateway declined 3 %); latency is from send to answer.
// Everything runs on this machine, load generator included, so the numbers
// are those of the whole path sharing its cores.

#include <algorithm>
#include <cstdint>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/journal_append.hpp"
#include "common/report.hpp"
#include "processes.hpp"
#include "troupe/net/http.hpp"

#if defined(TROUPE_BENCH_PAYMENT_SERVICE) && defined(TROUPE_BENCH_PAYMENT_GATEWAY) && \
    defined(TROUPE_BENCH_PAYMENT_LOADGEN) && defined(TROUPE_BENCH_PG_SERVER)

namespace troupe_bench {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using proc::Child;
using proc::fail;

// Payments in flight, closed loop, in total over the generators. On the
// 2-core machine the figures were taken on (generator, gateway and service
// sharing the cores), one node gave (medians of 16 runs) 8,000 payments/s
// with p99 19 ms at 64, 10,100 with p99 27 ms at 128 and 11,400 with p99
// 43 ms at 256: 64 leaves the node short of saturation, 256 is the best
// throughput with p99 still under the 50 ms of the bar; beyond it
// more payments in flight only queue. The cluster gets the same total
// (85-86 per node), so both rows offer the same load; its throughput was
// the same from 64 to 256 in flight, only its latency grows with them.
constexpr int kConcurrency = 256;
constexpr double kWarmupS = 3;
constexpr double kMeasureS = 12;
constexpr int kShards = 64;  // entities.shard_count of the cluster's nodes

// The gateway of the bar: answers in 1 ms, declines 3 %, never
// fails or hangs.
std::unique_ptr<Child> start_gateway(const std::string& dir, int& port) {
  auto gw = std::make_unique<Child>(
      "payment_gateway",
      std::vector<std::string>{TROUPE_BENCH_PAYMENT_GATEWAY, "--port", "0", "--latency-ms", "1",
                               "--jitter-ms", "0", "--decline-rate", "0.03", "--error-rate", "0",
                               "--hang-rate", "0"},
      dir + "/gateway.log");
  std::string line = gw->await_line("payment_gateway listening on http://", 30s);
  port = std::stoi(line.substr(line.rfind(':') + 1));
  return gw;
}

// One payment_service and the ports it printed.
struct Service {
  std::unique_ptr<Child> process;
  int api_port = 0;
  int admin_port = 0;
};

// "payment_service <id>: payments on http://HOST:PORT, dashboard on http://HOST:PORT/"
Service start_service(const std::string& dir, const std::string& id, const std::string& config) {
  std::string path = dir + "/" + id + ".toml";
  std::ofstream(path) << config;
  Service s;
  s.process = std::make_unique<Child>(
      id, std::vector<std::string>{TROUPE_BENCH_PAYMENT_SERVICE, "--config", path}, dir + "/" + id + ".log");
  std::string line = s.process->await_line("payment_service " + id + ": payments on http://", 90s);
  auto port_after = [&](const std::string& key) {
    auto at = line.find(key);
    if (at == std::string::npos) fail(id + ": unexpected start line: " + line);
    auto colon = line.find(':', line.find("://", at) + 3);
    return std::stoi(line.substr(colon + 1));
  };
  s.api_port = port_after("payments on ");
  s.admin_port = port_after("dashboard on ");
  return s;
}

std::string node_config(const std::string& dir, const std::string& id, int gateway_port) {
  return "[node]\nid = \"" + id + "\"\ndata_dir = \"" + dir + "/" + id +
         "\"\n\n[admin]\nport = 0\n\n[payment]\nport = 0\n" +
         "gateway = \"127.0.0.1:" + std::to_string(gateway_port) + "\"\n";
}

// What one payment_loadgen --json printed.
struct Load {
  double throughput = 0;
  double p50 = 0;
  double p99 = 0;
};

// Generator `i`'s part of `total` payments in flight, split as evenly as
// `n` generators allow.
int share(int total, std::size_t n, std::size_t i) {
  const int k = static_cast<int>(n);
  return total / k + (static_cast<int>(i) < total % k ? 1 : 0);
}

// Runs one load generator per URL at once, `concurrency` in flight over
// all of them (split evenly), for `measure_s` after `warmup_s`, or (with
// `payments` > 0) until each sent that many. Fails unless every one
// finished with no errors and some payments completed.
std::vector<Load> run_load(const std::string& dir, const std::vector<int>& api_ports, int concurrency,
                           double warmup_s, double measure_s, long payments = 0) {
  static int runs = 0;
  ++runs;
  std::vector<std::unique_ptr<Child>> gens;
  for (std::size_t i = 0; i < api_ports.size(); ++i) {
    std::string name = "payment_loadgen " + std::to_string(i + 1);
    // Refunds are another path (a job through the gateway): none, the rows
    // time settlements alone. A seed per generator and run keeps the order
    // ids apart, so each POST is a new payment.
    std::vector<std::string> argv = {TROUPE_BENCH_PAYMENT_LOADGEN, "--url",
                                     "http://127.0.0.1:" + std::to_string(api_ports[i])};
    argv.insert(argv.end(), {"--concurrency", std::to_string(share(concurrency, api_ports.size(), i)),
                             "--warmup-s", std::to_string(warmup_s), "--refund-rate", "0", "--seed",
                             std::to_string(runs * 100 + static_cast<int>(i) + 1), "--json", "--quiet"});
    if (payments > 0) {
      argv.insert(argv.end(), {"--payments", std::to_string(payments)});
    } else {
      argv.insert(argv.end(), {"--duration-s", std::to_string(measure_s)});
    }
    std::string log = dir + "/loadgen-" + std::to_string(runs) + "-" + std::to_string(i + 1) + ".log";
    gens.push_back(std::make_unique<Child>(name, argv, log));
  }
  std::vector<Load> loads;
  for (auto& gen : gens) {
    auto& g = *gen;
    // Generous: a generator that is still running this long after its
    // duration is stuck.
    int status = g.wait(std::chrono::seconds(static_cast<long>(warmup_s + measure_s) + 60));
    std::string out = g.output();
    // stderr shares the log; the summary is the line holding a JSON object.
    json j;
    std::stringstream lines(out);
    for (std::string l; std::getline(lines, l);) {
      if (l.empty() || l.front() != '{') continue;
      j = json::parse(l, nullptr, false);
    }
    if (status != 0 || !j.is_object())
      fail(g.name() + " exited with status " + std::to_string(status) + ": " + proc::tail(out));
    auto count = [&](const char* k) { return j.value(k, std::uint64_t{0}); };
    if (count("errors") > 0) {
      fail(g.name() + ": " + std::to_string(count("errors")) + " errors, the first: " +
           (j["first_error"].is_string() ? j["first_error"].get<std::string>() : std::string("?")));
    }
    if (count("completed") == 0) fail(g.name() + ": no payment completed: " + proc::tail(out));
    for (const char* k : {"refused", "timed_out", "gateway_error", "failed_other", "unsettled"}) {
      if (count(k) > 0)
        std::fprintf(stderr, "bench_troupe: payments: note: %s: %s = %llu\n", g.name().c_str(), k,
                     static_cast<unsigned long long>(count(k)));
    }
    Load l;
    l.throughput = j.value("throughput", 0.0);
    l.p50 = j["latency_ms"].value("p50", 0.0);
    l.p99 = j["latency_ms"].value("p99", 0.0);
    loads.push_back(l);
  }
  return loads;
}

// Throughput: the sum. Latency: with more than one generator, the largest
// of their percentiles, which bounds the percentile of all their payments
// together from above (each has at most 1 % of its payments above its own
// p99, so all together have at most 1 % above the largest).
void report(const std::string& name, const std::vector<Load>& loads) {
  Load total;
  for (const auto& l : loads) {
    total.throughput += l.throughput;
    total.p50 = std::max(total.p50, l.p50);
    total.p99 = std::max(total.p99, l.p99);
  }
  bench::report(name.c_str(), total.throughput, "payments/s");
  bench::report((name + "_p99").c_str(), total.p99, "ms");
  bench::report((name + "_p50").c_str(), total.p50, "ms");
}

json get_json(int port, const std::string& target, const std::string& method = "GET") {
  troupe::http::ClientSettings cs;
  cs.port = static_cast<std::uint16_t>(port);
  cs.max_connections = 1;
  auto client = troupe::http::Client::create(cs);
  if (!client.ok()) return nullptr;
  auto r = (*client)->request_sync(method, target, "", "", std::chrono::seconds(30));
  if (!r.ok() || r->status != 200) return nullptr;
  return json::parse(r->body, nullptr, false);
}

// Polls GET /cluster on each node until `ok` holds for its answer.
template <class Ok>
void await_cluster(const std::vector<Service>& nodes, const char* what, Ok ok) {
  auto until = std::chrono::steady_clock::now() + 90s;
  for (const auto& n : nodes) {
    for (;;) {
      json c = get_json(n.admin_port, "/cluster");
      if (c.is_object() && ok(c)) break;
      if (auto st = n.process->exited())
        fail(n.process->name() + " exited with status " + std::to_string(*st) + ": " +
             proc::tail(n.process->output()));
      if (std::chrono::steady_clock::now() > until)
        fail(n.process->name() + " never saw " + what +
             "; GET /cluster: " + (c.is_discarded() ? "?" : c.dump()));
      std::this_thread::sleep_for(100ms);
    }
  }
}

// The read side's lag under that load (`metric`): every applied event's
// lag, from its storing to the commit of its projection's page, counted by
// each node's projections in buckets (GET /projections: lag_bounds_ms,
// lag_counts), summed over every projection and slice of `nodes`; the p99
// is the upper bound of the bucket that holds it. Warm-up included.
void report_projection_lag(const std::string& metric, const std::vector<Service>& nodes) {
  // Every event stored under the load counts: the projections catch up
  // first (an event not applied yet would be left out, and it is the most
  // behind).
  const auto until = std::chrono::steady_clock::now() + 120s;
  for (bool all = false; !all;) {
    all = true;
    for (const auto& n : nodes) {
      json ps = get_json(n.admin_port, "/projections");
      for (const auto& p : ps.is_object() ? ps.value("projections", json::array()) : json::array())
        if (!p.value("caught_up", false)) all = false;
    }
    if (all) break;
    if (std::chrono::steady_clock::now() > until) fail(metric + ": the projections did not catch up within 120 s");
    std::this_thread::sleep_for(100ms);
  }
  std::vector<std::uint64_t> counts;
  std::vector<double> bounds;
  auto distribution = [&](const std::vector<std::uint64_t>& c) {
    std::string dist;
    for (std::size_t k = 0; k < c.size(); ++k)
      if (c[k] != 0)
        dist += (k < bounds.size() ? "<=" + std::to_string(static_cast<long>(bounds[k])) : std::string(">")) + ":" +
                std::to_string(c[k]) + " ";
    return dist;
  };
  for (const auto& n : nodes) {
    json ps = get_json(n.admin_port, "/projections");
    if (!ps.is_object()) fail(n.process->name() + ": GET /projections did not answer");
    for (const auto& p : ps.value("projections", json::array())) {
      auto c = p.value("lag_counts", std::vector<std::uint64_t>{});
      bounds = p.value("lag_bounds_ms", std::vector<double>{});
      if (counts.empty()) counts.assign(c.size(), 0);
      for (std::size_t i = 0; i < c.size() && i < counts.size(); ++i) counts[i] += c[i];
      // On stderr, for whoever reads the run: where each slice's lag lies.
      std::fprintf(stderr, "%s %s: %llu events in %llu pages; lag (ms) %s\n", n.process->name().c_str(),
                   p.value("key", std::string()).c_str(),
                   static_cast<unsigned long long>(p.value("events_applied", 0ULL)),
                   static_cast<unsigned long long>(p.value("pages_applied", 0ULL)), distribution(c).c_str());
    }
  }
  std::uint64_t total = 0;
  for (auto c : counts) total += c;
  if (total == 0) fail(metric + ": the nodes' projections applied no event");
  const auto rank = static_cast<std::uint64_t>(std::ceil(0.99 * static_cast<double>(total)));
  std::uint64_t seen = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (seen >= rank) {
      if (i >= bounds.size()) fail(metric + ": the p99 lies above every bucket; events by lag (ms): " + distribution(counts));
      return bench::report(metric.c_str(), bounds[i], "ms");
    }
  }
}

// One node, the rest as payments_1node: the same gateway, load and node
// settings; only the [journal] section differs. With a `lag_metric`, the
// read side's lag under the load is reported instead of the payments.
void one_node(const std::string& name, const std::string& journal, const std::string& lag_metric = "") {
  proc::TempDir dir("troupe-bench-payments");
  int gateway_port = 0;
  auto gateway = start_gateway(dir.path(), gateway_port);
  auto node = start_service(dir.path(), "pay-1",
                            node_config(dir.path(), "pay-1", gateway_port) + "\n[journal]\n" + journal);
  auto loads = run_load(dir.path(), {node.api_port}, kConcurrency, kWarmupS, kMeasureS);
  if (lag_metric.empty()) report(name, loads);
  if (!lag_metric.empty()) {
    std::vector<Service> nodes;
    nodes.push_back(std::move(node));
    report_projection_lag(lag_metric, nodes);
  }
}

// The SQLite journal as configured by default: every event durable before
// it is acknowledged.
void one_node_sqlite() { one_node("payments_1node", "backend = \"sqlite\"\n"); }

// projection_lag_p99: payments_1node's load, and the read side's lag under it.
void one_node_lag() { one_node("payments_1node", "backend = \"sqlite\"\n", "projection_lag_p99"); }

// The PostgreSQL journal (its default options) in the database bench/run
// created for this process on its own server.
void one_node_postgres() {
  const char* conninfo = std::getenv(bench::kPgConninfoEnv);
  if (conninfo == nullptr || *conninfo == '\0')
    fail(std::string("payments_1node_pg needs ") + bench::kPgConninfoEnv +
         " (the libpq connection string of an empty database; bench/run sets it)");
  one_node("payments_1node_pg", "backend = \"postgres\"\npostgres = " + json(conninfo).dump() + "\n");
}

// payments_3node; with a `lag_metric`, the read side's lag under its load
// (the slices spread over the three nodes) is reported instead.
void three_nodes(const std::string& lag_metric = "") {
  proc::Servers servers(TROUPE_BENCH_PG_SERVER);
  const std::string& dir = servers.dir();
  int gateway_port = 0;
  auto gateway = start_gateway(dir, gateway_port);
  std::vector<Service> nodes;
  std::vector<std::string> ids = {"pay-1", "pay-2", "pay-3"};
  for (const auto& id : ids) {
    std::string config = node_config(dir, id, gateway_port) +
                         "\n[journal]\nbackend = \"postgres\"\npostgres = \"" + servers.conninfo() +
                         "\"\n\n[cluster]\nredis = \"127.0.0.1:" + std::to_string(servers.redis_port()) +
                         "\"\nlisten_port = 0\ninsecure = true\n\n[entities]\nshard_count = " + std::to_string(kShards) + "\n";
    nodes.push_back(start_service(dir, id, config));
  }
  await_cluster(nodes, "3 members",
                [](const json& c) { return c.value("members", json::array()).size() == 3; });
  // Shards are placed on first use (on the least loaded member): a few
  // payments through every node place them all before the clock starts.
  std::vector<int> ports;
  for (const auto& n : nodes) ports.push_back(n.api_port);
  (void)run_load(dir, ports, 3 * 8, 0, 0, 500);
  await_cluster(nodes, "every shard placed on the 3 members", [&](const json& c) {
    std::set<long> shards;
    std::set<std::string> owners;
    for (const auto& s : c.value("shards", json::array())) {
      if (s.value("type", "") != "payment") continue;
      shards.insert(s.value("shard", -1L));
      owners.insert(s.value("owner", ""));
    }
    return shards.size() == static_cast<std::size_t>(kShards) &&
           owners == std::set<std::string>(ids.begin(), ids.end());
  });
  if (!lag_metric.empty()) {
    // The read side's slices are placed like the shards, on the members
    // there are when a node starts serving them (the first node, often):
    // a rebalance, as an operator runs after a start, spreads them, and
    // all of them run caught up before the clock starts.
    json moved = get_json(nodes.front().admin_port, "/rebalance", "POST");
    if (!moved.is_object()) fail("POST /rebalance did not answer");
    auto until = std::chrono::steady_clock::now() + 90s;
    for (;;) {
      std::size_t running = 0, fewest = SIZE_MAX;
      for (const auto& n : nodes) {
        json ps = get_json(n.admin_port, "/projections");
        std::size_t here = 0;
        for (const auto& p : ps.is_object() ? ps.value("projections", json::array()) : json::array())
          if (p.value("state", "") == "running" && p.value("caught_up", false)) ++here;
        running += here;
        fewest = std::min(fewest, here);
      }
      // payments_by_customer and daily_totals, 4 slices each, 2 or 3 a node
      if (running >= 8 && fewest >= 2) break;
      if (std::chrono::steady_clock::now() > until)
        fail("the read side's 8 slices never all ran caught up, spread over the nodes");
      std::this_thread::sleep_for(100ms);
    }
  }
  auto loads = run_load(dir, ports, kConcurrency, kWarmupS, kMeasureS);
  if (lag_metric.empty()) return report("payments_3node", loads);
  report_projection_lag(lag_metric, nodes);
}

}  // namespace

// `payments` runs payments_1node and payments_3node in one process;
// bench/run runs each row (and payments_1node_pg) as a workload of its own.
void payments(const std::string& workload) {
  proc::guarded(workload.c_str(), [&] {
    if (workload == "payments" || workload == "payments_1node") one_node_sqlite();
    if (workload == "projection_lag_p99") one_node_lag();
    if (workload == "payments_1node_pg") one_node_postgres();
    if (workload == "payments" || workload == "payments_3node") three_nodes();
    if (workload == "projection_lag_3node_p99") three_nodes("projection_lag_3node_p99");
  });
}

}  // namespace troupe_bench

#else

namespace troupe_bench {
void payments(const std::string&) {
  std::fprintf(stderr,
               "bench_troupe: payments needs payment_service, payment_gateway, payment_loadgen and the test "
               "binaries (configure with TROUPE_BUILD_TESTS=ON)\n");
  std::exit(2);
}
}  // namespace troupe_bench

#endif
