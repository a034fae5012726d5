#pragma once
// OutboxDispatcher: runs the side effects stored in a journal's outbox
// (outbox.hpp, SPEC A1) until each has succeeded.
//
//   troupe::OutboxSettings s;
//   s.owner = "node-1";  // stable across restarts: a restarted owner takes its leases back at once
//   auto outbox = troupe::OutboxDispatcher::start(system, journal, s, {
//       {"refund", [gateway](const troupe::OutboxEntry& e) {
//          return gateway->refund(e.entity_id(), e.record.payload, /*idempotency key=*/e.record.key);
//        }}});
//
// Every poll_interval (and at once on poke()) the dispatcher claims the due
// records (up to max_in_flight running at once), leased to it for `lease`,
// and calls the handler of each record's kind. A handler returns a
// Future<void>: success marks the record done (removed); an error, an
// exception, no handler for the kind, or no answer within attempt_timeout
// is a failed try, retried after an exponential back-off
// (min_backoff * backoff_factor^(tries - 1), at most max_backoff) until
// max_attempts tries have failed; the record is then kept as failed (it
// stays in the journal, counted and listed by read(), never dropped).
//
// At least once: a record runs again if its outcome was not stored (a
// crash, a lost lease), so handlers send the record's key (OutboxEntry::
// record.key) to the receiver, which drops what it has seen. Records are
// found in the journal at start, so a restart picks up what was pending;
// several dispatchers (one per node) on one shared journal split the
// records between them through the leases.
//
// Ownership: a handle; copies share the dispatcher, an actor of `system`
// that stops with it (or on stop()). The journal is shared. Thread safety:
// every member is thread-safe. Handlers are called on the dispatcher's
// actor thread: they must not block; they complete their future from any
// thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "troupe/core/actor.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/core/future.hpp"
#include "troupe/persist/journal.hpp"
#include "troupe/persist/outbox.hpp"

namespace troupe {

// Runs one try of one record; the future says how it went.
using OutboxHandler = std::function<Future<void>(const OutboxEntry&)>;
// Handlers by record kind.
using OutboxHandlers = std::map<std::string, OutboxHandler, std::less<>>;

struct OutboxSettings {
  // The dispatcher's name in its leases: the node's id. Non-empty.
  std::string owner;
  Duration poll_interval = std::chrono::milliseconds(200);
  std::size_t max_in_flight = 64;
  Duration attempt_timeout = std::chrono::seconds(10);
  // How long a claimed record is this dispatcher's. Longer than
  // attempt_timeout, so a try ends (and is stored) before another
  // dispatcher may take the record.
  Duration lease = std::chrono::seconds(30);
  Duration min_backoff = std::chrono::milliseconds(200);
  Duration max_backoff = std::chrono::seconds(60);
  double backoff_factor = 2.0;
  std::uint32_t max_attempts = 25;
  // How often the journal's counts (pending, failed) are read for stats().
  Duration count_interval = std::chrono::seconds(1);
  // Log failed settlements and claims to stderr.
  bool log = true;
};

// Counters since start, each exact, the set not one snapshot.
struct OutboxStats {
  std::uint64_t claimed = 0;         // records claimed (tries started)
  std::uint64_t sent = 0;            // tries that succeeded: records done
  std::uint64_t retries = 0;         // failed tries that will be tried again
  std::uint64_t failures = 0;        // records given up after max_attempts, kept as failed
  std::uint64_t timeouts = 0;        // tries that ran past attempt_timeout (among retries/failures)
  std::uint64_t journal_errors = 0;  // claims and settlements the journal refused
  std::uint64_t in_flight = 0;       // tries running now
  // As last read from the journal (every count_interval); absent until then.
  std::optional<std::uint64_t> pending;  // stored and not done (in flight included)
  std::optional<std::uint64_t> failed;   // kept as failed
};

namespace detail {
struct OutboxCore;
}

class OutboxDispatcher {
 public:
  // Starts the dispatcher on `journal`. invalid_argument: a journal
  // without an outbox, an empty owner, no handlers or an empty handler,
  // a lease not longer than attempt_timeout, zero intervals or limits;
  // shutting_down: the system no longer spawns.
  static Result<OutboxDispatcher> start(ActorSystem& system, std::shared_ptr<Journal> journal,
                                        OutboxSettings settings, OutboxHandlers handlers);

  OutboxStats stats() const;
  // Looks for due records now instead of at the next poll.
  void poke() const;
  // Stops claiming; the dispatcher actor stops. Tries in flight are not
  // settled: their leases run out and they run again (elsewhere, or here
  // after a restart).
  void stop() const;
  // The journal's counts and entries (read_outbox).
  Future<OutboxView> read(OutboxQuery query) const;
  const OutboxSettings& settings() const;
  // This run's incarnation in its leases.
  std::uint64_t incarnation() const;

 private:
  explicit OutboxDispatcher(std::shared_ptr<detail::OutboxCore> core) : core_(std::move(core)) {}
  std::shared_ptr<detail::OutboxCore> core_;
};

}  // namespace troupe
