#pragma once
// The payment service: the payment entity (payment.hpp) served by a
// troupe::node::Node behind an HTTP API, settling through a settlement
// gateway that runs as its own HTTP process (gateway_main.cpp).
//
// One settlement goes
//
//   POST /payments ─> process manager ─> keyed lock (customer) ─> payment entity ─> gateway
//                     (bounds how many     (one settlement per      (Settling: a processing
//                      settle at once;      customer at a time,      state with a deadline;
//                      429 past its         in arrival order)        events in the journal)
//                      buffer)
//
// and a cancel of a completed payment is a refund: the entity stores it
// with its PaymentCancelled event (the journal's outbox), and the node's
// outbox dispatcher pays it back through the gateway, retried with back-off,
// with an idempotency key the gateway uses to pay it once.
//
// HTTP API (JSON; doc/payment.md):
//   POST /payments              {"customer","order_id","amount","id"?,"settle"?}  create, and settle unless settle=false
//   POST /payments/{id}/settle  {"customer"?,"order_id"?,"amount"?}               settle a created payment
//   POST /payments/{id}/cancel                                                     cancel, or refund a completed one
//   GET  /payments/{id}
//   GET  /customers/{id}/payments                                                  the read side (read_side.hpp)
//   GET  /totals/daily?from=YYYY-MM-DD&to=YYYY-MM-DD
// A settlement is answered with its outcome (200, "status" Completed or
// Failed with "failure"), 429 when the service is at its bound, 400 for a
// bad request, 503 when stopping.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "gateway.hpp"
#include "payment.hpp"
#include "troupe/node/node.hpp"

namespace payment {

// The [payment] table of the service's config file.
struct ServiceSettings {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;
  std::string gateway_host = "127.0.0.1";
  std::uint16_t gateway_port = 8090;
  std::size_t gateway_connections = 256;
  std::chrono::milliseconds processing_timeout{1500};  // Settling's deadline
  std::size_t max_settlements = 2048;                 // settling at once (process manager)
  std::size_t settle_buffer = 20000;                  // waiting beyond those; then 429
  std::chrono::milliseconds lock_wait{10000};         // a customer's settlements queue this long at most
  std::size_t refund_workers = 8;                    // refunds sent at once
  std::chrono::milliseconds refund_timeout{10000};  // a refund's try without an answer fails
  int io_threads = 1;
  std::uint32_t read_slices = 4;  // the read side's slices (read_side.hpp); fixed once events are stored
  std::chrono::milliseconds expire_after{0};  // a created, unsettled payment expires then (expiry.hpp); 0: never
  double expire_rate = 100;                   // expiries delivered per second at most

  // Reads the [payment] table (absent: the defaults).
  static troupe::Result<ServiceSettings> from(const troupe::node::NodeConfig& config);
};

// The running service. Owns its HTTP server, gateway client, lock and
// process manager; borrows the node, which must outlive it (and runs its
// outbox dispatcher).
// Thread-safe: handlers run on the HTTP io threads and answer from any.
class PaymentService {
 public:
  static troupe::Result<std::unique_ptr<PaymentService>> start(troupe::node::Node& node, ServiceSettings settings);
  ~PaymentService();

  std::uint16_t port() const;
  // Stops taking requests (the HTTP server closes); the node drains after.
  void stop();

  struct Impl;

 private:
  explicit PaymentService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The status document of the API.
nlohmann::json status_json(const std::string& id, const PaymentStatus& s);

}  // namespace payment
