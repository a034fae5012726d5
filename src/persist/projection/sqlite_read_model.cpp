// SqliteReadModel (sqlite_read_model.hpp): a writing connection with a cache
// of prepared statements, the offsets table and its compare-and-move rule,
// and a reading connection.

#include "troupe/persist/sqlite_read_model.hpp"

#include <sqlite3.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../sqlite/sqlite_support.hpp"
#include "guarded_body.hpp"

namespace troupe {

using sqlite::Connection;
using sqlite::quoted;
using sqlite::Stmt;

namespace {

constexpr const char* kCreateOffsets =
    "CREATE TABLE IF NOT EXISTS troupe_projection_offsets ("
    " projection TEXT NOT NULL PRIMARY KEY, tx INTEGER NOT NULL, ordering INTEGER NOT NULL,"
    " updated_ms INTEGER NOT NULL) WITHOUT ROWID";
constexpr const char* kSelectOffset = "SELECT tx, ordering FROM troupe_projection_offsets WHERE projection = ?1";
constexpr const char* kUpsertOffset =
    "INSERT INTO troupe_projection_offsets (projection, tx, ordering, updated_ms) VALUES (?1, ?2, ?3, ?4) "
    "ON CONFLICT (projection) DO UPDATE SET tx = excluded.tx, ordering = excluded.ordering, "
    "updated_ms = excluded.updated_ms";

Error model_error(const std::string& path, std::string_view doing, sqlite3* db) {
  return Error(ErrorCode::journal_failed, "sqlite read model " + quoted(path) + ": " + std::string(doing) + ": " +
                                              (db != nullptr ? sqlite3_errmsg(db) : "out of memory"));
}

std::int64_t as_int(std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX)); }

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// One connection and the statements prepared on it, by SQL text.
class SqliteTransaction::Impl {
 public:
  Impl(std::string path, Connection& conn) : path_(std::move(path)), conn_(conn) {}

  Result<sqlite3_stmt*> statement(std::string_view sql) {
    auto it = cache_.find(sql);
    if (it == cache_.end()) {
      auto stmt = std::make_unique<Stmt>();
      if (sqlite3_prepare_v3(conn_.get(), sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT,
                             stmt->out(), nullptr) != SQLITE_OK)
        return model_error(path_, "prepare '" + std::string(sql.substr(0, 200)) + "'", conn_.get());
      if (stmt->get() == nullptr)
        return Error(ErrorCode::invalid_argument, "sqlite read model: no statement in '" + std::string(sql) + "'");
      it = cache_.emplace(std::string(sql), std::move(stmt)).first;
    }
    return it->second->get();
  }

  Result<void> bind(sqlite3_stmt* s, std::string_view sql, std::initializer_list<SqlParam> params) {
    if (static_cast<int>(params.size()) > sqlite3_bind_parameter_count(s))
      return Error(ErrorCode::invalid_argument, "sqlite read model: " + std::to_string(params.size()) +
                                                    " parameters for '" + std::string(sql.substr(0, 200)) + "'");
    int i = 1, rc = SQLITE_OK;
    for (const SqlParam& p : params) {
      if (std::holds_alternative<std::nullptr_t>(p)) rc = sqlite3_bind_null(s, i);
      else if (auto* n = std::get_if<std::int64_t>(&p)) rc = sqlite3_bind_int64(s, i, *n);
      else if (auto* d = std::get_if<double>(&p)) rc = sqlite3_bind_double(s, i, *d);
      else {
        auto v = std::get<std::string_view>(p);
        rc = sqlite3_bind_text64(s, i, v.data(), v.size(), SQLITE_STATIC, SQLITE_UTF8);
      }
      if (rc != SQLITE_OK) return model_error(path_, "bind parameter " + std::to_string(i), conn_.get());
      ++i;
    }
    return {};
  }

  // Steps `sql` to its end, collecting rows when `rows` is given.
  Result<void> run(std::string_view sql, std::initializer_list<SqlParam> params, std::vector<SqlRow>* rows) {
    auto st = statement(sql);
    if (!st) return std::move(st).error();
    sqlite3_stmt* s = *st;
    sqlite::ResetOnExit reset(s);
    sqlite3_clear_bindings(s);
    if (auto b = bind(s, sql, params); !b) return b;
    for (;;) {
      int rc = sqlite3_step(s);
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return model_error(path_, "run '" + std::string(sql.substr(0, 200)) + "'", conn_.get());
      if (rows == nullptr) continue;
      SqlRow row;
      const int n = sqlite3_column_count(s);
      row.reserve(static_cast<std::size_t>(n));
      for (int c = 0; c < n; ++c) {
        switch (sqlite3_column_type(s, c)) {
          case SQLITE_NULL: row.emplace_back(nullptr); break;
          case SQLITE_INTEGER: row.emplace_back(static_cast<std::int64_t>(sqlite3_column_int64(s, c))); break;
          case SQLITE_FLOAT: row.emplace_back(sqlite3_column_double(s, c)); break;
          default: {
            const void* p = sqlite3_column_blob(s, c);
            const int len = sqlite3_column_bytes(s, c);
            row.emplace_back(std::string(static_cast<const char*>(p), p != nullptr ? static_cast<std::size_t>(len) : 0));
          }
        }
      }
      rows->push_back(std::move(row));
    }
    changes_ = sqlite3_changes64(conn_.get());
    return {};
  }

  // The stored offset of `key`: nullopt for none; corrupt_record unless
  // both columns are non-negative integers.
  Result<std::optional<JournalOffset>> offset(std::string_view key) {
    auto st = statement(kSelectOffset);
    if (!st) return std::move(st).error();
    sqlite3_stmt* s = *st;
    sqlite::ResetOnExit reset(s);
    if (auto b = bind(s, kSelectOffset, {key}); !b) return std::move(b).error();
    const int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) return std::optional<JournalOffset>{};
    if (rc != SQLITE_ROW) return model_error(path_, "read the offset", conn_.get());
    if (sqlite3_column_type(s, 0) != SQLITE_INTEGER || sqlite3_column_type(s, 1) != SQLITE_INTEGER ||
        sqlite3_column_int64(s, 0) < 0 || sqlite3_column_int64(s, 1) < 0)
      return Error(ErrorCode::corrupt_record, "sqlite read model " + quoted(path_) + ": the offset of projection " +
                                                  quoted(key) + " is not two non-negative integers");
    return std::optional<JournalOffset>(JournalOffset{static_cast<std::uint64_t>(sqlite3_column_int64(s, 0)),
                                                      static_cast<std::uint64_t>(sqlite3_column_int64(s, 1))});
  }

  std::int64_t changes() const noexcept { return changes_; }
  sqlite3* db() const noexcept { return conn_.get(); }
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  Connection& conn_;
  std::map<std::string, std::unique_ptr<Stmt>, std::less<>> cache_;
  std::int64_t changes_ = 0;
};

Result<void> SqliteTransaction::exec(std::string_view sql, std::initializer_list<SqlParam> params) {
  return impl_.run(sql, params, nullptr);
}

Result<std::vector<SqlRow>> SqliteTransaction::query(std::string_view sql, std::initializer_list<SqlParam> params) {
  std::vector<SqlRow> rows;
  if (auto r = impl_.run(sql, params, &rows); !r) return std::move(r).error();
  return rows;
}

std::int64_t SqliteTransaction::changes() const { return impl_.changes(); }

sqlite3* SqliteTransaction::handle() const noexcept { return impl_.db(); }

struct SqliteReadModel::State {
  SqliteReadModelOptions options;
  // Declared before the statements that use them, so destroyed after.
  Connection writer_conn;
  Connection reader_conn;
  std::mutex write_mu;  // one transaction at a time on the writing connection
  std::shared_ptr<sqlite::WriteTurns> turns;  // with the journal's writer, when in its file
  // Pages waiting to be applied (transact): whoever finds no page being
  // applied applies every waiting one, its own included, in one
  // transaction (group_mu guards the queue and `applying`).
  struct Page;
  std::mutex group_mu;
  std::condition_variable group_done;
  std::vector<Page*> waiting;
  bool applying = false;
  std::mutex read_mu;
  std::unique_ptr<SqliteTransaction::Impl> writer;
  std::unique_ptr<SqliteTransaction::Impl> reader;
};

namespace {

Result<void> open_connection(Connection& conn, const SqliteReadModelOptions& o, bool write) {
  const int flags = (write ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE : SQLITE_OPEN_READONLY) | SQLITE_OPEN_NOMUTEX;
  if (sqlite3_open_v2(o.path.c_str(), conn.out(), flags, nullptr) != SQLITE_OK)
    return model_error(o.path, write ? "open for writing" : "open for reading", conn.get());
  sqlite::fine_busy_timeout(conn.get(), o.busy_timeout_ms);
  return {};
}

// Whether the file holds an SQLite journal's tables.
Result<bool> in_journal_file(sqlite3* db, const std::string& path) {
  Stmt s;
  const char* sql = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('events', 'journal_state')";
  if (sqlite3_prepare_v2(db, sql, -1, s.out(), nullptr) != SQLITE_OK || sqlite3_step(s.get()) != SQLITE_ROW)
    return model_error(path, "look for a journal's tables", db);
  return sqlite3_column_int64(s.get(), 0) == 2;
}

}  // namespace

Result<std::shared_ptr<SqliteReadModel>> SqliteReadModel::open(SqliteReadModelOptions options) {
  if (options.path.empty()) return Error(ErrorCode::invalid_argument, "sqlite read model: an empty path");
  auto st = std::make_unique<State>();
  st->options = std::move(options);
  const auto& o = st->options;
  if (auto r = open_connection(st->writer_conn, o, true); !r) return std::move(r).error();
  st->turns = sqlite::write_turns(o.path);
  sqlite3* db = st->writer_conn.get();
  if (auto r = sqlite::exec(db, o.path, "PRAGMA journal_mode = WAL", "switch to WAL mode"); !r)
    return std::move(r).error();
  if (auto r = sqlite::exec(db, o.path, o.synchronous_full ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL",
                            "set synchronous");
      !r)
    return std::move(r).error();
  // In a journal's file (it holds the journal's tables), the journal's
  // checkpoint mark: with SQLite's default (1,000 pages) the model would find
  // the busy journal's WAL past the mark at nearly every commit and copy it
  // back itself, at the page's cost (measured under the payments load: a
  // page's apply 40 ms instead of 18 ms). In a file of its own the model
  // keeps SQLite's default.
  if (auto r = in_journal_file(db, o.path); !r) {
    return std::move(r).error();
  } else if (*r) {
    if (auto c = sqlite::exec(db, o.path, "PRAGMA wal_autocheckpoint = 8192", "set wal_autocheckpoint"); !c)
      return std::move(c).error();
  }
  if (auto r = sqlite::exec(db, o.path, kCreateOffsets, "create the offsets table"); !r) return std::move(r).error();
  if (auto r = open_connection(st->reader_conn, o, false); !r) return std::move(r).error();
  st->writer = std::make_unique<SqliteTransaction::Impl>(o.path, st->writer_conn);
  st->reader = std::make_unique<SqliteTransaction::Impl>(o.path, st->reader_conn);
  return std::shared_ptr<SqliteReadModel>(new SqliteReadModel(std::move(st)));
}

SqliteReadModel::SqliteReadModel(std::unique_ptr<State> s) : state_(std::move(s)) {}

SqliteReadModel::~SqliteReadModel() {
  // The statements go before their connections.
  state_->writer.reset();
  state_->reader.reset();
}

const std::string& SqliteReadModel::path() const noexcept { return state_->options.path; }

Result<std::optional<JournalOffset>> SqliteReadModel::load_offset(std::string_view key) {
  std::lock_guard lk(state_->write_mu);
  return state_->writer->offset(key);
}

namespace {

// Runs `body` between BEGIN IMMEDIATE and COMMIT on `w`, rolling back on
// any failure (an exception from body included).
Result<void> in_transaction(SqliteTransaction::Impl& w, const std::function<Result<void>()>& body) {
  if (auto r = w.run("BEGIN IMMEDIATE", {}, nullptr); !r) return r;
  Result<void> r = detail::guarded_body(body);
  if (r) r = w.run("COMMIT", {}, nullptr);
  if (!r && !sqlite3_get_autocommit(w.db())) (void)w.run("ROLLBACK", {}, nullptr);
  return r;
}

}  // namespace

// A page handed to transact, waiting to be applied.
struct SqliteReadModel::State::Page {
  std::string_view key;
  std::optional<JournalOffset> from;
  JournalOffset to;
  const std::function<Result<void>(SqliteTransaction&)>* body = nullptr;
  Result<void> result;
  bool done = false;
};

namespace {

// One page in its own savepoint of the group's transaction: the offset's
// compare-and-move and the handler's statements; a failure undoes this
// page only.
Result<void> apply_page(SqliteTransaction::Impl& w, const SqliteReadModel::State::Page& p) {
  if (auto r = w.run("SAVEPOINT page", {}, nullptr); !r) return r;
  Result<void> r = detail::guarded_body([&]() -> Result<void> {
    auto read = w.offset(p.key);
    if (!read) return std::move(read).error();
    const std::optional<JournalOffset> stored = *read;
    if (stored != p.from)
      return Error(ErrorCode::journal_conflict,
                   "projection " + quoted(p.key) + ": its stored offset is " +
                       (stored ? stored->to_string() : std::string("none")) + ", not " +
                       (p.from ? p.from->to_string() : std::string("none")) + " (another instance moved it)");
    SqliteTransaction tx(w);
    if (auto b = (*p.body)(tx); !b) return b;
    return w.run(kUpsertOffset, {p.key, as_int(p.to.tx), as_int(p.to.ordering), now_ms()}, nullptr);
  });
  if (!r && !sqlite3_get_autocommit(w.db())) (void)w.run("ROLLBACK TO page", {}, nullptr);
  if (!sqlite3_get_autocommit(w.db())) (void)w.run("RELEASE page", {}, nullptr);
  return r;
}

}  // namespace

// Group commit: the pages of the projections sharing this model that wait
// together (they share the writing connection, and the file's write lock
// with the journal when it is the journal's file) go in one transaction, a
// savepoint each. One wait for the lock instead of one per page.
Result<void> SqliteReadModel::transact(std::string_view key, std::optional<JournalOffset> from, JournalOffset to,
                                       const std::function<Result<void>(SqliteTransaction&)>& body) {
  auto& st = *state_;
  State::Page me{key, from, to, &body, {}, false};
  std::unique_lock q(st.group_mu);
  st.waiting.push_back(&me);
  while (!me.done) {
    if (st.applying) {
      st.group_done.wait(q);
      continue;
    }
    st.applying = true;
    std::vector<State::Page*> group;
    group.swap(st.waiting);
    q.unlock();
    {
      std::lock_guard lk(st.write_mu);
      auto& w = *st.writer;
      sqlite::WriteTurns::Turn turn(st.turns.get());
      Result<void> tx = w.run("BEGIN IMMEDIATE", {}, nullptr);
      std::size_t applied = 0;
      for (State::Page* p : group) {
        if (!tx) break;
        p->result = apply_page(w, *p);
        applied += p->result ? 1 : 0;
        // A failure that ended the transaction (SQLite rolls back on some
        // I/O errors) fails every page of the group.
        if (!p->result && sqlite3_get_autocommit(w.db())) tx = p->result;
      }
      if (tx && applied > 0) tx = w.run("COMMIT", {}, nullptr);
      if (!sqlite3_get_autocommit(w.db())) (void)w.run(tx && applied == 0 ? "COMMIT" : "ROLLBACK", {}, nullptr);
      if (!tx)
        for (State::Page* p : group)
          if (p->result) p->result = tx;
    }
    q.lock();
    for (State::Page* p : group) p->done = true;
    st.applying = false;
    st.group_done.notify_all();
  }
  return std::move(me.result);
}

Result<void> SqliteReadModel::transact(const std::function<Result<void>(SqliteTransaction&)>& body) {
  std::lock_guard lk(state_->write_mu);
  auto& w = *state_->writer;
  sqlite::WriteTurns::Turn turn(state_->turns.get());
  return in_transaction(w, [&]() -> Result<void> {
    SqliteTransaction tx(w);
    return body(tx);
  });
}

Result<std::vector<SqlRow>> SqliteReadModel::query(std::string_view sql, std::initializer_list<SqlParam> params) {
  std::lock_guard lk(state_->read_mu);
  std::vector<SqlRow> rows;
  if (auto r = state_->reader->run(sql, params, &rows); !r) return std::move(r).error();
  return rows;
}

}  // namespace troupe
