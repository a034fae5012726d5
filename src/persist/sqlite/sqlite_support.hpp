#pragma once
// What the SQLite journal's writer and readers share: the statements they
// prepare, RAII handles for connections and statements, running and binding
// statements, error messages, and the lock file that keeps a second process
// out. Internal to src/persist/sqlite; the layout is documented in
// doc/journal.md.

#include <sqlite3.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "troupe/persist/journal.hpp"

namespace troupe::sqlite {

// SQLite's INTEGER is a signed 64-bit number; sequence numbers above this
// cannot be stored.
constexpr std::uint64_t kMaxSeq = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
// Bound on the writer's highest-seq cache; past it the cache starts over
// (entries are reloaded from the database on next use).
constexpr std::size_t kMaxCachedIds = std::size_t{1} << 20;

// The writer assigns `ordering` (the rowid) itself: see Writer::next_ordering_.
inline constexpr const char* kInsertEvent =
    "INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload, trace_id, ordering, tags) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
// OR IGNORE: an event may name a tag twice; it is found once.
inline constexpr const char* kInsertTag = "INSERT OR IGNORE INTO event_tags (tag, ordering) VALUES (?1, ?2)";
inline constexpr const char* kSelectDeletedTags =
    "SELECT ordering, tags FROM events WHERE persistence_id = ?1 AND seq <= ?2 AND tags IS NOT NULL";
inline constexpr const char* kDeleteTag = "DELETE FROM event_tags WHERE tag = ?1 AND ordering = ?2";
// The highest ordering ever given, kept where delete_up_to might remove the
// event that holds it.
inline constexpr const char* kSelectOrderingHigh =
    "SELECT max(coalesce((SELECT max(ordering) FROM events), 0), "
    "coalesce((SELECT value FROM journal_state WHERE key = 'ordering_high'), 0))";
inline constexpr const char* kRaiseOrderingHigh =
    "INSERT INTO journal_state (key, value) VALUES ('ordering_high', ?1) "
    "ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)";
// Both halves of "highest": the largest stored seq and the deletion mark.
// One statement, so one consistent read even outside a transaction.
inline constexpr const char* kSelectHighest =
    "SELECT (SELECT max(seq) FROM events WHERE persistence_id = ?1), "
    "(SELECT deleted_to FROM deletions WHERE persistence_id = ?1)";
inline constexpr const char* kDeleteEvents = "DELETE FROM events WHERE persistence_id = ?1 AND seq <= ?2";
inline constexpr const char* kUpsertDeletion =
    "INSERT INTO deletions (persistence_id, deleted_to) VALUES (?1, ?2) "
    "ON CONFLICT (persistence_id) DO UPDATE SET deleted_to = max(deleted_to, excluded.deleted_to)";
inline constexpr const char* kInsertSnapshot =
    "INSERT OR REPLACE INTO snapshots (persistence_id, seq, timestamp_ms, type, version, payload) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
inline constexpr const char* kPruneSnapshots =
    "DELETE FROM snapshots WHERE persistence_id = ?1 AND "
    "seq < (SELECT max(seq) FROM snapshots WHERE persistence_id = ?1)";
inline constexpr const char* kSelectFence = "SELECT fence FROM fences WHERE key = ?1";
inline constexpr const char* kUpsertFence =
    "INSERT INTO fences (key, fence) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET fence = excluded.fence";
inline constexpr const char* kSelectHighestFence = "SELECT coalesce(max(fence), 0) FROM fences";
inline constexpr const char* kSelectEvents =
    "SELECT seq, timestamp_ms, type, version, payload, trace_id, tags FROM events "
    "WHERE persistence_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq";
// Queries (event_query.hpp): the replay columns, then ordering and id. By
// type: the rowid (the global order) from the offset on, keeping the ids
// equal to the type (?1) or starting with "<type>|": those from ?4 =
// "<type>|" up to ?5 = "<type>}" ('}' follows '|'; a type holds no '|').
// The unary plus keeps SQLite from reading the (persistence_id, seq) index
// instead, which would need a sort. Rows of other types are read and
// skipped: a rare type in a large journal reads much (doc/journal.md). By
// tag: event_tags' key (tag, ordering), then each event by its rowid;
// CROSS JOIN keeps that nesting.
inline constexpr const char* kQueryByType =
    "SELECT seq, timestamp_ms, type, version, payload, trace_id, tags, ordering, persistence_id FROM events "
    "WHERE ordering > ?2 AND ((+persistence_id >= ?4 AND +persistence_id < ?5) OR +persistence_id = ?1) "
    "ORDER BY ordering LIMIT ?3";
inline constexpr const char* kQueryByTag =
    "SELECT e.seq, e.timestamp_ms, e.type, e.version, e.payload, e.trace_id, e.tags, e.ordering, "
    "e.persistence_id FROM event_tags t CROSS JOIN events e ON e.ordering = t.ordering "
    "WHERE t.tag = ?1 AND t.ordering > ?2 ORDER BY t.ordering LIMIT ?3";

// Tags are stored in events.tags joined by this byte (NULL for none); a tag
// holds no control character (validate_tag), so it cannot hold this one.
inline constexpr char kTagSeparator = '\n';
std::string join_tags(const std::vector<std::string>& tags);
inline constexpr const char* kSelectSnapshot =
    "SELECT seq, timestamp_ms, type, version, payload FROM snapshots "
    "WHERE persistence_id = ?1 ORDER BY seq DESC LIMIT 1";

// --- RAII handles ---------------------------------------------------------------

// A prepared statement, finalized on destruction.
class Stmt {
 public:
  Stmt() = default;
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  sqlite3_stmt* get() const noexcept { return s_; }
  sqlite3_stmt** out() noexcept { return &s_; }

 private:
  sqlite3_stmt* s_ = nullptr;
};

// Resets a statement when the scope ends, so no statement stays active (an
// active statement keeps its read transaction, and its snapshot, open).
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* s) : s_(s) {}
  ~ResetOnExit() { sqlite3_reset(s_); }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* s_;
};

// A connection, closed on destruction (after its statements, which are
// declared after it and so destroyed first; close_v2 copes either way).
class Connection {
 public:
  Connection() = default;
  ~Connection() { sqlite3_close_v2(db_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  sqlite3* get() const noexcept { return db_; }
  sqlite3** out() noexcept { return &db_; }

 private:
  sqlite3* db_ = nullptr;
};

// Waits for SQLite's write lock up to `timeout_ms` in short steps (0.1 ms,
// then 0.5 ms, then 2 ms) instead of sqlite3_busy_timeout's, which sleep
// up to 100 ms at a time: two writers of one file (the journal and a read
// model in it) hand the lock over within a fraction of a millisecond.
void fine_busy_timeout(sqlite3* db, int timeout_ms);

// The turns of this process's writers of one database file (the journal's
// writer, a read model in the journal's file): taken before BEGIN
// IMMEDIATE, given back after COMMIT or ROLLBACK, first come first served.
// SQLite's own lock is not fair: a writer that waits for it polls (the busy
// handler) while another commits again and again. Writers of other
// processes still meet on SQLite's lock. Thread-safe; shared by whoever
// writes the file (write_turns), which holds it through a shared_ptr.
class WriteTurns {
 public:
  // Waits for this caller's turn.
  void take();
  void give_back();

  // RAII: a turn for the scope.
  class Turn {
   public:
    explicit Turn(WriteTurns* t) : t_(t) {
      if (t_ != nullptr) t_->take();
    }
    ~Turn() {
      if (t_ != nullptr) t_->give_back();
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    WriteTurns* t_;
  };

 private:
  std::mutex mu_;
  std::condition_variable next_;
  std::uint64_t issued_ = 0;   // tickets handed out; guarded by mu_
  std::uint64_t serving_ = 0;  // the ticket whose turn it is; guarded by mu_
};

// The turns of the file at `path` (by its canonical path when it exists):
// one object per file in this process while anyone holds it.
std::shared_ptr<WriteTurns> write_turns(const std::string& path);

// A path or an id as messages show it: 'text'.
std::string quoted(std::string_view s);
// journal_failed naming the file, what was being done and SQLite's message.
Error failed(const std::string& path, std::string_view doing, sqlite3* db);
// Runs SQL text (one or more statements, no rows).
Result<void> exec(sqlite3* db, const std::string& path, const char* sql, std::string_view doing);
Result<void> prepare(sqlite3* db, const std::string& path, const char* sql, Stmt& out);
// A statement to prepare, and the handle that keeps it.
struct Prepared {
  Stmt* stmt;
  const char* sql;
};
Result<void> prepare_all(sqlite3* db, const std::string& path, std::initializer_list<Prepared> statements);
// Runs a statement that returns no rows (BEGIN, COMMIT, SAVEPOINT, ...).
Result<void> run(sqlite3* db, const std::string& path, sqlite3_stmt* s, std::string_view doing);

// Binding with SQLITE_STATIC: every caller keeps the bytes alive until the
// statement has been stepped and reset, and rebinds before the next step.
inline int bind_text(sqlite3_stmt* s, int i, const std::string& v) {
  return sqlite3_bind_text64(s, i, v.data(), v.size(), SQLITE_STATIC, SQLITE_UTF8);
}
inline int bind_blob(sqlite3_stmt* s, int i, const std::string& v) {
  // data() is never null, so an empty payload is a zero-length BLOB, not NULL.
  return sqlite3_bind_blob64(s, i, v.data(), v.size(), SQLITE_STATIC);
}
inline int bind_seq(sqlite3_stmt* s, int i, std::uint64_t v) {
  return sqlite3_bind_int64(s, i, static_cast<sqlite3_int64>(std::min(v, kMaxSeq)));
}

// A column type's SQL name, for corrupt_record messages.
const char* type_name(int t);
Error closed_error(const std::string& path);

// The exclusive advisory lock on "<path>.lock" that keeps a second process
// (or a second open() in this one: flock locks belong to the open file, not
// the process) from writing the same journal. Released when destroyed.
class LockFile {
 public:
  LockFile() = default;
  ~LockFile();
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  Result<void> acquire(const std::string& db_path);

 private:
  int fd_ = -1;
};

}  // namespace troupe::sqlite
