// payment_loadgen's report: the refunds looked up at the gateway after the
// run, and the summary with its latency histogram, the answers by status,
// the nodes and the latency windows. See loadgen.hpp.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>
#include <unordered_set>

#include "loadgen.hpp"

namespace payment_loadgen {

// GET `target` from the gateway as a JSON object; a discarded value with `why` otherwise.
json get_json(Client& c, const char* target, std::string& why) {
  auto r = c.request_sync("GET", target, "", "", std::chrono::seconds(10));
  if (!r.ok()) {
    why = std::string("GET ") + target + ": " + r.error().to_string();
    return json(json::value_t::discarded);
  }
  json j = r->status == 200 ? json::parse(r->body, nullptr, false) : json(json::value_t::discarded);
  if (j.is_discarded() || !j.is_object()) {
    why = std::string("GET ") + target + ": HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200);
    return json(json::value_t::discarded);
  }
  return j;
}

void Answers::count(const Result<Response>& r, bool never_sent) {
  if (r.ok()) {
    const int s = r->status;
    by_status[s >= 100 && s < 600 ? static_cast<std::size_t>(s) : 0].fetch_add(1, std::memory_order_relaxed);
  } else if (r.error().code() == ErrorCode::timeout) {
    timeouts.fetch_add(1, std::memory_order_relaxed);
    if (never_sent) no_ready_node.fetch_add(1, std::memory_order_relaxed);
  } else if (r.error().code() == ErrorCode::unreachable) {
    connection_errors.fetch_add(1, std::memory_order_relaxed);
  } else {
    other_errors.fetch_add(1, std::memory_order_relaxed);
  }
}

json Answers::statuses() const {
  json j = json::object();
  for (std::size_t s = 0; s < by_status.size(); ++s)
    if (const auto n = by_status[s].load(std::memory_order_relaxed))
      j[s == 0 ? std::string("other") : std::to_string(s)] = n;
  return j;
}

std::string outcome_name(const Result<Response>& r, bool never_sent) {
  if (r.ok()) return std::to_string(r->status);
  if (never_sent) return "no ready node";
  if (r.error().code() == ErrorCode::timeout) return "timeout";
  if (r.error().code() == ErrorCode::unreachable) return "connection error";
  return std::string(troupe::to_string(r.error().code()));
}

std::size_t LoadGen::measured_windows() const {
  const double measured = std::chrono::duration<double>(end_ - std::max(measure_from_, start_)).count();
  return measured > 0 ? static_cast<std::size_t>(std::ceil(measured / o_.window_s - 1e-9)) : 0;
}

json LoadGen::balance_json() const {
  const ReadyRoundRobin& rr = nodes_->balance();
  json nodes = json::array();
  for (std::size_t i = 0; i < nodes_->size(); ++i) {
    const NodePool::Node& n = nodes_->node(i);
    nodes.push_back({{"api", n.address.api},
                     {"admin", n.address.admin.empty() ? json(nullptr) : json(n.address.admin)},
                     {"payments", n.payments.load()},
                     {"cancels", n.cancels.load()},
                     {"turned_not_ready", rr.turned_not_ready(i)},
                     {"ready_at_end", rr.ready(i)}});
  }
  const auto& pa = payment_answers_;
  const auto& ca = cancel_answers_;
  json windows = json::array();
  std::uint64_t worst = 0;
  for (const auto& w : windows_.windows(measured_windows())) {
    windows.push_back({{"index", w.index},
                       {"start_s", static_cast<double>(w.index) * o_.window_s},
                       {"count", w.count},
                       {"p99_ms", w.count ? json(ms(w.p99_us)) : json(nullptr)},
                       {"max_ms", w.count ? json(ms(w.max_us)) : json(nullptr)}});
    worst = std::max(worst, w.p99_us);
  }
  const std::uint64_t steady = windows_.p99_all();
  Slowest slowest;
  {
    std::lock_guard lk(slowest_mu_);
    slowest = slowest_;
  }
  return {{"nodes", nodes},
          {"payment_statuses", pa.statuses()},
          {"payment_connection_errors", pa.connection_errors.load()},
          {"payment_client_timeouts", pa.timeouts.load()},
          {"payment_other_errors", pa.other_errors.load()},
          {"cancel_statuses", ca.statuses()},
          {"cancel_connection_errors", ca.connection_errors.load()},
          {"cancel_client_timeouts", ca.timeouts.load()},
          {"cancel_other_errors", ca.other_errors.load()},
          {"connection_errors", pa.connection_errors.load() + ca.connection_errors.load()},
          {"no_ready_waits", rr.waits()},
          {"no_ready_gave_up", rr.gave_up()},
          {"no_ready_longest_wait_ms", std::chrono::duration<double, std::milli>(rr.longest_wait()).count()},
          {"window_s", o_.window_s},
          {"windows", windows},
          {"steady_p99_ms", ms(steady)},
          {"window_p99_max_ms", ms(worst)},
          {"window_p99_ratio",
           steady ? json(static_cast<double>(worst) / static_cast<double>(steady)) : json(nullptr)},
          {"slowest", slowest.micros == 0 && slowest.kind.empty() ? json(nullptr)
                                                                  : json{{"ms", ms(slowest.micros)},
                                                                         {"node", slowest.node},
                                                                         {"kind", slowest.kind},
                                                                         {"outcome", slowest.outcome}}}};
}

void LoadGen::print_balance() const {
  const json b = balance_json();
  auto counts = [](const json& statuses) {
    std::string out;
    for (const auto& [status, n] : statuses.items())
      out += (out.empty() ? "" : "  ") + status + ": " + std::to_string(n.get<std::uint64_t>());
    return out.empty() ? std::string("none") : out;
  };
  std::printf("answers by HTTP status\n");
  std::printf("  payments   %s\n", counts(b["payment_statuses"]).c_str());
  std::printf("  cancels    %s\n", counts(b["cancel_statuses"]).c_str());
  std::printf("requests with no answer\n");
  for (const char* kind : {"payment", "cancel"}) {
    const std::string k = kind;
    std::printf("  %-9s  connection errors %llu   client timeouts %llu   other errors %llu\n",
                (k + "s").c_str(),
                static_cast<unsigned long long>(b[k + "_connection_errors"].get<std::uint64_t>()),
                static_cast<unsigned long long>(b[k + "_client_timeouts"].get<std::uint64_t>()),
                static_cast<unsigned long long>(b[k + "_other_errors"].get<std::uint64_t>()));
  }
  std::printf("nodes (round robin over those whose /ready answers 200)\n");
  for (const auto& n : b["nodes"]) {
    std::printf("  %-28s admin %-28s payments %8llu  cancels %6llu  turned not ready %llu%s\n",
                n["api"].get<std::string>().c_str(),
                n["admin"].is_null() ? "(none)" : n["admin"].get<std::string>().c_str(),
                static_cast<unsigned long long>(n["payments"].get<std::uint64_t>()),
                static_cast<unsigned long long>(n["cancels"].get<std::uint64_t>()),
                static_cast<unsigned long long>(n["turned_not_ready"].get<std::uint64_t>()),
                n["ready_at_end"].get<bool>() ? "" : "  (not ready at the end)");
  }
  std::printf("  waited for a ready node: %llu requests, longest %.1f ms; %llu gave up\n",
              static_cast<unsigned long long>(b["no_ready_waits"].get<std::uint64_t>()),
              b["no_ready_longest_wait_ms"].get<double>(),
              static_cast<unsigned long long>(b["no_ready_gave_up"].get<std::uint64_t>()));
  std::printf("latency of every request by %g s window of its sending (payments and cancels, any outcome)\n",
              o_.window_s);
  std::printf("  %6s %9s %9s %10s %10s\n", "window", "from s", "count", "p99 ms", "max ms");
  for (const auto& w : b["windows"]) {
    const auto index = w["index"].get<std::size_t>();
    const double from = w["start_s"].get<double>();
    if (w["count"].get<std::uint64_t>() == 0) {
      std::printf("  %6zu %9.1f %9d %10s %10s\n", index, from, 0, "-", "-");
      continue;
    }
    std::printf("  %6zu %9.1f %9llu %10.2f %10.2f\n", index, from,
                static_cast<unsigned long long>(w["count"].get<std::uint64_t>()), w["p99_ms"].get<double>(),
                w["max_ms"].get<double>());
  }
  std::printf("  steady p99 (the whole run) %.2f ms; the worst window's p99 %.2f ms",
              b["steady_p99_ms"].get<double>(), b["window_p99_max_ms"].get<double>());
  if (!b["window_p99_ratio"].is_null()) std::printf(" (%.2fx)", b["window_p99_ratio"].get<double>());
  std::printf("\n");
  if (const json& s = b["slowest"]; !s.is_null())
    std::printf("  slowest request: %.2f ms, %s to %s, %s\n", s["ms"].get<double>(),
                s["kind"].get<std::string>().c_str(),
                s["node"].get<std::string>().empty() ? "no node" : s["node"].get<std::string>().c_str(),
                s["outcome"].get<std::string>().c_str());
}

void LoadGen::check_gateway() {
  if (!gateway_) return;
  std::unordered_set<std::string> asked;
  {
    std::lock_guard lk(ids_mu_);
    asked.insert(refunded_ids_.begin(), refunded_ids_.end());
  }
  const auto started = Steady::now();
  const auto until = started + seconds(o_.refund_settle_s);
  GatewayCheck& g = check_;
  std::optional<std::uint64_t> listed_at;  // the gateway's refund total when the list was read
  // After a failed read only the error stands: no number half-read.
  auto forget_numbers = [&g] {
    std::string why = std::move(g.error);
    g = GatewayCheck{};
    g.error = std::move(why);
  };
  for (;;) {
    const bool last = Steady::now() >= until;
    const json st = get_json(*gateway_, "/stats", g.error);
    if (st.is_discarded()) {
      forget_numbers();
      break;
    }
    const std::uint64_t total = st.value("refunds", std::uint64_t{0});
    g.distinct = st.value("refunds_distinct", std::uint64_t{0});
    g.twice_all = st.value("refunded_twice", std::uint64_t{0});
    if (asked.empty()) {
      g.missing = g.twice = 0;
      break;
    }
    if ((*g.distinct >= asked.size() || last) && listed_at != total) {
      const json list = get_json(*gateway_, "/refunds", g.error);
      const auto refunds = list.is_object() ? list.find("refunds") : list.end();
      if (list.is_discarded() || refunds == list.end() || !refunds->is_object()) {
        if (!list.is_discarded()) g.error = "GET /refunds: no \"refunds\" object";
        forget_numbers();
        break;
      }
      listed_at = total;
      const json& ids = *refunds;
      std::vector<std::string> missing;
      std::uint64_t twice = 0;
      for (const auto& id : asked) {
        const auto it = ids.find(id);
        const std::uint64_t n = it != ids.end() && it->is_number_unsigned() ? it->get<std::uint64_t>() : 0;
        if (n == 0) missing.push_back(id);
        if (n > 1) ++twice;
      }
      g.missing = missing.size();
      g.twice = twice;
      std::sort(missing.begin(), missing.end(), [](const std::string& a, const std::string& b) {
        return a.size() != b.size() ? a.size() < b.size() : a < b;  // pay-o-1-9 before pay-o-1-10
      });
      if (missing.size() > 20) missing.resize(20);
      g.missing_ids = std::move(missing);
      if (*g.missing == 0) break;
    }
    if (last) break;
    std::this_thread::sleep_until(std::min(until, Steady::now() + std::chrono::milliseconds(500)));
  }
  g.waited_s = std::chrono::duration<double>(Steady::now() - started).count();
}

int LoadGen::report() const {
  const HistogramSnapshot h = latency_.snapshot();
  const double measured =
      std::max(1e-9, std::chrono::duration<double>(end_ - std::max(measure_from_, start_)).count());
  auto v = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const std::uint64_t answered = v(t_.answered);
  std::string first_error;
  {
    std::lock_guard lk(err_mu_);
    first_error = first_error_;
  }
  if (o_.json_out) {
    json j = {{"url", o_.url},
              {"mode", o_.rate > 0 ? "open" : "closed"},
              {"rate", o_.rate},
              {"concurrency", o_.concurrency},
              {"duration_s", measured},
              {"warmup_s", o_.warmup_s},
              {"sent", v(t_.sent)},
              {"answered", answered},
              {"completed", v(t_.completed)},
              {"declined", v(t_.declined)},
              {"gateway_error", v(t_.gateway_error)},
              {"failed_other", v(t_.failed_other)},
              {"timed_out", v(t_.timed_out)},
              {"unsettled", v(t_.unsettled)},
              {"refused", v(t_.refused)},
              {"errors", v(t_.errors)},
              {"client_timeouts", v(t_.client_timeouts)},
              {"first_error", first_error.empty() ? json(nullptr) : json(first_error)},
              {"refunds_requested", v(t_.refunds_requested)},
              {"refunds_asked", v(t_.refunds)},
              {"refund_errors", v(t_.refund_errors)},
              {"gateway", o_.gateway.empty() ? json(nullptr) : json(o_.gateway)},
              {"refunds_at_gateway", measured_json(check_.distinct)},
              {"refunds_missing", measured_json(check_.missing)},
              {"refunds_missing_ids", check_.missing_ids},
              {"refunded_twice", measured_json(check_.twice)},
              {"gateway_refunded_twice", measured_json(check_.twice_all)},
              {"refund_settle_waited_s", gateway_ ? json(check_.waited_s) : json(nullptr)},
              {"gateway_check_error", check_.error.empty() ? json(nullptr) : json(check_.error)},
              {"behind", v(t_.behind)},
              {"throughput", static_cast<double>(answered) / measured},
              {"latency_ms",
               {{"count", h.count()},
                {"p50", ms(h.percentile(50))},
                {"p90", ms(h.percentile(90))},
                {"p99", ms(h.percentile(99))},
                {"p99_9", ms(h.percentile(99.9))},
                {"max", ms(h.max())},
                {"mean", h.mean() / 1000.0}}}};
    j.update(balance_json());
    std::printf("%s\n", j.dump().c_str());
  } else {
    const std::uint64_t sent = v(t_.sent);
    auto pct = [&](std::uint64_t n) {
      return sent ? 100.0 * static_cast<double>(n) / static_cast<double>(sent) : 0.0;
    };
    auto row = [&](const char* name, std::uint64_t n) {
      std::printf("  %-24s %10llu  %5.1f%%\n", name, static_cast<unsigned long long>(n), pct(n));
    };
    if (nodes_->size() == 1)
      std::printf("payment_loadgen: %s, %.1f s measured", o_.url.c_str(), measured);
    else
      std::printf("payment_loadgen: %zu nodes, %.1f s measured", nodes_->size(), measured);
    if (o_.warmup_s > 0) std::printf(" after %.1f s warm-up", o_.warmup_s);
    if (o_.rate > 0)
      std::printf(", open loop at %.0f/s (at most %zu in flight)\n", o_.rate, o_.concurrency);
    else
      std::printf(", closed loop with %zu in flight\n", o_.concurrency);
    std::printf("  %-24s %10llu\n", "payments sent", static_cast<unsigned long long>(sent));
    row("completed", v(t_.completed));
    row("failed: declined", v(t_.declined));
    row("failed: gateway error", v(t_.gateway_error));
    if (v(t_.failed_other)) row("failed: other", v(t_.failed_other));
    row("timed out", v(t_.timed_out));
    if (v(t_.unsettled)) row("answered unsettled", v(t_.unsettled));
    row("refused (429)", v(t_.refused));
    row("errors", v(t_.errors));
    if (v(t_.client_timeouts))
      std::printf("    of which no answer within %.1f s: %llu\n", o_.timeout_s,
                  static_cast<unsigned long long>(v(t_.client_timeouts)));
    if (!first_error.empty()) std::printf("    first error: %s\n", first_error.c_str());
    // scripts/cluster-demo adds up the refund rows: keep their labels.
    std::printf("  %-24s %10llu  (cancels answered with the refund; %llu sent, %llu failed)\n",
                "refunds asked", static_cast<unsigned long long>(v(t_.refunds)),
                static_cast<unsigned long long>(v(t_.refunds_requested)),
                static_cast<unsigned long long>(v(t_.refund_errors)));
    print_gateway_check();
    if (o_.rate > 0)
      std::printf("  %-24s %10llu\n", "behind schedule (skipped)",
                  static_cast<unsigned long long>(v(t_.behind)));
    std::printf("  %-24s %10.1f payments/s\n", "throughput", static_cast<double>(answered) / measured);
    std::printf("latency of answered payments (ms, %llu measured, ~1%% precision)\n",
                static_cast<unsigned long long>(h.count()));
    std::printf("  p50 %.2f   p90 %.2f   p99 %.2f   p99.9 %.2f   max %.2f   mean %.2f\n",
                ms(h.percentile(50)), ms(h.percentile(90)), ms(h.percentile(99)), ms(h.percentile(99.9)),
                ms(h.max()), h.mean() / 1000.0);
    print_histogram(h);
    print_balance();
  }
  return v(t_.completed) > 0 ? 0 : 1;
}

void LoadGen::print_gateway_check() const {
  const GatewayCheck& g = check_;
  auto n = [](const std::optional<std::uint64_t>& x) { return static_cast<unsigned long long>(*x); };
  if (!gateway_) {
    std::printf("    at the gateway: not checked; give --gateway\n");
    return;
  }
  if (g.distinct) {
    std::printf("  %-24s %10llu  (payments it refunded, every client's; read after %.1f s)\n",
                "refunds at the gateway", n(g.distinct), g.waited_s);
  }
  if (g.missing) {
    std::printf("  %-24s %10llu  (asked, and never refunded at the gateway: checked by payment id)\n",
                "refunds missing", n(g.missing));
    if (!g.missing_ids.empty()) {
      std::printf("    first missing:");
      for (std::size_t i = 0; i < g.missing_ids.size() && i < 5; ++i)
        std::printf(" %s", g.missing_ids[i].c_str());
      std::printf("\n");
    }
    std::printf("  %-24s %10llu  (of those asked; %llu at the gateway, every client's)\n", "refunded twice",
                n(g.twice), n(g.twice_all));
  }
  if (!g.error.empty()) std::printf("    at the gateway: not checked: %s\n", g.error.c_str());
}

void LoadGen::print_histogram(const HistogramSnapshot& h) {
  if (h.count() == 0) return;
  struct Row {
    std::uint64_t lo, hi, count;
  };
  std::vector<Row> rows;
  for (const auto& b : h.bins()) {
    // Rows: [0, 1ms), then doubling.
    std::uint64_t lo = 0;
    std::uint64_t hi = 1000;
    while (b.lower >= hi) {
      lo = hi;
      hi *= 2;
    }
    if (rows.empty() || rows.back().lo != lo) rows.push_back(Row{lo, hi, 0});
    rows.back().count += b.count;
  }
  std::uint64_t most = 0;
  for (const auto& r : rows) most = std::max(most, r.count);
  std::printf("  histogram:\n");
  for (const auto& r : rows) {
    const int len = static_cast<int>(40.0 * static_cast<double>(r.count) / static_cast<double>(most) + 0.5);
    std::printf("  %8.1f - %8.1f ms |%-40s| %5.1f%%\n", ms(r.lo), ms(r.hi),
                std::string(static_cast<std::size_t>(len), '#').c_str(),
                100.0 * static_cast<double>(r.count) / static_cast<double>(h.count()));
  }
}

}  // namespace payment_loadgen
