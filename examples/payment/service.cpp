// The payment service: see service.hpp. This file wires it together: the
// gateway client, the command codecs, the [payment] settings, the refund
// desk, and start/stop; its HTTP routes are in service_routes.cpp.

#include "service_impl.hpp"

#include <cstdio>

#include "troupe/core/log.hpp"
#include <utility>

namespace payment {

namespace {

using namespace std::chrono_literals;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;

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
          // Under the payment's trace: the client sends it on as traceparent.
          troupe::log::debug(troupe::log::Component::app, "asking the gateway to settle", {{"payment", r.payment_id}});
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
