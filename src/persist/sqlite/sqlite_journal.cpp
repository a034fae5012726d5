// SqliteJournal: one writer lane with group commit, reader threads with
// their own connections (the threading is src/persist/journal_engine.hpp). Table layout, encoding and the rules enforced here
// are documented in doc/journal.md; keep the two in step.

#include "troupe/persist/sqlite_journal.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../journal_engine.hpp"

namespace troupe {
namespace {

// PRAGMA user_version of the layout below. A file with a higher number was
// written by a newer troupe: refuse it rather than misread it.
constexpr int kSchemaVersion = 2;
// PRAGMA application_id ("trup"): tells a troupe journal from some other
// application's SQLite file, which open() must not add tables to.
constexpr int kApplicationId = 0x74727570;
// SQLite's INTEGER is a signed 64-bit number; sequence numbers above this
// cannot be stored.
constexpr std::uint64_t kMaxSeq = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
// Bound on the writer's highest-seq cache; past it the cache starts over
// (entries are reloaded from the database on next use).
constexpr std::size_t kMaxCachedIds = std::size_t{1} << 20;

constexpr const char* kCreateSchema = R"sql(
CREATE TABLE events (
  persistence_id TEXT    NOT NULL,
  seq            INTEGER NOT NULL,
  timestamp_ms   INTEGER,
  type           TEXT,
  version        INTEGER,
  payload        BLOB,
  PRIMARY KEY (persistence_id, seq)
);
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
PRAGMA user_version = 2;
)sql";
// Schema 1 had no fences.
constexpr const char* kMigrateFrom1 = R"sql(
CREATE TABLE fences (
  key   TEXT    NOT NULL PRIMARY KEY,
  fence INTEGER NOT NULL
) WITHOUT ROWID;
PRAGMA user_version = 2;
)sql";
static_assert(kApplicationId == 1953658224, "kCreateSchema spells the application id in decimal");

constexpr const char* kInsertEvent =
    "INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
// Both halves of "highest": the largest stored seq and the deletion mark.
// One statement, so one consistent read even outside a transaction.
constexpr const char* kSelectHighest =
    "SELECT (SELECT max(seq) FROM events WHERE persistence_id = ?1), "
    "(SELECT deleted_to FROM deletions WHERE persistence_id = ?1)";
constexpr const char* kDeleteEvents = "DELETE FROM events WHERE persistence_id = ?1 AND seq <= ?2";
constexpr const char* kUpsertDeletion =
    "INSERT INTO deletions (persistence_id, deleted_to) VALUES (?1, ?2) "
    "ON CONFLICT (persistence_id) DO UPDATE SET deleted_to = max(deleted_to, excluded.deleted_to)";
constexpr const char* kInsertSnapshot =
    "INSERT OR REPLACE INTO snapshots (persistence_id, seq, timestamp_ms, type, version, payload) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
constexpr const char* kPruneSnapshots =
    "DELETE FROM snapshots WHERE persistence_id = ?1 AND "
    "seq < (SELECT max(seq) FROM snapshots WHERE persistence_id = ?1)";
constexpr const char* kSelectFence = "SELECT fence FROM fences WHERE key = ?1";
constexpr const char* kUpsertFence =
    "INSERT INTO fences (key, fence) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET fence = excluded.fence";
constexpr const char* kSelectHighestFence = "SELECT coalesce(max(fence), 0) FROM fences";
constexpr const char* kSelectEvents =
    "SELECT seq, timestamp_ms, type, version, payload FROM events "
    "WHERE persistence_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq";
constexpr const char* kSelectSnapshot =
    "SELECT seq, timestamp_ms, type, version, payload FROM snapshots "
    "WHERE persistence_id = ?1 ORDER BY seq DESC LIMIT 1";

// --- small RAII and error helpers ------------------------------------------

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

std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

Error failed(const std::string& path, std::string_view doing, sqlite3* db) {
  std::string m = "sqlite journal " + quoted(path) + ": " + std::string(doing) + ": ";
  m += db != nullptr ? sqlite3_errmsg(db) : "out of memory";
  if (db != nullptr) m += " (SQLite code " + std::to_string(sqlite3_extended_errcode(db)) + ")";
  return Error(ErrorCode::journal_failed, std::move(m));
}

Result<void> exec(sqlite3* db, const std::string& path, const char* sql, std::string_view doing) {
  if (sqlite3_exec(db, sql, nullptr, nullptr, nullptr) != SQLITE_OK) return failed(path, doing, db);
  return {};
}

Result<void> prepare(sqlite3* db, const std::string& path, const char* sql, Stmt& out) {
  if (sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, out.out(), nullptr) != SQLITE_OK)
    return failed(path, std::string("prepare \"") + sql + "\"", db);
  return {};
}

// Runs a statement that returns no rows (BEGIN, COMMIT, SAVEPOINT, ...).
Result<void> run(sqlite3* db, const std::string& path, sqlite3_stmt* s, std::string_view doing) {
  int rc = sqlite3_step(s);
  Result<void> r;
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) r = failed(path, doing, db);
  sqlite3_reset(s);
  return r;
}

// Binding with SQLITE_STATIC: every caller keeps the bytes alive until the
// statement has been stepped and reset, and rebinds before the next step.
int bind_text(sqlite3_stmt* s, int i, const std::string& v) {
  return sqlite3_bind_text64(s, i, v.data(), v.size(), SQLITE_STATIC, SQLITE_UTF8);
}
int bind_blob(sqlite3_stmt* s, int i, const std::string& v) {
  // data() is never null, so an empty payload is a zero-length BLOB, not NULL.
  return sqlite3_bind_blob64(s, i, v.data(), v.size(), SQLITE_STATIC);
}
int bind_seq(sqlite3_stmt* s, int i, std::uint64_t v) {
  return sqlite3_bind_int64(s, i, static_cast<sqlite3_int64>(std::min(v, kMaxSeq)));
}

const char* type_name(int t) {
  switch (t) {
    case SQLITE_INTEGER: return "INTEGER";
    case SQLITE_FLOAT: return "REAL";
    case SQLITE_TEXT: return "TEXT";
    case SQLITE_BLOB: return "BLOB";
    default: return "NULL";
  }
}

Error closed_error(const std::string& path) {
  return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) + " is closed");
}

// The exclusive advisory lock on "<path>.lock" that keeps a second process
// (or a second open() in this one: flock locks belong to the open file, not
// the process) from writing the same journal. Released when closed.
class LockFile {
 public:
  LockFile() = default;
  ~LockFile() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the flock
  }
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

  Result<void> acquire(const std::string& db_path) {
    std::string p = db_path + ".lock";
    fd_ = ::open(p.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(db_path) + ": cannot create lock file " +
                                                  quoted(p) + ": " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      std::string why = e == EWOULDBLOCK ? "the journal is already open (another process, or this one, holds "
                                           "the lock file " + quoted(p) + ")"
                                         : "cannot lock " + quoted(p) + ": " + std::strerror(e);
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(db_path) + ": " + why);
    }
    return {};
  }

 private:
  int fd_ = -1;
};

// Reads the five record columns (seq, timestamp_ms, type, version, payload)
// of the current row into `out`, checking every SQL type and range: a row
// that is not what this journal writes is corrupt_record, naming the id and
// the seq (SPEC X1: a bad row is a clear error, never a crash or a guess).
template <class Record>
Result<void> read_record(sqlite3_stmt* s, const std::string& path, const std::string& id, const char* what,
                         std::int64_t min_seq, Record& out) {
  auto corrupt = [&](const std::string& seq_text, const std::string& why) {
    return Error(ErrorCode::corrupt_record, "sqlite journal " + quoted(path) + ": corrupt " + what +
                                                " of persistence id " + quoted(id) + " seq " + seq_text + ": " +
                                                why);
  };
  if (sqlite3_column_type(s, 0) != SQLITE_INTEGER)
    return corrupt("?", std::string("seq is ") + type_name(sqlite3_column_type(s, 0)) + ", expected INTEGER");
  std::int64_t seq = sqlite3_column_int64(s, 0);
  std::string seq_text = std::to_string(seq);
  if (seq < min_seq) return corrupt(seq_text, "seq is below " + std::to_string(min_seq));
  auto expect = [&](int col, int type, const char* name) -> Result<void> {
    int t = sqlite3_column_type(s, col);
    if (t != type)
      return corrupt(seq_text, std::string(name) + " is " + type_name(t) + ", expected " + type_name(type));
    return {};
  };
  if (auto r = expect(1, SQLITE_INTEGER, "timestamp_ms"); !r) return r;
  if (auto r = expect(2, SQLITE_TEXT, "type"); !r) return r;
  if (auto r = expect(3, SQLITE_INTEGER, "version"); !r) return r;
  if (auto r = expect(4, SQLITE_BLOB, "payload"); !r) return r;
  std::int64_t version = sqlite3_column_int64(s, 3);
  if (version < 0 || version > std::int64_t{std::numeric_limits<std::uint32_t>::max()})
    return corrupt(seq_text, "version " + std::to_string(version) + " is outside 0.." +
                                 std::to_string(std::numeric_limits<std::uint32_t>::max()));
  out.seq = static_cast<std::uint64_t>(seq);
  out.timestamp_ms = sqlite3_column_int64(s, 1);
  // Column types were checked above, so these calls convert nothing.
  const auto* type = reinterpret_cast<const char*>(sqlite3_column_text(s, 2));
  out.type.assign(type != nullptr ? type : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 2)));
  out.version = static_cast<std::uint32_t>(version);
  const auto* payload = static_cast<const char*>(sqlite3_column_blob(s, 4));
  // A zero-length BLOB comes back as a null pointer.
  out.payload.assign(payload != nullptr ? payload : "", static_cast<std::size_t>(sqlite3_column_bytes(s, 4)));
  return {};
}

}  // namespace

// --- the shared state ----------------------------------------------------------

class SqliteCore;

// The writer: the only write connection, its statements and its caches.
// Used by the group-commit lane's thread only (and by open() before that
// thread starts).
class SqliteWriter final : public detail::JournalLane {
 public:
  explicit SqliteWriter(SqliteCore& core) : core_(core) {}
  // Opens the connection and checks, creates or migrates the schema.
  Result<void> open();
  void commit(std::span<detail::JournalWrite> ops, std::span<Result<void>> results) override;

 private:
  Result<void> do_append(AppendBatch& batch, std::uint64_t& written);
  Result<void> do_delete(const std::string& id, std::uint64_t to_seq);
  Result<void> do_snapshot(const std::string& id, const SnapshotRecord& snapshot);
  Result<void> do_fence(const std::string& key, std::uint64_t value);
  Result<std::uint64_t*> cached_highest(const std::string& id);
  Result<std::uint64_t*> cached_fence(const std::string& key);
  Result<void> check_schema();
  Result<void> savepoint();
  Result<void> release();
  void rollback_savepoint();
  void forget();
  Error fail(std::string_view doing) const;

  SqliteCore& core_;  // owns this writer
  Connection db_;
  Stmt begin_, commit_, rollback_, savepoint_, release_, rollback_to_;
  Stmt insert_event_, select_highest_, delete_events_, upsert_deletion_, insert_snapshot_, prune_snapshots_;
  Stmt select_fence_, upsert_fence_;
  // Highest seq per id and the stored fence per key, as of the current
  // transaction. Valid because this thread is the only writer of the file
  // (the lock file keeps other processes out); cleared whenever a
  // transaction is lost.
  std::unordered_map<std::string, std::uint64_t> highest_;
  std::unordered_map<std::string, std::uint64_t> fences_;
};

// Everything the journal's threads use. Held by shared_ptr: by the public
// object and by each thread, so that the journal may be destroyed from one
// of its own callbacks (that thread then finishes the queued work and frees
// the state when it exits).
class SqliteCore : public std::enable_shared_from_this<SqliteCore> {
 public:
  // One read connection and its statements; used by one reader thread only.
  class Reader {
   public:
    explicit Reader(const SqliteCore& core) : core_(core) {}
    Result<void> open();
    Result<std::vector<EventRecord>> replay(const std::string& id, std::uint64_t from, std::uint64_t to);
    Result<std::uint64_t> highest_seq(const std::string& id);
    Result<std::optional<SnapshotRecord>> load_snapshot(const std::string& id);
    Result<Recovery> recover(const std::string& id);
    Result<std::uint64_t> highest_fence();

   private:
    struct Highest {
      std::uint64_t max_seq = 0;
      std::uint64_t deleted_to = 0;
      std::uint64_t value() const { return std::max(max_seq, deleted_to); }
    };
    Result<Highest> read_highest(const std::string& id);
    Result<void> read_events(const std::string& id, std::uint64_t from, std::uint64_t to,
                             std::uint64_t deleted_to, std::vector<EventRecord>& out);
    Result<std::optional<SnapshotRecord>> read_snapshot(const std::string& id);
    Result<void> begin();
    Result<void> end();
    void abort();

    const SqliteCore& core_;
    Connection db_;
    Stmt begin_, commit_, rollback_, events_, snapshot_, highest_, highest_fence_;
  };

  using ReadTask = detail::ReaderPool<Reader>::Task;

  explicit SqliteCore(SqliteJournalOptions options) : options_(std::move(options)) {}
  // Runs once every thread is joined, or on the last of them as it exits
  // (destruction from a callback). Member order does the rest: the engines
  // go first (their statements finalize, their connections close), then the
  // lock file is released.
  ~SqliteCore() = default;

  Result<void> open();
  void start_threads();
  void shutdown();

  void write(detail::JournalWrite&& op) { writes_->submit(std::move(op)); }
  void read(ReadTask&& task) { reads_->submit(std::move(task)); }

  SqliteJournal::Stats stats() const {
    return {transactions_.load(std::memory_order_relaxed), events_written_.load(std::memory_order_relaxed),
            writes_ ? writes_->append_failures() : 0};
  }
  const std::string& path() const noexcept { return options_.path; }
  const SqliteJournalOptions& options() const noexcept { return options_; }

  std::atomic<std::uint64_t> transactions_{0};
  std::atomic<std::uint64_t> events_written_{0};

 private:
  const SqliteJournalOptions options_;
  LockFile lock_;
  std::unique_ptr<detail::GroupCommit> writes_;
  std::unique_ptr<detail::ReaderPool<Reader>> reads_;
};

class SqliteJournal::Impl {
 public:
  std::shared_ptr<SqliteCore> core;
};

// --- open and close ----------------------------------------------------------------

Result<void> SqliteCore::open() {
  if (auto r = lock_.acquire(options_.path); !r) return r;
  auto writer = std::make_unique<SqliteWriter>(*this);
  if (auto r = writer->open(); !r) return r;
  std::vector<std::unique_ptr<detail::JournalLane>> lanes;
  lanes.push_back(std::move(writer));
  writes_ = std::make_unique<detail::GroupCommit>(std::move(lanes), options_.max_batch_events,
                                                  [path = options_.path] { return closed_error(path); });
  std::vector<std::unique_ptr<Reader>> readers;
  for (unsigned i = 0; i < options_.reader_threads; ++i) {
    auto reader = std::make_unique<Reader>(*this);
    if (auto r = reader->open(); !r) return r;
    readers.push_back(std::move(reader));
  }
  reads_ = std::make_unique<detail::ReaderPool<Reader>>(std::move(readers));
  return {};
}

Error SqliteWriter::fail(std::string_view doing) const { return failed(core_.path(), doing, db_.get()); }

Result<void> SqliteWriter::open() {
  const std::string& path = core_.path();
  // NOMUTEX: each connection is used by one thread at a time, so SQLite's
  // per-connection mutex would only cost.
  int rc = sqlite3_open_v2(path.c_str(), db_.out(), SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  sqlite3* db = db_.get();
  if (rc != SQLITE_OK) return fail("open for writing");
  sqlite3_busy_timeout(db, core_.options().busy_timeout_ms);

  // journal_mode is the first statement that reads the file: a file that is
  // not a database fails here with SQLITE_NOTADB.
  {
    Stmt s;
    if (auto r = prepare(db, path, "PRAGMA journal_mode = WAL", s); !r) return r;
    ResetOnExit reset(s.get());
    if (sqlite3_step(s.get()) != SQLITE_ROW) return fail("switch to WAL mode");
    const auto* mode = reinterpret_cast<const char*>(sqlite3_column_text(s.get(), 0));
    if (mode == nullptr || std::string_view(mode) != "wal")
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) +
                                                  ": cannot use WAL mode (journal_mode is " +
                                                  (mode != nullptr ? mode : "unknown") + ")");
  }
  const char* sync = core_.options().durability == Durability::full ? "PRAGMA synchronous = FULL"
                                                             : "PRAGMA synchronous = NORMAL";
  if (auto r = exec(db, path, sync, "set synchronous"); !r) return r;
  // A commit of N entities' events dirties about one index page per entity;
  // a cache that holds them saves re-reading them on the next commit, and a
  // longer WAL between checkpoints lets one checkpoint write a hot page once
  // for several commits. Numbers measured with 10,000 entities appending.
  if (auto r = exec(db, path, "PRAGMA cache_size = -65536", "set cache_size"); !r) return r;
  if (auto r = exec(db, path, "PRAGMA wal_autocheckpoint = 8192", "set wal_autocheckpoint"); !r) return r;

  if (auto r = check_schema(); !r) return r;

  struct {
    Stmt* stmt;
    const char* sql;
  } const statements[] = {
      {&begin_, "BEGIN IMMEDIATE"},        {&commit_, "COMMIT"},
      {&rollback_, "ROLLBACK"},            {&savepoint_, "SAVEPOINT op"},
      {&release_, "RELEASE op"},           {&rollback_to_, "ROLLBACK TO op"},
      {&insert_event_, kInsertEvent},      {&select_highest_, kSelectHighest},
      {&delete_events_, kDeleteEvents},    {&upsert_deletion_, kUpsertDeletion},
      {&insert_snapshot_, kInsertSnapshot}, {&prune_snapshots_, kPruneSnapshots},
      {&select_fence_, kSelectFence},      {&upsert_fence_, kUpsertFence},
  };
  for (const auto& st : statements)
    if (auto r = prepare(db, path, st.sql, *st.stmt); !r) return r;

  return {};
}

// Checks the schema under the write lock, creating it in a new file and
// migrating an older layout, so two first opens cannot both create it (the
// lock file already excludes that; this keeps the check honest for files
// touched by other tools).
Result<void> SqliteWriter::check_schema() {
  const std::string& path = core_.path();
  sqlite3* db = db_.get();
  if (auto r = exec(db, path, "BEGIN IMMEDIATE", "begin the schema check"); !r) return r;
  auto schema = [&]() -> Result<void> {
    auto pragma_int = [&](const char* sql, std::int64_t& v) -> Result<void> {
      Stmt s;
      if (auto r = prepare(db, path, sql, s); !r) return r;
      ResetOnExit reset(s.get());
      if (sqlite3_step(s.get()) != SQLITE_ROW) return fail(std::string("read ") + sql);
      v = sqlite3_column_int64(s.get(), 0);
      return {};
    };
    std::int64_t version = 0, app = 0, tables = 0;
    if (auto r = pragma_int("PRAGMA user_version", version); !r) return r;
    if (auto r = pragma_int("PRAGMA application_id", app); !r) return r;
    if (auto r = pragma_int("SELECT count(*) FROM sqlite_schema", tables); !r) return r;
    if (version == 0 && app == 0 && tables == 0) return exec(db, path, kCreateSchema, "create the tables");
    if (app != kApplicationId)
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) +
                                                  ": the file is an SQLite database of another application "
                                                  "(application_id " + std::to_string(app) + "), not a journal");
    if (version > kSchemaVersion)
      return Error(ErrorCode::journal_failed,
                   "sqlite journal " + quoted(path) + ": schema version " + std::to_string(version) +
                       " is newer than this build understands (" + std::to_string(kSchemaVersion) + ")");
    if (version == 1) return exec(db, path, kMigrateFrom1, "add the fences table (schema 1 to 2)");
    if (version != kSchemaVersion)
      return Error(ErrorCode::journal_failed, "sqlite journal " + quoted(path) + ": unknown schema version " +
                                                  std::to_string(version));
    return {};
  }();
  if (!schema) {
    (void)exec(db, path, "ROLLBACK", "roll back the schema check");
    return schema;
  }
  return exec(db, path, "COMMIT", "commit the schema");
}


Result<void> SqliteCore::Reader::open() {
  const std::string& path = core_.path();
  if (sqlite3_open_v2(path.c_str(), db_.out(), SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr) != SQLITE_OK)
    return failed(path, "open for reading", db_.get());
  sqlite3_busy_timeout(db_.get(), core_.options_.busy_timeout_ms);
  struct {
    Stmt* stmt;
    const char* sql;
  } const statements[] = {
      {&begin_, "BEGIN"},           {&commit_, "COMMIT"},          {&rollback_, "ROLLBACK"},
      {&events_, kSelectEvents},    {&snapshot_, kSelectSnapshot}, {&highest_, kSelectHighest},
      {&highest_fence_, kSelectHighestFence},
  };
  for (const auto& st : statements)
    if (auto r = prepare(db_.get(), path, st.sql, *st.stmt); !r) return r;
  return {};
}

// --- the writer ----------------------------------------------------------------

void SqliteCore::start_threads() {
  // Each thread holds the state alive: see the class comment.
  auto self = shared_from_this();
  writes_->start(self);
  reads_->start(self);
}

void SqliteCore::shutdown() {
  writes_->close();
  reads_->close();
  writes_->join();
  reads_->join();
}

void SqliteWriter::forget() {
  highest_.clear();
  fences_.clear();
}

void SqliteWriter::commit(std::span<detail::JournalWrite> ops, std::span<Result<void>> results) {
  const std::string& path = core_.path();
  auto fail_all = [&](const Error& e) {
    for (auto& r : results) r = e;
    // The caches may hold numbers from the lost transaction.
    forget();
    if (sqlite3_get_autocommit(db_.get()) == 0) (void)run(db_.get(), path, rollback_.get(), "roll back");
  };

  if (auto r = run(db_.get(), path, begin_.get(), "begin a write transaction"); !r) return fail_all(r.error());

  std::uint64_t written = 0;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    detail::JournalWrite& op = ops[i];
    Result<void> r;
    switch (op.kind) {
      case detail::JournalWrite::Kind::append: r = do_append(op.batch, written); break;
      case detail::JournalWrite::Kind::delete_to: r = do_delete(op.key(), op.value); break;
      case detail::JournalWrite::Kind::snapshot: r = do_snapshot(op.key(), op.snapshot); break;
      case detail::JournalWrite::Kind::fence: r = do_fence(op.key(), op.value); break;
    }
    // Some errors (I/O, disk full) make SQLite roll back the whole
    // transaction: then nothing of this chunk is stored, and every op in it
    // must say so, including those that had gone in.
    if (!r.ok() && sqlite3_get_autocommit(db_.get()) != 0)
      return fail_all(Error(ErrorCode::journal_failed,
                            r.error().message() + "; the transaction was rolled back, nothing of it is stored"));
    results[i] = std::move(r);
  }

  if (auto r = run(db_.get(), path, commit_.get(), "commit"); !r) return fail_all(r.error());
  core_.transactions_.fetch_add(1, std::memory_order_relaxed);
  core_.events_written_.fetch_add(written, std::memory_order_relaxed);
}

Result<std::uint64_t*> SqliteWriter::cached_highest(const std::string& id) {
  if (auto it = highest_.find(id); it != highest_.end()) return &it->second;
  sqlite3_stmt* s = select_highest_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK) return fail("bind the persistence id");
  if (sqlite3_step(s) != SQLITE_ROW) return fail("read the highest seq of " + quoted(id));
  // Corrupt (non-integer) values read as 0 here; readers report them.
  auto max_seq = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
  auto deleted_to = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 1)));
  if (highest_.size() >= kMaxCachedIds) highest_.clear();
  return &highest_.emplace(id, std::max(max_seq, deleted_to)).first->second;
}

Result<std::uint64_t*> SqliteWriter::cached_fence(const std::string& key) {
  if (auto it = fences_.find(key); it != fences_.end()) return &it->second;
  sqlite3_stmt* s = select_fence_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, key) != SQLITE_OK) return fail("bind the fence key");
  std::uint64_t stored = 0;
  int rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    stored = static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
  } else if (rc != SQLITE_DONE) {
    return fail("read the fence " + quoted(key));
  }
  if (fences_.size() >= kMaxCachedIds) fences_.clear();
  return &fences_.emplace(key, stored).first->second;
}

Result<void> SqliteWriter::do_fence(const std::string& key, std::uint64_t value) {
  if (auto v = validate_fence(key, value); !v) return v;
  auto cached = cached_fence(key);
  if (!cached) return std::move(cached).error();
  std::uint64_t& stored = *cached.value();
  if (stored > value) return fence_lowered(key, value, stored);
  if (stored == value) return {};
  sqlite3_stmt* s = upsert_fence_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, key) != SQLITE_OK || bind_seq(s, 2, value) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
    return fail("raise the fence " + quoted(key) + " to " + std::to_string(value));
  stored = value;
  return {};
}

Result<void> SqliteWriter::savepoint() { return run(db_.get(), core_.path(), savepoint_.get(), "open a savepoint"); }
Result<void> SqliteWriter::release() { return run(db_.get(), core_.path(), release_.get(), "release a savepoint"); }
void SqliteWriter::rollback_savepoint() {
  // Only this op's rows go; the transaction, and the ops before it, stay.
  if (sqlite3_get_autocommit(db_.get()) != 0) return;
  (void)run(db_.get(), core_.path(), rollback_to_.get(), "roll back to a savepoint");
  (void)release();
}

Result<void> SqliteWriter::do_append(AppendBatch& batch, std::uint64_t& written) {
  if (auto v = validate_batch(batch); !v.ok()) return v;
  const std::string& id = batch.persistence_id;
  if (batch.events.back().seq > kMaxSeq)
    return Error(ErrorCode::invalid_argument, "append to " + quoted(id) + ": sequence number " +
                                                  std::to_string(batch.events.back().seq) +
                                                  " exceeds the largest storable, " + std::to_string(kMaxSeq));
  if (batch.fence.value != 0) {
    auto fence = cached_fence(batch.fence.key);
    if (!fence) return std::move(fence).error();
    if (*fence.value() > batch.fence.value) return fence_refused(batch, *fence.value());
  }
  auto cached = cached_highest(id);
  if (!cached) return std::move(cached).error();
  std::uint64_t& highest = *cached.value();
  const std::uint64_t first = batch.events.front().seq;
  // The cache answers both conflicts without touching the file; the primary
  // key below is the backstop should the cache ever be wrong.
  if (first <= highest)
    return Error(ErrorCode::journal_conflict, quoted(id) + " already holds sequence number " +
                                                  std::to_string(first) + ": another writer appended it");
  if (first != highest + 1)
    return Error(ErrorCode::journal_conflict, "append to " + quoted(id) + " at " + std::to_string(first) +
                                                  " would leave a gap after " + std::to_string(highest));

  // A one-row INSERT that fails leaves nothing behind (SQLite undoes the
  // statement), so only multi-event batches need a savepoint.
  const bool multi = batch.events.size() > 1;
  if (multi)
    if (auto r = savepoint(); !r) return r;
  sqlite3_stmt* s = insert_event_.get();
  if (bind_text(s, 1, id) != SQLITE_OK) {
    Error e = fail("bind the persistence id");
    if (multi) rollback_savepoint();
    return e;
  }
  for (const EventRecord& e : batch.events) {
    int rc = bind_seq(s, 2, e.seq);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, e.timestamp_ms);
    if (rc == SQLITE_OK) rc = bind_text(s, 4, e.type);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 5, e.version);
    if (rc == SQLITE_OK) rc = bind_blob(s, 6, e.payload);
    if (rc == SQLITE_OK) rc = sqlite3_step(s);
    if (rc != SQLITE_DONE) {
      const int ext = sqlite3_extended_errcode(db_.get());
      Error err = fail("append " + quoted(id) + " seq " + std::to_string(e.seq));
      sqlite3_reset(s);
      if (multi) rollback_savepoint();
      if (ext == SQLITE_CONSTRAINT_PRIMARYKEY) {
        highest_.erase(id);  // it was wrong; reload on next use
        return Error(ErrorCode::journal_conflict, quoted(id) + " already holds sequence number " +
                                                      std::to_string(e.seq) + ": another writer appended it");
      }
      return err;
    }
    sqlite3_reset(s);
  }
  if (multi)
    if (auto r = release(); !r) {
      rollback_savepoint();
      return r;
    }
  highest = batch.events.back().seq;
  written += batch.events.size();
  return {};
}

Result<void> SqliteWriter::do_delete(const std::string& id, std::uint64_t to_seq) {
  auto cached = cached_highest(id);
  if (!cached) return std::move(cached).error();
  // Never mark numbers above the highest as deleted: the next append must
  // still be highest + 1.
  const std::uint64_t upto = std::min(to_seq, *cached.value());
  if (upto == 0) return {};
  if (auto r = savepoint(); !r) return r;
  auto step = [&](sqlite3_stmt* s, const char* doing) -> Result<void> {
    ResetOnExit reset(s);
    if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, upto) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
      return fail(std::string(doing) + " of " + quoted(id) + " up to " + std::to_string(upto));
    return {};
  };
  Result<void> r = step(delete_events_.get(), "delete the events");
  if (r) r = step(upsert_deletion_.get(), "record the deletion");
  if (r) r = release();
  if (!r) rollback_savepoint();
  return r;
}

Result<void> SqliteWriter::do_snapshot(const std::string& id, const SnapshotRecord& snap) {
  if (id.empty()) return Error(ErrorCode::invalid_argument, "snapshot with an empty persistence id");
  if (snap.seq > kMaxSeq)
    return Error(ErrorCode::invalid_argument, "snapshot of " + quoted(id) + " at sequence number " +
                                                  std::to_string(snap.seq) + " exceeds the largest storable");
  if (auto r = savepoint(); !r) return r;
  Result<void> r;
  {
    sqlite3_stmt* s = insert_snapshot_.get();
    ResetOnExit reset(s);
    if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, snap.seq) != SQLITE_OK ||
        sqlite3_bind_int64(s, 3, snap.timestamp_ms) != SQLITE_OK || bind_text(s, 4, snap.type) != SQLITE_OK ||
        sqlite3_bind_int64(s, 5, snap.version) != SQLITE_OK || bind_blob(s, 6, snap.payload) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_DONE)
      r = fail("save a snapshot of " + quoted(id) + " at " + std::to_string(snap.seq));
  }
  if (r) {
    // Only the latest snapshot is ever loaded; older ones are dead weight.
    sqlite3_stmt* s = prune_snapshots_.get();
    ResetOnExit reset(s);
    if (bind_text(s, 1, id) != SQLITE_OK || sqlite3_step(s) != SQLITE_DONE)
      r = fail("drop older snapshots of " + quoted(id));
  }
  if (r) r = release();
  if (!r) rollback_savepoint();
  return r;
}

// --- the readers ----------------------------------------------------------------

Result<void> SqliteCore::Reader::begin() {
  // A read that starts after an append's callback sees that append: each
  // read takes a fresh snapshot of the WAL here, after the commit.
  return run(db_.get(), core_.path(), begin_.get(), "begin a read transaction");
}

Result<void> SqliteCore::Reader::end() {
  if (auto r = run(db_.get(), core_.path(), commit_.get(), "end a read transaction"); !r) {
    abort();
    return r;
  }
  return {};
}

void SqliteCore::Reader::abort() {
  if (sqlite3_get_autocommit(db_.get()) == 0)
    (void)run(db_.get(), core_.path(), rollback_.get(), "roll back a read transaction");
}

Result<SqliteCore::Reader::Highest> SqliteCore::Reader::read_highest(const std::string& id) {
  sqlite3_stmt* s = highest_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK || sqlite3_step(s) != SQLITE_ROW)
    return failed(core_.path(), "read the highest seq of " + quoted(id), db_.get());
  Highest h;
  const char* names[] = {"max(seq) of its events", "its deleted_to mark"};
  std::uint64_t* values[] = {&h.max_seq, &h.deleted_to};
  for (int col = 0; col < 2; ++col) {
    int t = sqlite3_column_type(s, col);
    if (t == SQLITE_NULL) continue;
    sqlite3_int64 v = sqlite3_column_int64(s, col);
    if (t != SQLITE_INTEGER || v < 0)
      return Error(ErrorCode::corrupt_record,
                   "sqlite journal " + quoted(core_.path()) + ": corrupt record of persistence id " + quoted(id) +
                       " seq ?: " + names[col] + " is " +
                       (t == SQLITE_INTEGER ? std::to_string(v) : std::string(type_name(t))) +
                       ", expected a non-negative INTEGER");
    *values[col] = static_cast<std::uint64_t>(v);
  }
  return h;
}

Result<void> SqliteCore::Reader::read_events(const std::string& id, std::uint64_t from, std::uint64_t to,
                                             std::uint64_t deleted_to, std::vector<EventRecord>& out) {
  from = std::max<std::uint64_t>(from, 1);
  to = std::min(to, kMaxSeq);
  if (from > to) return {};
  sqlite3_stmt* s = events_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK || bind_seq(s, 2, from) != SQLITE_OK || bind_seq(s, 3, to) != SQLITE_OK)
    return failed(core_.path(), "bind the replay of " + quoted(id), db_.get());
  // Rows must run on without a hole from here: below deleted_to they were
  // deleted on purpose; anything else missing was lost.
  std::uint64_t expected = std::max(from, deleted_to + 1);
  bool first = true;
  for (;;) {
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return {};
    if (rc != SQLITE_ROW) return failed(core_.path(), "replay " + quoted(id), db_.get());
    EventRecord e;
    if (auto r = read_record(s, core_.path(), id, "event", 1, e); !r) return r;
    // Rows at or below the deletion mark are harmless leftovers.
    if (first && e.seq < expected) expected = e.seq;
    first = false;
    if (e.seq != expected)
      return Error(ErrorCode::corrupt_record,
                   "sqlite journal " + quoted(core_.path()) + ": corrupt event log of persistence id " +
                       quoted(id) + " seq " + std::to_string(expected) + ": missing (the next stored event is " +
                       std::to_string(e.seq) + ", and events were deleted only up to " +
                       std::to_string(deleted_to) + ")");
    ++expected;
    out.push_back(std::move(e));
  }
}

Result<std::optional<SnapshotRecord>> SqliteCore::Reader::read_snapshot(const std::string& id) {
  sqlite3_stmt* s = snapshot_.get();
  ResetOnExit reset(s);
  if (bind_text(s, 1, id) != SQLITE_OK) return failed(core_.path(), "bind the snapshot load", db_.get());
  int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::optional<SnapshotRecord>();
  if (rc != SQLITE_ROW) return failed(core_.path(), "load the snapshot of " + quoted(id), db_.get());
  SnapshotRecord snap;
  if (auto r = read_record(s, core_.path(), id, "snapshot", 0, snap); !r) return std::move(r).error();
  return std::optional<SnapshotRecord>(std::move(snap));
}

Result<std::vector<EventRecord>> SqliteCore::Reader::replay(const std::string& id, std::uint64_t from,
                                                             std::uint64_t to) {
  // The deletion mark and the rows must come from one snapshot, or a delete
  // committed between the two reads would look like a hole.
  if (auto r = begin(); !r) return std::move(r).error();
  auto h = read_highest(id);
  std::vector<EventRecord> events;
  Result<void> r = h ? read_events(id, from, to, h->deleted_to, events) : Result<void>(h.error());
  if (!r) {
    abort();
    return std::move(r).error();
  }
  if (auto e = end(); !e) return std::move(e).error();
  return events;
}

Result<std::uint64_t> SqliteCore::Reader::highest_seq(const std::string& id) {
  auto h = read_highest(id);
  if (!h) return std::move(h).error();
  return h->value();
}

Result<std::optional<SnapshotRecord>> SqliteCore::Reader::load_snapshot(const std::string& id) {
  return read_snapshot(id);
}

Result<std::uint64_t> SqliteCore::Reader::highest_fence() {
  sqlite3_stmt* s = highest_fence_.get();
  ResetOnExit reset(s);
  if (sqlite3_step(s) != SQLITE_ROW) return failed(core_.path(), "read the highest fence", db_.get());
  return static_cast<std::uint64_t>(std::max<sqlite3_int64>(0, sqlite3_column_int64(s, 0)));
}

Result<Recovery> SqliteCore::Reader::recover(const std::string& id) {
  // One read transaction: the snapshot, the events after it and the highest
  // number all come from the same committed state.
  if (auto r = begin(); !r) return std::move(r).error();
  Recovery rec;
  Result<void> r = [&]() -> Result<void> {
    auto snap = read_snapshot(id);
    if (!snap) return std::move(snap).error();
    rec.snapshot = std::move(*snap);
    auto h = read_highest(id);
    if (!h) return std::move(h).error();
    rec.highest_seq = h->value();
    std::uint64_t from = rec.snapshot ? rec.snapshot->seq + 1 : 1;
    return read_events(id, from, UINT64_MAX, h->deleted_to, rec.events);
  }();
  if (!r) {
    abort();
    return std::move(r).error();
  }
  if (auto e = end(); !e) return std::move(e).error();
  return rec;
}

// --- the public object ---------------------------------------------------------------

Result<std::shared_ptr<SqliteJournal>> SqliteJournal::open(SqliteJournalOptions options) {
  if (options.path.empty() || options.path == ":memory:")
    return Error(ErrorCode::invalid_argument, "sqlite journal: the path must name a file");
  if (options.max_batch_events == 0)
    return Error(ErrorCode::invalid_argument, "sqlite journal: max_batch_events must be at least 1");
  if (options.reader_threads == 0)
    return Error(ErrorCode::invalid_argument, "sqlite journal: reader_threads must be at least 1");
  if (options.busy_timeout_ms < 0)
    return Error(ErrorCode::invalid_argument, "sqlite journal: busy_timeout_ms must not be negative");
  auto core = std::make_shared<SqliteCore>(std::move(options));
  if (auto r = core->open(); !r) return std::move(r).error();
  core->start_threads();
  auto impl = std::make_unique<Impl>();
  impl->core = std::move(core);
  return std::shared_ptr<SqliteJournal>(new SqliteJournal(std::move(impl)));
}

SqliteJournal::SqliteJournal(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SqliteJournal::~SqliteJournal() { impl_->core->shutdown(); }

void SqliteJournal::append(AppendBatch batch, Callback<void> done) {
  impl_->core->write({detail::JournalWrite::Kind::append, std::move(batch), 0, {}, std::move(done)});
}

void SqliteJournal::delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) {
  impl_->core->write({detail::JournalWrite::Kind::delete_to, AppendBatch{std::move(persistence_id), {}, {}},
                      std::min(to_seq, kMaxSeq), {}, std::move(done)});
}

void SqliteJournal::save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) {
  impl_->core->write({detail::JournalWrite::Kind::snapshot, AppendBatch{std::move(persistence_id), {}, {}}, 0,
                      std::move(snapshot), std::move(done)});
}

void SqliteJournal::raise_fence(std::string key, std::uint64_t value, Callback<void> done) {
  impl_->core->write(
      {detail::JournalWrite::Kind::fence, AppendBatch{std::move(key), {}, {}}, value, {}, std::move(done)});
}

namespace {
// Wraps a reader call as a ReadTask: runs it on a reader thread, or answers
// journal_failed when the journal is already closed.
template <class T, class Fn>
SqliteCore::ReadTask read_task(const SqliteCore& core, Journal::Callback<T> done, Fn fn) {
  return [&core, done = std::move(done), fn = std::move(fn)](SqliteCore::Reader* r) mutable {
    if (r == nullptr) return done(closed_error(core.path()));
    done(fn(*r));
  };
}
}  // namespace

void SqliteJournal::replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
                           Callback<std::vector<EventRecord>> done) {
  impl_->core->read(read_task(*impl_->core, std::move(done),
                              [id = std::move(persistence_id), from_seq, to_seq](SqliteCore::Reader& r) {
                                return r.replay(id, from_seq, to_seq);
                              }));
}

void SqliteJournal::highest_seq(std::string persistence_id, Callback<std::uint64_t> done) {
  impl_->core->read(read_task(*impl_->core, std::move(done),
                              [id = std::move(persistence_id)](SqliteCore::Reader& r) { return r.highest_seq(id); }));
}

void SqliteJournal::load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) {
  impl_->core->read(read_task(*impl_->core, std::move(done), [id = std::move(persistence_id)](SqliteCore::Reader& r) {
    return r.load_snapshot(id);
  }));
}

void SqliteJournal::recover(std::string persistence_id, Callback<Recovery> done) {
  impl_->core->read(read_task(*impl_->core, std::move(done),
                              [id = std::move(persistence_id)](SqliteCore::Reader& r) { return r.recover(id); }));
}

void SqliteJournal::highest_fence(Callback<std::uint64_t> done) {
  impl_->core->read(read_task(*impl_->core, std::move(done), [](SqliteCore::Reader& r) { return r.highest_fence(); }));
}

SqliteJournal::Stats SqliteJournal::stats() const { return impl_->core->stats(); }

JournalStats SqliteJournal::journal_stats() const {
  const Stats s = stats();
  return {s.transactions, s.events_written};
}

}  // namespace troupe
