// PostgresReminderStore (reminders.hpp): <schema>.reminders over one libpq
// connection, one statement per call under a mutex. Layout in
// doc/reminders.md.

#include <libpq-fe.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "../postgres/pg_support.hpp"
#include "reminder_support.hpp"

namespace troupe {
namespace {

using pg::Outcome;
using pg::Params;

class PostgresReminderStore final : public ReminderStore {
 public:
  explicit PostgresReminderStore(PostgresReminderOptions o) : options_(std::move(o)) {
    std::string q = "\"";
    for (char ch : options_.schema) {
      q += ch;
      if (ch == '"') q += '"';
    }
    table_ = q + "\".reminders";
    quoted_schema_ = q + "\"";
  }

  Result<void> open() {
    if (options_.schema.empty()) return Error(ErrorCode::invalid_argument, "postgres reminders: no schema");
    conn_.reset(PQconnectdb(options_.conninfo.c_str()));
    if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK)
      return Error(ErrorCode::journal_failed,
                   "postgres reminders: cannot connect: " + (conn_ ? pg::trim(PQerrorMessage(conn_.get())) : "no memory"));
    // "already exists, skipping" and the like are not for stderr.
    PQsetNoticeProcessor(conn_.get(), [](void*, const char*) {}, nullptr);
    // One creator at a time: concurrent CREATE ... IF NOT EXISTS can clash.
    const std::string sql = "BEGIN; SELECT pg_advisory_xact_lock(" +
                            std::to_string(pg::fence_lock(options_.schema, "reminders")) +
                            "); CREATE SCHEMA IF NOT EXISTS " + quoted_schema_ + "; CREATE TABLE IF NOT EXISTS " +
                            table_ +
                            " (owner bytea NOT NULL, name bytea NOT NULL, due_ms bigint NOT NULL, "
                            "period_ms bigint NOT NULL, payload bytea NOT NULL, attempts bigint NOT NULL, "
                            "next_try_ms bigint NOT NULL, last_error bytea NOT NULL, token bigint NOT NULL, "
                            "PRIMARY KEY (owner, name)); CREATE INDEX IF NOT EXISTS reminders_next_try ON " +
                            table_ + " (next_try_ms, owner, name); COMMIT";
    pg::PgResult r(PQexec(conn_.get(), sql.c_str()));
    if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      std::string m = pg::trim(PQerrorMessage(conn_.get()));
      pg::PgResult rb(PQexec(conn_.get(), "ROLLBACK"));
      return Error(ErrorCode::journal_failed, "postgres reminders: create the table: " + m);
    }
    return {};
  }

  std::string_view kind() const noexcept override { return "postgres"; }

  Result<void> set(const ReminderSpec& spec) override {
    if (auto r = reminders::check(spec); !r) return r;
    Params p;
    p.bytes(spec.owner);
    p.bytes(spec.name);
    p.int8(spec.due_ms);
    p.int8(spec.period_ms);
    p.bytes(spec.payload);
    p.int8(static_cast<std::int64_t>(reminders::new_token()));
    auto o = call("INSERT INTO " + table_ + " (" + kColumns +
                      ") VALUES ($1, $2, $3, $4, $5, 0, $3, '', $6) ON CONFLICT (owner, name) DO UPDATE SET "
                      "due_ms = excluded.due_ms, period_ms = excluded.period_ms, payload = excluded.payload, "
                      "attempts = 0, next_try_ms = excluded.next_try_ms, last_error = '', token = excluded.token",
                  p, "set a reminder");
    if (!o) return std::move(o).error();
    return {};
  }

  Result<bool> cancel(std::string_view owner, std::string_view name) override {
    if (auto r = reminders::check_key(owner, name); !r) return std::move(r).error();
    const std::string o(owner), n(name);
    Params p;
    p.bytes(o);
    p.bytes(n);
    return changed(call("DELETE FROM " + table_ + " WHERE owner = $1 AND name = $2", p, "cancel a reminder"));
  }

  Result<std::vector<Reminder>> list(std::string_view owner) override {
    const std::string o(owner);
    Params p;
    p.bytes(o);
    return rows(call("SELECT " + std::string(kColumns) + " FROM " + table_ + " WHERE owner = $1 ORDER BY name", p,
                     "list reminders"));
  }

  // One statement: the due rows are locked (rows another caller is
  // claiming right now are skipped, not waited for), moved to the claim's
  // end and returned with the try time they were taken at.
  Result<std::vector<Reminder>> take_due(std::int64_t now_ms, std::size_t limit, std::int64_t lease_ms) override {
    if (auto r = reminders::check_take(limit, lease_ms); !r) return std::move(r).error();
    Params p;
    p.int8(now_ms);
    p.int8(static_cast<std::int64_t>(std::min<std::size_t>(limit, INT64_MAX)));
    p.int8(reminders::claim_end(now_ms, lease_ms));
    auto got = rows(call("UPDATE " + table_ +
                             " AS t SET next_try_ms = $3 FROM (SELECT owner, name, next_try_ms FROM " + table_ +
                             " WHERE next_try_ms <= $1 ORDER BY next_try_ms, owner, name LIMIT $2 FOR UPDATE SKIP "
                             "LOCKED) AS d WHERE t.owner = d.owner AND t.name = d.name RETURNING t.owner, t.name, "
                             "t.due_ms, t.period_ms, t.payload, t.attempts, d.next_try_ms, t.last_error, t.token",
                         p, "take due reminders"));
    if (!got) return got;
    // RETURNING keeps no order: the contract's is restored here (bytea
    // compares bytewise, as std::string does).
    std::sort(got->begin(), got->end(), [](const Reminder& a, const Reminder& b) {
      return std::tie(a.next_try_ms, a.owner, a.name) < std::tie(b.next_try_ms, b.owner, b.name);
    });
    return got;
  }

  Result<bool> record_fired(const Reminder& r, std::int64_t fired_ms) override {
    Params p = key(r);
    if (r.period_ms == 0)
      return changed(call("DELETE FROM " + table_ + " WHERE owner = $1 AND name = $2 AND token = $3 AND due_ms = $4",
                          p, "record a fired reminder"));
    p.int8(reminders::next_due(r.due_ms, r.period_ms, fired_ms));
    return changed(call("UPDATE " + table_ +
                            " SET due_ms = $5, next_try_ms = $5, attempts = 0, last_error = '' "
                            "WHERE owner = $1 AND name = $2 AND token = $3 AND due_ms = $4",
                        p, "record a fired reminder"));
  }

  Result<bool> record_failed(const Reminder& r, std::int64_t retry_ms, std::string_view error) override {
    const std::string why(error);
    Params p = key(r);
    p.int8(retry_ms);
    p.bytes(why);
    return changed(call("UPDATE " + table_ +
                            " SET attempts = attempts + 1, next_try_ms = $5, last_error = $6 "
                            "WHERE owner = $1 AND name = $2 AND token = $3 AND due_ms = $4",
                        p, "record a failed try"));
  }

  Result<ReminderSummary> summary(std::int64_t now_ms) override {
    Params p;
    p.int8(now_ms);
    auto o = call("SELECT (SELECT count(*) FROM " + table_ + " WHERE next_try_ms <= $1), (SELECT min(next_try_ms) FROM " +
                      table_ + ")",
                  p, "count due reminders");
    if (!o) return std::move(o).error();
    const PGresult* res = o->res.get();
    if (PQntuples(res) != 1 || PQnfields(res) != 2 || PQgetisnull(res, 0, 0) || PQgetlength(res, 0, 0) != 8)
      return Error(ErrorCode::journal_failed, "postgres reminders: the count has the wrong shape");
    ReminderSummary s;
    s.due = static_cast<std::uint64_t>(pg::read_int8(PQgetvalue(res, 0, 0)));
    if (!PQgetisnull(res, 0, 1)) s.next_try_ms = pg::read_int8(PQgetvalue(res, 0, 1));
    return s;
  }

 private:
  static constexpr const char* kColumns =
      "owner, name, due_ms, period_ms, payload, attempts, next_try_ms, last_error, token";

  static Params key(const Reminder& r) {
    Params p;
    p.bytes(r.owner);
    p.bytes(r.name);
    p.int8(static_cast<std::int64_t>(r.token));
    p.int8(r.due_ms);
    return p;
  }

  Result<Outcome> call(const std::string& sql, const Params& p, std::string_view doing) {
    std::lock_guard lk(mu_);
    if (PQstatus(conn_.get()) != CONNECTION_OK) PQreset(conn_.get());
    Outcome o = pg::run(conn_.get(), sql, &p);
    if (!o.ok) {
      std::string m = "postgres reminders: " + std::string(doing) + ": " + o.message;
      if (!o.sqlstate.empty()) m += " (SQLSTATE " + o.sqlstate + ")";
      return Error(ErrorCode::journal_failed, std::move(m));
    }
    return o;
  }

  static Result<bool> changed(Result<Outcome> o) {
    if (!o) return std::move(o).error();
    return std::string_view(PQcmdTuples(o->res.get())) != "0";
  }

  static std::string bytes(const PGresult* r, int row, int col) {
    return std::string(PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col)));
  }

  static Result<std::vector<Reminder>> rows(Result<Outcome> o) {
    if (!o) return std::move(o).error();
    const PGresult* res = o->res.get();
    if (PQnfields(res) != 9) return Error(ErrorCode::journal_failed, "postgres reminders: rows of the wrong shape");
    std::vector<Reminder> out;
    const int n = PQntuples(res);
    out.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      for (int c : {2, 3, 5, 6, 8})
        if (PQgetisnull(res, i, c) || PQgetlength(res, i, c) != 8)
          return Error(ErrorCode::corrupt_record, "postgres reminders: column " + std::to_string(c) +
                                                      " of a reminder is not a bigint");
      Reminder r;
      r.owner = bytes(res, i, 0);
      r.name = bytes(res, i, 1);
      r.due_ms = pg::read_int8(PQgetvalue(res, i, 2));
      r.period_ms = pg::read_int8(PQgetvalue(res, i, 3));
      r.payload = bytes(res, i, 4);
      const std::int64_t attempts = pg::read_int8(PQgetvalue(res, i, 5));
      r.next_try_ms = pg::read_int8(PQgetvalue(res, i, 6));
      r.last_error = bytes(res, i, 7);
      r.token = static_cast<std::uint64_t>(pg::read_int8(PQgetvalue(res, i, 8)));
      if (attempts < 0 || attempts > UINT32_MAX || r.period_ms < 0 || r.name.empty())
        return Error(ErrorCode::corrupt_record, "postgres reminders: a reminder row out of range");
      r.attempts = static_cast<std::uint32_t>(attempts);
      out.push_back(std::move(r));
    }
    return out;
  }

  PostgresReminderOptions options_;
  std::string quoted_schema_, table_;
  std::mutex mu_;
  pg::PgConn conn_;
};

}  // namespace

Result<std::shared_ptr<ReminderStore>> open_postgres_reminder_store(PostgresReminderOptions options) {
  auto s = std::make_shared<PostgresReminderStore>(std::move(options));
  if (auto r = s->open(); !r) return std::move(r).error();
  return std::shared_ptr<ReminderStore>(std::move(s));
}

}  // namespace troupe
