// The payment service: see service.hpp. This file wires it together: the
// gateway client, the command codecs, the [payment] settings, the refunds
// (the outbox handler that pays them back), and start/stop; its HTTP routes
// are in service_routes.cpp.

#include "service_impl.hpp"

#include <charconv>
#include <cstdio>

#include "troupe/core/log.hpp"
#include <utility>

#include "payment_wire.pb.h"
#include "troupe/protobuf/messages.hpp"

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
// As the messages of payment_wire.proto.

pb::PaymentStatus status_to_pb(const PaymentStatus& st) {
  const auto& s = st.state;
  pb::PaymentStatus m;
  m.set_phase(static_cast<pb::Phase>(s.phase));
  m.set_failure(static_cast<pb::Failure>(s.failure));
  m.set_customer(s.customer);
  m.set_order_id(s.order_id);
  m.set_amount(s.amount);
  m.set_accepted_at_ms(s.accepted_at_ms);
  m.set_detail(s.detail);
  m.set_refunded(s.refunded);
  m.set_events(st.events);
  return m;
}

Result<PaymentStatus> status_from_pb(const pb::PaymentStatus& m) {
  if (m.phase() < 0 || m.phase() > static_cast<int>(Phase::cancelled) || m.failure() < 0 ||
      m.failure() > static_cast<int>(Failure::gateway_error))
    return Error(ErrorCode::protocol_error, "payment status: unknown phase or failure");
  PaymentStatus st;
  auto& s = st.state;
  s.phase = static_cast<Phase>(m.phase());
  s.failure = static_cast<Failure>(m.failure());
  s.customer = m.customer();
  s.order_id = m.order_id();
  s.amount = m.amount();
  s.accepted_at_ms = m.accepted_at_ms();
  s.detail = m.detail();
  s.refunded = m.refunded();
  st.events = m.events();
  return st;
}

pb::Create create_to_pb(const Create& c) {
  pb::Create m;
  m.set_customer(c.customer);
  m.set_order_id(c.order_id);
  m.set_amount(c.amount);
  return m;
}
Create create_from_pb(const pb::Create& m) { return Create{m.customer(), m.order_id(), m.amount(), {}}; }

pb::Settle settle_to_pb(const Settle& c) {
  pb::Settle m;
  m.set_order_id(c.order_id);
  m.set_amount(c.amount);
  m.set_customer(c.customer);
  return m;
}
Settle settle_from_pb(const pb::Settle& m) { return Settle{m.order_id(), m.amount(), {}, m.customer()}; }

// The commands' wire codecs; an error if a registration is refused (an
// empty or colliding message name), which start() reports.
Result<troupe::cluster::MessageCodecs<Command>> command_codecs() {
  troupe::cluster::MessageCodecs<Command> c;
  // A repeat of these is answered with the stored outcome and stores
  // nothing (payment.hpp: a retried Settle never settles twice, a second
  // Cancel sends no second refund), so a shard region may send them again
  // to a new owner when theirs dies while they are out (SPEC C1).
  const troupe::cluster::MessageOptions kIdempotent{.idempotent = true};
  auto cancel_to_pb = [](const Cancel&) { return pb::Cancel(); };
  auto get_to_pb = [](const GetStatus&) { return pb::GetStatus(); };
  auto expire_to_pb = [](const Expire& e) {
    pb::Expire m;
    m.set_due_ms(e.due_ms);
    return m;
  };
  for (Result<void> added : {
           troupe::add_protobuf<Create>(c, create_to_pb, create_from_pb, status_to_pb, status_from_pb,
                                        kIdempotent),
           troupe::add_protobuf<Settle>(c, settle_to_pb, settle_from_pb, status_to_pb, status_from_pb,
                                        kIdempotent),
           troupe::add_protobuf<Cancel>(
               c, cancel_to_pb, [](const pb::Cancel&) { return Cancel{}; }, status_to_pb, status_from_pb,
               kIdempotent),
           troupe::add_protobuf<GetStatus>(
               c, get_to_pb, [](const pb::GetStatus&) { return GetStatus{}; }, status_to_pb, status_from_pb,
               kIdempotent),
           // A repeated or late firing stores nothing (payment.hpp, "Expiry").
           troupe::add_protobuf<Expire>(
               c, expire_to_pb, [](const pb::Expire& m) { return Expire{m.due_ms(), {}}; }, status_to_pb,
               status_from_pb, kIdempotent),
       }) {
    if (!added.ok()) return std::move(added).error();
  }
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
  PAY_READ(rt, r.millis("refund_timeout_ms", s.refund_timeout, 1ms, std::chrono::milliseconds(600'000)));
  s.refund_timeout = *rt;
  PAY_READ(io, r.integer("io_threads", s.io_threads, 1, 64));
  s.io_threads = static_cast<int>(*io);
  PAY_READ(slices, r.integer("read_slices", s.read_slices, 1, kMaxReadSlices));
  s.read_slices = static_cast<std::uint32_t>(*slices);
  PAY_READ(expire, r.string("expire_after", "0"));
  PAY_READ(after, parse_expire_after(*expire));
  s.expire_after = *after;
  PAY_READ(rate, r.number("expire_rate", s.expire_rate, 0.001, 1'000'000));
  s.expire_rate = *rate;
#undef PAY_READ
  if (auto f = r.finish(); !f.ok()) return std::move(f).error();
  return s;
}

// --- refunds: the outbox records of cancelled payments, paid back -------------------------

namespace {

// The record's key as an HTTP header value: bytes outside visible ASCII,
// and '%', as %XX. The same key always gives the same value.
std::string header_value(const std::string& key) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (c > 0x20 && c < 0x7f && c != '%') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// Pays one refund back (payment.hpp: a PaymentCancelled's side effect):
// POST /refund to the gateway with the record's key as Idempotency-Key, so
// a try that runs again (a lost answer, a crash, another node's retry)
// refunds nothing more. Done on 200; anything else is a failed try.
troupe::OutboxHandler refund_handler(std::shared_ptr<http::Client> client, troupe::Duration timeout) {
  return [client = std::move(client), timeout](const troupe::OutboxEntry& e) {
    auto done = std::make_shared<troupe::Promise<void>>();
    auto f = done->future();
    const std::string& text = e.record.payload;
    std::int64_t amount = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), amount);
    if (ec != std::errc() || end != text.data() + text.size() || amount <= 0) {
      done->set_error(Error(ErrorCode::invalid_argument, "refund record '" + e.record.key + "': amount '" + text +
                                                              "' is not a positive number"));
      return f;
    }
    http::ClientRequest req;
    req.method = "POST";
    req.target = "/refund";
    req.content_type = "application/json";
    req.body = json{{"payment_id", e.entity_id()}, {"amount", amount}}.dump();
    req.headers.emplace_back("Idempotency-Key", header_value(e.record.key));
    req.timeout = timeout;
    client->request(std::move(req), [done](Result<http::Response> resp) {
      if (!resp.ok()) return done->set_error(Error(resp.error().code(), "gateway: " + resp.error().message()));
      if (resp->status == 200) return done->set_value();
      done->set_error(Error(ErrorCode::unreachable, "gateway answered HTTP " + std::to_string(resp->status) + ": " +
                                                        resp->body.substr(0, 200)));
    });
    return f;
  };
}

}  // namespace

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

  // Refunds are the outbox records the payments store with PaymentCancelled:
  // this node's dispatcher pays them back (in a cluster, every node's
  // dispatcher takes its share of the shared journal's records), retried
  // with back-off until the gateway has said 200.
  troupe::OutboxSettings os;
  os.max_in_flight = settings.refund_workers;
  os.attempt_timeout = settings.refund_timeout;
  os.lease = settings.refund_timeout + 5s;
  os.max_backoff = 30s;
  os.max_attempts = 50;  // about 20 minutes of a gateway that keeps failing
  auto outbox = node.start_outbox({{kRefundEffect, refund_handler(impl->gateway_client, settings.refund_timeout)}}, os);
  if (!outbox.ok()) return Error(outbox.error().code(), "the refunds' outbox: " + outbox.error().message());
  impl->refunds = *outbox;

  troupe::node::EntityTypeOptions<Payment> opts;
  opts.type = "payment";
  opts.events = payment_codecs();
  auto commands = command_codecs();
  if (!commands.ok()) return Error(commands.error().code(), "the payment commands' codecs: " + commands.error().message());
  opts.commands = std::move(commands).value();
  opts.stop_timeout = settings.processing_timeout + 1s;
  auto gateway = impl->gateway;
  auto timeout = settings.processing_timeout;
  auto slices = settings.read_slices;
  // Created payments expire through reminders beside the journal (expiry.hpp).
  auto expiry = PaymentExpiry::open(node, settings.expire_after, settings.expire_rate);
  if (!expiry.ok()) return std::move(expiry).error();
  impl->expiry = std::move(*expiry);
  auto policy = impl->expiry ? impl->expiry->policy() : std::make_shared<const ExpiryPolicy>();
  opts.factory = [gateway, timeout, slices, policy](const std::string& id) {
    return Payment(gateway, timeout, slice_tag(id, slices), *policy);
  };
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
  if (impl->expiry)
    if (auto run = impl->expiry->run(*payments); !run.ok()) return std::move(run).error();

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
  node.add_counter("refunds sent", [raw] { return raw->refunds->stats().sent; });

  // The read side runs where its read models can share the journal's
  // database; elsewhere its routes answer 503 saying why.
  auto side = ReadSide::start(node, settings.read_slices);
  if (side.ok()) {
    impl->read_side = std::move(*side);
  } else {
    impl->read_side_unavailable = side.error().message();
    troupe::log::warn(troupe::log::Component::app, "the read side does not run",
                      {{"reason", impl->read_side_unavailable}});
  }

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
