// Expiring payments created and never settled: the expire_after parser and
// the reminder service beside the journal (expiry.hpp).

#include "expiry.hpp"

#include <charconv>
#include <utility>

namespace payment {

using troupe::Error;
using troupe::ErrorCode;
using troupe::Result;

Result<std::chrono::milliseconds> parse_expire_after(std::string_view text) {
  auto bad = [&](std::string why) {
    return Error(ErrorCode::invalid_argument,
                 "payment.expire_after: \"" + std::string(text) + "\" " + why +
                     " (a whole number and a unit: \"1500ms\", \"90s\", \"30m\", \"2h\", \"1d\"; \"0\": never)");
  };
  std::int64_t n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || n < 0) return bad("does not start with a whole number of 0 or more");
  std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  std::int64_t scale = 0;
  if (unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else if (unit == "d") scale = 86'400'000;
  else if (unit.empty() && n == 0) return std::chrono::milliseconds(0);
  else return bad("has no unit of ms, s, m, h or d");
  if (n > kMaxExpireAfter.count() / scale) return bad("is more than 30 days");
  return std::chrono::milliseconds(n * scale);
}

Result<std::unique_ptr<PaymentExpiry>> PaymentExpiry::open(troupe::node::Node& node, std::chrono::milliseconds after,
                                                           double rate) {
  if (after <= std::chrono::milliseconds::zero()) return std::unique_ptr<PaymentExpiry>();
  if (!(rate > 0)) return Error(ErrorCode::invalid_argument, "payment.expire_rate: must be above 0");
  const auto& j = node.config().journal;
  Result<std::shared_ptr<troupe::ReminderStore>> store = Error(ErrorCode::invalid_argument, "");
  if (j.backend == "sqlite") {
    // The journal's file: the node opened the journal first, so the store
    // adds its table there (doc/reminders.md, "the file rule").
    store = troupe::open_sqlite_reminder_store({.path = node.config().sqlite_path().string()});
  } else if (j.backend == "postgres") {
    // In a cluster every node's service shares this table: each takes
    // (claims) its own reminders, and delivers through the cluster.
    store = troupe::open_postgres_reminder_store({.conninfo = j.postgres, .schema = j.schema});
  } else {
    store = troupe::make_memory_reminder_store();  // gone with the process, like the memory journal
  }
  if (!store.ok()) return Error(store.error().code(), "the payments' reminders: " + store.error().message());
  std::unique_ptr<PaymentExpiry> e(new PaymentExpiry());
  e->node_ = &node;
  e->after_ = after;
  e->rate_ = rate;
  e->store_ = std::move(*store);
  return e;
}

Result<void> PaymentExpiry::run(troupe::node::Entities<Payment> payments) {
  troupe::ReminderSettings rs;
  rs.max_per_second = rate_;
  // An expiry is one append: the ask's timeout leaves room for a recovery.
  rs.attempt_timeout = std::chrono::seconds(10);
  auto svc = troupe::ReminderService::start(node_->system(), store_, rs,
                                            deliver_expiry(std::move(payments), rs.attempt_timeout));
  if (!svc.ok()) return Error(svc.error().code(), "the payments' reminder service: " + svc.error().message());
  service_ = std::make_unique<troupe::ReminderService>(*svc);
  *policy_ = ExpiryPolicy{service_->handle(), after_};
  troupe::ReminderService s = *service_;
  collector_ = node_->metrics().add_collector([s](troupe::node::MetricsWriter& w) {
    auto st = s.stats();
    auto d = [](auto v) { return static_cast<double>(v); };
    w.counter("payment_expiry_delivered_total", "Expire reminders the payments answered.").set({}, d(st.delivered));
    w.counter("payment_expiry_failed_total", "Expire deliveries that failed (each retried after a back-off).")
        .set({}, d(st.failed));
    w.counter("payment_expiry_store_errors_total", "Reminder store calls that failed.").set({}, d(st.store_errors));
    w.gauge("payment_expiry_in_flight", "Expire reminders being delivered now.").set({}, d(st.in_flight));
    w.gauge("payment_expiry_due", "Expire reminders due as of the last page taken.").set({}, d(st.due_now));
    w.gauge("payment_expiry_lag_seconds", "How far behind its due time the oldest due reminder was.")
        .set({}, d(st.oldest_lag_ms) / 1000.0);
  });
  return {};
}

troupe::ReminderStats PaymentExpiry::stats() const { return service_ ? service_->stats() : troupe::ReminderStats{}; }

PaymentExpiry::~PaymentExpiry() {
  if (collector_ != 0) node_->metrics().remove_collector(collector_);
  // The payments' factory holds the policy and the service's deliver holds
  // the payments: dropping the handle breaks that cycle.
  *policy_ = ExpiryPolicy{};
  if (service_) service_->stop();
}

}  // namespace payment
