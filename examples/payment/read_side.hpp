#pragma once
// The payment service's read side (doc/payment.md, "Read side"): two
// projections of the payments' events into read models that live in the
// journal's own database (its SQLite file, or its PostgreSQL database and
// schema), each exactly once (troupe::Projection stores its offset in the
// same transaction as its rows):
//
//   payments_by_customer  one row per payment: customer, order, amount,
//                         status, refunded, created/updated times
//                         -> GET /customers/{id}/payments
//   daily_totals          per UTC day: payments settled (count, amount) and
//                         refunds stored (count, amount)
//                         -> GET /totals/daily?from=YYYY-MM-DD&to=YYYY-MM-DD
//
// Slices. Every payment event carries the tag "payment-slice-<k>", k a
// stable hash (FNV-1a, 64 bits) of the payment id modulo [payment]
// read_slices (slice_tag below). Each projection runs once per slice, over
// that tag; all of one payment's events are in one slice, so they are
// applied in their order. The slice count must be the same on every node
// and must not change once events are stored (a payment's later events
// would go to another slice); events stored before tags existed belong to
// no slice and are not in the read models.
//
// In a cluster on PostgreSQL each slice of each projection runs on one node
// (Node::serve_projection: the units of "projections/payments_by_customer"
// and "projections/daily_totals"), and every node reads the one read model.
//
// Ownership: ReadSide::start returns the only owner; it borrows the node,
// which must outlive it, and registers its projections with it (/metrics,
// GET /projections, the dashboard). Destroying it stops them, except the
// slices a cluster placed here: the node runs those until it stops.
// Thread safety: every member is thread-safe; reads run on the caller's
// thread (an indexed query on the read model's reading connection).

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "payment.hpp"
#include "troupe/net/http.hpp"
#include "troupe/node/node.hpp"

namespace payment {

inline constexpr std::uint32_t kDefaultReadSlices = 4;
inline constexpr std::uint32_t kMaxReadSlices = 1024;
inline constexpr std::size_t kMaxCustomerLength = 128;

// "payment-slice-<k>", k = FNV-1a 64 of `payment_id` mod `slices` (>= 1).
std::string slice_tag(std::string_view payment_id, std::uint32_t slices);

// One row of payments_by_customer. Value type.
struct CustomerPayment {
  std::string id;
  std::string order_id;
  std::int64_t amount = 0;
  std::string status;  // as GET /payments/{id} names it: WaitingForRequest, Settling, Completed, Failed, Cancelled
  std::int64_t refunded = 0;
  std::int64_t created_ms = 0;  // the first event's time
  std::int64_t updated_ms = 0;  // the last event's time
};

// One UTC day of daily_totals. Value type.
struct DayTotals {
  std::string day;  // YYYY-MM-DD
  std::int64_t settled_count = 0;
  std::int64_t settled_amount = 0;
  std::int64_t refunded_count = 0;
  std::int64_t refunded_amount = 0;
};

// The UTC day (YYYY-MM-DD) of `ms` since the epoch: the day a daily total
// counts an event under.
std::string utc_day(std::int64_t ms);

// invalid_argument unless `day` is a calendar date written YYYY-MM-DD.
troupe::Result<void> validate_day(std::string_view day);

class ReadSide {
 public:
  // Opens the read model in the journal's database (after the node opened
  // the journal: the SQLite file, or the PostgreSQL database and schema)
  // and starts 2 x `slices` projections: all here, or in a cluster on
  // PostgreSQL each where the cluster places it. Errors: invalid_argument
  // for the memory journal or one that does not answer queries across
  // entities; the read model's or the projections' errors.
  static troupe::Result<std::unique_ptr<ReadSide>> start(troupe::node::Node& node, std::uint32_t slices);
  // The same over any journal that answers queries, with the read models
  // in the SQLite file `model_path` (tests and tools).
  static troupe::Result<std::unique_ptr<ReadSide>> open(troupe::node::Node& node,
                                                        std::shared_ptr<troupe::Journal> journal,
                                                        const std::string& model_path, std::uint32_t slices);
  ~ReadSide();
  ReadSide(const ReadSide&) = delete;
  ReadSide& operator=(const ReadSide&) = delete;

  // The customer's payments, oldest first, at most `limit` (1 to 1000);
  // an unknown customer has none. invalid_argument for a bad customer id
  // (empty, over kMaxCustomerLength bytes, or a control character).
  troupe::Result<std::vector<CustomerPayment>> customer_payments(std::string_view customer, std::size_t limit) const;
  // The days from `from` to `to` (inclusive, at most 366) that have
  // totals, in order. invalid_argument for bad dates or from > to.
  troupe::Result<std::vector<DayTotals>> daily_totals(std::string_view from, std::string_view to) const;
  // The statuses of its projections' slices running on this node (all of
  // them but in a cluster), and the slowest one's lag (ms).
  std::vector<troupe::ProjectionStatus> statuses() const;
  std::int64_t max_lag_ms() const;

  // GET /customers/{id}/payments and GET /totals/daily on `r`, answered
  // from `read_side`, which must outlive the server serving `r`; null: both
  // answer 503 with `unavailable` (why the service runs without it).
  static void add_routes(troupe::http::Router& r, const ReadSide* read_side, std::string unavailable);

  struct Impl;

 private:
  explicit ReadSide(std::unique_ptr<Impl> impl);
  static troupe::Result<void> check(const std::shared_ptr<troupe::Journal>& journal, std::uint32_t slices);
  std::unique_ptr<Impl> impl_;
};

}  // namespace payment
