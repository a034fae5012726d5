// Raw SQLite peer of the journal workloads: `bench_sqlite journal_append_<N>`
// inserts the rows troupe's SqliteJournal stores, with the same batching and
// durability, straight through the SQLite C API — the limit of what a
// journal on SQLite can do on this machine. Prints one JSON line per metric
// (see bench/common/report.hpp and bench/common/journal_append.hpp).
// Unknown workload -> stderr, exit 2.
//
// What it does, and why it is a fair baseline:
//  - the schema, pragmas and connection settings of the journal's write
//    connection (doc/journal.md): the same events table with its primary
//    key on (persistence_id, seq), WAL, synchronous=FULL, the same page
//    cache and checkpoint interval, BEGIN IMMEDIATE;
//  - one writer thread with one connection and one prepared INSERT (plus
//    prepared BEGIN/COMMIT), values bound without copying;
//  - the same group commit the journal does with N entities each keeping one
//    append in flight: every transaction holds one event of each of the N
//    entities (at most kJournalMaxBatchEvents rows; more entities are split
//    over several transactions), and the next transaction starts as soon as
//    the previous commit (and its fsync) returned;
//  - measured like the troupe side (bench::AckMeter): a transaction's events
//    count as acknowledged when its COMMIT returned.

#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/journal_append.hpp"
#include "common/report.hpp"

namespace {

constexpr const char* kSide = "bench_sqlite";

[[noreturn]] void fail_db(sqlite3* db, const char* what) {
  bench::journal_fail(kSide, std::string(what) + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
}

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = std::string(sql) + ": " + (err ? err : "?");
    sqlite3_free(err);
    bench::journal_fail(kSide, msg);
  }
}

sqlite3_stmt* prepare(sqlite3* db, const char* sql) {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, nullptr) != SQLITE_OK)
    fail_db(db, sql);
  return st;
}

void step_done(sqlite3* db, sqlite3_stmt* st, const char* what) {
  if (sqlite3_step(st) != SQLITE_DONE) fail_db(db, what);
  sqlite3_reset(st);
}

// Opens the database the way SqliteJournal opens its write connection
// (doc/journal.md, "Connections and pragmas"; keep the two in step) and
// creates its events table, column for column. The journal's other tables
// (deletions, snapshots) play no part in appending.
sqlite3* open_db(const std::string& path) {
  sqlite3* db = nullptr;
  // One connection used by one thread at a time: no per-connection mutex.
  int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(path.c_str(), &db, flags, nullptr) != SQLITE_OK) fail_db(db, "open");
  sqlite3_busy_timeout(db, 5000);
  exec(db, "PRAGMA journal_mode = WAL");
  exec(db, "PRAGMA synchronous = FULL");  // Durability::full
  exec(db, "PRAGMA cache_size = -65536");
  exec(db, "PRAGMA wal_autocheckpoint = 8192");
  exec(db,
       "CREATE TABLE events ("
       "persistence_id TEXT NOT NULL, seq INTEGER NOT NULL, timestamp_ms INTEGER, type TEXT, "
       "version INTEGER, payload BLOB, PRIMARY KEY (persistence_id, seq))");
  return db;
}

void journal_append(long entities) {
  bench::TempDir dir(kSide);
  const std::string path = (dir.path() / "journal.db").string();
  sqlite3* db = open_db(path);

  const std::vector<std::string> ids = [&] {
    std::vector<std::string> v;
    v.reserve(static_cast<std::size_t>(entities));
    for (long i = 0; i < entities; ++i) v.push_back(bench::journal_persistence_id(i));
    return v;
  }();
  const std::string payload = bench::journal_payload();
  const std::string type = bench::kJournalEventType;

  sqlite3_stmt* begin = prepare(db, "BEGIN IMMEDIATE");
  sqlite3_stmt* commit = prepare(db, "COMMIT");
  sqlite3_stmt* insert = prepare(
      db,
      "INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
  // Bound once: the same for every row (SQLITE_STATIC: the strings outlive
  // the statement, so SQLite does not copy them).
  sqlite3_bind_text(insert, 4, type.data(), static_cast<int>(type.size()), SQLITE_STATIC);
  sqlite3_bind_int(insert, 5, static_cast<int>(bench::kJournalEventVersion));
  sqlite3_bind_blob(insert, 6, payload.data(), static_cast<int>(payload.size()), SQLITE_STATIC);

  bench::AckMeter committed;
  std::atomic<bool> stop{false};

  // Round r appends seq r for every entity; a round is one transaction, or
  // several of at most kJournalMaxBatchEvents rows when N is larger.
  std::thread writer([&] {
    const std::size_t n = ids.size();
    for (std::int64_t seq = 1; !stop.load(std::memory_order_relaxed); ++seq) {
      for (std::size_t first = 0; first < n; first += bench::kJournalMaxBatchEvents) {
        const std::size_t last = std::min(n, first + bench::kJournalMaxBatchEvents);
        step_done(db, begin, "BEGIN");
        for (std::size_t i = first; i < last; ++i) {
          sqlite3_bind_text(insert, 1, ids[i].data(), static_cast<int>(ids[i].size()), SQLITE_STATIC);
          sqlite3_bind_int64(insert, 2, seq);
          sqlite3_bind_int64(insert, 3, bench::wall_clock_ms());
          step_done(db, insert, "INSERT");
        }
        step_done(db, commit, "COMMIT");
        committed.add(last - first);
      }
    }
  });

  const double rate = committed.measure();
  stop = true;
  writer.join();

  sqlite3_finalize(begin);
  sqlite3_finalize(commit);
  sqlite3_finalize(insert);

  // Everything acknowledged must be in the table.
  sqlite3_stmt* count = prepare(db, "SELECT count(*) FROM events");
  if (sqlite3_step(count) != SQLITE_ROW) fail_db(db, "SELECT count(*)");
  const auto rows = static_cast<std::uint64_t>(sqlite3_column_int64(count, 0));
  sqlite3_finalize(count);
  if (rows != committed.count())
    bench::journal_fail(kSide, "committed " + std::to_string(committed.count()) + " events but the table holds " +
                                   std::to_string(rows));
  if (sqlite3_close(db) != SQLITE_OK) fail_db(db, "close");

  const std::string metric = "journal_append_" + std::to_string(entities);
  bench::report(metric.c_str(), rate, "events/s");
}

}  // namespace

int main(int argc, char** argv) {
  return bench::journal_peer_main(argc, argv, kSide, bench::kJournalSqlitePrefix, journal_append);
}
