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
// refund (Cancelled, refunded = the amount); the service then pays them back
// through the gateway from a job queue. With --gateway the load generator
// keeps those payment ids and, at the end, asks the gateway (payment_gateway:
// GET /stats, GET /refunds) what became of them, waiting up to
// --refund-settle-s for the queue to drain: "refunds at the gateway" (its
// refunded payments, every client's), "refunds missing" (ids asked that
// the gateway never refunded) and "refunded twice" (ids asked refunded more
// than once). Without --gateway the refunds are not checked, and the
// summary says so.
//
// Order ids are --id-prefix-N (default o-SEED-N); the service makes the
// payment id pay-ORDER. Load generators that share a service or a gateway
// need prefixes (or seeds) of their own.
//
// Exit status: 0 when some payment completed; 1 when none did (including
// a service that could not be reached at the start, or with --gateway a
// gateway that could not be asked about refunds); 2 for bad flags.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "troupe/net/http.hpp"
#include "troupe/net/url.hpp"
#include "troupe/node/latency_histogram.hpp"

namespace {

using json = nlohmann::json;
using Steady = std::chrono::steady_clock;
using troupe::ErrorCode;
using troupe::Result;
using troupe::http::Client;
using troupe::http::ClientSettings;
using troupe::http::Response;
using troupe::node::HistogramSnapshot;
using troupe::node::LatencyHistogram;

std::atomic<bool> g_interrupted{false};

// The first SIGINT/SIGTERM stops sending and reports; a second one quits.
extern "C" void on_signal(int) {
  if (g_interrupted.exchange(true)) _exit(130);
}

struct Options {
  std::string url = "http://127.0.0.1:8080";
  double duration_s = 30;
  std::uint64_t payments = 0;  // 0: no limit
  double rate = 0;             // payments/s; 0: closed loop
  std::size_t concurrency = 64;
  std::size_t connections = 0;  // 0: = concurrency
  std::uint64_t customers = 10000;
  double refund_rate = 0.02;
  std::int64_t amount_min = 100;
  std::int64_t amount_max = 100000;
  std::uint64_t seed = 1;
  bool json_out = false;
  bool quiet = false;
  double warmup_s = 0;
  double timeout_s = 10;
  std::string id_prefix;        // "": o-SEED
  std::string gateway;          // "": refunds not checked at the gateway
  double refund_settle_s = 15;  // with --gateway: wait at most this for the refunds to arrive
};

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

std::string percent_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

double ms(std::uint64_t micros) { return static_cast<double>(micros) / 1000.0; }

// Every count of the run; updated from the client's io thread and the
// scheduler, read by the progress loop: relaxed atomics.
struct Tally {
  std::atomic<std::uint64_t> sent{0}, answered{0}, completed{0}, declined{0}, gateway_error{0}, timed_out{0};
  std::atomic<std::uint64_t> failed_other{0}, unsettled{0}, refused{0}, errors{0}, client_timeouts{0};
  // refunds_requested: cancels sent; refunds: those answered with the refund.
  std::atomic<std::uint64_t> refunds_requested{0}, refunds{0}, refund_errors{0}, behind{0};
};

// What the gateway said of the refunds asked, after the run; a number is
// set only when it was read.
struct GatewayCheck {
  std::optional<std::uint64_t> distinct;   // payments it refunded, every client's (GET /stats)
  std::optional<std::uint64_t> twice_all;  // ... more than once
  std::optional<std::uint64_t> missing;    // ids asked that it never refunded (GET /refunds)
  std::optional<std::uint64_t> twice;      // ids asked that it refunded more than once
  std::vector<std::string> missing_ids;    // the first few, sorted
  double waited_s = 0;                     // how long it waited for the refunds
  std::string error;                       // why something is not set
};

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

class LoadGen {
 public:
  LoadGen(Options o, std::unique_ptr<Client> client, std::unique_ptr<Client> gateway)
      : o_(std::move(o)), client_(std::move(client)), gateway_(std::move(gateway)), rng_(o_.seed) {}

  // Whether anything answers at the URL: any HTTP response will do.
  Result<void> probe() {
    auto r = client_->request_sync("GET", "/payments/loadgen-probe", "", "", std::chrono::seconds(5));
    if (!r.ok()) return r.error();
    return {};
  }

  void run() {
    start_ = Steady::now();
    measure_from_ = start_ + seconds(o_.warmup_s);
    has_deadline_ = o_.duration_s > 0;
    deadline_ = measure_from_ + seconds(o_.duration_s);
    std::thread scheduler;
    if (o_.rate > 0) {
      scheduler = std::thread([this] { open_loop(); });
    } else {
      for (std::size_t i = 0; i < o_.concurrency && may_send(Steady::now()); ++i) send_payment(Steady::now());
    }
    progress_loop();
    const bool reached_deadline = has_deadline_ && Steady::now() >= deadline_;
    const auto stopped_at = reached_deadline ? deadline_ : Steady::now();
    if (scheduler.joinable()) scheduler.join();
    // Whatever is in flight gets its answer or its timeout.
    std::unique_lock lk(idle_mu_);
    idle_cv_.wait_for(lk, seconds(o_.timeout_s + 5), [&] { return in_flight_.load() == 0; });
    // A run of a given length is measured over that length (answers that
    // come after it were sent within it); a run of --payments N lasts
    // until its last answer.
    const auto last = last_answer_at();
    end_ = !reached_deadline && o_.payments > 0 && last > measure_from_ ? last : stopped_at;
  }

  // With --gateway, after run(): looks the refunds asked up at the gateway.
  // The service pays them from a job queue after answering the cancel, so
  // this polls GET /stats every 0.5 s for up to --refund-settle-s; the
  // per-payment list (GET /refunds) is read once the gateway has refunded
  // as many payments as were asked (or when the wait runs out), and again
  // only if more refunds came, until none asked is missing.
  void check_gateway() {
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

  int report() const {
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
      std::printf("%s\n", j.dump().c_str());
    } else {
      const std::uint64_t sent = v(t_.sent);
      auto pct = [&](std::uint64_t n) {
        return sent ? 100.0 * static_cast<double>(n) / static_cast<double>(sent) : 0.0;
      };
      auto row = [&](const char* name, std::uint64_t n) {
        std::printf("  %-24s %10llu  %5.1f%%\n", name, static_cast<unsigned long long>(n), pct(n));
      };
      std::printf("payment_loadgen: %s, %.1f s measured", o_.url.c_str(), measured);
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
    }
    return v(t_.completed) > 0 ? 0 : 1;
  }

 private:
  // The refund rows read from the gateway, each only if it was read.
  void print_gateway_check() const {
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

  static json measured_json(const std::optional<std::uint64_t>& x) { return x ? json(*x) : json(nullptr); }

  static Steady::duration seconds(double s) {
    return std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(s));
  }

  bool counted(Steady::time_point scheduled) const { return scheduled >= measure_from_; }

  // Whether a payment scheduled at `at` may still go out.
  bool may_send(Steady::time_point at) {
    if (g_interrupted.load() || stopping_.load()) return false;
    if (has_deadline_ && at >= deadline_) return false;
    if (o_.payments > 0 && counted(at) && counted_sent_.load() >= o_.payments) return false;
    return true;
  }

  Steady::time_point last_answer_at() const {
    return Steady::time_point(Steady::duration(last_answer_.load(std::memory_order_relaxed)));
  }

  void open_loop() {
    const auto interval = seconds(1.0 / o_.rate);
    std::uint64_t k = 0;
    for (;;) {
      const auto now = Steady::now();
      auto next = start_ + interval * static_cast<std::int64_t>(k);
      while (next <= now) {
        if (!may_send(next)) {
          stopping_.store(true);
          return;
        }
        if (in_flight_.load() >= o_.concurrency) {
          if (counted(next)) t_.behind.fetch_add(1, std::memory_order_relaxed);
        } else {
          send_payment(next);
        }
        ++k;
        next = start_ + interval * static_cast<std::int64_t>(k);
      }
      std::this_thread::sleep_until(std::min(next, now + std::chrono::milliseconds(50)));
    }
  }

  void send_payment(Steady::time_point scheduled) {
    const bool count = counted(scheduled);
    std::uint64_t seq;
    std::string body;
    {
      std::lock_guard lk(rng_mu_);
      seq = ++seq_;
      std::uniform_int_distribution<std::uint64_t> customer(0, o_.customers - 1);
      std::uniform_int_distribution<std::int64_t> amount(o_.amount_min, o_.amount_max);
      body = json{
          {"customer", "c-" + std::to_string(customer(rng_))},
          {"order_id", o_.id_prefix + "-" + std::to_string(seq)},
          {"amount", amount(rng_)},
          {"settle",
           true}}.dump();
    }
    if (count) {
      t_.sent.fetch_add(1, std::memory_order_relaxed);
      counted_sent_.fetch_add(1);
    }
    in_flight_.fetch_add(1);
    client_->request(
        "POST", "/payments", std::move(body), "application/json",
        [this, scheduled, count](Result<Response> r) { on_payment(scheduled, count, std::move(r)); });
  }

  void on_payment(Steady::time_point scheduled, bool count, Result<Response> r) {
    const auto now = Steady::now();
    if (count) note_answer(now);
    bool follow_up = false;
    if (!r.ok()) {
      if (count) {
        t_.errors.fetch_add(1, std::memory_order_relaxed);
        if (r.error().code() == ErrorCode::timeout)
          t_.client_timeouts.fetch_add(1, std::memory_order_relaxed);
        note_error("POST /payments: " + r.error().to_string());
      }
    } else if (r->status == 429) {
      if (count) t_.refused.fetch_add(1, std::memory_order_relaxed);
    } else if (r->status != 200 && r->status != 201) {
      if (count) {
        t_.errors.fetch_add(1, std::memory_order_relaxed);
        note_error("POST /payments: HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200));
      }
    } else {
      const json j = json::parse(r->body, nullptr, false);
      const std::string status = j.is_object() ? j.value("status", std::string()) : std::string();
      if (status.empty()) {
        if (count) {
          t_.errors.fetch_add(1, std::memory_order_relaxed);
          note_error("POST /payments: an answer without a status: " + r->body.substr(0, 200));
        }
      } else {
        all_answers_.fetch_add(1, std::memory_order_relaxed);
        if (count) follow_up = tally_outcome(j, status, now - scheduled);
      }
      const std::string id = follow_up ? j.value("id", std::string()) : std::string();
      if (!id.empty()) {
        // The refund goes on in the payment's slot; it finishes the slot.
        refund(id, j.value("amount", std::int64_t{0}));
        return;
      }
    }
    finished();
  }

  // Counts one answered payment; true if it is to be refunded.
  bool tally_outcome(const json& j, const std::string& status, Steady::duration latency) {
    t_.answered.fetch_add(1, std::memory_order_relaxed);
    latency_.record(latency);
    const std::string failure =
        j.contains("failure") && j["failure"].is_string() ? j["failure"].get<std::string>() : std::string();
    if (status == "Completed") {
      t_.completed.fetch_add(1, std::memory_order_relaxed);
      return draw_refund();
    }
    if (status == "Failed" && failure == "declined")
      t_.declined.fetch_add(1, std::memory_order_relaxed);
    else if (status == "Failed" && failure == "gateway error")
      t_.gateway_error.fetch_add(1, std::memory_order_relaxed);
    else if (status == "Failed" && failure == "timed out")
      t_.timed_out.fetch_add(1, std::memory_order_relaxed);
    else if (status == "Settling" || status == "WaitingForRequest")
      t_.unsettled.fetch_add(1, std::memory_order_relaxed);
    else
      t_.failed_other.fetch_add(1, std::memory_order_relaxed);
    return false;
  }

  bool draw_refund() {
    if (o_.refund_rate <= 0) return false;
    std::lock_guard lk(rng_mu_);
    return std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < o_.refund_rate;
  }

  // Cancels a completed payment, which refunds it, in the payment's slot.
  void refund(const std::string& id, std::int64_t amount) {
    t_.refunds_requested.fetch_add(1, std::memory_order_relaxed);
    client_->request("POST", "/payments/" + percent_encode(id) + "/cancel", "{}", "application/json",
                     [this, id, amount](Result<Response> r) {
                       bool ok = false;
                       std::string why;
                       if (!r.ok()) {
                         why = r.error().to_string();
                       } else if (r->status != 200) {
                         why = "HTTP " + std::to_string(r->status) + " " + r->body.substr(0, 200);
                       } else {
                         const json j = json::parse(r->body, nullptr, false);
                         ok = j.is_object() && j.value("status", std::string()) == "Cancelled" &&
                              j.value("refunded", std::int64_t{-1}) == amount;
                         if (!ok) why = "unexpected answer " + r->body.substr(0, 200);
                       }
                       if (ok) {
                         t_.refunds.fetch_add(1, std::memory_order_relaxed);
                         if (gateway_) {
                           std::lock_guard lk(ids_mu_);
                           refunded_ids_.push_back(id);
                         }
                       } else {
                         t_.refund_errors.fetch_add(1, std::memory_order_relaxed);
                         note_error("refund (cancel): " + why);
                       }
                       finished();
                     });
  }

  // A payment (and its refund, if any) is done: in closed-loop mode its
  // slot sends the next payment; otherwise the slot is free.
  void finished() {
    if (o_.rate <= 0) {
      const auto now = Steady::now();
      if (may_send(now)) {
        in_flight_.fetch_sub(1);  // send_payment takes it again
        send_payment(now);
        return;
      }
    }
    if (in_flight_.fetch_sub(1) == 1) {
      std::lock_guard lk(idle_mu_);
      idle_cv_.notify_all();
    }
  }

  void note_answer(Steady::time_point now) {
    last_answer_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }

  void note_error(std::string e) {
    std::lock_guard lk(err_mu_);
    if (first_error_.empty()) first_error_ = std::move(e);
  }

  void progress_loop() {
    const bool tty = isatty(STDERR_FILENO) != 0;
    const auto every = tty ? std::chrono::milliseconds(200) : std::chrono::milliseconds(5000);
    std::deque<std::pair<Steady::time_point, std::uint64_t>> window;  // (when, answered) over the last second
    auto next_print = Steady::now() + every;
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto now = Steady::now();
      const bool done_sending = (o_.rate > 0 ? stopping_.load() : !may_send(now)) || g_interrupted.load();
      if (done_sending) stopping_.store(true);
      const std::uint64_t answered = all_answers_.load(std::memory_order_relaxed);
      window.emplace_back(now, answered);
      while (window.size() > 1 && now - window.front().first > std::chrono::seconds(1)) window.pop_front();
      if (!o_.quiet && (now >= next_print || done_sending)) {
        next_print = now + every;
        print_progress(now, window, tty);
      }
      if (done_sending) break;
    }
    if (!o_.quiet && tty) std::fprintf(stderr, "\n");
  }

  void print_progress(Steady::time_point now,
                      const std::deque<std::pair<Steady::time_point, std::uint64_t>>& window,
                      bool tty) const {
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double total = o_.warmup_s + o_.duration_s;
    // With --payments alone the bar shows payments sent of those asked.
    const bool by_count = o_.duration_s <= 0 && o_.payments > 0;
    double rate = 0;
    if (window.size() > 1) {
      const double dt = std::chrono::duration<double>(window.back().first - window.front().first).count();
      if (dt > 0) rate = static_cast<double>(window.back().second - window.front().second) / dt;
    }
    auto v = [](const std::atomic<std::uint64_t>& a) { return static_cast<unsigned long long>(a.load()); };
    const unsigned long long failed = v(t_.declined) + v(t_.gateway_error) + v(t_.failed_other);
    const double p99 = ms(latency_.percentile(99));
    char bar[32] = {};
    const int width = 20;
    const double frac =
        by_count ? std::clamp(static_cast<double>(counted_sent_.load()) / static_cast<double>(o_.payments),
                              0.0, 1.0)
                 : std::clamp(total > 0 ? elapsed / total : 0.0, 0.0, 1.0);
    for (int i = 0; i < width; ++i) bar[i] = i < static_cast<int>(frac * width) ? '#' : '-';
    char line[320];
    char when[48];
    if (by_count)
      std::snprintf(when, sizeof when, "%6.1fs %llu/%llu", elapsed, v(counted_sent_),
                    static_cast<unsigned long long>(o_.payments));
    else
      std::snprintf(when, sizeof when, "%6.1f/%gs", elapsed, total);
    std::snprintf(
        line, sizeof line,
        "%s [%s] %7.0f/s  ok %llu  failed %llu  timed out %llu  refused %llu  errors %llu  p99 %.1f ms%s",
        when, bar, rate, v(t_.completed), failed, v(t_.timed_out), v(t_.refused), v(t_.errors), p99,
        now < measure_from_ ? "  (warm-up)" : "");
    if (tty)
      std::fprintf(stderr, "\r%s\033[K", line);
    else
      std::fprintf(stderr, "%s\n", line);
  }

  // A few rows, one per power of two of milliseconds, bars scaled to the
  // fullest row.
  static void print_histogram(const HistogramSnapshot& h) {
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

  const Options o_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Client> gateway_;  // with --gateway
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::uint64_t seq_ = 0;  // guarded by rng_mu_

  Steady::time_point start_{}, measure_from_{}, deadline_{}, end_{};
  bool has_deadline_ = true;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> counted_sent_{0};
  std::atomic<std::size_t> in_flight_{0};
  std::atomic<std::uint64_t> all_answers_{0};
  std::atomic<Steady::rep> last_answer_{0};
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;

  Tally t_;
  LatencyHistogram latency_;
  mutable std::mutex err_mu_;
  std::string first_error_;
  // With --gateway: the payments whose cancel was answered with the refund.
  std::mutex ids_mu_;
  std::vector<std::string> refunded_ids_;
  GatewayCheck check_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool duration_given = false;
  CLI::App app{"Load generator for the troupe payment service's HTTP API."};
  app.add_option("--url", o.url, "Base URL of the payment service")->capture_default_str();
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
  app.add_option("--connections", o.connections, "HTTP connections (default: --concurrency)")
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
                 "every refund asked (the service pays them from a job queue after answering the cancel)")
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
  const auto target = parse_root_url(o.url, why);
  if (!target) {
    std::fprintf(stderr, "payment_loadgen: bad --url '%s': %s\n", o.url.c_str(), why.c_str());
    return 2;
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
  cs.host = target->host;
  cs.port = target->port;
  cs.max_connections = o.connections;
  cs.max_queued = o.concurrency * 2 + 16;  // refunds ride on top of the payments in flight
  cs.request_timeout =
      std::chrono::duration_cast<troupe::Duration>(std::chrono::duration<double>(o.timeout_s));
  auto client = Client::create(cs);
  if (!client.ok()) {
    std::fprintf(stderr, "payment_loadgen: cannot reach %s: %s\n", o.url.c_str(),
                 client.error().message().c_str());
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
  LoadGen gen(o, std::move(client).value(), std::move(gateway));
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
