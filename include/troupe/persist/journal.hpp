#pragma once
// The event journal: where entities keep their history.
//
// A journal stores, per persistence id ("<entity type>|<entity id>"), an
// append-only log of events numbered 1, 2, 3, ... and the latest snapshots.
// Events are opaque bytes plus a manifest (event type name and version) so
// that the journal never needs the user's types; codecs (codec.hpp) turn
// events into bytes and back.
//
// Guarantees every back end gives (the contract suite in
// src/persist/journal_contract.test.cpp checks them):
//  - an append of a batch for one persistence id is atomic: all its events
//    are stored or none is;
//  - sequence numbers are unique per persistence id: appending a number that
//    is already stored (or was deleted) fails with journal_conflict and
//    stores nothing of that batch. This is what makes a second, stale
//    incarnation of an entity fail (SPEC E7);
//  - a batch must continue the log: its first number is highest + 1 and its
//    numbers are consecutive; anything else is journal_conflict (a gap) or
//    invalid_argument (a batch that is not consecutive);
//  - once `done` reports success the events survive a crash of the process
//    (for back ends configured as durable);
//  - appends for one persistence id complete in the order they were made;
//  - fences (SPEC E9): an append may carry the writer's fence, a key (what
//    the writer owns: a shard such as "payment/17", or a journal owner) and
//    a value (the epoch at which it owns it). raise_fence(key, v) stores v
//    as that key's fence (a fence never goes down). A fenced append whose
//    value is lower than the key's stored fence is refused with
//    journal_conflict naming both values, and stores nothing of its batch.
//    The check is atomic with the insert: once raise_fence(key, v) has
//    reported success, no append fenced below v is stored afterwards, and
//    every append that was stored before it is visible to a recovery that
//    starts after it. This is what makes a stale owner that wakes up after
//    a takeover unable to write (a paused process, a partition), whatever
//    the timing. An append without a fence (value 0) is not checked;
//  - the outbox (outbox.hpp; journals whose stores_outbox() is true): a
//    batch's outbox records are stored with its events, atomically, under
//    the same fence check; their keys are unique in the journal (a key
//    already stored is journal_conflict and stores nothing of the batch).
//
// All operations are asynchronous: `done` runs exactly once, on a journal
// thread or, for back ends that finish at once, on the caller's thread
// before the call returns. Callbacks must be short and must not block (tell
// an actor). Journal objects are thread-safe: any thread may call any
// operation at any time. Owned by the application (usually via
// shared_ptr, shared by the entity registries that use it); it must outlive
// every operation in flight — the destructor finishes or fails what is queued.

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "troupe/core/result.hpp"
#include "troupe/persist/event_query.hpp"
#include "troupe/persist/outbox.hpp"

namespace troupe {

// One stored event.
struct EventRecord {
  std::uint64_t seq = 0;           // 1-based, consecutive per persistence id
  std::int64_t timestamp_ms = 0;   // wall-clock ms since the Unix epoch when it was persisted
  std::string type;                // manifest: the event's registered type name
  std::uint32_t version = 0;       // manifest: the version of that type's encoding
  std::string payload;             // the codec's bytes (may hold any byte, including 0)
  // Metadata: the trace id (32 lowercase hex digits, troupe/core/trace.hpp)
  // of the request that caused the event, SPEC X4; empty for none. Stored
  // and read back as it is; entities fill it from the current trace.
  std::string trace_id{};
  // Tags for queries across entities (event_query.hpp "Tags"); stored and
  // read back as they are, in their order.
  std::vector<std::string> tags{};

  friend bool operator==(const EventRecord&, const EventRecord&) = default;
};

// One event as a query across entities returns it (event_query.hpp).
struct StreamEvent {
  JournalOffset offset;        // its place in the global order
  std::string persistence_id;  // whose event it is
  EventRecord event;           // seq, manifest, payload, trace id, tags

  friend bool operator==(const StreamEvent&, const StreamEvent&) = default;
};

// A query's answer: up to `limit` events after the query's offset, oldest
// first. Fewer than `limit` (possibly none) means the reader has caught up
// with what is visible now.
struct EventPage {
  std::vector<StreamEvent> events;
};

// One stored snapshot: the state after event `seq`.
struct SnapshotRecord {
  std::uint64_t seq = 0;
  std::int64_t timestamp_ms = 0;
  std::string type;
  std::uint32_t version = 0;
  std::string payload;

  friend bool operator==(const SnapshotRecord&, const SnapshotRecord&) = default;
};

// The writer's claim on what it appends: see "fences" above.
struct Fence {
  std::string key;          // what the writer owns ("payment/17", "owner|node-1")
  std::uint64_t value = 0;  // the epoch it owns it at; 0: no fence

  friend bool operator==(const Fence&, const Fence&) = default;
};

// Events to append, atomically, to one persistence id.
struct AppendBatch {
  std::string persistence_id;
  std::vector<EventRecord> events;  // non-empty; seqs consecutive from highest + 1
  Fence fence{};                    // checked when fence.value > 0
  std::vector<OutboxRecord> outbox{};  // side effects stored with the events (outbox.hpp)
};

// What an entity needs to recover: the latest snapshot (if any), the events
// after it (in order), and the highest sequence number ever stored for the
// id (which can exceed the last event's when events were deleted).
struct Recovery {
  std::optional<SnapshotRecord> snapshot;
  std::vector<EventRecord> events;
  std::uint64_t highest_seq = 0;
};

// Counters a journal reports for metrics (monotonic since it was opened).
// A journal leaves absent what it does not count: one that does not commit
// in transactions reports no transactions.
struct JournalStats {
  std::optional<std::uint64_t> transactions;    // write transactions committed (group commits)
  std::optional<std::uint64_t> events_written;  // events those transactions stored
};

// The interface every back end implements. See the file comment for the
// guarantees and threading rules.
class Journal {
 public:
  template <class T>
  using Callback = std::function<void(Result<T>)>;

  virtual ~Journal() = default;

  // Appends `batch` atomically; see the guarantees above.
  virtual void append(AppendBatch batch, Callback<void> done) = 0;

  // Events of `persistence_id` with from_seq <= seq <= to_seq, in order.
  // A stored row that cannot be read back intact is corrupt_record (the
  // message names the persistence id and the sequence number).
  virtual void replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
                      Callback<std::vector<EventRecord>> done) = 0;

  // The highest sequence number ever stored for the id (0 for none), deleted
  // events included.
  virtual void highest_seq(std::string persistence_id, Callback<std::uint64_t> done) = 0;

  // Deletes the events with seq <= `to_seq`. The highest sequence number is
  // kept: deleted numbers are never reused.
  virtual void delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) = 0;

  // Stores a snapshot; later loads return the one with the highest seq.
  virtual void save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) = 0;

  virtual void load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) = 0;

  // Latest snapshot + the events after it + the highest sequence number, in
  // one call. The default composes the three reads above; back ends may do
  // it in one round trip.
  virtual void recover(std::string persistence_id, Callback<Recovery> done);

  // Raises the stored fence of `key` to `value` (see "fences" above).
  // journal_conflict, changing nothing, when the stored fence is higher;
  // invalid_argument for an empty key or a value of 0. Raising to the value
  // already stored succeeds.
  virtual void raise_fence(std::string key, std::uint64_t value, Callback<void> done) = 0;

  // The highest fence stored under any key (0 for none). A cluster whose
  // epochs start over (Redis lost its data) draws new ones above it, so no
  // new owner is locked out by an old fence.
  virtual void highest_fence(Callback<std::uint64_t> done) = 0;

  // A short name for logs and metrics ("memory", "sqlite").
  virtual std::string_view name() const noexcept = 0;

  // The journal's counters, as they are now. Any thread. A decorator
  // reports the counters of the journal it wraps.
  virtual JournalStats journal_stats() const = 0;

  // The outbox (outbox.hpp). A journal that keeps one says so here and
  // stores AppendBatch::outbox; one that does not must not be given records
  // (the entity runtime refuses to start such a registry). The defaults
  // answer invalid_argument: no outbox.
  virtual bool stores_outbox() const noexcept { return false; }
  // Leases due records to the caller (see OutboxClaim).
  virtual void claim_outbox(OutboxClaim claim, Callback<std::vector<OutboxEntry>> done);
  // Records what became of a claimed record (see OutboxSettlement).
  virtual void settle_outbox(OutboxSettlement settlement, Callback<void> done);
  // Counts and lists the stored records (see OutboxQuery).
  virtual void read_outbox(OutboxQuery query, Callback<OutboxView> done);

  // Queries across entities (event_query.hpp). A journal that keeps the
  // global order says so here; the default query_events answers
  // invalid_argument: no queries.
  virtual bool supports_queries() const noexcept { return false; }
  // The events `query` selects after its offset, in the global order. A
  // query that breaks validate_query is invalid_argument; a stored event
  // that cannot be read back intact is corrupt_record.
  virtual void query_events(EventQuery query, Callback<EventPage> done);
  // Registers `listener`, called after events were stored (event_query.hpp
  // "Live"); returns the id that removes it, or 0 when this journal never
  // calls listeners (its readers poll). After remove_append_listener(id)
  // returns, the listener is not running and is not called again; never
  // call it from inside a listener.
  virtual std::uint64_t add_append_listener(std::function<void()> listener);
  virtual void remove_append_listener(std::uint64_t id);
};

// Blocking forms of the operations, for tools, tests and benchmarks. Never
// call them from an actor's handler: they wait for a journal thread.
namespace journal_sync {

template <class T, class Op>
Result<T> wait_for(Op&& op) {
  std::promise<Result<T>> p;
  auto f = p.get_future();
  op([&p](Result<T> r) { p.set_value(std::move(r)); });
  return f.get();
}

inline Result<void> append(Journal& j, AppendBatch b) {
  return wait_for<void>([&](auto cb) { j.append(std::move(b), std::move(cb)); });
}
inline Result<std::vector<EventRecord>> replay(Journal& j, std::string id, std::uint64_t from = 1,
                                               std::uint64_t to = UINT64_MAX) {
  return wait_for<std::vector<EventRecord>>(
      [&](auto cb) { j.replay(std::move(id), from, to, std::move(cb)); });
}
inline Result<std::uint64_t> highest_seq(Journal& j, std::string id) {
  return wait_for<std::uint64_t>([&](auto cb) { j.highest_seq(std::move(id), std::move(cb)); });
}
inline Result<void> delete_up_to(Journal& j, std::string id, std::uint64_t to) {
  return wait_for<void>([&](auto cb) { j.delete_up_to(std::move(id), to, std::move(cb)); });
}
inline Result<void> save_snapshot(Journal& j, std::string id, SnapshotRecord s) {
  return wait_for<void>([&](auto cb) { j.save_snapshot(std::move(id), std::move(s), std::move(cb)); });
}
inline Result<std::optional<SnapshotRecord>> load_snapshot(Journal& j, std::string id) {
  return wait_for<std::optional<SnapshotRecord>>(
      [&](auto cb) { j.load_snapshot(std::move(id), std::move(cb)); });
}
inline Result<void> raise_fence(Journal& j, std::string key, std::uint64_t value) {
  return wait_for<void>([&](auto cb) { j.raise_fence(std::move(key), value, std::move(cb)); });
}
inline Result<std::uint64_t> highest_fence(Journal& j) {
  return wait_for<std::uint64_t>([&](auto cb) { j.highest_fence(std::move(cb)); });
}
inline Result<Recovery> recover(Journal& j, std::string id) {
  return wait_for<Recovery>([&](auto cb) { j.recover(std::move(id), std::move(cb)); });
}
inline Result<std::vector<OutboxEntry>> claim_outbox(Journal& j, OutboxClaim c) {
  return wait_for<std::vector<OutboxEntry>>([&](auto cb) { j.claim_outbox(std::move(c), std::move(cb)); });
}
inline Result<void> settle_outbox(Journal& j, OutboxSettlement s) {
  return wait_for<void>([&](auto cb) { j.settle_outbox(std::move(s), std::move(cb)); });
}
inline Result<OutboxView> read_outbox(Journal& j, OutboxQuery q) {
  return wait_for<OutboxView>([&](auto cb) { j.read_outbox(q, std::move(cb)); });
}
inline Result<EventPage> query_events(Journal& j, EventQuery q) {
  return wait_for<EventPage>([&](auto cb) { j.query_events(std::move(q), std::move(cb)); });
}

}  // namespace journal_sync

// Checks a batch against the rules every back end enforces before it
// touches storage: non-empty id, at least one event, consecutive seqs
// starting at >= 1, tags that pass validate_tag (at most
// max_tags_per_event per event). Back ends call it; exposed for their tests.
Result<void> validate_batch(const AppendBatch& batch);
// Checks a claim and a settlement the same way (invalid_argument).
Result<void> validate_claim(const OutboxClaim& claim);
Result<void> validate_settlement(const OutboxSettlement& settlement);
// Checks raise_fence's arguments the same way.
Result<void> validate_fence(const std::string& key, std::uint64_t value);
// The journal_conflict of an append refused by its fence.
Error fence_refused(const AppendBatch& batch, std::uint64_t stored);
// The journal_conflict of a raise_fence below the stored fence.
Error fence_lowered(const std::string& key, std::uint64_t value, std::uint64_t stored);

}  // namespace troupe
