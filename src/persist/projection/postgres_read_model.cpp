// PostgresReadModel (postgres_read_model.hpp): two libpq connections (write,
// read) with statements prepared once per connection, the offsets table and
// its compare-and-move rule, and reconnecting after the server dropped one.

#include "troupe/persist/postgres_read_model.hpp"

#include <libpq-fe.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "guarded_body.hpp"

namespace troupe {

namespace {

constexpr Oid kInt2 = 21, kInt4 = 23, kInt8 = 20, kFloat4 = 700, kFloat8 = 701;

std::int64_t as_int(std::uint64_t v) { return static_cast<std::int64_t>(std::min<std::uint64_t>(v, INT64_MAX)); }

std::int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string quote_ident(std::string_view s) {
  std::string q = "\"";
  for (char c : s) {
    q += c;
    if (c == '"') q += '"';
  }
  return q + "\"";
}

struct ResultFree {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultFree>;

}  // namespace

// One connection, its prepared statements, and the schema it works in.
class PostgresTransaction::Impl {
 public:
  Impl(std::string conninfo, std::string schema) : conninfo_(std::move(conninfo)), schema_(std::move(schema)) {}
  ~Impl() {
    if (conn_ != nullptr) PQfinish(conn_);
  }

  Result<void> connect() {
    if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return {};
    // Never a new connection inside a transaction: what follows would run
    // outside it. The transaction fails; the next one reconnects.
    if (tx_open_)
      return Error(ErrorCode::journal_failed, "postgres read model: the connection broke in a transaction: " + message());
    if (conn_ != nullptr) PQfinish(conn_);
    prepared_.clear();
    tentative_.clear();
    conn_ = PQconnectdb(conninfo_.c_str());
    if (PQstatus(conn_) != CONNECTION_OK)
      return Error(ErrorCode::journal_failed, "postgres read model: cannot connect: " + message());
    // Warnings and errors only: the NOTICEs of a setup's CREATE ... IF NOT
    // EXISTS on every start would otherwise go to stderr (libpq's default).
    ResultPtr r(PQexec(conn_, ("SET search_path TO " + quote_ident(schema_) +
                               ", public; SET client_min_messages TO warning")
                                  .c_str()));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK)
      return Error(ErrorCode::journal_failed, "postgres read model: cannot set the search path: " + message());
    return {};
  }

  // Runs `sql` with `params`; collects rows when `rows` is given.
  Result<void> run(std::string_view sql, std::initializer_list<SqlParam> params, std::vector<SqlRow>* rows) {
    if (auto c = connect(); !c) return c;
    // Prepared once per connection, in a pipeline too: the server parses
    // and plans each statement text once, not once per event.
    Result<std::string> name = pipeline_ ? prepare_in_pipeline(sql) : prepare(sql);
    if (!name) return std::move(name).error();
    std::vector<std::string> texts;
    texts.reserve(params.size());
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    for (const SqlParam& p : params) {
      if (std::holds_alternative<std::nullptr_t>(p)) {
        values.push_back(nullptr);
        lengths.push_back(0);
        formats.push_back(0);
        continue;
      }
      if (auto* v = std::get_if<std::string_view>(&p)) {
        // Bytes as they are (binary format: text and bytea take them raw).
        values.push_back(v->data());
        lengths.push_back(static_cast<int>(v->size()));
        formats.push_back(1);
        continue;
      }
      if (auto* n = std::get_if<std::int64_t>(&p)) texts.push_back(std::to_string(*n));
      else texts.push_back(std::to_string(std::get<double>(p)));
      values.push_back(texts.back().c_str());
      lengths.push_back(0);
      formats.push_back(0);
    }
    ResultPtr r;
    if (pipeline_) {
      // In a page's pipeline (begin_pipeline): sent now, answered at the
      // end; a query first collects what was sent before it, then waits
      // for its own rows.
      if (PQsendQueryPrepared(conn_, name->c_str(), static_cast<int>(values.size()), values.data(), lengths.data(),
                              formats.data(), 0) == 0)
        return Error(ErrorCode::journal_failed, "postgres read model: cannot send '" +
                                                    std::string(sql.substr(0, 200)) + "': " + message());
      ++sent_;
      changes_ = -1;  // known when the pipeline is read
      if (rows == nullptr) {
        ++pending_;
        return {};
      }
      // A query: what was sent before it (its prepare too) is read first;
      // it stays counted until its own answer is read, so a failure before
      // it leaves that answer to the page's end.
      ++pending_;
      if (auto f = flush(); !f) return f;
      if (pending_ > 1) {
        auto before = collect(pending_ - 1);
        pending_ = 1;
        if (!before) return before;
      }
      r.reset(PQgetResult(conn_));
      --pending_;
      while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);  // the statement's end
      if (!r) return Error(ErrorCode::journal_failed, "postgres read model: the pipeline broke: " + message());
      if (auto n = note(r.get(), sql); !n) return n;
    } else {
      r.reset(PQexecPrepared(conn_, name->c_str(), static_cast<int>(values.size()), values.data(), lengths.data(),
                             formats.data(), 0));
    }
    const auto st = PQresultStatus(r.get());
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) return failure(r.get(), sql);
    const char* affected = PQcmdTuples(r.get());
    changes_ = (affected != nullptr && *affected != '\0') ? std::stoll(affected) : 0;
    if (rows == nullptr || st != PGRES_TUPLES_OK) return {};
    const int n = PQntuples(r.get()), cols = PQnfields(r.get());
    for (int i = 0; i < n; ++i) {
      SqlRow row;
      row.reserve(static_cast<std::size_t>(cols));
      for (int c = 0; c < cols; ++c) {
        if (PQgetisnull(r.get(), i, c)) {
          row.emplace_back(nullptr);
          continue;
        }
        const char* v = PQgetvalue(r.get(), i, c);
        const Oid t = PQftype(r.get(), c);
        if (t == kInt2 || t == kInt4 || t == kInt8) row.emplace_back(static_cast<std::int64_t>(std::stoll(v)));
        else if (t == kFloat4 || t == kFloat8) row.emplace_back(std::stod(v));
        else row.emplace_back(std::string(v, static_cast<std::size_t>(PQgetlength(r.get(), i, c))));
      }
      rows->push_back(std::move(row));
    }
    return {};
  }

  // Text without parameters (BEGIN, COMMIT, ROLLBACK, DDL).
  Result<void> simple(const std::string& sql) {
    if (sql == "COMMIT" || sql == "ROLLBACK") {
      if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
        tx_open_ = false;
        return Error(ErrorCode::journal_failed, "postgres read model: the connection broke in a transaction");
      }
      tx_open_ = false;
    }
    if (auto c = connect(); !c) return c;
    if (sql.rfind("BEGIN", 0) == 0) tx_open_ = true;
    ResultPtr r(PQexec(conn_, sql.c_str()));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) return failure(r.get(), sql);
    return {};
  }

  bool in_transaction() const { return tx_open_; }
  bool in_pipeline() const { return pipeline_; }

  // A page as one pipeline (libpq pipeline mode): BEGIN and `setup` sent
  // first, then the statements as the handler makes them, their results
  // read once, at end_pipeline: one round trip for the page.
  Result<void> begin_pipeline(std::initializer_list<const char*> setup) {
    if (auto c = connect(); !c) return c;
    if (PQenterPipelineMode(conn_) == 0)
      return Error(ErrorCode::journal_failed, "postgres read model: cannot enter pipeline mode: " + message());
    pipeline_ = true;
    pending_ = sent_ = read_ = 0;
    first_failed_ = -1;
    tentative_.clear();
    tx_open_ = true;
    if (auto r = send_plain("BEGIN"); !r) return r;
    for (const char* sql : setup)
      if (auto r = send_plain(sql); !r) return r;
    return {};
  }

  // Statements sent in the open pipeline so far: the last one sent is
  // number sent() - 1.
  int sent() const noexcept { return sent_; }
  // The number of the pipeline's first statement that failed (-1: none);
  // last_state() is its SQLSTATE.
  int first_failed() const noexcept { return first_failed_; }

  // Ends the pipeline: sends COMMIT when `body` succeeded, syncs, reads every
  // result, and rolls back on the first failure (which it returns, or
  // body's own).
  Result<void> end_pipeline(Result<void> body) {
    if (body) body = send_plain("COMMIT");
    Result<void> read = sync();
    pipeline_ = false;
    if (PQexitPipelineMode(conn_) == 0 && read) read = Error(ErrorCode::journal_failed, "postgres read model: " + message());
    if (body && read) {
      tx_open_ = false;
      tentative_.clear();
      return {};
    }
    for (Prepared p : tentative_) prepared_.erase(p);
    tentative_.clear();
    (void)simple("ROLLBACK");
    return body ? read : body;
  }

 private:
  Result<void> send_plain(const char* sql) {
    if (PQsendQueryParams(conn_, sql, 0, nullptr, nullptr, nullptr, nullptr, 0) == 0)
      return Error(ErrorCode::journal_failed, std::string("postgres read model: cannot send ") + sql + ": " + message());
    ++pending_;
    ++sent_;
    return {};
  }

  // Notes the pipeline's next result read (number read_): the first that
  // failed, with its SQLSTATE (failure() keeps it).
  Result<void> note(const PGresult* r, std::string_view what) {
    const int at = read_++;
    const auto st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_PIPELINE_ABORTED) return {};
    if (first_failed_ >= 0) return Error(ErrorCode::journal_failed, "postgres read model: " + std::string(what));
    first_failed_ = at;
    return failure(r, what);
  }

  Result<void> flush() {
    if (PQsendFlushRequest(conn_) == 0 || PQflush(conn_) != 0)
      return Error(ErrorCode::journal_failed, "postgres read model: cannot send the pipeline: " + message());
    return {};
  }

  // Reads the results of what was sent (each followed by its end), keeping
  // the first failure.
  Result<void> collect(int n) {
    Result<void> first;
    for (int i = 0; i < n; ++i) {
      ResultPtr r(PQgetResult(conn_));
      if (!r) {
        if (first) first = Error(ErrorCode::journal_failed, "postgres read model: the pipeline broke: " + message());
        pending_ = 0;
        return first;
      }
      if (auto noted = note(r.get(), "a statement of the page"); !noted && first) first = std::move(noted);
      while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);
    }
    pending_ = 0;
    return first;
  }

  // Ends the pipeline's statements with a sync and reads everything.
  Result<void> sync() {
    if (PQpipelineSync(conn_) == 0)
      return Error(ErrorCode::journal_failed, "postgres read model: cannot sync the pipeline: " + message());
    Result<void> r = collect(pending_);
    ResultPtr s(PQgetResult(conn_));
    if (r && (!s || PQresultStatus(s.get()) != PGRES_PIPELINE_SYNC))
      r = Error(ErrorCode::journal_failed, "postgres read model: the pipeline did not end: " + message());
    return r;
  }

 public:
  std::int64_t changes() const noexcept { return changes_; }
  PGconn* conn() const noexcept { return conn_; }
  const std::string& schema() const noexcept { return schema_; }
  // The SQLSTATE of the last failure ("" for none).
  const std::string& last_state() const noexcept { return state_; }

 private:
  Result<std::string> prepare(std::string_view sql) {
    auto it = prepared_.find(sql);
    if (it != prepared_.end()) return it->second;
    std::string name = "rm" + std::to_string(++statements_);
    ResultPtr r(PQprepare(conn_, name.c_str(), std::string(sql).c_str(), 0, nullptr));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      auto e = failure(r.get(), sql);
      return std::move(e).error();
    }
    prepared_.emplace(std::string(sql), name);
    return name;
  }

  // As prepare, sent in the pipeline: its answer is read with the page's.
  // Until the page's end shows every statement succeeded, the name is
  // tentative: a failed or aborted pipeline forgets it (names are never
  // reused, so one the server kept anyway does not collide).
  Result<std::string> prepare_in_pipeline(std::string_view sql) {
    auto it = prepared_.find(sql);
    if (it != prepared_.end()) return it->second;
    std::string name = "rm" + std::to_string(++statements_);
    if (PQsendPrepare(conn_, name.c_str(), std::string(sql).c_str(), 0, nullptr) == 0)
      return Error(ErrorCode::journal_failed, "postgres read model: cannot prepare '" +
                                                  std::string(sql.substr(0, 200)) + "': " + message());
    ++pending_;
    ++sent_;
    tentative_.push_back(prepared_.emplace(std::string(sql), name).first);
    return name;
  }

  Result<void> failure(const PGresult* r, std::string_view sql) {
    const char* code = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    state_ = code != nullptr ? code : "";
    return Error(ErrorCode::journal_failed, "postgres read model: '" + std::string(sql.substr(0, 200)) +
                                                "' failed" + (state_.empty() ? "" : " (" + state_ + ")") + ": " +
                                                message());
  }

  std::string message() const {
    std::string m = conn_ != nullptr ? PQerrorMessage(conn_) : "out of memory";
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.pop_back();
    return m;
  }

  std::string conninfo_;
  std::string schema_;
  PGconn* conn_ = nullptr;
  std::map<std::string, std::string, std::less<>> prepared_;  // sql -> statement name
  using Prepared = std::map<std::string, std::string, std::less<>>::iterator;
  std::vector<Prepared> tentative_;  // prepared in the open pipeline
  std::uint64_t statements_ = 0;     // names handed out on this object
  std::int64_t changes_ = 0;
  std::string state_;
  bool tx_open_ = false;   // between BEGIN and COMMIT/ROLLBACK
  bool pipeline_ = false;  // between begin_pipeline and end_pipeline
  int pending_ = 0;        // statements sent in the pipeline, not yet read
  int sent_ = 0;           // statements sent in the pipeline (prepares too)
  int read_ = 0;           // their results read
  int first_failed_ = -1;  // the first failed one's number
};

Result<void> PostgresTransaction::exec(std::string_view sql, std::initializer_list<SqlParam> params) {
  return impl_.run(sql, params, nullptr);
}

Result<std::vector<SqlRow>> PostgresTransaction::query(std::string_view sql, std::initializer_list<SqlParam> params) {
  std::vector<SqlRow> rows;
  if (auto r = impl_.run(sql, params, &rows); !r) return std::move(r).error();
  return rows;
}

std::int64_t PostgresTransaction::changes() const { return impl_.changes(); }

pg_conn* PostgresTransaction::handle() const noexcept { return impl_.conn(); }

struct PostgresReadModel::State {
  PostgresReadModelOptions options;
  std::mutex write_mu;
  std::condition_variable writer_free;
  std::vector<std::unique_ptr<PostgresTransaction::Impl>> idle;  // guarded by write_mu
  std::size_t writers = 0;                                       // made so far; guarded by write_mu
  std::mutex setup_mu;  // transact(body): one at a time
  std::mutex read_mu;
  std::unique_ptr<PostgresTransaction::Impl> reader;  // guarded by read_mu
};

namespace {

// A write connection, taken from the idle ones (or made, up to
// max_writers; else waited for) and given back when the lease ends.
class WriterLease {
 public:
  explicit WriterLease(PostgresReadModel::State& s) : s_(s) {
    std::unique_lock lk(s_.write_mu);
    s_.writer_free.wait(lk, [&] { return !s_.idle.empty() || s_.writers < s_.options.max_writers; });
    if (!s_.idle.empty()) {
      w_ = std::move(s_.idle.back());
      s_.idle.pop_back();
    } else {
      ++s_.writers;
      w_ = std::make_unique<PostgresTransaction::Impl>(s_.options.conninfo, s_.options.schema);
    }
  }
  ~WriterLease() {
    {
      std::lock_guard lk(s_.write_mu);
      s_.idle.push_back(std::move(w_));
    }
    s_.writer_free.notify_one();
  }
  WriterLease(const WriterLease&) = delete;
  WriterLease& operator=(const WriterLease&) = delete;
  PostgresTransaction::Impl& operator*() const noexcept { return *w_; }

 private:
  PostgresReadModel::State& s_;
  std::unique_ptr<PostgresTransaction::Impl> w_;
};

}  // namespace

namespace {

constexpr const char* kSelectOffset = "SELECT tx, ordering FROM troupe_projection_offsets WHERE projection = $1";
// The compare-and-move: the row must hold what the projection read. It
// runs in the page's pipeline, ahead of the page's statements and COMMIT,
// so a row that holds something else must fail the statement (and with it
// the transaction), not just change nothing: dividing by the count of rows
// moved does that, with SQLSTATE 22012 at this statement's place.
constexpr const char* kMoveOffset =
    "WITH moved AS (UPDATE troupe_projection_offsets SET tx = $2, ordering = $3, updated_ms = $6 "
    "WHERE projection = $1 AND tx = $4 AND ordering = $5 RETURNING 1) SELECT 1 / count(*)::int FROM moved";
constexpr const char* kFirstOffset =
    "INSERT INTO troupe_projection_offsets (projection, tx, ordering, updated_ms) VALUES ($1, $2, $3, $4)";
constexpr std::string_view kUniqueViolation = "23505";
constexpr std::string_view kDivisionByZero = "22012";

Error moved(std::string_view key, std::optional<JournalOffset> from) {
  return Error(ErrorCode::journal_conflict, "projection '" + std::string(key) + "': its stored offset is no longer " +
                                                (from ? from->to_string() : std::string("none")) +
                                                " (another instance moved it)");
}

Result<void> in_transaction(PostgresTransaction::Impl& w, const std::function<Result<void>()>& body) {
  if (auto r = w.simple("BEGIN"); !r) return r;
  Result<void> r = detail::guarded_body(body);
  if (r) r = w.simple("COMMIT");
  if (!r && w.in_transaction()) (void)w.simple("ROLLBACK");
  return r;
}

}  // namespace

Result<std::shared_ptr<PostgresReadModel>> PostgresReadModel::open(PostgresReadModelOptions options) {
  if (options.conninfo.empty()) return Error(ErrorCode::invalid_argument, "postgres read model: an empty conninfo");
  if (options.schema.empty() || options.schema.find('\0') != std::string::npos)
    return Error(ErrorCode::invalid_argument, "postgres read model: the schema name is empty or holds a NUL");
  if (options.max_writers == 0)
    return Error(ErrorCode::invalid_argument, "postgres read model: max_writers must be at least 1");
  auto st = std::make_unique<State>();
  st->options = std::move(options);
  st->writers = 1;
  st->idle.push_back(std::make_unique<PostgresTransaction::Impl>(st->options.conninfo, st->options.schema));
  st->reader = std::make_unique<PostgresTransaction::Impl>(st->options.conninfo, st->options.schema);
  auto& w = *st->idle.back();
  if (auto r = w.simple("CREATE SCHEMA IF NOT EXISTS " + quote_ident(st->options.schema)); !r) {
    // Another process may create it at the same moment.
    if (w.last_state() != kUniqueViolation) return std::move(r).error();
  }
  if (auto r = w.simple("CREATE TABLE IF NOT EXISTS troupe_projection_offsets (projection text PRIMARY KEY, "
                        "tx bigint NOT NULL, ordering bigint NOT NULL, updated_ms bigint NOT NULL)");
      !r && w.last_state() != kUniqueViolation)
    return std::move(r).error();
  if (auto r = st->reader->connect(); !r) return std::move(r).error();
  return std::shared_ptr<PostgresReadModel>(new PostgresReadModel(std::move(st)));
}

PostgresReadModel::PostgresReadModel(std::unique_ptr<State> s) : state_(std::move(s)) {}

PostgresReadModel::~PostgresReadModel() = default;

const std::string& PostgresReadModel::schema() const noexcept { return state_->options.schema; }

Result<std::optional<JournalOffset>> PostgresReadModel::load_offset(std::string_view key) {
  WriterLease w(*state_);
  std::vector<SqlRow> rows;
  if (auto r = (*w).run(kSelectOffset, {key}, &rows); !r) return std::move(r).error();
  if (rows.empty()) return std::optional<JournalOffset>{};
  std::int64_t tx = -1, ordering = -1;
  if (rows.front().size() == 2) {
    std::visit([&](const auto& v) { if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::int64_t>) tx = v; },
               rows.front().front());
    std::visit([&](const auto& v) { if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::int64_t>) ordering = v; },
               rows.front().back());
  }
  if (tx < 0 || ordering < 0)
    return Error(ErrorCode::corrupt_record, "postgres read model: the offset of projection '" + std::string(key) +
                                                "' is not two non-negative integers");
  return std::optional<JournalOffset>(JournalOffset{static_cast<std::uint64_t>(tx), static_cast<std::uint64_t>(ordering)});
}

Result<void> PostgresReadModel::transact(std::string_view key, std::optional<JournalOffset> from, JournalOffset to,
                                         const std::function<Result<void>(PostgresTransaction&)>& body) {
  WriterLease lease(*state_);
  auto& w = *lease;
  // The whole page is one pipeline, one round trip (more only where the
  // handler reads): BEGIN, then no wait for the WAL flush (a crash that
  // loses the page loses its offset with it, in one transaction, so it is
  // applied again: exactly once holds, and only the journal's own commits
  // must be durable), the offset's move, the page, COMMIT.
  if (auto r = w.begin_pipeline({"SET LOCAL synchronous_commit TO off"}); !r)
    return w.in_pipeline() ? w.end_pipeline(std::move(r)) : r;
  // The offset moves first: its row lock holds off a second instance
  // until this transaction ends, and then its compare fails.
  Result<void> r = from ? w.run(kMoveOffset, {key, as_int(to.tx), as_int(to.ordering), as_int(from->tx),
                                              as_int(from->ordering), now_ms()},
                                nullptr)
                        : w.run(kFirstOffset, {key, as_int(to.tx), as_int(to.ordering), now_ms()}, nullptr);
  const int move = w.sent() - 1;
  if (r) r = detail::guarded_body([&] {
    PostgresTransaction tx(w);
    return body(tx);
  });
  r = w.end_pipeline(std::move(r));
  const std::string_view refused = from ? kDivisionByZero : kUniqueViolation;
  if (!r && w.first_failed() == move && w.last_state() == refused) return moved(key, from);
  return r;
}

Result<void> PostgresReadModel::transact(const std::function<Result<void>(PostgresTransaction&)>& body) {
  // One at a time in this process, on whichever connection: these are the
  // handlers' setups, whose CREATE ... IF NOT EXISTS run at once on two
  // connections may fail one of them.
  std::lock_guard one(state_->setup_mu);
  WriterLease lease(*state_);
  auto& w = *lease;
  return in_transaction(w, [&]() -> Result<void> {
    PostgresTransaction tx(w);
    return body(tx);
  });
}

Result<std::vector<SqlRow>> PostgresReadModel::query(std::string_view sql, std::initializer_list<SqlParam> params) {
  std::lock_guard lk(state_->read_mu);
  std::vector<SqlRow> rows;
  if (auto r = state_->reader->run(sql, params, &rows); !r) return std::move(r).error();
  return rows;
}

}  // namespace troupe
