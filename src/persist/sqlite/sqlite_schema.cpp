// The file the SQLite journal's writer opens: WAL mode, the durability
// setting, and the schema (created in a new file, migrated from an older
// layout, refused when newer or another application's). The layout is
// documented in doc/journal.md; keep the two in step.

#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "sqlite_support.hpp"
#include "sqlite_writer.hpp"

namespace troupe::sqlite {
namespace {

// PRAGMA user_version of the layout below. A file with a higher number was
// written by a newer troupe: refuse it rather than misread it.
constexpr int kSchemaVersion = 3;
// PRAGMA application_id ("trup"): tells a troupe journal from some other
// application's SQLite file, which open() must not add tables to.
constexpr int kApplicationId = 0x74727570;

// The tables of schema 3 other than `events` (whose layout kEventsTable
// gives, so that the migration from 2 can build it under another name).
constexpr const char* kEventsTable = R"sql(
  ordering       INTEGER PRIMARY KEY,
  persistence_id TEXT    NOT NULL,
  seq            INTEGER NOT NULL,
  timestamp_ms   INTEGER,
  type           TEXT,
  version        INTEGER,
  payload        BLOB,
  trace_id       TEXT,
  tags           TEXT,
  UNIQUE (persistence_id, seq)
)sql";
// Nothing stores or indexes the entity type: a column and an index on it
// cost appends about a third more CPU per event (measured). A query by
// type reads the rowid order and filters on the id instead (kQueryByType).
constexpr const char* kQueryTables = R"sql(
CREATE TABLE event_tags (
  tag      TEXT    NOT NULL,
  ordering INTEGER NOT NULL,
  PRIMARY KEY (tag, ordering)
) WITHOUT ROWID;
CREATE TABLE journal_state (
  key   TEXT    NOT NULL PRIMARY KEY,
  value INTEGER NOT NULL
) WITHOUT ROWID;
)sql";
constexpr const char* kOtherTables = R"sql(
CREATE TABLE deletions (
  persistence_id TEXT    NOT NULL PRIMARY KEY,
  deleted_to     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE snapshots (
  persistence_id TEXT    NOT NULL,
  seq            INTEGER NOT NULL,
  timestamp_ms   INTEGER,
  type           TEXT,
  version        INTEGER,
  payload        BLOB,
  PRIMARY KEY (persistence_id, seq)
) WITHOUT ROWID;
CREATE TABLE fences (
  key   TEXT    NOT NULL PRIMARY KEY,
  fence INTEGER NOT NULL
) WITHOUT ROWID;
PRAGMA application_id = 1953658224;
)sql";
// Schema 1 had no fences.
constexpr const char* kMigrateFrom1 = R"sql(
CREATE TABLE fences (
  key   TEXT    NOT NULL PRIMARY KEY,
  fence INTEGER NOT NULL
) WITHOUT ROWID;
PRAGMA user_version = 2;
)sql";
// Schema 2 kept events in a table whose rowid was implicit (VACUUM may
// renumber such rowids) and without tags. The table is rebuilt with the
// rowid as the declared `ordering` column, so every event keeps its rowid
// as its place in the global order; no event has tags. Run after
// add_trace_column, so trace_id exists.
constexpr const char* kMigrateFrom2Copy = R"sql(
INSERT INTO events_3 (ordering, persistence_id, seq, timestamp_ms, type, version, payload, trace_id)
SELECT rowid, persistence_id, seq, timestamp_ms, type, version, payload, trace_id FROM events;
DROP TABLE events;
ALTER TABLE events_3 RENAME TO events;
)sql";
static_assert(kApplicationId == 1953658224, "kOtherTables spells the application id in decimal");
static_assert(kSchemaVersion == 3, "check_schema and migrate_from_2 spell the version");

// Adds the events' trace_id column (SPEC X4) to a file that lacks it: a new
// one, or one written before the column existed. Older builds still read
// and write such a file (they name their columns).
Result<void> add_trace_column(sqlite3* db, const std::string& path) {
  Stmt s;
  if (auto r = prepare(db, path, "SELECT count(*) FROM pragma_table_info('events') WHERE name = 'trace_id'", s); !r)
    return r;
  ResetOnExit reset(s.get());
  if (sqlite3_step(s.get()) != SQLITE_ROW) return failed(path, "look for the trace_id column", db);
  if (sqlite3_column_int64(s.get(), 0) > 0) return {};
  return exec(db, path, "ALTER TABLE events ADD COLUMN trace_id TEXT", "add the trace_id column");
}

// Schema 2 to 3 (kMigrateFrom2Copy), in the schema check's transaction: a
// failure anywhere leaves the file as it was.
Result<void> migrate_from_2(sqlite3* db, const std::string& path) {
  if (auto r = add_trace_column(db, path); !r) return r;
  const std::string create = std::string("CREATE TABLE events_3 (") + kEventsTable + ");";
  if (auto r = exec(db, path, create.c_str(), "create the events table of schema 3"); !r) return r;
  if (auto r = exec(db, path, kMigrateFrom2Copy, "copy the events into schema 3"); !r) return r;
  if (auto r = exec(db, path, kQueryTables, "create the query tables of schema 3"); !r) return r;
  return exec(db, path, "PRAGMA user_version = 3", "set schema version 3");
}

// Checks the schema under the write lock, creating it in a new file and
// migrating an older layout, so two first opens cannot both create it (the
// lock file already excludes that; this keeps the check honest for files
// touched by other tools).
Result<void> check_schema(sqlite3* db, const std::string& path) {
  if (auto r = exec(db, path, "BEGIN IMMEDIATE", "begin the schema check"); !r) return r;
  auto schema = [&]() -> Result<void> {
    auto pragma_int = [&](const char* sql, std::int64_t& v) -> Result<void> {
      Stmt s;
      if (auto r = prepare(db, path, sql, s); !r) return r;
      ResetOnExit reset(s.get());
      if (sqlite3_step(s.get()) != SQLITE_ROW) return failed(path, std::string("read ") + sql, db);
      v = sqlite3_column_int64(s.get(), 0);
      return {};
    };
    std::int64_t version = 0, app = 0, tables = 0;
    if (auto r = pragma_int("PRAGMA user_version", version); !r) return r;
    if (auto r = pragma_int("PRAGMA application_id", app); !r) return r;
    if (auto r = pragma_int("SELECT count(*) FROM sqlite_schema", tables); !r) return r;
    if (version == 0 && app == 0 && tables == 0) {
      const std::string create = std::string("CREATE TABLE events (") + kEventsTable + ");" + kQueryTables +
                                 kOtherTables + "PRAGMA user_version = 3;";
      return exec(db, path, create.c_str(), "create the tables");
    }
    if (app != kApplicationId)
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) +
                                                  ": the file is an SQLite database of another application "
                                                  "(application_id " + std::to_string(app) + "), not a journal");
    if (version > kSchemaVersion)
      return Error(ErrorCode::journal_failed,
                   "sqlite journal " + quoted(path) + ": schema version " + std::to_string(version) +
                       " is newer than this build understands (" + std::to_string(kSchemaVersion) + ")");
    if (version < 1)
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) + ": unknown schema version " +
                                                  std::to_string(version));
    if (version == 1)
      if (auto r = exec(db, path, kMigrateFrom1, "add the fences table (schema 1 to 2)"); !r) return r;
    if (version <= 2) return migrate_from_2(db, path);
    return {};
  }();
  // A file of any version may lack the column (rows from before it).
  if (schema) schema = add_trace_column(db, path);
  if (!schema) {
    (void)exec(db, path, "ROLLBACK", "roll back the schema check");
    return schema;
  }
  return exec(db, path, "COMMIT", "commit the schema");
}

}  // namespace

Result<void> open_for_writing(Connection& conn, const SqliteJournalOptions& options) {
  const std::string& path = options.path;
  // NOMUTEX: each connection is used by one thread at a time, so SQLite's
  // per-connection mutex would only cost.
  int rc = sqlite3_open_v2(path.c_str(), conn.out(),
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  sqlite3* db = conn.get();
  if (rc != SQLITE_OK) return failed(path, "open for writing", db);
  fine_busy_timeout(db, options.busy_timeout_ms);

  // journal_mode is the first statement that reads the file: a file that is
  // not a database fails here with SQLITE_NOTADB.
  {
    Stmt s;
    if (auto r = prepare(db, path, "PRAGMA journal_mode = WAL", s); !r) return r;
    ResetOnExit reset(s.get());
    if (sqlite3_step(s.get()) != SQLITE_ROW) return failed(path, "switch to WAL mode", db);
    const auto* mode = reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0));
    if (mode == nullptr || std::string_view(mode) != "wal")
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) +
                                                  ": cannot use WAL mode (journal_mode is " +
                                                  (mode != nullptr ? mode : "unknown") + ")");
  }
  const char* sync =
      options.durability == Durability::full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL";
  if (auto r = exec(db, path, sync, "set synchronous"); !r) return r;
  // A commit of N entities' events dirties about one index page per entity;
  // a cache that holds them saves re-reading them on the next commit, and a
  // longer WAL between checkpoints lets one checkpoint write a hot page once
  // for several commits. Numbers measured with 10,000 entities appending.
  if (auto r = exec(db, path, "PRAGMA cache_size = -65536", "set cache_size"); !r) return r;
  if (auto r = exec(db, path, "PRAGMA wal_autocheckpoint = 8192", "set wal_autocheckpoint"); !r) return r;

  return check_schema(db, path);
}

}  // namespace troupe::sqlite
