#pragma once
// The server journal: PostgreSQL through libpq.
//
// One writer thread owns the only write connection. Appends, deletions and
// snapshot saves from every entity queue up; the writer takes everything
// queued (up to `max_batch_events`) and commits it in one transaction, each
// operation under its own SAVEPOINT, so one commit covers many entities'
// events (group commit) and a primary-key violation (SQLSTATE 23505) fails
// only its own batch with journal_conflict. Reads (replay, recover,
// highest_seq, load_snapshot) run on `reader_connections` threads, each with
// its own connection, so recovery never waits behind a write transaction.
//
// Table layout, encoding, group commit and reconnect rules: doc/journal.md
// ("PostgreSQL"). The primary key (persistence_id, seq) is what rejects a
// second writer (SPEC E7). The writer caches each id's highest sequence
// number and reads it again before refusing an append, so several journals
// (nodes) may write one schema, each id from one of them at a time.
//
// A lost connection is re-established with back-off (reconnect_initial_ms,
// doubling up to reconnect_max_ms). A write queued meanwhile waits at most
// `unavailable_timeout_ms` for the server and then fails with
// journal_failed; nothing is reported as stored unless its COMMIT
// succeeded, and a write whose COMMIT outcome is unknown (the connection
// broke during COMMIT) fails with journal_failed saying so.
//
// Thread-safe; owned through the shared_ptr open() returns. Callbacks run on
// the journal's threads. Destroying it commits everything already queued,
// runs every callback exactly once, fails later calls with journal_failed and
// joins its threads; it may be destroyed from one of its own callbacks.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "troupe/persist/journal.hpp"

namespace troupe {

struct PostgresJournalOptions {
  std::string conninfo;            // libpq connection string ("host=... port=... dbname=...")
  std::string schema = "public";   // schema holding the tables; created if missing
  std::size_t max_batch_events = 16384;  // per transaction (a delete or snapshot counts as one)
  unsigned reader_connections = 2;
  int reconnect_initial_ms = 50;   // first back-off after a failed connection attempt
  int reconnect_max_ms = 2000;     // back-off cap
  int unavailable_timeout_ms = 2000;  // how long a write waits for a lost server before failing
};

class PostgresJournal final : public Journal {
 public:
  // Connects every connection and creates the schema and tables if missing.
  // Errors: journal_failed with the server's or libpq's message (bad
  // connection string, server unreachable, a newer schema version),
  // invalid_argument for unusable options.
  static Result<std::shared_ptr<PostgresJournal>> open(PostgresJournalOptions options);

  ~PostgresJournal() override;
  PostgresJournal(const PostgresJournal&) = delete;
  PostgresJournal& operator=(const PostgresJournal&) = delete;

  void append(AppendBatch batch, Callback<void> done) override;
  void replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
              Callback<std::vector<EventRecord>> done) override;
  void highest_seq(std::string persistence_id, Callback<std::uint64_t> done) override;
  void delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) override;
  void save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) override;
  void load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) override;
  void recover(std::string persistence_id, Callback<Recovery> done) override;
  std::string_view name() const noexcept override { return "postgres"; }

  // Counters for metrics and tests (monotonic, thread-safe).
  struct Stats {
    std::uint64_t transactions = 0;  // write transactions committed
    std::uint64_t events_written = 0;
    std::uint64_t append_failures = 0;
    std::uint64_t reconnects = 0;    // successful connections after the first, all connections
  };
  Stats stats() const;

  class Impl;

 private:
  explicit PostgresJournal(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
