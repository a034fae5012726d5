#pragma once
// Reading the journal across entities (SPEC R1): every event in one global
// order, selected by entity type or by tag, from an offset, in pages, with
// a push when new events are stored.
//
// The global order. Every stored event gets a JournalOffset when its
// append commits; offsets only grow in the order a reader can see them:
//   - memory: an arrival counter (tx 0);
//   - SQLite: the events table's rowid, assigned by the single writer, never
//     reused after deletions (tx 0);
//   - PostgreSQL: (tx, ordering) = (the appending transaction's id, xid8;
//     a sequence value). A query returns only events whose transaction is
//     older than every transaction still running (xid8 below the snapshot's
//     xmin), in (tx, ordering) order. Such a transaction has ended, so no
//     event can later appear with an offset below one already returned: an
//     event committed late under a lower sequence number is never skipped
//     (the gap problem), it is returned after the older ones, and a reader's
//     offset still only grows. doc/journal.md "Global order" has the proof.
// A query's `after` is the last offset the reader processed; it returns the
// events after it, oldest first, at most `limit`. `JournalOffset{}` reads
// from the beginning. Events deleted by delete_up_to are not returned.
//
// Tags. An event may carry tags (EventRecord::tags, set by the entity's
// `tags(event)` member): 1 to 128 bytes each, none of them a control
// character, at most 16 per event; validate_batch refuses others.
// The entity type of an event is its persistence id up to the first '|'.
//
// Live. add_append_listener registers a callback that runs after events were
// stored (a hint with no data: the listener queries). Local appends call it
// once per committed group, right after the commit; PostgreSQL also calls it
// when another process's journal on the same database announces a commit
// (LISTEN/NOTIFY). A listener must be short and must not block: it runs on a
// journal thread. Readers that may miss a hint (another process on SQLite)
// poll as well; Projection (projection.hpp) does both.

#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/result.hpp"

// StreamEvent and EventPage, the answers, are in journal.hpp, next to
// EventRecord; Journal::query_events and add_append_listener are the calls.

namespace troupe {

// A position in the journal's global order. Value type; ordered.
struct JournalOffset {
  std::uint64_t tx = 0;        // PostgreSQL: the appending transaction (xid8); 0 elsewhere
  std::uint64_t ordering = 0;  // the event's number in the order

  friend auto operator<=>(const JournalOffset&, const JournalOffset&) = default;
  friend bool operator==(const JournalOffset&, const JournalOffset&) = default;
  // "tx:ordering", e.g. "0:1742"; parse_offset reads it back.
  std::string to_string() const;
};
// invalid_argument for text that is not "<digits>:<digits>".
Result<JournalOffset> parse_offset(std::string_view text);

// Which events a query reads: those of one entity type, or those with one
// tag. Exactly one of the two is set.
struct EventSelector {
  std::string entity_type{};
  std::string tag{};

  static EventSelector of_type(std::string type) { return {std::move(type), {}}; }
  static EventSelector with_tag(std::string tag) { return {{}, std::move(tag)}; }
  // "type:<name>" or "tag:<name>", for logs, metrics and status.
  std::string to_string() const;
  friend bool operator==(const EventSelector&, const EventSelector&) = default;
};

struct EventQuery {
  EventSelector select;
  JournalOffset after{};     // events strictly after this offset
  std::size_t limit = 1000;  // 1 to max_query_limit
  // PostgreSQL: when the page would be empty while committed events wait
  // behind an older open transaction (anywhere on the server), ask again
  // for up to this long, so a query made right after an append sees it.
  // Zero answers at once: for readers told of appends, which ask again
  // anyway (a projection), and which must not hold a reader meanwhile.
  std::chrono::milliseconds hidden_wait{2000};
};

inline constexpr std::size_t max_tag_length = 128;
inline constexpr std::size_t max_tags_per_event = 16;
inline constexpr std::size_t max_query_limit = 100000;

// The entity type of a persistence id: up to its first '|' (all of it when
// there is none).
std::string_view entity_type_of(std::string_view persistence_id) noexcept;
// Ok, or invalid_argument saying what is wrong: a tag (see "Tags" above);
// a query (exactly one of type and tag, each a valid name; a limit in range).
Result<void> validate_tag(std::string_view tag);
Result<void> validate_query(const EventQuery& query);

}  // namespace troupe
