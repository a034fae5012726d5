// SqliteReminderStore (reminders.hpp): the reminders table in an SQLite
// file, on a connection of its own (WAL, busy timeout), one statement per
// call under a mutex (take_due: two, in one write transaction). The file rule and the layout are in doc/reminders.md.

#include <sqlite3.h>

#include <mutex>
#include <string>
#include <utility>

#include "../sqlite/sqlite_support.hpp"
#include "reminder_support.hpp"

namespace troupe {
namespace {

using sqlite::bind_blob;
using sqlite::Connection;
using sqlite::ResetOnExit;
using sqlite::Stmt;

// PRAGMA application_id of the SQLite journal ("trup") and of a file that
// holds reminders only ("trmd").
constexpr int kJournalApplicationId = 0x74727570;
constexpr int kRemindersApplicationId = 0x74726d64;
static_assert(kRemindersApplicationId == 1953656164, "kCreateOwnFile spells the application id in decimal");

constexpr const char* kCreateTable = R"sql(
CREATE TABLE IF NOT EXISTS reminders (
  owner       BLOB    NOT NULL,
  name        BLOB    NOT NULL,
  due_ms      INTEGER NOT NULL,
  period_ms   INTEGER NOT NULL,
  payload     BLOB    NOT NULL,
  attempts    INTEGER NOT NULL,
  next_try_ms INTEGER NOT NULL,
  last_error  TEXT    NOT NULL,
  token       INTEGER NOT NULL,
  PRIMARY KEY (owner, name)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS reminders_next_try ON reminders (next_try_ms, owner, name);
)sql";
constexpr const char* kCreateOwnFile = "PRAGMA application_id = 1953656164;";

constexpr const char* kColumns = "owner, name, due_ms, period_ms, payload, attempts, next_try_ms, last_error, token";

class SqliteReminderStore final : public ReminderStore {
 public:
  explicit SqliteReminderStore(SqliteReminderOptions o) : options_(std::move(o)) {}

  Result<void> open() {
    const std::string& path = options_.path;
    if (path.empty()) return Error(ErrorCode::invalid_argument, "sqlite reminders: no path");
    int rc = sqlite3_open_v2(path.c_str(), conn_.out(), SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                             nullptr);
    if (rc != SQLITE_OK) return failed("open");
    sqlite3_busy_timeout(db(), options_.busy_timeout_ms);
    {
      Stmt s;
      if (auto r = prepare("PRAGMA journal_mode = WAL", s); !r) return r;
      ResetOnExit reset(s.get());
      if (sqlite3_step(s.get()) != SQLITE_ROW) return failed("switch to WAL mode");
    }
    if (auto r = exec(options_.full_sync ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL", "set synchronous");
        !r)
      return r;
    if (auto r = create(); !r) return r;
    const std::string cols = kColumns;
    const std::pair<Stmt*, std::string> statements[] = {
        {&set_,
         "INSERT INTO reminders (" + cols + ") VALUES (?1, ?2, ?3, ?4, ?5, 0, ?3, '', ?6) "
         "ON CONFLICT (owner, name) DO UPDATE SET due_ms = excluded.due_ms, period_ms = excluded.period_ms, "
         "payload = excluded.payload, attempts = 0, next_try_ms = excluded.next_try_ms, last_error = '', "
         "token = excluded.token"},
        {&cancel_, "DELETE FROM reminders WHERE owner = ?1 AND name = ?2"},
        {&list_, "SELECT " + cols + " FROM reminders WHERE owner = ?1 ORDER BY name"},
        {&take_, "SELECT " + cols + " FROM reminders WHERE next_try_ms <= ?1 ORDER BY next_try_ms, owner, name LIMIT ?2"},
        // The same rows as take_ (one write transaction holds both), moved
        // to the claim's end.
        {&claim_,
         "UPDATE reminders SET next_try_ms = ?3 WHERE (owner, name) IN (SELECT owner, name FROM reminders "
         "WHERE next_try_ms <= ?1 ORDER BY next_try_ms, owner, name LIMIT ?2)"},
        {&delete_fired_, "DELETE FROM reminders WHERE owner = ?1 AND name = ?2 AND token = ?3 AND due_ms = ?4"},
        {&move_fired_,
         "UPDATE reminders SET due_ms = ?5, next_try_ms = ?5, attempts = 0, last_error = '' "
         "WHERE owner = ?1 AND name = ?2 AND token = ?3 AND due_ms = ?4"},
        {&failed_,
         "UPDATE reminders SET attempts = attempts + 1, next_try_ms = ?5, last_error = ?6 "
         "WHERE owner = ?1 AND name = ?2 AND token = ?3 AND due_ms = ?4"},
        {&summary_,
         "SELECT (SELECT count(*) FROM reminders WHERE next_try_ms <= ?1), (SELECT min(next_try_ms) FROM reminders)"},
    };
    for (const auto& [stmt, sql] : statements)
      if (auto r = prepare(sql.c_str(), *stmt); !r) return r;
    return {};
  }

  std::string_view kind() const noexcept override { return "sqlite"; }

  Result<void> set(const ReminderSpec& spec) override {
    if (auto r = reminders::check(spec); !r) return r;
    std::lock_guard lk(mu_);
    sqlite3_stmt* s = set_.get();
    ResetOnExit reset(s);
    bind_blob(s, 1, spec.owner);
    bind_blob(s, 2, spec.name);
    sqlite3_bind_int64(s, 3, spec.due_ms);
    sqlite3_bind_int64(s, 4, spec.period_ms);
    bind_blob(s, 5, spec.payload);
    sqlite3_bind_int64(s, 6, static_cast<sqlite3_int64>(reminders::new_token()));
    if (sqlite3_step(s) != SQLITE_DONE) return failed("set a reminder");
    return {};
  }

  Result<bool> cancel(std::string_view owner, std::string_view name) override {
    if (auto r = reminders::check_key(owner, name); !r) return std::move(r).error();
    std::lock_guard lk(mu_);
    sqlite3_stmt* s = cancel_.get();
    ResetOnExit reset(s);
    sqlite3_bind_blob64(s, 1, owner.data(), owner.size(), SQLITE_STATIC);
    sqlite3_bind_blob64(s, 2, name.data(), name.size(), SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_DONE) return failed("cancel a reminder");
    return sqlite3_changes(db()) > 0;
  }

  Result<std::vector<Reminder>> list(std::string_view owner) override {
    std::lock_guard lk(mu_);
    sqlite3_stmt* s = list_.get();
    ResetOnExit reset(s);
    sqlite3_bind_blob64(s, 1, owner.data(), owner.size(), SQLITE_STATIC);
    return rows(s, "list reminders");
  }

  // Under BEGIN IMMEDIATE (the file's write lock, taken first): no other
  // connection, in this process or another, takes or claims in between.
  Result<std::vector<Reminder>> take_due(std::int64_t now_ms, std::size_t limit, std::int64_t lease_ms) override {
    if (auto r = reminders::check_take(limit, lease_ms); !r) return std::move(r).error();
    const auto n = static_cast<sqlite3_int64>(std::min<std::size_t>(limit, INT64_MAX));
    std::lock_guard lk(mu_);
    if (auto r = exec("BEGIN IMMEDIATE", "begin taking due reminders"); !r) return std::move(r).error();
    auto taken = [&]() -> Result<std::vector<Reminder>> {
      std::vector<Reminder> out;
      {
        sqlite3_stmt* s = take_.get();
        ResetOnExit reset(s);
        sqlite3_bind_int64(s, 1, now_ms);
        sqlite3_bind_int64(s, 2, n);
        auto got = rows(s, "take due reminders");
        if (!got) return got;
        out = std::move(*got);
      }
      if (out.empty()) return out;
      sqlite3_stmt* c = claim_.get();
      ResetOnExit reset(c);
      sqlite3_bind_int64(c, 1, now_ms);
      sqlite3_bind_int64(c, 2, n);
      sqlite3_bind_int64(c, 3, reminders::claim_end(now_ms, lease_ms));
      if (sqlite3_step(c) != SQLITE_DONE) return failed("claim due reminders");
      return out;
    }();
    if (!taken) {
      (void)exec("ROLLBACK", "roll back");
      return taken;
    }
    if (auto r = exec("COMMIT", "commit the claim"); !r) {
      (void)exec("ROLLBACK", "roll back");
      return std::move(r).error();
    }
    return taken;
  }

  Result<bool> record_fired(const Reminder& r, std::int64_t fired_ms) override {
    std::lock_guard lk(mu_);
    sqlite3_stmt* s = r.period_ms == 0 ? delete_fired_.get() : move_fired_.get();
    ResetOnExit reset(s);
    bind_key(s, r);
    if (r.period_ms != 0) sqlite3_bind_int64(s, 5, reminders::next_due(r.due_ms, r.period_ms, fired_ms));
    if (sqlite3_step(s) != SQLITE_DONE) return failed("record a fired reminder");
    return sqlite3_changes(db()) > 0;
  }

  Result<bool> record_failed(const Reminder& r, std::int64_t retry_ms, std::string_view error) override {
    std::lock_guard lk(mu_);
    sqlite3_stmt* s = failed_.get();
    ResetOnExit reset(s);
    bind_key(s, r);
    sqlite3_bind_int64(s, 5, retry_ms);
    sqlite3_bind_text64(s, 6, error.data(), error.size(), SQLITE_STATIC, SQLITE_UTF8);
    if (sqlite3_step(s) != SQLITE_DONE) return failed("record a failed try");
    return sqlite3_changes(db()) > 0;
  }

  Result<ReminderSummary> summary(std::int64_t now_ms) override {
    std::lock_guard lk(mu_);
    sqlite3_stmt* s = summary_.get();
    ResetOnExit reset(s);
    sqlite3_bind_int64(s, 1, now_ms);
    if (sqlite3_step(s) != SQLITE_ROW) return failed("count due reminders");
    ReminderSummary out;
    out.due = static_cast<std::uint64_t>(sqlite3_column_int64(s, 0));
    if (sqlite3_column_type(s, 1) == SQLITE_INTEGER) out.next_try_ms = sqlite3_column_int64(s, 1);
    return out;
  }

 private:
  sqlite3* db() const { return conn_.get(); }

  Error failed(std::string_view doing) const {
    std::string m = "sqlite reminders " + sqlite::quoted(options_.path) + ": " + std::string(doing) + ": ";
    m += db() != nullptr ? sqlite3_errmsg(db()) : "out of memory";
    return Error(ErrorCode::journal_failed, std::move(m));
  }
  Result<void> exec(const char* sql, std::string_view doing) {
    if (sqlite3_exec(db(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) return failed(doing);
    return {};
  }
  Result<void> prepare(const char* sql, Stmt& out) {
    if (sqlite3_prepare_v3(db(), sql, -1, SQLITE_PREPARE_PERSISTENT, out.out(), nullptr) != SQLITE_OK)
      return failed("prepare a statement");
    return {};
  }

  // Under one write transaction: the file's owner is checked and the table
  // created where the rule allows it.
  Result<void> create() {
    if (auto r = exec("BEGIN IMMEDIATE", "begin creating the table"); !r) return r;
    auto made = [&]() -> Result<void> {
      auto pragma_int = [&](const char* sql, std::int64_t& v) -> Result<void> {
        Stmt s;
        if (auto r = prepare(sql, s); !r) return r;
        ResetOnExit reset(s.get());
        if (sqlite3_step(s.get()) != SQLITE_ROW) return failed(sql);
        v = sqlite3_column_int64(s.get(), 0);
        return {};
      };
      std::int64_t app = 0, version = 0, tables = 0;
      if (auto r = pragma_int("PRAGMA application_id", app); !r) return r;
      if (auto r = pragma_int("PRAGMA user_version", version); !r) return r;
      if (auto r = pragma_int("SELECT count(*) FROM sqlite_schema", tables); !r) return r;
      if (app == 0 && version == 0 && tables == 0) {
        if (auto r = exec(kCreateOwnFile, "mark the file as a reminders file"); !r) return r;
      } else if (app != kJournalApplicationId && app != kRemindersApplicationId) {
        return Error(ErrorCode::journal_failed,
                     "sqlite reminders " + sqlite::quoted(options_.path) +
                         ": the file is an SQLite database of another application (application_id " +
                         std::to_string(app) + "), neither a troupe journal nor a reminders file");
      }
      return exec(kCreateTable, "create the reminders table");
    }();
    if (!made) {
      (void)exec("ROLLBACK", "roll back");
      return made;
    }
    return exec("COMMIT", "commit the reminders table");
  }

  static void bind_key(sqlite3_stmt* s, const Reminder& r) {
    bind_blob(s, 1, r.owner);
    bind_blob(s, 2, r.name);
    sqlite3_bind_int64(s, 3, static_cast<sqlite3_int64>(r.token));
    sqlite3_bind_int64(s, 4, r.due_ms);
  }

  static std::string bytes(sqlite3_stmt* s, int col) {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(s, col));
    return p == nullptr ? std::string() : std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(s, col)));
  }

  Result<std::vector<Reminder>> rows(sqlite3_stmt* s, std::string_view doing) const {
    std::vector<Reminder> out;
    for (;;) {
      int rc = sqlite3_step(s);
      if (rc == SQLITE_DONE) return out;
      if (rc != SQLITE_ROW) return failed(doing);
      for (int c : {2, 3, 5, 6, 8})
        if (sqlite3_column_type(s, c) != SQLITE_INTEGER)
          return Error(ErrorCode::corrupt_record, "sqlite reminders " + sqlite::quoted(options_.path) + ": column " +
                                                      std::to_string(c) + " of a reminder is " +
                                                      sqlite::type_name(sqlite3_column_type(s, c)));
      Reminder r;
      r.owner = bytes(s, 0);
      r.name = bytes(s, 1);
      r.due_ms = sqlite3_column_int64(s, 2);
      r.period_ms = sqlite3_column_int64(s, 3);
      r.payload = bytes(s, 4);
      const std::int64_t attempts = sqlite3_column_int64(s, 5);
      r.next_try_ms = sqlite3_column_int64(s, 6);
      r.last_error = bytes(s, 7);
      r.token = static_cast<std::uint64_t>(sqlite3_column_int64(s, 8));
      if (attempts < 0 || attempts > UINT32_MAX || r.period_ms < 0 || r.name.empty())
        return Error(ErrorCode::corrupt_record,
                     "sqlite reminders " + sqlite::quoted(options_.path) + ": a reminder row out of range");
      r.attempts = static_cast<std::uint32_t>(attempts);
      out.push_back(std::move(r));
    }
  }

  SqliteReminderOptions options_;
  std::mutex mu_;
  Connection conn_;  // declared before the statements: destroyed after them
  Stmt set_, cancel_, list_, take_, claim_, delete_fired_, move_fired_, failed_, summary_;
};

}  // namespace

Result<std::shared_ptr<ReminderStore>> open_sqlite_reminder_store(SqliteReminderOptions options) {
  auto s = std::make_shared<SqliteReminderStore>(std::move(options));
  if (auto r = s->open(); !r) return std::move(r).error();
  return std::shared_ptr<ReminderStore>(std::move(s));
}

}  // namespace troupe
