// The payment service: see service.hpp.

#include "service.hpp"

#include <cstdio>
#include <utility>

namespace payment {

namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;
namespace http = troupe::http;

// --- the gateway over HTTP ----------------------------------------------------------

// Sends each GatewayRequest to the gateway process as POST /settle and
// answers its reply target when the response (or the error) comes. One
// actor, never blocking: the HTTP client completes on its io thread.
// Thread safety: an actor, reached through its ref; the client is shared.
class HttpGateway final : public troupe::Actor<GatewayMsg> {
 public:
  HttpGateway(std::shared_ptr<http::Client> client, troupe::Duration timeout)
      : client_(std::move(client)), timeout_(timeout) {}

  void receive(GatewayMsg& m) {
    troupe::match(
        m,
        [&](GatewayRequest& r) {
          http::ClientRequest req;
          req.method = "POST";
          req.target = "/settle";
          req.content_type = "application/json";
          req.body = json{{"payment_id", r.payment_id}, {"order_id", r.order_id}, {"amount", r.amount}}.dump();
          req.timeout = timeout_;
          auto reply = std::make_shared<troupe::ReplyTo<GatewayReply>>(std::move(r.reply_to));
          client_->request(std::move(req), [reply](Result<http::Response> resp) { answer(*reply, resp); });
        },
        [&](GatewayAnswerDue& d) { d.reply_to.reply(std::move(d.reply)); });
  }

 private:
  static void answer(troupe::ReplyTo<GatewayReply>& reply, const Result<http::Response>& resp) {
    if (!resp.ok()) return reply.fail(Error(resp.error().code(), "gateway: " + resp.error().message()));
    if (resp->status != 200)
      return reply.fail(Error(ErrorCode::unreachable, "gateway answered HTTP " + std::to_string(resp->status)));
    auto j = json::parse(resp->body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("approved") || !j["approved"].is_boolean())
      return reply.fail(Error(ErrorCode::protocol_error, "gateway: unreadable answer"));
    reply.reply(GatewayReply{j["approved"].get<bool>(), j.value("code", std::string())});
  }

  std::shared_ptr<http::Client> client_;
  troupe::Duration timeout_;
};

// --- one settlement, as a process of the process manager -----------------------------

struct SettleOrder {
  std::string id;
  std::string customer;
  std::string order_id;
  std::int64_t amount = 0;
};

struct Shared {
  troupe::node::Entities<Payment> payments;
  troupe::KeyedLock customers;
  troupe::Duration ask_timeout;
};

// Holds the customer's lock while the payment entity settles; completes
// with the payment's status. The process actor has nothing to receive: the
// lock's future completes its handle from whichever thread answers.
class SettleProcess final : public troupe::Actor<std::monostate> {
 public:
  using result_type = PaymentStatus;
  SettleProcess(troupe::ProcessHandle<PaymentStatus> done, SettleOrder order, std::shared_ptr<Shared> shared)
      : done_(std::move(done)), order_(std::move(order)), shared_(std::move(shared)) {}

  void on_start() {
    auto shared = shared_;
    auto order = order_;
    auto settled = shared_->customers.lock(order_.customer, [shared, order](const troupe::LockLease&) {
      return shared->payments.ask<PaymentStatus>(
          order.id,
          [&](troupe::ReplyTo<PaymentStatus> r) {
            return Settle{order.order_id, order.amount, std::move(r), order.customer};
          },
          shared->ask_timeout);
    });
    std::move(settled).then([done = done_](Result<PaymentStatus> r) {
      if (r.ok()) {
        done.complete(std::move(*r));
      } else {
        done.fail(std::move(r).error());
      }
    });
  }
  void receive(std::monostate&) {}

 private:
  troupe::ProcessHandle<PaymentStatus> done_;
  SettleOrder order_;
  std::shared_ptr<Shared> shared_;
};

const char* failure_text(Failure f) {
  switch (f) {
    case Failure::none: return nullptr;
    case Failure::declined: return "declined";
    case Failure::timed_out: return "timed out";
    case Failure::gateway_error: return "gateway error";
  }
  return nullptr;
}

int http_status(const Error& e) {
  switch (e.code()) {
    case ErrorCode::invalid_argument: return 400;
    case ErrorCode::buffer_overflow:
    case ErrorCode::mailbox_full:
    case ErrorCode::stash_overflow: return 429;
    case ErrorCode::timeout:
    case ErrorCode::acquire_timeout:
    case ErrorCode::lease_expired: return 504;
    default: return 503;
  }
}

http::Response error_response(const Error& e) {
  return http::Response::error(http_status(e), troupe::to_string(e.code()), e.message());
}

// --- the payment's commands on the wire (a cluster routes them to the owner) -----

void write_status(const PaymentStatus& st, troupe::ByteWriter& w) {
  const auto& s = st.state;
  w.u64(static_cast<std::uint64_t>(s.phase)).u64(static_cast<std::uint64_t>(s.failure));
  w.str(s.customer).str(s.order_id).i64(s.amount).i64(s.accepted_at_ms).str(s.detail).i64(s.refunded);
  w.u64(s.refund_job).str(s.refund_error).u64(st.events);
}

Result<PaymentStatus> read_status(troupe::ByteReader& r) {
  PaymentStatus st;
  auto& s = st.state;
  auto phase = r.u64();
  auto failure = r.u64();
  s.customer = r.str();
  s.order_id = r.str();
  s.amount = r.i64();
  s.accepted_at_ms = r.i64();
  s.detail = r.str();
  s.refunded = r.i64();
  s.refund_job = r.u64();
  s.refund_error = r.str();
  st.events = r.u64();
  if (phase > static_cast<std::uint64_t>(Phase::cancelled) || failure > static_cast<std::uint64_t>(Failure::gateway_error))
    return Error(ErrorCode::protocol_error, "payment status: unknown phase or failure");
  s.phase = static_cast<Phase>(phase);
  s.failure = static_cast<Failure>(failure);
  return r.finish(std::move(st));
}

// The commands' wire codecs; an error if a registration is refused (an
// empty or colliding message name), which start() reports.
Result<troupe::cluster::MessageCodecs<Command>> command_codecs() {
  using troupe::ByteReader;
  using troupe::ByteWriter;
  troupe::cluster::MessageCodecs<Command> c;
  // A repeat of these is answered with the stored outcome and stores
  // nothing (payment.hpp: a retried Settle never settles twice), so a shard
  // region may send them again to a new owner when theirs dies while they
  // are out (SPEC C1). Cancel is not: a second cancel after a refund that
  // failed to queue tries the refund again.
  const troupe::cluster::MessageOptions kIdempotent{.idempotent = true};
  Result<void> added = c.add<Create>(
      "payment.Create", [](const Create& m, ByteWriter& w) { w.str(m.customer).str(m.order_id).i64(m.amount); },
      [](ByteReader& r) -> Result<Create> {
        Create m;
        m.customer = r.str();
        m.order_id = r.str();
        m.amount = r.i64();
        return r.finish(std::move(m));
      },
      write_status, read_status, kIdempotent);
  if (!added.ok()) return std::move(added).error();
  added = c.add<Settle>(
      "payment.Settle", [](const Settle& m, ByteWriter& w) { w.str(m.order_id).i64(m.amount).str(m.customer); },
      [](ByteReader& r) -> Result<Settle> {
        Settle m;
        m.order_id = r.str();
        m.amount = r.i64();
        m.customer = r.str();
        return r.finish(std::move(m));
      },
      write_status, read_status, kIdempotent);
  if (!added.ok()) return std::move(added).error();
  added = c.add<Cancel>(
      "payment.Cancel", [](const Cancel&, ByteWriter&) {}, [](ByteReader& r) { return r.finish(Cancel{}); },
      write_status, read_status);
  if (!added.ok()) return std::move(added).error();
  added = c.add<GetStatus>(
      "payment.GetStatus", [](const GetStatus&, ByteWriter&) {}, [](ByteReader& r) { return r.finish(GetStatus{}); },
      write_status, read_status, kIdempotent);
  if (!added.ok()) return std::move(added).error();
  return c;
}

}  // namespace

json status_json(const std::string& id, const PaymentStatus& st) {
  const auto& s = st.state;
  const char* f = failure_text(s.failure);
  return {{"id", id},
          {"customer", s.customer},
          {"order_id", s.order_id},
          {"amount", s.amount},
          {"status", to_string(s.phase)},
          {"failure", f ? json(f) : json(nullptr)},
          {"detail", s.detail},
          {"refunded", s.refunded},
          {"refund_job", s.refund_job},
          {"refund_error", s.refund_error.empty() ? json(nullptr) : json(s.refund_error)},
          {"events", st.events}};
}

Result<ServiceSettings> ServiceSettings::from(const troupe::node::NodeConfig& config) {
  ServiceSettings s;
  troupe::node::ConfigReader r(config.app_table("payment"), "payment");
  auto fail = [&](Error e) { return Error(e.code(), e.message()); };
#define PAY_READ(var, expr)           \
  auto var = (expr);                  \
  if (!var.ok()) return fail(std::move(var).error())
  PAY_READ(host, r.string("host", s.host));
  s.host = *host;
  PAY_READ(port, r.integer("port", s.port, 0, 65535));
  s.port = static_cast<std::uint16_t>(*port);
  PAY_READ(gw, r.string("gateway", s.gateway_host + ":" + std::to_string(s.gateway_port)));
  auto colon = gw->rfind(':');
  if (colon == std::string::npos || colon == 0)
    return Error(ErrorCode::invalid_argument, "payment.gateway: expected \"host:port\", got \"" + *gw + "\"");
  s.gateway_host = gw->substr(0, colon);
  try {
    int p = std::stoi(gw->substr(colon + 1));
    if (p <= 0 || p > 65535) throw std::out_of_range("port");
    s.gateway_port = static_cast<std::uint16_t>(p);
  } catch (const std::exception&) {
    return Error(ErrorCode::invalid_argument, "payment.gateway: the port in \"" + *gw + "\" is not a number from 1 to 65535");
  }
  PAY_READ(conns, r.integer("gateway_connections", static_cast<std::int64_t>(s.gateway_connections), 1, 10000));
  s.gateway_connections = static_cast<std::size_t>(*conns);
  PAY_READ(pt, r.millis("processing_timeout_ms", s.processing_timeout, 1ms, std::chrono::milliseconds(3'600'000)));
  s.processing_timeout = *pt;
  PAY_READ(ms, r.integer("max_settlements", static_cast<std::int64_t>(s.max_settlements), 1, 1'000'000));
  s.max_settlements = static_cast<std::size_t>(*ms);
  PAY_READ(buf, r.integer("settle_buffer", static_cast<std::int64_t>(s.settle_buffer), 0, 10'000'000));
  s.settle_buffer = static_cast<std::size_t>(*buf);
  PAY_READ(lw, r.millis("lock_wait_ms", s.lock_wait, 0ms, std::chrono::milliseconds(3'600'000)));
  s.lock_wait = *lw;
  PAY_READ(rw, r.integer("refund_workers", static_cast<std::int64_t>(s.refund_workers), 1, 1024));
  s.refund_workers = static_cast<std::size_t>(*rw);
  PAY_READ(io, r.integer("io_threads", s.io_threads, 1, 64));
  s.io_threads = static_cast<int>(*io);
#undef PAY_READ
  if (auto f = r.finish(); !f.ok()) return std::move(f).error();
  return s;
}

// --- the refund desk: where a payment hands its refund to the durable queue ---------------

// Takes a payment's QueueRefund, enqueues the refund job (priority by
// amount) and answers with its id once the queue has accepted it (journaled),
// or with why not. Stateless apart from its handles; one per node.
class RefundDesk final : public troupe::Actor<QueueRefund> {
 public:
  RefundDesk(troupe::JobService jobs, std::shared_ptr<troupe::node::Counter> outcomes)
      : jobs_(std::move(jobs)), outcomes_(std::move(outcomes)) {}

  void receive(QueueRefund& m) {
    // Large refunds first: the customer waits for more money.
    int priority = m.amount >= 100'000 ? 10 : m.amount >= 10'000 ? 5 : 1;
    jobs_.enqueue(troupe::Job{"refund", json{{"payment_id", m.payment_id}, {"amount", m.amount}}.dump()}, priority)
        .then([rt = std::move(m.reply_to), outcomes = outcomes_](Result<troupe::JobId> id) mutable {
          if (!id.ok()) return rt.fail(std::move(id).error());
          outcomes->add({"refund_queued"});
          rt.reply(id.value());
        });
  }

 private:
  troupe::JobService jobs_;
  std::shared_ptr<troupe::node::Counter> outcomes_;
};

// --- the service ------------------------------------------------------------------------

struct PaymentService::Impl {
  troupe::node::Node* node = nullptr;
  ServiceSettings settings;
  std::shared_ptr<http::Client> gateway_client;
  troupe::ActorRef<GatewayMsg> gateway;
  std::shared_ptr<Shared> shared;
  std::optional<troupe::ProcessManager<SettleProcess>> settlements;
  std::optional<troupe::JobService> refunds;
  troupe::ActorRef<QueueRefund> refund_desk;
  std::unique_ptr<http::Server> server;

  std::shared_ptr<troupe::node::Counter> outcomes;
  std::shared_ptr<troupe::node::Histogram> latency;
  std::atomic<std::uint64_t> finished{0};

  void count(const char* outcome, std::chrono::steady_clock::time_point start) {
    outcomes->add({outcome});
    finished.fetch_add(1, std::memory_order_relaxed);
    latency->observe_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  void settle(SettleOrder order, http::Responder out) {
    auto start = std::chrono::steady_clock::now();
    std::string id = order.id;
    auto f = settlements->submit(std::move(order), shared);
    std::move(f).then([this, id, start, out = std::move(out)](Result<PaymentStatus> r) mutable {
      if (!r.ok()) {
        count(r.error().code() == ErrorCode::buffer_overflow ? "refused" : "error", start);
        out.respond(error_response(r.error()));
        return;
      }
      const auto& s = r->state;
      const char* outcome = s.phase == Phase::completed                ? "completed"
                            : s.failure == Failure::declined           ? "declined"
                            : s.failure == Failure::timed_out          ? "timed_out"
                            : s.failure == Failure::gateway_error      ? "gateway_error"
                                                                       : "other";
      count(outcome, start);
      out.respond(http::Response::json(200, status_json(id, *r).dump()));
    });
  }

  http::Router routes();
};

http::Router PaymentService::Impl::routes() {
  http::Router r;
  auto parse = [](const http::Request& req, http::Responder& out) -> std::optional<json> {
    if (req.body.empty()) return json::object();
    auto j = json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      out.respond(http::Response::error(400, "invalid_argument", "the body is not a JSON object"));
      return std::nullopt;
    }
    return j;
  };
  // Reads the order fields; false (and answered 400) if one has the wrong type.
  auto fields = [](const json& j, SettleOrder& o, http::Responder& out) {
    try {
      if (j.contains("customer")) o.customer = j.at("customer").get<std::string>();
      if (j.contains("order_id")) o.order_id = j.at("order_id").get<std::string>();
      if (j.contains("amount")) o.amount = j.at("amount").get<std::int64_t>();
      if (j.contains("id")) o.id = j.at("id").get<std::string>();
    } catch (const json::exception&) {
      out.respond(http::Response::error(400, "invalid_argument",
                                        "customer, order_id and id must be strings and amount a whole number"));
      return false;
    }
    return true;
  };

  r.add("POST", "/payments", [this, parse, fields](http::Request& req, http::Responder out) {
    auto j = parse(req, out);
    if (!j) return;
    SettleOrder o;
    if (!fields(*j, o, out)) return;
    if (o.customer.empty() || o.order_id.empty() || o.amount <= 0) {
      out.respond(http::Response::error(400, "invalid_argument",
                                        "a payment needs a customer, an order_id and a positive amount"));
      return;
    }
    if (o.id.empty()) o.id = "pay-" + o.order_id;  // one payment per order: a retried POST finds it
    bool settle_now = j->value("settle", true);
    if (settle_now) return settle(std::move(o), std::move(out));
    auto f = shared->payments.ask<PaymentStatus>(
        o.id, [&](troupe::ReplyTo<PaymentStatus> rt) { return Create{o.customer, o.order_id, o.amount, std::move(rt)}; },
        10s);
    std::move(f).then([id = o.id, out = std::move(out)](Result<PaymentStatus> st) mutable {
      if (!st.ok()) return out.respond(error_response(st.error()));
      out.respond(http::Response::json(201, status_json(id, *st).dump()));
    });
  });

  r.add("POST", "/payments/{id}/settle", [this, parse, fields](http::Request& req, http::Responder out) {
    auto j = parse(req, out);
    if (!j) return;
    SettleOrder o;
    if (!fields(*j, o, out)) return;
    o.id = req.params["id"];
    if (o.customer.empty()) {
      // The lock key: a created payment knows its customer.
      auto st = shared->payments.ask<PaymentStatus>(
          o.id, [](troupe::ReplyTo<PaymentStatus> rt) { return GetStatus{std::move(rt)}; }, 10s);
      std::move(st).then([this, o = std::move(o), out = std::move(out)](Result<PaymentStatus> s) mutable {
        if (!s.ok()) return out.respond(error_response(s.error()));
        if (s->state.customer.empty()) {
          return out.respond(http::Response::error(
              400, "invalid_argument", "payment '" + o.id + "' was not created: give customer, order_id and amount"));
        }
        o.customer = s->state.customer;
        settle(std::move(o), std::move(out));
      });
      return;
    }
    settle(std::move(o), std::move(out));
  });

  r.add("POST", "/payments/{id}/cancel", [this](http::Request& req, http::Responder out) {
    std::string id = req.params["id"];
    auto f = shared->payments.ask<PaymentStatus>(
        id, [](troupe::ReplyTo<PaymentStatus> rt) { return Cancel{std::move(rt)}; },
        // A settlement in progress first, then the refund being queued.
        settings.processing_timeout + std::max<troupe::Duration>(settings.processing_timeout, kRefundQueueTimeout) + 5s);
    std::move(f).then([id, out = std::move(out)](Result<PaymentStatus> st) mutable {
      if (!st.ok()) return out.respond(error_response(st.error()));
      // The entity answers a refund once the durable refund queue has
      // accepted it (refund_job). If it could not, the refund is recorded but
      // will not be sent until a cancel succeeds: say so, never 200.
      const auto& s = st->state;
      if (s.phase == Phase::cancelled && s.refunded > 0 && s.refund_job == 0) {
        return out.respond(http::Response::error(
            503, "refund_not_queued",
            "payment '" + id + "' is cancelled and its refund of " + std::to_string(s.refunded) +
                " recorded, but the refund queue did not take it (" +
                (s.refund_error.empty() ? std::string("no answer") : s.refund_error) +
                "); send the cancel again to queue it"));
      }
      out.respond(http::Response::json(200, status_json(id, *st).dump()));
    });
  });

  r.add("GET", "/payments/{id}", [this](http::Request& req, http::Responder out) {
    std::string id = req.params["id"];
    auto f = shared->payments.ask<PaymentStatus>(
        id, [](troupe::ReplyTo<PaymentStatus> rt) { return GetStatus{std::move(rt)}; }, 10s);
    std::move(f).then([id, out = std::move(out)](Result<PaymentStatus> st) mutable {
      if (!st.ok()) return out.respond(error_response(st.error()));
      if (st->events == 0) return out.respond(http::Response::error(404, "not_found", "no payment '" + id + "'"));
      out.respond(http::Response::json(200, status_json(id, *st).dump()));
    });
  });
  r.add("GET", "/health", [](http::Request&, http::Responder out) {
    out.respond(http::Response::json(200, R"({"status":"ok"})"));
  });
  return r;
}

PaymentService::PaymentService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PaymentService::~PaymentService() { stop(); }

std::uint16_t PaymentService::port() const { return impl_->server ? impl_->server->port() : 0; }

void PaymentService::stop() {
  if (impl_ && impl_->server) impl_->server->stop();
}

Result<std::unique_ptr<PaymentService>> PaymentService::start(troupe::node::Node& node, ServiceSettings settings) {
  auto impl = std::make_unique<Impl>();
  impl->node = &node;
  impl->settings = settings;
  auto& metrics = node.metrics();
  impl->outcomes = metrics.counter("payments_total", "Payment requests finished, by outcome.", {"outcome"});
  impl->latency = metrics.histogram("payment_request_seconds", "Settlement requests, from arrival to answer.",
                                    {0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05,
                                     0.075, 0.1, 0.15, 0.25, 0.5, 1, 2, 5, 10});

  http::ClientSettings cs;
  cs.host = settings.gateway_host;
  cs.port = settings.gateway_port;
  cs.max_connections = settings.gateway_connections;
  cs.max_queued = settings.max_settlements + settings.settle_buffer + 10'000;
  auto client = http::Client::create(cs);
  if (!client.ok()) return Error(client.error().code(), "payment.gateway: " + client.error().message());
  impl->gateway_client = std::move(*client);
  // The gateway call's own timeout outlives the processing deadline: the
  // entity's deadline (stored, recoverable) is what ends a hung request.
  impl->gateway = node.system().spawn<HttpGateway>(impl->gateway_client, settings.processing_timeout + 1s);

  troupe::JobSettings js;
  js.name = "refunds";
  js.workers = settings.refund_workers;
  js.max_attempts = 5;
  js.default_timeout = 10s;
  js.watchdog_limit = 30s;
  js.log = false;
  auto refund_client = impl->gateway_client;
  // Durable (accepted refunds survive a crash, J6) on the node's journal;
  // in a cluster the queue is sharded over the nodes (jobs.shard_count).
  auto jobs = node.start_jobs(
      js,
      [](const troupe::Job& j) -> std::optional<troupe::JobWorkerCall> {
        if (j.kind == "refund") return troupe::JobWorkerCall{"gateway", j.payload};
        return std::nullopt;
      },
      {{"gateway", [refund_client](troupe::JobRun run) {
          http::ClientRequest req;
          req.method = "POST";
          req.target = "/refund";
          req.content_type = "application/json";
          req.body = run.detail();
          refund_client->request(std::move(req), [run](Result<http::Response> resp) {
            if (!resp.ok()) return (void)run.fail(resp.error().message());
            if (resp->status != 200) return (void)run.fail("gateway answered HTTP " + std::to_string(resp->status));
            run.succeed(resp->body);
          });
        }}});
  if (!jobs.ok()) return Error(jobs.error().code(), "the refund queue: " + jobs.error().message());
  impl->refunds = *jobs;
  impl->refund_desk = node.system().spawn<RefundDesk>(troupe::SpawnOptions{.name = "refund-desk"}, *jobs, impl->outcomes);
  if (!impl->refund_desk) return Error(ErrorCode::shutting_down, "the actor system is shutting down");

  troupe::node::EntityTypeOptions<Payment> opts;
  opts.type = "payment";
  opts.events = payment_codecs();
  auto commands = command_codecs();
  if (!commands.ok()) return Error(commands.error().code(), "the payment commands' codecs: " + commands.error().message());
  opts.commands = std::move(commands).value();
  opts.stop_timeout = settings.processing_timeout + 1s;
  auto gateway = impl->gateway;
  auto desk = impl->refund_desk;
  auto timeout = settings.processing_timeout;
  opts.factory = [gateway, desk, timeout](const std::string&) { return Payment(gateway, desk, timeout); };
  Impl* raw = impl.get();
  auto payments = node.serve_entities<Payment>(std::move(opts), [raw](const std::string& id, auto done) {
    if (!raw->shared) return done(Error(ErrorCode::not_ready, "the payment service is starting"));
    auto f = raw->shared->payments.ask<PaymentStatus>(
        id, [](troupe::ReplyTo<PaymentStatus> rt) { return GetStatus{std::move(rt)}; }, 10s);
    std::move(f).then([id, done = std::move(done)](Result<PaymentStatus> st) {
      if (!st.ok()) return done(std::move(st).error());
      if (st->events == 0) return done(Error(ErrorCode::invalid_argument, "no payment '" + id + "': not found"));
      done(status_json(id, *st));
    });
  });
  if (!payments.ok()) return std::move(payments).error();

  troupe::KeyedLockSettings ls;
  ls.name = "customers";
  ls.wait_timeout = settings.lock_wait;
  // The block holds the key while the payment settles: the lease covers the
  // processing deadline, with room for the journal.
  ls.lease = settings.processing_timeout + 5s;
  auto lock = troupe::KeyedLock::start(node.system(), ls);
  if (!lock.ok()) return std::move(lock).error();
  impl->shared = std::make_shared<Shared>(Shared{*payments, *lock, settings.processing_timeout + 2s});
  node.watch_lock("customers", *lock);

  troupe::ProcessManager<SettleProcess>::Settings ps;
  ps.name = "settlements";
  ps.max_running = settings.max_settlements;
  ps.buffer = settings.settle_buffer;
  auto pm = troupe::ProcessManager<SettleProcess>::start(node.system(), ps);
  if (!pm.ok()) return std::move(pm).error();
  impl->settlements = *pm;
  node.watch_process_manager("settlements", [pm = *pm] { return pm.stats(); });

  node.add_rate("payments", [raw] { return raw->finished.load(std::memory_order_relaxed); });
  node.set_latency("payment", impl->latency);
  for (const char* o : {"completed", "declined", "gateway_error", "timed_out", "refused"}) {
    std::string label = o;
    std::string tile = "payments " + label;
    for (auto& ch : tile)
      if (ch == '_') ch = ' ';
    node.add_counter(tile, [raw, label] { return raw->outcomes->value({label}); });
  }
  node.add_counter("refunds queued", [raw] { return raw->outcomes->value({"refund_queued"}); });

  http::ServerSettings hs;
  hs.host = settings.host;
  hs.port = settings.port;
  hs.io_threads = settings.io_threads;
  auto server = http::Server::start(hs, impl->routes());
  if (!server.ok()) return Error(server.error().code(), "payment.port: " + server.error().message());
  impl->server = std::move(*server);
  return std::unique_ptr<PaymentService>(new PaymentService(std::move(impl)));
}

}  // namespace payment
