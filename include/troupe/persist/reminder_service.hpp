#pragma once
// ReminderService: delivers the reminders of one store (reminders.hpp,
// SPEC R2) when they fall due, at a bounded rate, until each delivery has
// succeeded.
//
//   auto store = troupe::open_sqlite_reminder_store({.path = "node.db"});
//   troupe::ReminderSettings s;
//   s.max_per_second = 500;
//   auto service = troupe::ReminderService::start(system, *store, s,
//       troupe::deliver_to_entities(payments, [](const troupe::Reminder& r) {
//         return PaymentCommand{Expire{r.name}};
//       }));
//   troupe::Reminders reminders = service->handle();  // give it to the entities
//
// The service is an actor of `system`. It wakes at the earliest due time
// (read through the system's Clock: the manual clock in tests), and at
// least every poll_interval (reminders set by another process in a shared
// store). It takes the due reminders in pages of page_size, oldest first,
// and holds no more than one page in memory however many are due. Each
// reminder is handed to the Deliver function, at most max_per_second of
// them per second (a token bucket of `burst`), at most max_in_flight at
// once. A delivery whose future succeeds is recorded as fired (a periodic
// reminder moves to its next period boundary after now: periods missed
// during an outage fire once; a one-shot one is deleted). One whose future
// fails, throws, or does not answer within attempt_timeout is recorded as a
// failed try and taken again after a back-off (min_backoff *
// backoff_factor^(tries - 1), at most max_backoff), however many times it
// takes: a reminder is never dropped and never skipped.
//
// At least once: the record follows the delivery, so a crash between the
// two (or a store error on the record) delivers the reminder again once its
// claim lapses (`lease` after it was taken); handlers should be idempotent
// (the reminder's owner, name and due_ms identify a firing). Without a
// crash, each firing is delivered once.
//
// Several services may share one store (one per process or node of a
// cluster): a page taken is claimed for `lease` (ReminderStore::take_due),
// so the others take other reminders, and each firing is delivered by one
// of them. A service starts a delivery only while its claim has at least
// attempt_timeout left; a reminder whose claim runs short in the queue
// (a slow rate, a long page) is let go and taken again after the lease.
//
// Ownership: a handle; copies share the service, an actor of `system` that
// stops with it (or on stop()). The store is shared with the caller.
// Thread safety: every member is thread-safe. The Deliver function is
// called on the service's actor thread and must not block; it completes its
// future from any thread. Store calls run on that thread too (they block
// for the store's I/O).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "troupe/core/actor_system.hpp"
#include "troupe/core/future.hpp"
#include "troupe/persist/entity.hpp"
#include "troupe/persist/reminders.hpp"

namespace troupe {

// Delivers one firing of a reminder; the future says how it went.
using ReminderDeliver = std::function<Future<void>(const Reminder&)>;

struct ReminderSettings {
  double max_per_second = 1000;  // > 0
  // Deliveries allowed at once after a quiet time; 0: max_per_second / 10
  // (at least 1). The bucket refills at max_per_second.
  std::size_t burst = 0;
  std::size_t page_size = 1000;   // reminders taken from the store at a time (the memory bound)
  std::size_t max_in_flight = 64;
  Duration poll_interval = std::chrono::seconds(1);
  Duration attempt_timeout = std::chrono::seconds(10);
  // How long a taken page stays claimed in the store: another service on
  // the store does not take it before, and a firing this service took and
  // never recorded (it stopped, or crashed) is delivered again after it.
  // Must be above attempt_timeout.
  Duration lease = std::chrono::seconds(60);
  Duration min_backoff = std::chrono::milliseconds(500);
  Duration max_backoff = std::chrono::seconds(60);
  double backoff_factor = 2.0;
  // Log store errors and failed deliveries (the first of each kind in a
  // row) to stderr.
  bool log = true;
};

// Counters since start, each exact, the set not one snapshot.
struct ReminderStats {
  std::uint64_t delivered = 0;     // deliveries that succeeded
  std::uint64_t failed = 0;        // tries that failed (each taken again after a back-off)
  std::uint64_t retried = 0;       // tries of a firing that had failed before
  std::uint64_t timeouts = 0;      // tries past attempt_timeout (among failed)
  std::uint64_t store_errors = 0;  // store calls that failed
  std::uint64_t stale = 0;         // records ignored: set again or cancelled while delivered
  std::uint64_t lapsed = 0;        // taken, then let go unstarted: too little of the claim left
  std::uint64_t in_flight = 0;
  std::uint64_t held = 0;          // reminders in memory now (the page being delivered)
  std::uint64_t max_held = 0;      // the most ever held at once
  // As of the last page taken: reminders due then, and how far behind the
  // earliest of them was (now - its try time), in ms.
  std::uint64_t due_now = 0;
  std::int64_t oldest_lag_ms = 0;
};

namespace detail {
struct ReminderCore;
}

// What an entity (or anything else) holds to set and cancel reminders:
// non-blocking, thread-safe, cheap to copy. The futures complete once the
// store has (or has not) taken the change; an entity may ignore them (the
// change is stored shortly) or await them in a coroutine handler.
class Reminders {
 public:
  Reminders() = default;
  Future<void> set(ReminderSpec spec) const;
  // Due at `due`, then every `period` if it is above zero.
  Future<void> set(std::string owner, std::string name, WallTime due, Duration period = Duration::zero(),
                   std::string payload = {}) const;
  Future<bool> cancel(std::string owner, std::string name) const;
  explicit operator bool() const noexcept { return static_cast<bool>(core_); }

 private:
  friend class ReminderService;
  explicit Reminders(std::shared_ptr<detail::ReminderCore> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::ReminderCore> core_;
};

// The service of one store (see the top of this file). A handle: copies
// share one actor of the system; every member is thread-safe.
class ReminderService {
 public:
  // invalid_argument: no store or no deliver function, a rate, burst,
  // page or in-flight limit of zero, bad back-off, a lease not above
  // attempt_timeout; shutting_down: the
  // system no longer spawns.
  static Result<ReminderService> start(ActorSystem& system, std::shared_ptr<ReminderStore> store,
                                       ReminderSettings settings, ReminderDeliver deliver);

  ReminderStats stats() const;
  Reminders handle() const { return Reminders(core_); }
  // Looks at the store now instead of at the next wake.
  void poke() const;
  // Stops the actor. Deliveries in flight are not recorded: they are
  // delivered again, by any service on the store, once their claim lapses.
  void stop() const;
  const ReminderSettings& settings() const;
  ReminderStore& store() const;

 private:
  explicit ReminderService(std::shared_ptr<detail::ReminderCore> c) : core_(std::move(c)) {}
  std::shared_ptr<detail::ReminderCore> core_;
};

// A Deliver that tells the reminder's entity of `registry` the command
// make(reminder) builds, activating (recovering) it if it is passivated.
// The owner is the entity id, or its persistence id "<type>|<id>" with this
// registry's type. A delivery succeeds once the registry took the command:
// a crash after the firing was recorded and before the entity handled the
// command loses that firing (use ask_entities where that matters).
template <class B, class Make>
ReminderDeliver deliver_to_entities(EntityRegistry<B> registry, Make make) {
  return [registry, make = std::move(make)](const Reminder& r) -> Future<void> {
    Promise<void> p;
    Future<void> f = p.future();
    std::string_view id = r.owner;
    const std::string& type = registry.settings().type_name;
    if (id.size() > type.size() && id.substr(0, type.size()) == type && id[type.size()] == '|')
      id.remove_prefix(type.size() + 1);
    p.set_result(registry.tell(id, typename B::Command(make(r))));
    return f;
  };
}

// A Deliver that asks the reminder's entity (owner as for
// deliver_to_entities) with the command make(reminder, ReplyTo<R>) builds:
// the delivery succeeds when the entity answers (any value), fails on an
// error answer or none within `timeout`. The firing is then recorded only
// after the entity handled the command (stored its events), so a crash
// anywhere delivers it again rather than losing it.
template <class R, class B, class Make>
ReminderDeliver ask_entities(EntityRegistry<B> registry, Make make, Duration timeout) {
  return [registry, make = std::move(make), timeout](const Reminder& r) -> Future<void> {
    auto p = std::make_shared<Promise<void>>();
    Future<void> f = p->future();
    std::string_view id = r.owner;
    const std::string& type = registry.settings().type_name;
    if (id.size() > type.size() && id.substr(0, type.size()) == type && id[type.size()] == '|')
      id.remove_prefix(type.size() + 1);
    registry.template ask<R>(id, [&](ReplyTo<R> to) { return make(r, std::move(to)); }, timeout)
        .then([p](Result<R> answer) {
          if (answer) {
            p->set_value();
          } else {
            p->set_error(std::move(answer).error());
          }
        });
    return f;
  };
}

// A Deliver that passes each reminder to the Deliver of its owner's type
// (the owner's "<type>|" prefix), for a store shared by several entity
// types. An owner without a known type fails its delivery (invalid_argument),
// so it is retried, logged and counted, never dropped.
ReminderDeliver route_by_type(std::map<std::string, ReminderDeliver, std::less<>> by_type);

}  // namespace troupe
