// payment_gateway: the simulated settlement gateway (gateway.hpp) as its own
// HTTP process, the external system the payment service settles through.
//
// Like the in-process actor it answers after a latency (mean ± uniform
// jitter), declines a share of settlements, and never answers another share
// ("hangs": the request's Responder is kept until the process stops, as a
// gateway that lost a request behind a broken connection would). Unlike the
// actor it also fails a share outright with HTTP 503, a gateway error as
// opposed to a decline.
//
//   POST /settle  {"payment_id","order_id","amount"}  200 {"approved":true,"code":"AUTH-1A2B3C4D"}
//                                                     200 {"approved":false,"code":"declined by issuer"}
//   POST /refund  {"payment_id","amount"}             200 {"refunded":true,"code":"RF-1A2B3C4D"}
//                 header Idempotency-Key (optional)
//   GET  /health                                      200 {"status":"ok"}
//   GET  /stats                                       200 the counters
//   GET  /refunds                                     200 {"refunds":{"<payment_id>":count,...}}
// A body that is not such an object (amount: an integer of minor units,
// above 0) gets 400 with a reason. A 503 carries {"error":{"code":
// "gateway_error",...}}.
//
// Idempotency: a refund may carry an Idempotency-Key header (the payment
// service sends its outbox record's key). The first request with a key that
// the gateway decides to pay records the key; a later request with the same
// key refunds nothing and gets the first answer (200, the same body) once
// that was sent, 409 "in_progress" while it is still on its way, and 422
// "idempotency_key_reused" if its payment id or amount differ. A request
// answered 503 or held (hung) records nothing: it refunded nothing, and the
// next try with its key is a fresh one.
//
// Refunds are also counted per payment id: a refund counts when its 200 is
// sent (one answered 503 or held never does; a repeat of a key answered
// from the first answer neither), so /refunds says exactly which payments
// were paid back and how often. /stats has `refunds` (200
// answers), `refunds_distinct` (payment ids refunded at least once) and
// `refunded_twice` (ids refunded more than once), `refunds_repeated`
// (requests answered from an earlier one's key), so a client can compare
// what it asked for with what the gateway did. Approved settlements are
// counted the same way: `settled_distinct` and `settled_twice` (payments
// whose settlement was approved more than once).
//
// The latency never blocks an io thread: each answer waits on an Asio
// steady_timer of the gateway's own timer thread, which then responds
// through the request's Responder, so any number of requests may wait at
// once.
//
// On start it prints "payment_gateway listening on http://HOST:PORT" (the
// chosen port when --port is 0); SIGINT or SIGTERM stop it (exit 0).

#include "../../src/cluster/asio_headers.hpp"  // first: see there

#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "troupe/net/http.hpp"

namespace {

using json = nlohmann::json;
using troupe::http::Request;
using troupe::http::Responder;
using troupe::http::Response;
using troupe::http::Router;

struct Options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8090;
  double latency_ms = 1.0;
  double jitter_ms = 0.0;
  double decline_rate = 0.05;
  double error_rate = 0.01;
  double hang_rate = 0.001;
  std::uint64_t seed = 1;
  int io_threads = 1;
};

struct Counters {
  std::atomic<std::uint64_t> requests{0}, approved{0}, declined{0}, errors{0}, hung{0}, refunds{0}, refunds_repeated{0};
  std::atomic<std::uint64_t> bad_requests{0}, in_flight{0};
};

// What to do with one request, drawn from the rates.
enum class Fate { answer, fail, hang };

// The gateway: decisions, the timer thread, the held (hung) requests.
// Handlers run on the server's io threads; timers on the gateway's own.
class Gateway {
 public:
  explicit Gateway(const Options& o) : o_(o), rng_(o.seed), timer_work_(asio::make_work_guard(timer_io_)) {
    timer_thread_ = std::thread([this] { timer_io_.run(); });
  }

  // The server must be stopped first: answers after that go nowhere.
  ~Gateway() {
    timer_work_.reset();
    timer_io_.stop();
    timer_thread_.join();
    std::lock_guard lk(hung_mu_);
    hung_.clear();
  }

  Router routes() {
    Router r;
    r.add("POST", "/settle", [this](Request& req, Responder out) { settle(req, std::move(out)); });
    r.add("POST", "/refund", [this](Request& req, Responder out) { refund(req, std::move(out)); });
    r.add("GET", "/health",
          [](Request&, Responder out) { out.respond(Response::json(200, R"({"status":"ok"})")); });
    r.add("GET", "/stats",
          [this](Request&, Responder out) { out.respond(Response::json(200, stats().dump())); });
    r.add("GET", "/refunds",
          [this](Request&, Responder out) { out.respond(Response::json(200, refunds().dump())); });
    return r;
  }

  json stats() const {
    auto v = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    json j = {{"requests", v(c_.requests)},
              {"approved", v(c_.approved)},
              {"declined", v(c_.declined)},
              {"errors", v(c_.errors)},
              {"hung", v(c_.hung)},
              {"bad_requests", v(c_.bad_requests)},
              {"in_flight", v(c_.in_flight)}};
    // The refund numbers from one moment, so they agree with each other.
    std::lock_guard lk(refunds_mu_);
    j["refunds"] = v(c_.refunds);
    j["refunds_distinct"] = refunded_.size();
    j["refunded_twice"] = refunded_twice_;
    j["refunds_repeated"] = v(c_.refunds_repeated);
    j["settled_distinct"] = settled_.size();
    j["settled_twice"] = settled_twice_;
    return j;
  }

  // {"refunds": {payment_id: successful refunds}}.
  json refunds() const {
    json ids = json::object();
    std::lock_guard lk(refunds_mu_);
    for (const auto& [id, n] : refunded_) ids[id] = n;
    return {{"refunds", std::move(ids)}};
  }

 private:
  // The body as a JSON object with the fields required, or a 400 sent.
  std::optional<json> parse(const Request& req, Responder& out, bool settle) {
    json j = json::parse(req.body, nullptr, false);
    const char* why = nullptr;
    if (j.is_discarded() || !j.is_object())
      why = "the body is not a JSON object";
    else if (!j.contains("payment_id") || !j["payment_id"].is_string() ||
             j["payment_id"].get<std::string>().empty())
      why = "payment_id: a non-empty string is required";
    else if (settle && (!j.contains("order_id") || !j["order_id"].is_string() ||
                        j["order_id"].get<std::string>().empty()))
      why = "order_id: a non-empty string is required";
    else if (!j.contains("amount") || !j["amount"].is_number_integer())
      why = "amount: an integer number of minor units is required";
    else if (j["amount"].get<std::int64_t>() <= 0)
      why = "amount: must be above 0";
    if (!why) return j;
    c_.bad_requests.fetch_add(1, std::memory_order_relaxed);
    out.respond(Response::error(400, "invalid_argument", why));
    return std::nullopt;
  }

  void settle(Request& req, Responder out) {
    const auto body = parse(req, out, true);
    if (!body) return;
    c_.requests.fetch_add(1, std::memory_order_relaxed);
    const auto [fate, delay, declined, code] = draw("AUTH-");
    if (fate == Fate::hang) return hold(std::move(out));
    if (fate == Fate::fail) return later(std::move(out), delay, gateway_error(), &c_.errors);
    if (declined) {
      return later(std::move(out), delay,
                   Response::json(200, R"({"approved":false,"code":"declined by issuer"})"), &c_.declined);
    }
    later(std::move(out), delay, Response::json(200, json{{"approved", true}, {"code", code}}.dump()),
          &c_.approved, body->at("payment_id").get<std::string>(), Book::settled);
  }

  void refund(Request& req, Responder out) {
    const auto body = parse(req, out, false);
    if (!body) return;
    c_.requests.fetch_add(1, std::memory_order_relaxed);
    const std::string key(req.header("Idempotency-Key"));
    const std::string payment_id = body->at("payment_id").get<std::string>();
    const std::int64_t amount = body->at("amount").get<std::int64_t>();
    if (!key.empty() && repeated(key, payment_id, amount, out)) return;
    // A refund is never declined; latency, errors and hangs are as for a
    // settlement.
    const auto [fate, delay, declined, code] = draw("RF-");
    (void)declined;
    if (fate == Fate::hang) return hold(std::move(out));
    if (fate == Fate::fail) return later(std::move(out), delay, gateway_error(), &c_.errors);
    std::string answer = json{{"refunded", true}, {"code", code}}.dump();
    if (!key.empty()) {
      std::lock_guard lk(refunds_mu_);
      // Another request with this key may have been drawn meanwhile: the
      // first to get here pays; this one is its repeat.
      if (!keyed_.try_emplace(key, KeyedRefund{payment_id, amount, false, answer}).second) {
        c_.refunds_repeated.fetch_add(1, std::memory_order_relaxed);
        return out.respond(in_progress(key));
      }
    }
    later(std::move(out), delay, Response::json(200, std::move(answer)), &c_.refunds, payment_id, Book::refunded, key);
  }

  // A refund whose key the gateway has seen: answered here (true), from
  // the first request's outcome; false for a key it has not.
  bool repeated(const std::string& key, const std::string& payment_id, std::int64_t amount, Responder& out) {
    std::unique_lock lk(refunds_mu_);
    auto it = keyed_.find(key);
    if (it == keyed_.end()) return false;
    const KeyedRefund k = it->second;
    lk.unlock();
    if (k.payment_id != payment_id || k.amount != amount) {
      c_.bad_requests.fetch_add(1, std::memory_order_relaxed);
      out.respond(Response::error(422, "idempotency_key_reused",
                                  "Idempotency-Key '" + key + "' was used for payment '" + k.payment_id +
                                      "' amount " + std::to_string(k.amount)));
      return true;
    }
    c_.refunds_repeated.fetch_add(1, std::memory_order_relaxed);
    out.respond(k.answered ? Response::json(200, k.answer) : in_progress(key));
    return true;
  }

  static Response in_progress(const std::string& key) {
    return Response::error(409, "in_progress", "the refund with Idempotency-Key '" + key + "' is on its way");
  }

  static Response gateway_error() {
    return Response::error(503, "gateway_error", "the settlement gateway failed to process the request");
  }

  struct Draw {
    Fate fate;
    std::chrono::microseconds delay;
    bool declined;
    std::string code;
  };

  // Hang first, then error, then decline, as the shares of one uniform draw.
  Draw draw(const char* prefix) {
    std::lock_guard lk(rng_mu_);
    const double u = unit_(rng_);
    Draw d{Fate::answer, {}, false, {}};
    if (u < o_.hang_rate) {
      d.fate = Fate::hang;
      return d;
    }
    if (u < o_.hang_rate + o_.error_rate)
      d.fate = Fate::fail;
    else if (u < o_.hang_rate + o_.error_rate + o_.decline_rate)
      d.declined = true;
    const double ms = o_.latency_ms + (unit_(rng_) * 2.0 - 1.0) * o_.jitter_ms;
    d.delay = std::chrono::microseconds(ms > 0 ? static_cast<std::int64_t>(ms * 1000.0) : 0);
    char code[24];
    std::snprintf(code, sizeof code, "%s%08llX", prefix,
                  static_cast<unsigned long long>(rng_() & 0xffffffffu));
    d.code = code;
    return d;
  }

  void hold(Responder out) {
    c_.hung.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard lk(hung_mu_);
    hung_.push_back(std::move(out));
  }

  // Answers after `delay`, from the timer thread; counted in `counter` when
  // answered, and, for a refund (`refunded`: its payment id), per payment.
  // What an answer is, for the per-payment books.
  enum class Book { none, settled, refunded };

  void later(Responder out, std::chrono::microseconds delay, Response r, std::atomic<std::uint64_t>* counter,
             std::string payment_id = {}, Book book = Book::none, std::string key = {}) {
    auto answer = [this, out = std::move(out), r = std::move(r), counter, payment_id = std::move(payment_id), book,
                   key = std::move(key)]() mutable {
      if (book == Book::none)
        counter->fetch_add(1, std::memory_order_relaxed);
      else
        count_for(payment_id, *counter, book, key);
      out.respond(std::move(r));
    };
    if (delay.count() == 0) return answer();
    c_.in_flight.fetch_add(1, std::memory_order_relaxed);
    auto timer = std::make_shared<asio::steady_timer>(timer_io_, delay);
    timer->async_wait([this, timer, answer = std::move(answer)](const std::error_code&) mutable {
      c_.in_flight.fetch_sub(1, std::memory_order_relaxed);
      answer();
    });
  }

  // Counts an answer as it is sent; a keyed refund's repeats are answered
  // from it from now on.
  void count_for(const std::string& payment_id, std::atomic<std::uint64_t>& total, Book book,
                 const std::string& key) {
    std::lock_guard lk(refunds_mu_);
    total.fetch_add(1, std::memory_order_relaxed);
    if (!key.empty()) keyed_[key].answered = true;
    if (book == Book::refunded) {
      if (++refunded_[payment_id] == 2) ++refunded_twice_;
    } else if (++settled_[payment_id] == 2) {
      ++settled_twice_;
    }
  }

  const Options o_;
  Counters c_;
  std::mutex rng_mu_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};
  std::mutex hung_mu_;
  std::vector<Responder> hung_;
  // Successful refunds per payment id, and how many ids have more than one.
  mutable std::mutex refunds_mu_;
  std::unordered_map<std::string, std::uint64_t> refunded_;
  std::unordered_map<std::string, std::uint64_t> settled_;  // approved settlements per payment
  // What the first paid request of each Idempotency-Key was.
  struct KeyedRefund {
    std::string payment_id;
    std::int64_t amount = 0;
    bool answered = false;  // its 200 was sent
    std::string answer;     // that 200's body
  };
  std::unordered_map<std::string, KeyedRefund> keyed_;
  std::uint64_t refunded_twice_ = 0;
  std::uint64_t settled_twice_ = 0;
  asio::io_context timer_io_{1};
  asio::executor_work_guard<asio::io_context::executor_type> timer_work_;
  std::thread timer_thread_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"The simulated settlement gateway of the troupe payment example, over HTTP."};
  app.add_option("--host", o.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "Port to listen on (0: any free port, printed)")->capture_default_str();
  app.add_option("--latency-ms", o.latency_ms, "Mean answer latency in ms")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--jitter-ms", o.jitter_ms, "Latency jitter in ms: uniform in mean ± jitter")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--decline-rate", o.decline_rate, "Share of settlements declined")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--error-rate", o.error_rate, "Share of requests answered HTTP 503 (gateway error)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--hang-rate", o.hang_rate, "Share of requests never answered")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the random draws")->capture_default_str();
  app.add_option("--io-threads", o.io_threads, "HTTP io threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.decline_rate + o.error_rate + o.hang_rate > 1.0) {
    std::fprintf(stderr, "payment_gateway: --decline-rate + --error-rate + --hang-rate must not exceed 1\n");
    return 2;
  }

  // SIGINT and SIGTERM are taken by sigwait() below; every thread started
  // from here on inherits the mask, so none of them is interrupted.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Gateway gateway(o);
  troupe::http::ServerSettings settings;
  settings.host = o.host;
  settings.port = o.port;
  settings.io_threads = o.io_threads;
  // Hung requests never drain; stopping should not wait long for them.
  settings.drain_timeout = std::chrono::milliseconds(500);
  settings.log = [](std::string_view line) {
    std::fprintf(stderr, "payment_gateway: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  auto server = troupe::http::Server::start(settings, gateway.routes());
  if (!server.ok()) {
    std::fprintf(stderr, "payment_gateway: %s\n", server.error().to_string().c_str());
    return 1;
  }
  std::printf("payment_gateway listening on http://%s:%u\n", o.host.c_str(),
              static_cast<unsigned>((*server)->port()));
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "payment_gateway: %s, stopping; %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
               gateway.stats().dump().c_str());
  (*server)->stop();
  return 0;
}
