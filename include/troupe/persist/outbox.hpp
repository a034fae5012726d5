#pragma once
// The outbox: side effects stored with the events that cause them (SPEC A1).
//
// An entity that must tell the outside world about an event (pay a refund
// back, send a mail) cannot do it reliably from its handler: a crash between
// storing the event and sending the message loses the message, and sending
// first sends it for an event that may never be stored. So the journal
// stores the message itself, as an OutboxRecord in the same atomic append as
// the events (journal.hpp: AppendBatch::outbox). Nothing of a batch is stored
// unless all of it is, the fence check of a fenced append covers its records
// as well, and a refused or failed append stores none of them.
//
// A dispatcher (outbox_dispatcher.hpp) then runs the stored records, after
// they are stored, through a handler per kind, and retries them until they
// succeed. Every record carries an idempotency key, unique in the journal,
// which the handler sends along so the receiver can drop duplicates: a
// record may run more than once (a crash after the receiver acted and before
// the record was marked done; a lease that ran out), never zero times.
//
// The records' lifecycle, in the journal:
//   pending ──claim──> claimed (leased to one dispatcher until lease_until)
//      ^                  │ done: removed
//      │  retry (after    │ retry: pending again, from next_attempt_ms
//      └── back-off) ─────┤ failed: kept as failed, not run again, listed
//                         │ lease runs out: claimable by any dispatcher
// Claims use the caller's wall clock (ms since the epoch): dispatchers that
// share a journal should have clocks within a small part of the lease.
//
// Plain value types, no thread-safety concerns of their own.

#include <cstdint>
#include <string>
#include <vector>

namespace troupe {

// One side effect, as appended with the events that cause it.
struct OutboxRecord {
  std::string key;      // idempotency key, unique in the journal ("<persistence id>/<seq>/<n>")
  std::string kind;     // which handler runs it ("refund")
  std::string payload;  // the handler's bytes (any byte, including 0)

  friend bool operator==(const OutboxRecord&, const OutboxRecord&) = default;
};

// A side effect an entity derives from one of its events: an entity
// behaviour may declare
//   std::vector<troupe::SideEffect> side_effects(const Event& e) const;
// and the runtime then stores, with each event it appends, the side effects
// that event calls for, keyed "<persistence id>/<seq>/<n>" (n: 0, 1, ...
// within the event), and a dispatcher runs them. Never called on recovery.
struct SideEffect {
  std::string kind;
  std::string payload;
};

// Where a stored record stands (claimed records are pending with a lease).
enum class OutboxStatus : std::uint8_t { pending = 0, failed = 1 };

// One stored record, as a dispatcher claims it or a reader lists it.
struct OutboxEntry {
  OutboxRecord record;
  std::string persistence_id;     // of the events it was stored with
  std::uint64_t seq = 0;          // the last event of that append
  std::int64_t created_ms = 0;    // when it was appended (the events' timestamp)
  OutboxStatus status = OutboxStatus::pending;
  std::uint32_t attempts = 0;     // claims so far, this one included
  std::int64_t next_attempt_ms = 0;  // not claimed before this (wall ms)
  std::string last_error;         // why the last try failed ("" if none did)

  // The entity id: the persistence id after its "<type>|".
  std::string entity_id() const {
    auto bar = persistence_id.find('|');
    return bar == std::string::npos ? persistence_id : persistence_id.substr(bar + 1);
  }
  friend bool operator==(const OutboxEntry&, const OutboxEntry&) = default;
};

// A dispatcher's request for work: up to `limit` pending records due at
// `now_ms` (next_attempt_ms <= now_ms) whose lease has run out, or that an
// earlier incarnation of the same owner holds (it restarted: its leases
// are void). Each is leased to (owner, incarnation) until now_ms + lease_ms
// and its attempts counted up by one. Oldest first.
struct OutboxClaim {
  std::string owner;             // non-empty: the dispatcher's stable name (the node's id)
  std::uint64_t incarnation = 0; // this run of the owner; differs from every earlier run
  std::int64_t now_ms = 0;
  std::int64_t lease_ms = 0;     // > 0
  std::size_t limit = 0;         // > 0
};

// What became of one claimed record. Applied only while the lease is the
// caller's (owner and incarnation match), else ignored: someone else has it.
struct OutboxSettlement {
  enum class Outcome : std::uint8_t {
    done,    // the record is removed
    retry,   // pending again, claimable from next_attempt_ms
    failed,  // kept as failed with `error`; not run again
  };
  std::string key;
  std::string owner;
  std::uint64_t incarnation = 0;
  Outcome outcome = Outcome::done;
  std::int64_t next_attempt_ms = 0;  // retry
  std::string error;                 // retry, failed
};

// What a reader sees of the outbox: the counts, and up to `limit` entries
// of one status, oldest first.
struct OutboxQuery {
  OutboxStatus status = OutboxStatus::failed;
  std::size_t limit = 0;  // 0: counts only
};
struct OutboxView {
  std::uint64_t pending = 0;  // claimed ones included
  std::uint64_t failed = 0;
  std::vector<OutboxEntry> entries;
};

}  // namespace troupe
