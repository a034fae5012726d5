#pragma once
// The server journal: PostgreSQL through libpq.
//
// Writes go through `writer_connections` lanes, each one thread with its own
// connection; a persistence id (or a fence key) always uses the same lane,
// so one id's operations stay in order, while the lanes' transactions
// overlap and PostgreSQL's own group commit has concurrency to work with.
// A lane takes everything queued on it (up to `max_batch_events`) and sends
// it as one pipeline of prepared statements: the fence check, one multi-row
// INSERT of every appended event, the snapshots and deletions, and one
// Sync, so a group commit is one implicit transaction and one round trip.
// An append that continues the highest seq the lane knows (from its own
// commits, or from the recovery that preceded it) needs no read: the
// primary key (persistence_id, seq) refuses a writer that got there first
// (SPEC E7). When the server refuses a group (a conflict, a fence), its
// operations run again one by one under savepoints after a fresh read, so a
// conflict fails only its own batch with journal_conflict.
//
// Fences (SPEC E9, journal.hpp): an append fenced below its key's stored
// fence is refused, in the same transaction as the insert. Appends take the
// shared advisory lock of their fence keys and raise_fence takes it
// exclusively, so a raise waits for the appends in flight under the old
// fence, and none under the old fence is stored after it. With `owner` set,
// open() takes the owner's next incarnation as the fence "owner|<owner>"
// and appends that carry no fence of their own are fenced with it: a
// second process opened with the same owner refuses the first's writes.
//
// Reads (replay, recover, highest_seq, load_snapshot) run on
// `reader_connections` threads with connections of their own, each one
// prepared statement and one round trip; recoveries that wait for a busy
// reader go together, up to 256 in one round trip. A recovery passes the
// highest seq it saw to the id's lane. Layout and statements: doc/journal.md
// ("PostgreSQL").
//
// The global order (event_query.hpp, SPEC R1): each event row gets the
// appending transaction's id and a sequence value from column defaults, so
// an append sends nothing more; query_events returns only events of
// transactions older than every one still open (doc/journal.md "Global
// order"). After each lane commit that stored events one more connection
// sends NOTIFY on the schema's channel, outside the append's transaction;
// it LISTENs there too and calls this journal's append listeners when
// another journal on the same schema (another process) announces a commit.
//
// A lost connection is re-established with back-off (reconnect_initial_ms,
// doubling up to reconnect_max_ms). A write queued meanwhile waits at most
// `unavailable_timeout_ms` for the server and then fails with
// journal_failed. Nothing is reported as stored unless its transaction
// committed: when a connection breaks with a group commit in flight, the
// lane reconnects and reads one of its rows back to learn whether it
// committed (then it succeeded) or not (then it is sent again, within the
// timeout); only if that cannot be learned does the write fail with
// journal_failed saying the outcome is unknown.
//
// Thread-safe; owned through the shared_ptr open() returns. Callbacks run on
// the journal's threads. Destroying it commits everything already queued,
// runs every callback exactly once, fails later calls with journal_failed and
// joins its threads; it may be destroyed from one of its own callbacks.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "troupe/persist/detail/group_commit_journal.hpp"
#include "troupe/persist/journal.hpp"

namespace troupe {

struct PostgresJournalOptions {
  std::string conninfo;            // libpq connection string ("host=... port=... dbname=...")
  std::string schema = "public";   // schema holding the tables; created if missing
  std::size_t max_batch_events = 16384;  // per transaction and lane (a delete or snapshot counts as one)
  unsigned writer_connections = 1;  // lanes: 1..64 (doc/journal.md says how many)
  unsigned reader_connections = 2;
  // When set, this journal writes as the next incarnation of this owner
  // (usually the node's name): see "Fences" above.
  std::string owner;
  int reconnect_initial_ms = 50;   // first back-off after a failed connection attempt
  int reconnect_max_ms = 2000;     // back-off cap
  int unavailable_timeout_ms = 2000;  // how long a write waits for a lost server before failing
};

class PostgresJournal final : public detail::GroupCommitJournal {
 public:
  // Connects every connection and creates the schema and tables if missing.
  // Errors: journal_failed with the server's or libpq's message (bad
  // connection string, server unreachable, a newer schema version),
  // invalid_argument for unusable options.
  static Result<std::shared_ptr<PostgresJournal>> open(PostgresJournalOptions options);
  ~PostgresJournal() override;

  // The Journal operations: detail/group_commit_journal.hpp.
  std::string_view name() const noexcept override { return "postgres"; }

  // The counters of every group-commit journal, and the reconnects.
  struct Stats : GroupCommitJournal::Stats {
    std::uint64_t reconnects = 0;  // successful connections after the first, all connections
  };
  Stats stats() const;
  // The incarnation open() took as `owner`; 0 without an owner.
  std::uint64_t owner_incarnation() const noexcept;

  class Impl;

 private:
  explicit PostgresJournal(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace troupe
