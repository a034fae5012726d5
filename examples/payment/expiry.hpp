#pragma once
// Expiring payments created and never settled (payment.hpp, "Expiry"): the
// [payment] expire_after setting's parser, the Deliver that hands a fired
// "expire" reminder to its payment, and PaymentExpiry, the reminder service
// the payment service runs beside its journal (doc/payment.md).

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "payment.hpp"
#include "troupe/node/node.hpp"
#include "troupe/persist/reminder_service.hpp"

namespace payment {

// The longest expire_after: 30 days.
inline constexpr std::chrono::milliseconds kMaxExpireAfter{30LL * 24 * 3600 * 1000};

// A duration as a number and a unit: "1500ms", "90s", "30m", "2h", "1d";
// "0" (any unit, or none) means never. invalid_argument, naming
// payment.expire_after, for anything else or for more than 30 days.
troupe::Result<std::chrono::milliseconds> parse_expire_after(std::string_view text);

// A Deliver that asks the payment a reminder names (its owner, "payment|<id>"
// or a bare id) to Expire: the firing is recorded once the payment answered,
// so a crash before it stored its expiry fires it again. `Registry` is an
// EntityRegistry<Payment> or a node's Entities<Payment>.
template <class Registry>
troupe::ReminderDeliver deliver_expiry(Registry payments, troupe::Duration timeout) {
  return [payments, timeout](const troupe::Reminder& r) -> troupe::Future<void> {
    auto done = std::make_shared<troupe::Promise<void>>();
    troupe::Future<void> f = done->future();
    std::string_view id = r.owner;
    if (auto bar = id.find('|'); bar != std::string_view::npos) id.remove_prefix(bar + 1);
    std::int64_t due = r.due_ms;
    payments
        .template ask<PaymentStatus>(
            id, [due](troupe::ReplyTo<PaymentStatus> to) { return Expire{due, std::move(to)}; }, timeout)
        .then([done](troupe::Result<PaymentStatus> answer) {
          if (answer.ok()) return done->set_value();
          done->set_error(std::move(answer).error());
        });
    return f;
  };
}

// The payments' reminder service on one node: a reminder store beside the
// node's journal (the SQLite journal's file, the PostgreSQL journal's
// schema, or memory for a memory journal) and the service that fires the
// "expire" reminders at most `rate` a second. In a cluster on the shared
// PostgreSQL journal every node runs one on the shared table: each firing
// is claimed and delivered by one of them, through the node's
// Entities<Payment>, which routes it to the payment's owner.
// Ownership: owned by the payment service; the service's actor belongs to
// the node's system. Thread safety: policy() and stats are thread-safe;
// open and run are called once each during start-up.
class PaymentExpiry {
 public:
  // Opens the store (after the journal: the node opened it). Errors:
  // invalid_argument for a rate not above 0; the store's errors, prefixed.
  static troupe::Result<std::unique_ptr<PaymentExpiry>> open(troupe::node::Node& node,
                                                             std::chrono::milliseconds after, double rate);
  ~PaymentExpiry();
  PaymentExpiry(const PaymentExpiry&) = delete;
  PaymentExpiry& operator=(const PaymentExpiry&) = delete;

  // What the entity factory gives each payment: empty until run() filled it.
  std::shared_ptr<const ExpiryPolicy> policy() const { return policy_; }
  // Starts the service on `payments` and fills the policy in; reports its
  // stats in the node's /metrics (payment_expiry_*). Call before the
  // payments take commands.
  troupe::Result<void> run(troupe::node::Entities<Payment> payments);
  troupe::ReminderStats stats() const;

 private:
  PaymentExpiry() = default;
  troupe::node::Node* node_ = nullptr;
  std::chrono::milliseconds after_{};
  double rate_ = 0;
  std::shared_ptr<troupe::ReminderStore> store_;
  std::shared_ptr<ExpiryPolicy> policy_ = std::make_shared<ExpiryPolicy>();
  std::unique_ptr<troupe::ReminderService> service_;
  std::uint64_t collector_ = 0;
};

}  // namespace payment
