#pragma once
// The embedded journal: SQLite 3 in WAL mode.
//
// One writer thread owns the only write connection. Appends from every
// entity queue up; the writer takes everything queued (up to
// `max_batch_events`) and commits it in one transaction, so one fsync covers
// many entities' events (group commit), then runs the callbacks. Reads
// (replay, recover, snapshots) run on `reader_threads` threads, each with its
// own read connection, so recovery never waits behind a write batch.
//
// Table layout and encoding: doc/journal.md. The unique index on
// (persistence_id, seq) is what rejects a second writer (SPEC E7).
//
// Queries across entities (event_query.hpp): every event's offset is its
// rowid, given by the writer and never given twice, also after deletions
// and reopening; supports_queries() is true. Listeners hear of this
// journal's own appends only: another process reading the file polls.
//
// A SqliteJournal is used by one process at a time: open() takes an
// exclusive advisory lock on "<path>.lock" and fails if another process holds
// it. Thread-safe; owned through the shared_ptr open() returns. Destroying it
// commits everything already queued, runs every callback, fails later calls
// with journal_failed and joins its threads. It may be destroyed from one of
// its own callbacks: the destructor then returns at once and that thread
// finishes the queue and releases the file as it exits.
//
// Sequence numbers are stored as SQLite INTEGERs: above INT64_MAX an append
// or snapshot is invalid_argument.

#include <cstddef>
#include <memory>
#include <string>

#include "troupe/persist/detail/group_commit_journal.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

// How hard a commit tries to survive a crash.
enum class Durability {
  // fsync on every commit (PRAGMA synchronous=FULL): an acknowledged append
  // survives a process crash and a power loss.
  full,
  // No fsync at commit (synchronous=NORMAL in WAL): survives a process crash
  // (the WAL is in the OS cache), may lose the last commits on power loss.
  process_crash,
};

struct SqliteJournalOptions {
  std::string path;                    // database file; created if missing
  Durability durability = Durability::full;
  std::size_t max_batch_events = 16384;  // per transaction (a delete or snapshot counts as one;
                                         // a larger single batch still goes whole into one)
  unsigned reader_threads = 2;
  int busy_timeout_ms = 5000;
};

class SqliteJournal final : public detail::GroupCommitJournal {
 public:
  // Opens (creating the file and tables if needed). Errors: journal_failed
  // with SQLite's message (unwritable path, not a database, locked by
  // another process), invalid_argument for unusable options.
  static Result<std::shared_ptr<SqliteJournal>> open(SqliteJournalOptions options);

  // The Journal operations and stats(): detail/group_commit_journal.hpp.
  std::string_view name() const noexcept override { return "sqlite"; }

 private:
  explicit SqliteJournal(std::shared_ptr<detail::JournalEngine> engine);
};

}  // namespace troupe
