// The payment service's HTTP API (doc/payment.md): the routes, how a
// settlement is answered, and how errors map to statuses. The service is
// wired in service.cpp.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "service_impl.hpp"
#include "troupe/core/log.hpp"
#include "troupe/core/trace.hpp"

namespace payment {

using namespace std::chrono_literals;
using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;

namespace {

const char* failure_text(Failure f) {
  switch (f) {
    case Failure::none: return nullptr;
    case Failure::declined: return "declined";
    case Failure::timed_out: return "timed out";
    case Failure::gateway_error: return "gateway error";
  }
  return nullptr;
}

}  // namespace

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

void PaymentService::Impl::settle(SettleOrder order, http::Responder out) {
  auto start = std::chrono::steady_clock::now();
  std::string id = order.id;
  // The HTTP server runs this handler under the request's trace (its
  // traceparent, or a new one); the answer may come back on another
  // thread, so the trace is taken along to log under it there too.
  const troupe::TraceContext* current = troupe::current_trace();
  std::optional<troupe::TraceContext> trace = current ? std::optional(*current) : std::nullopt;
  namespace log = troupe::log;
  log::debug(log::Component::app, "settlement requested", {{"payment", id}, {"amount", order.amount}});
  auto f = settlements->submit(std::move(order), shared);
  std::move(f).then([this, id, start, trace, out = std::move(out)](Result<PaymentStatus> r) mutable {
    std::optional<troupe::TraceScope> scope;
    if (trace) scope.emplace(*trace);
    if (!r.ok()) {
      log::debug(log::Component::app, "settlement failed", {{"payment", id}, {"error", r.error().to_string()}});
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
    log::debug(log::Component::app, "settlement answered", {{"payment", id}, {"outcome", outcome}});
    out.respond(http::Response::json(200, status_json(id, *r).dump()));
  });
}

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

}  // namespace payment
