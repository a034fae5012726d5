// payment_loadgen: drives the payment service's HTTP API and reports what
// came back: outcomes, throughput and latency percentiles.
//
// Each payment is one POST /payments {"customer","order_id","amount",
// "settle":true}, answered when its outcome is known; a share of the
// completed ones (--refund-rate) is then cancelled, which refunds it
// (POST /payments/{id}/cancel). Two ways to drive:
//   - closed loop (no --rate): --concurrency payments in flight, each
//     answer sends the next;
//   - open loop (--rate R): sends are scheduled every 1/R s, whatever the
//     answers do; latency counts from the scheduled time, so a slow service
//     cannot hide its queueing (no coordinated omission), and a send due
//     while --concurrency requests are in flight is skipped and counted as
//     "behind".
// Latency is that of POST /payments, from send (or schedule) to the answer
// carrying an outcome (HTTP 200); refusals and errors are counted, not
// timed. Requests scheduled during --warmup-s are sent but not counted.
//
// Refunds: "refunds asked" counts the cancels the service answered with the
// refund (Cancelled, refunded = the amount): the refund is then stored with
// the cancel, and the service pays it back through the gateway from its
// outbox, once per idempotency key. With --gateway the load generator
// keeps those payment ids and, at the end, asks the gateway (payment_gateway:
// GET /stats, GET /refunds) what became of them, waiting up to
// --refund-settle-s for the outbox to drain: "refunds at the gateway" (its
// refunded payments, every client's), "refunds missing" (ids asked that
// the gateway never refunded) and "refunded twice" (ids asked refunded more
// than once). Without --gateway the refunds are not checked, and the
// summary says so.
//
// Several nodes (--node API_URL,ADMIN_URL, repeated): the load generator
// acts as a load balancer in front of them. Every 100 ms it GETs each
// ADMIN_URL/ready (500 ms timeout); a node gets new requests only while its
// last /ready answered 200 (any other status or no answer: not ready).
// Payments and cancels alike go round robin over the ready nodes; while
// none is ready a request waits for one, within its --timeout-s, and is
// counted as a wait (one that waits its whole timeout is a client timeout,
// "no ready node"). A request sent to a node that then turns not ready is
// not sent again: its real outcome is counted. --url alone is one node
// with no admin URL, always ready. Each node has its own keep-alive
// connections (--connections each).
//
// Besides the outcomes above, the summary gives: the answers by HTTP
// status for payments and cancels; the requests that got no answer, as
// connection errors (refused, reset, closed before the answer), client
// timeouts and other errors; per node the payments and cancels sent and
// how often it turned not ready; the latency of every counted request
// (payments and cancels, any outcome, waits included) in windows of
// --window-s by the time it was sent (a cancel sent after the run's end
// counts in the last window): count, p99 and max per window, the p99 of
// the whole run ("steady p99") and the worst window's ratio to it; and the
// slowest request (ms, node, kind, outcome).
//
// With --json the same as one object: the keys of the text's rows (url:
// the nodes' API URLs, ", " between them), plus
//   nodes[]: {api, admin (null without), payments, cancels,
//             turned_not_ready, ready_at_end}
//   payment_statuses, cancel_statuses: {"200": n, "503": n, ...}
//   payment_connection_errors, payment_client_timeouts,
//   payment_other_errors, and the same with cancel_; connection_errors
//   (both kinds)
//   no_ready_waits, no_ready_gave_up, no_ready_longest_wait_ms
//   window_s, windows[]: {index, start_s, count, p99_ms, max_ms} (the
//   last two null when count is 0), steady_p99_ms, window_p99_max_ms,
//   window_p99_ratio (null without requests)
//   slowest: {ms, node ("" when no node was ready), kind ("payment" or
//            "cancel"), outcome ("200", "connection error", "timeout",
//            "no ready node", ...)}, null without requests.

// Order ids are --id-prefix-N (default o-SEED-N); the service makes the
// payment id pay-ORDER. Load generators that share a service or a gateway
// need prefixes (or seeds) of their own.
//
// Exit status: 0 when some payment completed; 1 when none did (including
// a service that could not be reached at the start, or with --gateway a
// gateway that could not be asked about refunds); 2 for bad flags.
//
// The parts: loadgen.hpp (the options and LoadGen), loadgen_driver.cpp
// (sending and counting), loadgen_balance.hpp (the nodes, their /ready
// poller, the round robin and the latency windows), loadgen_report.cpp
// (the gateway check and the summary). This file reads the command line
// and wires them together.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cstdio>

#include "loadgen.hpp"
#include "troupe/net/url.hpp"

namespace payment_loadgen {

std::atomic<bool> g_interrupted{false};

namespace {

// The first SIGINT/SIGTERM stops sending and reports; a second one quits.
extern "C" void on_signal(int) {
  if (g_interrupted.exchange(true)) _exit(130);
}

// "http://host[:port][/]"; nullopt with `why` otherwise.
std::optional<troupe::http::Url> parse_root_url(const std::string& url, std::string& why) {
  auto parsed = troupe::http::parse_url(url);
  if (!parsed.ok()) {
    why = parsed.error().message();
    return std::nullopt;
  }
  if (parsed->target != "/") {
    why = "the URL must not have a path (the API is at the root)";
    return std::nullopt;
  }
  return std::move(*parsed);
}

// "API_URL,ADMIN_URL" of --node; nullopt with `why` otherwise.
std::optional<NodeAddress> parse_node(const std::string& spec, std::string& why) {
  const auto comma = spec.find(',');
  if (comma == std::string::npos) {
    why = "expected API_URL,ADMIN_URL (e.g. http://127.0.0.1:8080,http://127.0.0.1:8081)";
    return std::nullopt;
  }
  NodeAddress a{spec.substr(0, comma), spec.substr(comma + 1)};
  if (a.api.empty() || a.admin.empty() || a.admin.find(',') != std::string::npos) {
    why = "expected API_URL,ADMIN_URL: two URLs, one comma";
    return std::nullopt;
  }
  std::string sub;
  if (!parse_root_url(a.api, sub)) {
    why = "API URL '" + a.api + "': " + sub;
    return std::nullopt;
  }
  if (!parse_root_url(a.admin, sub)) {
    why = "admin URL '" + a.admin + "': " + sub;
    return std::nullopt;
  }
  return a;
}

}  // namespace

}  // namespace payment_loadgen

int main(int argc, char** argv) {
  using namespace payment_loadgen;
  Options o;
  bool duration_given = false;
  CLI::App app{"Load generator for the troupe payment service's HTTP API."};
  app.footer(
      "With several --node, payments and cancels go round robin over the nodes whose ADMIN_URL/ready "
      "last answered 200; while none is ready a request waits (within --timeout-s). The summary adds "
      "answers by HTTP status, connection errors, requests per node, p99 and max per --window-s window "
      "and the slowest request (loadgen_main.cpp lists the --json keys).\n"
      "Exit status: 0 when some payment completed, 1 when none did, 2 for bad flags.");
  std::vector<std::string> node_specs;
  auto* url = app.add_option("--url", o.url, "Base URL of the payment service (one node, always ready)")
                  ->capture_default_str();
  app.add_option("--node", node_specs,
                 "A node as API_URL,ADMIN_URL; repeat for several. Requests go round robin over the nodes "
                 "whose ADMIN_URL/ready last answered 200 (polled every 100 ms); not with --url")
      ->allow_extra_args(false)
      ->excludes(url);
  app.add_option("--window-s", o.window_s, "Seconds per latency window (p99 and max of each)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  auto* duration = app.add_option("--duration-s", o.duration_s, "Seconds to send for, after the warm-up")
                       ->check(CLI::PositiveNumber)
                       ->capture_default_str();
  app.add_option("--payments", o.payments, "Stop after this many payments (counted after the warm-up)")
      ->check(CLI::PositiveNumber);
  app.add_option("--rate", o.rate,
                 "Payments per second, open loop (0: closed loop, as fast as --concurrency allows)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--concurrency", o.concurrency, "Requests in flight at most")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--connections", o.connections, "HTTP connections to each node (default: --concurrency)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--customers", o.customers, "Customer ids drawn uniformly from this many")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--refund-rate", o.refund_rate, "Share of completed payments then cancelled (refunded)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--amount-min", o.amount_min, "Smallest amount, minor units")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--amount-max", o.amount_max, "Largest amount, minor units")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the random draws")->capture_default_str();
  app.add_option("--warmup-s", o.warmup_s, "Seconds sent first and not counted")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--timeout-s", o.timeout_s, "HTTP request timeout in seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--id-prefix", o.id_prefix,
                 "Order ids are PREFIX-1, PREFIX-2, ... (payment ids pay-PREFIX-N); default o-SEED. Load "
                 "generators that share a service or a gateway need prefixes of their own")
      ->check([](const std::string& p) -> std::string {
        if (p.empty()) return "must not be empty";
        for (unsigned char c : p)
          if (!std::isalnum(c) && c != '-' && c != '_' && c != '.') return "only letters, digits, - _ and .";
        return {};
      });
  app.add_option("--gateway", o.gateway,
                 "Base URL of the settlement gateway (payment_gateway): at the end, look the refunds "
                 "asked up there. 'refunds at the gateway' counts every client's refunds, so it compares "
                 "with 'refunds asked' only when this load generator is the gateway's only client; "
                 "'refunds missing' and 'refunded twice' are checked payment by payment, which holds with "
                 "several clients as long as their order ids differ (--id-prefix)");
  app.add_option("--refund-settle-s", o.refund_settle_s,
                 "With --gateway: seconds to wait at the end, polling every 0.5 s, until the gateway has "
                 "every refund asked (the service pays them from its outbox after answering the cancel)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--json", o.json_out, "Print the summary as one JSON object");
  app.add_flag("--quiet", o.quiet, "No progress on stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  duration_given = duration->count() > 0;
  if (o.payments > 0 && !duration_given) o.duration_s = 0;  // --payments alone: no time limit
  if (o.amount_min > o.amount_max) {
    std::fprintf(stderr, "payment_loadgen: --amount-min must not exceed --amount-max\n");
    return 2;
  }
  if (o.connections == 0) o.connections = o.concurrency;
  if (o.id_prefix.empty()) o.id_prefix = "o-" + std::to_string(o.seed);
  std::string why;
  if (node_specs.empty()) {
    if (!parse_root_url(o.url, why)) {
      std::fprintf(stderr, "payment_loadgen: bad --url '%s': %s\n", o.url.c_str(), why.c_str());
      return 2;
    }
    o.nodes.push_back(NodeAddress{o.url, ""});
  } else {
    o.url.clear();
    for (const auto& spec : node_specs) {
      const auto node = parse_node(spec, why);
      if (!node) {
        std::fprintf(stderr, "payment_loadgen: bad --node '%s': %s\n", spec.c_str(), why.c_str());
        return 2;
      }
      o.nodes.push_back(*node);
      o.url += (o.url.empty() ? "" : ", ") + node->api;
    }
  }
  std::optional<troupe::http::Url> gateway_target;
  if (!o.gateway.empty()) {
    gateway_target = parse_root_url(o.gateway, why);
    if (!gateway_target) {
      std::fprintf(stderr, "payment_loadgen: bad --gateway '%s': %s\n", o.gateway.c_str(), why.c_str());
      return 2;
    }
  }

  ClientSettings cs;
  cs.max_connections = o.connections;
  cs.max_queued = o.concurrency * 2 + 16;  // refunds ride on top of the payments in flight
  cs.request_timeout =
      std::chrono::duration_cast<troupe::Duration>(std::chrono::duration<double>(o.timeout_s));
  auto nodes = NodePool::create(o.nodes, cs);
  if (!nodes.ok()) {
    std::fprintf(stderr, "payment_loadgen: cannot reach %s\n", nodes.error().message().c_str());
    return 1;
  }
  // The gateway is asked at the start too, so that a run that cannot
  // check its refunds says so before it starts rather than after.
  std::unique_ptr<Client> gateway;
  if (gateway_target) {
    ClientSettings gs;
    gs.host = gateway_target->host;
    gs.port = gateway_target->port;
    gs.max_connections = 1;
    auto g = Client::create(gs);
    if (!g.ok()) {
      std::fprintf(stderr, "payment_loadgen: cannot reach the gateway %s: %s\n", o.gateway.c_str(),
                   g.error().message().c_str());
      return 1;
    }
    gateway = std::move(g).value();
    const json st = get_json(*gateway, "/stats", why);
    if (st.is_discarded() || !st.contains("refunds_distinct")) {
      std::fprintf(stderr, "payment_loadgen: the gateway %s cannot check refunds: %s\n", o.gateway.c_str(),
                   st.is_discarded() ? why.c_str() : "its GET /stats has no refunds_distinct");
      return 1;
    }
  }
  LoadGen gen(o, std::move(nodes).value(), std::move(gateway));
  if (auto reachable = gen.probe(); !reachable.ok()) {
    std::fprintf(stderr, "payment_loadgen: cannot reach %s: %s\n", o.url.c_str(),
                 reachable.error().to_string().c_str());
    return 1;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  gen.run();
  gen.check_gateway();
  const int rc = gen.report();
  if (rc != 0) std::fprintf(stderr, "payment_loadgen: no payment completed\n");
  return rc;
}
