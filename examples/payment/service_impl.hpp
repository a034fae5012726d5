#pragma once
// What the payment service's two files share (service.cpp wires the
// service, service_routes.cpp serves its HTTP API): one settlement as a
// process of the process manager, and the running service's state.
// Internal to examples/payment.

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "expiry.hpp"
#include "read_side.hpp"
#include "service.hpp"

namespace payment {

using json = nlohmann::json;
namespace http = troupe::http;

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
    std::move(settled).then([done = done_](troupe::Result<PaymentStatus> r) {
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

// The HTTP status an error is answered with: invalid_argument 400; a full
// bound 429; timeouts 504; anything else 503.
int http_status(const troupe::Error& e);
http::Response error_response(const troupe::Error& e);

struct PaymentService::Impl {
  troupe::node::Node* node = nullptr;
  ServiceSettings settings;
  std::shared_ptr<http::Client> gateway_client;
  troupe::ActorRef<GatewayMsg> gateway;
  std::shared_ptr<Shared> shared;
  std::optional<troupe::ProcessManager<SettleProcess>> settlements;
  std::optional<troupe::OutboxDispatcher> refunds;  // runs the refunds stored with PaymentCancelled
  std::unique_ptr<ReadSide> read_side;  // null when it cannot run here:
  std::string read_side_unavailable;    // why
  std::unique_ptr<PaymentExpiry> expiry;  // null when payments do not expire
  std::unique_ptr<http::Server> server;

  std::shared_ptr<troupe::node::Counter> outcomes;
  std::shared_ptr<troupe::node::Histogram> latency;
  std::atomic<std::uint64_t> finished{0};

  void count(const char* outcome, std::chrono::steady_clock::time_point start) {
    outcomes->add({outcome});
    finished.fetch_add(1, std::memory_order_relaxed);
    latency->observe_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  // The routes' coroutines (service_routes.cpp), each answering `out`:
  // one settlement through the process manager, with its outcome; a
  // payment created without settling; the settlement of a created one; a
  // cancel; a status read.
  troupe::Task<> settle(SettleOrder order, http::Responder out);
  troupe::Task<> create(SettleOrder o, http::Responder out);
  troupe::Task<> settle_created(SettleOrder o, http::Responder out);
  troupe::Task<> cancel(std::string id, http::Responder out);
  troupe::Task<> status(std::string id, http::Responder out);

  // The payment API (service_routes.cpp).
  http::Router routes();
};

}  // namespace payment
