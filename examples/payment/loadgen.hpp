#pragma once
// payment_loadgen's parts (loadgen_main.cpp describes the program): its
// options, the counts of a run, and LoadGen, which drives the payment
// service's HTTP API on one or more nodes (loadgen_driver.cpp, with the
// balancing in loadgen_balance.hpp) and reports what came back
// (loadgen_report.cpp).

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "loadgen_balance.hpp"
#include "troupe/net/http.hpp"
#include "troupe/node/latency_histogram.hpp"

namespace payment_loadgen {

using json = nlohmann::json;
using troupe::ErrorCode;
using troupe::Result;
using troupe::http::Client;
using troupe::http::ClientSettings;
using troupe::http::Response;
using troupe::node::HistogramSnapshot;
using troupe::node::LatencyHistogram;

// Set by the first SIGINT/SIGTERM (loadgen_main.cpp): stop sending and report.
extern std::atomic<bool> g_interrupted;

// The command line's settings (loadgen_main.cpp reads them). Value type.
struct Options {
  std::string url = "http://127.0.0.1:8080";
  std::vector<NodeAddress> nodes;  // --node, or the --url alone (no admin URL)
  double window_s = 10;            // latency windows
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

inline double ms(std::uint64_t micros) { return static_cast<double>(micros) / 1000.0; }

// Every count of the run; updated from the client's io thread and the
// scheduler, read by the progress loop: relaxed atomics.
struct Tally {
  std::atomic<std::uint64_t> sent{0}, answered{0}, completed{0}, declined{0}, gateway_error{0}, timed_out{0};
  std::atomic<std::uint64_t> failed_other{0}, unsettled{0}, refused{0}, errors{0}, client_timeouts{0};
  // refunds_requested: cancels sent; refunds: those answered with the refund.
  std::atomic<std::uint64_t> refunds_requested{0}, refunds{0}, refund_errors{0}, behind{0};
};

// How the requests of one kind (payments, cancels) ended, as a client sees
// them: answers by HTTP status, and the requests that got none. Relaxed
// atomics, as Tally.
struct Answers {
  std::array<std::atomic<std::uint64_t>, 600> by_status{};  // [0]: a status outside 100..599
  std::atomic<std::uint64_t> connection_errors{0};          // refused, reset, closed before the answer
  std::atomic<std::uint64_t> timeouts{0};                   // no answer within --timeout-s (waits included)
  std::atomic<std::uint64_t> no_ready_node{0};              // of those: never sent, no node was ready
  std::atomic<std::uint64_t> other_errors{0};               // a malformed answer, a full client queue, ...

  // Counts one outcome; `never_sent`: no node was ready in time.
  void count(const Result<Response>& r, bool never_sent);
  // {"200": n, "503": n, ...}, only statuses seen.
  json statuses() const;
};

// A request's outcome in a word: "200", "connection error", "timeout",
// "no ready node", or the error code's name.
std::string outcome_name(const Result<Response>& r, bool never_sent);

// The slowest request of the run.
struct Slowest {
  std::uint64_t micros = 0;
  std::string node;  // its API URL; "" when no node was ready
  std::string kind;  // "payment" or "cancel"
  std::string outcome;
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
json get_json(Client& c, const char* target, std::string& why);

// One run of the load generator: sends the payments (closed or open loop),
// counts and times their answers, asks for refunds, and afterwards checks
// the refunds at the gateway and prints the summary. Owns its HTTP
// clients. Thread safety: run(), check_gateway() and report() are called
// one after the other from one thread; inside run() the scheduler thread
// and the clients' io threads share the counters (atomics) and the
// mutex-guarded members.
class LoadGen {
 public:
  LoadGen(Options o, std::unique_ptr<NodePool> nodes, std::unique_ptr<Client> gateway)
      : o_(std::move(o)),
        gateway_(std::move(gateway)),
        rng_(o_.seed),
        windows_(std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(o_.window_s))),
        nodes_(std::move(nodes)) {}
  // The clients' callbacks reach every other member, nodes_ too: they end
  // while all is still there.
  ~LoadGen() { nodes_->close(); }

  // Whether anything answers at the nodes' API URLs: any HTTP response
  // will do, from one node at least (the others are named on stderr).
  // Then learns which nodes are ready and starts polling their /ready.
  Result<void> probe();

  // Sends until the duration, the payment count or an interrupt ends the
  // run, then waits for the answers in flight (or their timeouts).
  void run();

  // With --gateway, after run(): looks the refunds asked up at the gateway.
  // The service pays them from its outbox after answering the cancel, so
  // this polls GET /stats every 0.5 s for up to --refund-settle-s; the
  // per-payment list (GET /refunds) is read once the gateway has refunded
  // as many payments as were asked (or when the wait runs out), and again
  // only if more refunds came, until none asked is missing.
  void check_gateway();

  // Prints the summary (text, or one JSON object with --json); the exit
  // code: 0 when some payment completed.
  int report() const;

 private:
  // The refund rows read from the gateway, each only if it was read.
  void print_gateway_check() const;
  // The nodes, the answers by status, the latency windows and the slowest request.
  json balance_json() const;
  void print_balance() const;
  std::size_t measured_windows() const;

  static json measured_json(const std::optional<std::uint64_t>& x) { return x ? json(*x) : json(nullptr); }

  static Steady::duration seconds(double s) {
    return std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(s));
  }

  bool counted(Steady::time_point scheduled) const { return scheduled >= measure_from_; }

  // Whether a payment scheduled at `at` may still go out.
  bool may_send(Steady::time_point at);

  Steady::time_point last_answer_at() const {
    return Steady::time_point(Steady::duration(last_answer_.load(std::memory_order_relaxed)));
  }

  void open_loop();

  void send_payment(Steady::time_point scheduled);

  // `node`: where it went; nullopt when no node was ready before its timeout.
  void on_payment(Steady::time_point scheduled, bool count, std::optional<std::size_t> node,
                  Result<Response> r);

  // Times a counted request (payment or cancel) of any outcome: its window
  // (by `sent`), and the slowest of the run.
  void time_request(Steady::time_point sent, Steady::time_point now, std::optional<std::size_t> node,
                    const char* kind, const Result<Response>& r);

  // The request's timeout from `now` on: --timeout-s.
  Steady::time_point deadline_from(Steady::time_point now) const { return now + seconds(o_.timeout_s); }

  // Counts one answered payment; true if it is to be refunded.
  bool tally_outcome(const json& j, const std::string& status, Steady::duration latency);

  bool draw_refund();

  // Cancels a completed payment, which refunds it, in the payment's slot.
  void refund(const std::string& id, std::int64_t amount);
  void on_refund(const std::string& id, std::int64_t amount, Steady::time_point sent,
                 std::optional<std::size_t> node, Result<Response> r);

  // A payment (and its refund, if any) is done: in closed-loop mode its
  // slot sends the next payment; otherwise the slot is free.
  void finished();

  void note_answer(Steady::time_point now) {
    last_answer_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  }

  void note_error(std::string e);

  void progress_loop();

  void print_progress(Steady::time_point now,
                      const std::deque<std::pair<Steady::time_point, std::uint64_t>>& window, bool tty) const;

  // A few rows, one per power of two of milliseconds, bars scaled to the
  // fullest row.
  static void print_histogram(const HistogramSnapshot& h);

  const Options o_;
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
  Answers payment_answers_, cancel_answers_;
  WindowLatency windows_;  // every counted request, payments and cancels
  std::atomic<std::uint64_t> slowest_us_{0};
  mutable std::mutex slowest_mu_;
  Slowest slowest_;
  // Last: its clients' io threads call into the members above.
  std::unique_ptr<NodePool> nodes_;
};

}  // namespace payment_loadgen
