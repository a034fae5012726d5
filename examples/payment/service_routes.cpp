// The payment service's HTTP API (doc/payment.md): the routes, how a
// settlement is answered, and how errors map to statuses. The service is
// wired in service.cpp. A route checks its input on the server's thread,
// then hands the request to a coroutine (troupe::Task, started detached)
// that awaits the payment and answers; it resumes on the thread that
// completes what it awaits, as a Future continuation would.

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
          {"events", st.events}};
}

troupe::Task<> PaymentService::Impl::settle(SettleOrder order, http::Responder out) {
  auto start = std::chrono::steady_clock::now();
  std::string id = order.id;
  // The HTTP server starts this coroutine under the request's trace (its
  // traceparent, or a new one), and a co_await resumes under the trace it
  // suspended in, so every line below logs under the request's trace.
  namespace log = troupe::log;
  log::debug(log::Component::app, "settlement requested", {{"payment", id}, {"amount", order.amount}});
  Result<PaymentStatus> r = co_await settlements->submit(std::move(order), shared);
  if (!r.ok()) {
    log::debug(log::Component::app, "settlement failed", {{"payment", id}, {"error", r.error().to_string()}});
    count(r.error().code() == ErrorCode::buffer_overflow ? "refused" : "error", start);
    out.respond(error_response(r.error()));
    co_return;
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
}

troupe::Task<> PaymentService::Impl::create(SettleOrder o, http::Responder out) {
  Result<PaymentStatus> st = co_await shared->payments.ask<PaymentStatus>(
      o.id, [&](troupe::ReplyTo<PaymentStatus> rt) { return Create{o.customer, o.order_id, o.amount, std::move(rt)}; },
      10s);
  if (!st.ok()) {
    out.respond(error_response(st.error()));
    co_return;
  }
  out.respond(http::Response::json(201, status_json(o.id, *st).dump()));
}

troupe::Task<> PaymentService::Impl::settle_created(SettleOrder o, http::Responder out) {
  // The lock key: a created payment knows its customer.
  Result<PaymentStatus> st = co_await shared->payments.ask<PaymentStatus>(
      o.id, [](troupe::ReplyTo<PaymentStatus> rt) { return GetStatus{std::move(rt)}; }, 10s);
  if (!st.ok()) {
    out.respond(error_response(st.error()));
    co_return;
  }
  if (st->state.customer.empty()) {
    out.respond(http::Response::error(400, "invalid_argument",
                                      "payment '" + o.id + "' was not created: give customer, order_id and amount"));
    co_return;
  }
  o.customer = st->state.customer;
  co_await settle(std::move(o), std::move(out));
}

troupe::Task<> PaymentService::Impl::cancel(std::string id, http::Responder out) {
  Result<PaymentStatus> st = co_await shared->payments.ask<PaymentStatus>(
      id, [](troupe::ReplyTo<PaymentStatus> rt) { return Cancel{std::move(rt)}; },
      // A settlement in progress first: the cancel waits for its outcome.
      settings.processing_timeout + 5s);
  if (!st.ok()) {
    out.respond(error_response(st.error()));
    co_return;
  }
  // 200 with "refunded" above 0: the refund is stored with the cancel,
  // and the outbox pays it back (service.cpp). Nothing more to ask for.
  out.respond(http::Response::json(200, status_json(id, *st).dump()));
}

troupe::Task<> PaymentService::Impl::status(std::string id, http::Responder out) {
  Result<PaymentStatus> st = co_await shared->payments.ask<PaymentStatus>(
      id, [](troupe::ReplyTo<PaymentStatus> rt) { return GetStatus{std::move(rt)}; }, 10s);
  if (!st.ok()) {
    out.respond(error_response(st.error()));
  } else if (st->events == 0) {
    out.respond(http::Response::error(404, "not_found", "no payment '" + id + "'"));
  } else {
    out.respond(http::Response::json(200, status_json(id, *st).dump()));
  }
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
    if (settle_now) return troupe::detach(settle(std::move(o), std::move(out)));
    troupe::detach(create(std::move(o), std::move(out)));
  });

  r.add("POST", "/payments/{id}/settle", [this, parse, fields](http::Request& req, http::Responder out) {
    auto j = parse(req, out);
    if (!j) return;
    SettleOrder o;
    if (!fields(*j, o, out)) return;
    o.id = req.params["id"];
    if (o.customer.empty()) return troupe::detach(settle_created(std::move(o), std::move(out)));
    troupe::detach(settle(std::move(o), std::move(out)));
  });

  r.add("POST", "/payments/{id}/cancel", [this](http::Request& req, http::Responder out) {
    troupe::detach(cancel(req.params["id"], std::move(out)));
  });
  r.add("GET", "/payments/{id}", [this](http::Request& req, http::Responder out) {
    troupe::detach(status(req.params["id"], std::move(out)));
  });
  r.add("GET", "/health", [](http::Request&, http::Responder out) {
    out.respond(http::Response::json(200, R"({"status":"ok"})"));
  });
  ReadSide::add_routes(r, read_side.get(), read_side_unavailable);
  return r;
}

}  // namespace payment
