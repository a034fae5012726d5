#pragma once
// Durable reminders (SPEC R2): named timers kept in a store, so that they
// survive passivation, restarts and moves of whatever set them.
//
// A reminder is keyed by (owner, name). The owner is an opaque string: an
// entity's persistence id "<type>|<id>", an entity id, or any unit's name;
// the name is 1..128 bytes. It falls due at due_ms (wall time, ms since the
// epoch) and, if period_ms > 0, again every period after that. Setting a
// reminder that exists replaces its due time, period and payload (a new
// registration, with a new token).
//
// A ReminderService (reminder_service.hpp) runs the reminders of one store:
// it takes the due ones in pages (take_due), delivers each, and stores what
// became of it (record_fired, record_failed). Taking claims: a taken
// reminder's try time moves to the end of a lease, so several services on
// one store (processes, nodes) each take different reminders, and one that
// stopped without recording leaves its claims to lapse and be taken again
// (at least once). A periodic reminder's next due
// time is the first period boundary after the time it fired, so periods
// missed while nothing ran (an outage) fire once, not once each; a one-shot
// reminder is deleted once it has fired.
//
// Back ends: MemoryReminderStore (this process only), SqliteReminderStore
// (its own table in an SQLite file, possibly a journal's), and
// PostgresReminderStore (its own table in a schema). Layouts in
// doc/reminders.md.
//
// Every store is thread-safe: any member may be called from any thread. The
// calls block for the store's I/O (none for the memory store). Errors are
// values: invalid_argument for a bad owner, name or time; journal_failed
// when the database cannot be read or written; corrupt_record for a stored
// row this code would not have written.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/core/result.hpp"

namespace troupe {

// The longest reminder name, in bytes.
inline constexpr std::size_t kMaxReminderName = 128;

// What a caller asks to be reminded of. Plain value type.
struct ReminderSpec {
  std::string owner;            // non-empty
  std::string name;             // 1..kMaxReminderName bytes
  std::int64_t due_ms = 0;      // first due time, wall ms since the epoch, >= 0
  std::int64_t period_ms = 0;   // 0: one-shot; > 0: repeats every period_ms
  std::string payload;          // the caller's bytes, handed back on delivery
};

// A stored reminder as the store holds it. Plain value type.
struct Reminder {
  std::string owner;
  std::string name;
  std::int64_t due_ms = 0;       // this firing's scheduled time
  std::int64_t period_ms = 0;    // 0: one-shot
  std::string payload;
  std::uint32_t attempts = 0;    // failed tries of this firing
  // When it is taken next: due_ms, later after a failed try, or the end of
  // the claim while a service holds it. take_due returns the try time the
  // reminder was taken at (its claim is in the store only).
  std::int64_t next_try_ms = 0;
  std::string last_error;        // why the last try failed ("" if none did)
  std::uint64_t token = 0;       // this registration: a set() gives a new one

  friend bool operator==(const Reminder&, const Reminder&) = default;
};

// How many reminders are due at a time, and the earliest try time of all.
struct ReminderSummary {
  std::uint64_t due = 0;                    // next_try_ms <= now_ms: not counting claimed ones
  std::optional<std::int64_t> next_try_ms;  // the earliest of all; none when the store is empty
};

// The storage of reminders. See the top of this file for the rules every
// back end keeps; the contract test (reminder_store.test.cpp) runs them all.
// Ownership: held through a shared_ptr by its callers and the service that
// runs it; it owns its connection. Thread safety: every member, any thread.
class ReminderStore {
 public:
  virtual ~ReminderStore() = default;
  virtual std::string_view kind() const noexcept = 0;  // "memory", "sqlite", "postgres"

  // Inserts or replaces (owner, name).
  virtual Result<void> set(const ReminderSpec& spec) = 0;
  // Deletes (owner, name); true if it was there.
  virtual Result<bool> cancel(std::string_view owner, std::string_view name) = 0;
  // The reminders of `owner`, by name.
  virtual Result<std::vector<Reminder>> list(std::string_view owner) = 0;
  // Up to `limit` (> 0) reminders with next_try_ms <= now_ms, the earliest
  // first (ties by owner, then name), claimed for `lease_ms` (> 0): in the
  // same atomic step their next_try_ms becomes now_ms + lease_ms, so no
  // caller takes them again before the lease ends, unless their firing or
  // failure is recorded first. Callers that share a store take disjoint
  // sets while the claims last. A claim that lapses (its holder stopped, or
  // is slower than the lease) makes the reminder due again: taken anew, and
  // the holder's record, if it still comes, still counts (records check
  // token and due_ms, not the claim).
  virtual Result<std::vector<Reminder>> take_due(std::int64_t now_ms, std::size_t limit, std::int64_t lease_ms) = 0;
  // `r` (as taken) was delivered at fired_ms: a periodic one moves to the
  // first period boundary after fired_ms (due_ms + k * period_ms), its
  // attempts and error cleared; a one-shot one is deleted. True if stored;
  // false if the reminder is gone, was set again since it was taken
  // (another token) or was already recorded (another due_ms): then nothing
  // changes.
  virtual Result<bool> record_fired(const Reminder& r, std::int64_t fired_ms) = 0;
  // A try of `r` (as taken) failed: attempts + 1, next_try_ms = retry_ms,
  // last_error = error. True if stored; false as for record_fired.
  virtual Result<bool> record_failed(const Reminder& r, std::int64_t retry_ms, std::string_view error) = 0;
  virtual Result<ReminderSummary> summary(std::int64_t now_ms) = 0;
};

// Reminders in this process's memory: gone with it. For tests and for
// single-process tools.
std::shared_ptr<ReminderStore> make_memory_reminder_store();

struct SqliteReminderOptions {
  // The database file. It may be the SQLite journal's own file (opened by
  // the journal first): the store then adds its table there, on its own
  // connection. Otherwise a new or empty file becomes a reminders-only
  // file; a file of another application is refused (doc/reminders.md).
  std::string path;
  int busy_timeout_ms = 5000;
  // synchronous=FULL (every record survives a power cut) or NORMAL (a
  // power cut may lose the last records; a process crash loses none).
  bool full_sync = true;
};
// Opens (creating if needed) the store in `options.path`.
Result<std::shared_ptr<ReminderStore>> open_sqlite_reminder_store(SqliteReminderOptions options);

struct PostgresReminderOptions {
  std::string conninfo;           // libpq connection string
  std::string schema = "troupe";  // created if missing; the table is <schema>.reminders
};
// Connects and creates the schema and table if missing. One connection,
// shared by the calls in turn (a mutex): each call is one short statement.
// A call that finds the connection broken reconnects once before it runs;
// one that breaks it is journal_failed (the service tries again later).
Result<std::shared_ptr<ReminderStore>> open_postgres_reminder_store(PostgresReminderOptions options);

}  // namespace troupe
