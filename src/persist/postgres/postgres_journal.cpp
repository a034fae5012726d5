// PostgresJournal: one writer thread with group commit and savepoints, reader
// threads with their own connections, reconnect with back-off. Table
// layout, encoding and the rules enforced here are documented in
// doc/journal.md ("PostgreSQL"); keep the two in step.

#include "troupe/persist/postgres_journal.hpp"

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace troupe {
namespace {

using Clock = std::chrono::steady_clock;

// The layout below; stored in <schema>.journal_schema. A higher number was
// written by a newer troupe: refuse it rather than misread it.
constexpr std::int64_t kSchemaVersion = 1;
constexpr std::uint64_t kMaxSeq = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
constexpr std::size_t kMaxCachedIds = std::size_t{1} << 20;
// PostgreSQL takes at most 65535 parameters per statement: 1 + 5 per row.
constexpr std::size_t kRowsPerInsert = 10000;
// Type OIDs (pg_type.h is a server header).
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;

struct ResultDeleter {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using PgResult = std::unique_ptr<PGresult, ResultDeleter>;
struct ConnDeleter {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
using PgConn = std::unique_ptr<PGconn, ConnDeleter>;


// Printable form of an id that may hold any byte.
std::string printable(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Big-endian int8 parameter buffer.
struct Int8 {
  char b[8];
  explicit Int8(std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 7; i >= 0; --i) {
      b[i] = static_cast<char>(u & 0xff);
      u >>= 8;
    }
  }
};

std::int64_t read_int8(const char* p) {
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u = (u << 8) | static_cast<unsigned char>(p[i]);
  return static_cast<std::int64_t>(u);
}

// Parameters of one statement, all sent in binary.
class Params {
 public:
  void bytes(const std::string& s) { add(s.data(), s.size(), kByteaOid); }
  void int8(std::int64_t v) {
    ints_.push_back(std::make_unique<Int8>(v));
    add(ints_.back()->b, 8, kInt8Oid);
  }
  int size() const { return static_cast<int>(values_.size()); }
  const char* const* values() const { return values_.data(); }
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }
  const Oid* types() const { return types_.data(); }

 private:
  void add(const char* p, std::size_t n, Oid t) {
    values_.push_back(p);
    lengths_.push_back(static_cast<int>(n));
    formats_.push_back(1);
    types_.push_back(t);
  }
  std::vector<std::unique_ptr<Int8>> ints_;
  std::vector<const char*> values_;
  std::vector<int> lengths_, formats_;
  std::vector<Oid> types_;
};

// The outcome of one statement.
struct Outcome {
  PgResult res;
  bool ok = false;
  bool lost = false;     // the connection is gone
  std::string sqlstate;  // on failure, when the server sent one
  std::string message;
};

Outcome run(PGconn* c, const std::string& sql, const Params* p = nullptr) {
  Outcome o;
  PGresult* r = p == nullptr ? PQexecParams(c, sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 1)
                             : PQexecParams(c, sql.c_str(), p->size(), p->types(), p->values(), p->lengths(),
                                            p->formats(), 1);
  o.res.reset(r);
  ExecStatusType st = r != nullptr ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  o.ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!o.ok) {
    if (r != nullptr) {
      const char* s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
      if (s != nullptr) o.sqlstate = s;
      o.message = trim(PQresultErrorMessage(r));
    }
    if (o.message.empty()) o.message = trim(PQerrorMessage(c));
    o.lost = PQstatus(c) == CONNECTION_BAD;
    if (o.message.empty()) o.message = "no result from the server";
  }
  return o;
}

Error closed_error() { return Error(ErrorCode::journal_failed, "postgres journal is closed"); }

// The SQL this journal runs, with the schema's quoted name filled in.
struct Sql {
  std::string create, lock, version_table_exists, read_version;
  std::string highest, delete_events, upsert_deletion, insert_snapshot, prune_snapshots;
  std::string select_events, select_snapshot, events_prefix;

  explicit Sql(const std::string& s) {  // s: the quoted schema identifier
    create = "CREATE SCHEMA IF NOT EXISTS " + s + ";" +
             "CREATE TABLE " + s + ".events (persistence_id bytea NOT NULL, seq bigint NOT NULL, "
             "timestamp_ms bigint, type bytea, version bigint, payload bytea, PRIMARY KEY (persistence_id, seq));" +
             "CREATE TABLE " + s + ".deletions (persistence_id bytea NOT NULL PRIMARY KEY, "
             "deleted_to bigint NOT NULL);" +
             "CREATE TABLE " + s + ".snapshots (persistence_id bytea NOT NULL, seq bigint NOT NULL, "
             "timestamp_ms bigint, type bytea, version bigint, payload bytea, PRIMARY KEY (persistence_id, seq));" +
             "CREATE TABLE " + s + ".journal_schema (version bigint NOT NULL);" +
             "INSERT INTO " + s + ".journal_schema (version) VALUES (" + std::to_string(kSchemaVersion) + ")";
    // Serializes first opens racing to create the tables (key: "trup").
    lock = "SELECT pg_advisory_xact_lock(1953658224)";
    version_table_exists = "SELECT to_regclass('" + s + ".journal_schema') IS NOT NULL";
    read_version = "SELECT max(version) FROM " + s + ".journal_schema";
    highest = "SELECT (SELECT max(seq) FROM " + s + ".events WHERE persistence_id = $1), "
              "(SELECT deleted_to FROM " + s + ".deletions WHERE persistence_id = $1)";
    delete_events = "DELETE FROM " + s + ".events WHERE persistence_id = $1 AND seq <= $2";
    upsert_deletion = "INSERT INTO " + s + ".deletions AS d (persistence_id, deleted_to) VALUES ($1, $2) "
                      "ON CONFLICT (persistence_id) DO UPDATE SET deleted_to = "
                      "greatest(d.deleted_to, excluded.deleted_to)";
    insert_snapshot = "INSERT INTO " + s + ".snapshots (persistence_id, seq, timestamp_ms, type, version, payload) "
                      "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (persistence_id, seq) DO UPDATE SET "
                      "timestamp_ms = excluded.timestamp_ms, type = excluded.type, version = excluded.version, "
                      "payload = excluded.payload";
    prune_snapshots = "DELETE FROM " + s + ".snapshots WHERE persistence_id = $1 AND "
                      "seq < (SELECT max(seq) FROM " + s + ".snapshots WHERE persistence_id = $1)";
    select_events = "SELECT seq, timestamp_ms, type, version, payload FROM " + s + ".events "
                    "WHERE persistence_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq";
    select_snapshot = "SELECT seq, timestamp_ms, type, version, payload FROM " + s + ".snapshots "
                      "WHERE persistence_id = $1 ORDER BY seq DESC LIMIT 1";
    events_prefix = "INSERT INTO " + s + ".events (persistence_id, seq, timestamp_ms, type, version, payload) VALUES ";
  }
};

// Reads the five record columns of row `row`, checking types, nulls and
// ranges: anything this journal would not have written is corrupt_record.
template <class Record>
Result<void> read_record(const PGresult* r, int row, const std::string& id, const char* what,
                         std::int64_t min_seq, Record& out) {
  auto corrupt = [&](const std::string& seq_text, const std::string& why) {
    return Error(ErrorCode::corrupt_record, "postgres journal: corrupt " + std::string(what) +
                                                " of persistence id " + printable(id) + " seq " + seq_text +
                                                ": " + why);
  };
  static const char* names[] = {"seq", "timestamp_ms", "type", "version", "payload"};
  static const Oid types[] = {kInt8Oid, kInt8Oid, kByteaOid, kInt8Oid, kByteaOid};
  std::string seq_text = "?";
  for (int col = 0; col < 5; ++col) {
    if (PQftype(r, col) != types[col])
      return corrupt(seq_text, std::string(names[col]) + " has type oid " + std::to_string(PQftype(r, col)));
    if (PQgetisnull(r, row, col) != 0)
      return corrupt(seq_text, std::string(names[col]) + " is NULL, expected " +
                                   (types[col] == kInt8Oid ? "bigint" : "bytea"));
    if (types[col] == kInt8Oid && PQgetlength(r, row, col) != 8)
      return corrupt(seq_text, std::string(names[col]) + " is not an 8-byte bigint");
    if (col == 0) {
      std::int64_t seq = read_int8(PQgetvalue(r, row, 0));
      seq_text = std::to_string(seq);
      if (seq < min_seq) return corrupt(seq_text, "seq is below " + std::to_string(min_seq));
    }
  }
  std::int64_t version = read_int8(PQgetvalue(r, row, 3));
  if (version < 0 || version > std::int64_t{std::numeric_limits<std::uint32_t>::max()})
    return corrupt(seq_text, "version " + std::to_string(version) + " is outside 0.." +
                                 std::to_string(std::numeric_limits<std::uint32_t>::max()));
  out.seq = static_cast<std::uint64_t>(read_int8(PQgetvalue(r, row, 0)));
  out.timestamp_ms = read_int8(PQgetvalue(r, row, 1));
  out.type.assign(PQgetvalue(r, row, 2), static_cast<std::size_t>(PQgetlength(r, row, 2)));
  out.version = static_cast<std::uint32_t>(version);
  out.payload.assign(PQgetvalue(r, row, 4), static_cast<std::size_t>(PQgetlength(r, row, 4)));
  return {};
}

}  // namespace

// --- the shared state ---------------------------------------------------------

class PostgresCore : public std::enable_shared_from_this<PostgresCore> {
 public:
  struct Reader {
    PgConn conn;
  };
  using ReadTask = std::function<void(Reader*)>;  // nullptr: closed

  PostgresCore(PostgresJournalOptions options, std::string quoted_schema)
      : options_(std::move(options)), sql_(quoted_schema) {}

  Result<void> open();
  void start_threads();
  void shutdown();

  void submit(AppendBatch&& batch, Journal::Callback<void>&& done);
  void submit_delete(std::string&& id, std::uint64_t to_seq, Journal::Callback<void>&& done);
  void submit_snapshot(std::string&& id, SnapshotRecord&& snapshot, Journal::Callback<void>&& done);
  void read(ReadTask&& task);

  // The read operations, run on a reader thread with its connection.
  Result<std::vector<EventRecord>> replay(Reader& r, const std::string& id, std::uint64_t from, std::uint64_t to);
  Result<std::uint64_t> highest_seq(Reader& r, const std::string& id);
  Result<std::optional<SnapshotRecord>> load_snapshot(Reader& r, const std::string& id);
  Result<Recovery> recover(Reader& r, const std::string& id);

  PostgresJournal::Stats stats() const {
    return {transactions_.load(std::memory_order_relaxed), events_written_.load(std::memory_order_relaxed),
            append_failures_.load(std::memory_order_relaxed), reconnects_.load(std::memory_order_relaxed)};
  }

  // Runs `fn(conn)` on a reader's connection, reconnecting once if the
  // connection is (or turns out to be) lost: reads are safe to repeat.
  template <class T, class Fn>
  Result<T> with_reader(Reader& r, Fn&& fn);

 private:
  struct WriteOp {
    enum class Kind : std::uint8_t { append, delete_to, snapshot };
    Kind kind = Kind::append;
    AppendBatch batch;
    std::uint64_t to_seq = 0;
    SnapshotRecord snapshot;
    Journal::Callback<void> done;
    std::size_t weight() const { return kind == Kind::append ? batch.events.size() : 1; }
  };
  // An operation's own failure, or the loss of the whole transaction.
  struct OpOutcome {
    Result<void> result;
    bool transaction_lost = false;
  };
  struct Highest {
    std::uint64_t max_seq = 0, deleted_to = 0;
    std::uint64_t value() const { return std::max(max_seq, deleted_to); }
  };

  Result<PgConn> connect() const;
  void enqueue(WriteOp&& op);
  void writer_loop();
  void reader_loop(Reader& reader);
  bool ensure_writer_connected(Clock::time_point deadline, std::string& why);
  void commit_chunk(std::vector<WriteOp>& ops, std::size_t begin, std::size_t end,
                    std::vector<Result<void>>& results);
  OpOutcome apply(WriteOp& op, std::uint64_t& written);
  Result<void> do_append(AppendBatch& batch, std::uint64_t& written, bool& lost);
  Result<void> do_delete(const std::string& id, std::uint64_t to_seq, bool& lost);
  Result<void> do_snapshot(const std::string& id, const SnapshotRecord& snap, bool& lost);
  Result<std::uint64_t*> cached_highest(const std::string& id, bool& lost);
  static Result<Highest> read_highest(PGconn* c, const Sql& sql, const std::string& id, bool& lost);
  Result<void> read_events(PGconn* c, const std::string& id, std::uint64_t from, std::uint64_t to,
                           std::uint64_t deleted_to, std::vector<EventRecord>& out, bool& lost);
  Result<std::optional<SnapshotRecord>> read_snapshot(PGconn* c, const std::string& id, bool& lost);

  static Error failed(std::string_view doing, const Outcome& o) {
    return Error(ErrorCode::journal_failed, "postgres journal: " + std::string(doing) + ": " + o.message +
                                                (o.sqlstate.empty() ? "" : " (SQLSTATE " + o.sqlstate + ")"));
  }

  const PostgresJournalOptions options_;
  const Sql sql_;

  // Writer side: used by the writer thread only (and open() before it starts).
  PgConn wconn_;
  std::unordered_map<std::string, std::uint64_t> highest_;
  int backoff_ms_ = 0;
  Clock::time_point next_attempt_{};
  std::string last_connect_error_;

  std::mutex wmu_;
  std::condition_variable wcv_;
  std::vector<WriteOp> wq_;
  bool write_closed_ = false;
  bool writer_idle_ = false;  // guarded by wmu_: the writer waits on wcv_

  std::vector<std::unique_ptr<Reader>> readers_;
  std::mutex rmu_;
  std::condition_variable rcv_;
  std::deque<ReadTask> rq_;
  bool read_closed_ = false;

  std::vector<std::thread> threads_;

  std::atomic<std::uint64_t> transactions_{0};
  std::atomic<std::uint64_t> events_written_{0};
  std::atomic<std::uint64_t> append_failures_{0};
  std::atomic<std::uint64_t> reconnects_{0};
};

class PostgresJournal::Impl {
 public:
  std::shared_ptr<PostgresCore> core;
};

// --- connections, open and close ------------------------------------------------

Result<PgConn> PostgresCore::connect() const {
  PgConn c(PQconnectdb(options_.conninfo.c_str()));
  if (!c) return Error(ErrorCode::journal_failed, "postgres journal: cannot connect: out of memory");
  if (PQstatus(c.get()) != CONNECTION_OK)
    return Error(ErrorCode::journal_failed, "postgres journal: cannot connect: " + trim(PQerrorMessage(c.get())));
  // Quiet NOTICEs ("schema already exists") instead of printing them to stderr.
  PQsetNoticeProcessor(c.get(), [](void*, const char*) {}, nullptr);
  return c;
}

Result<void> PostgresCore::open() {
  auto c = connect();
  if (!c) return std::move(c).error();
  wconn_ = std::move(*c);
  PGconn* w = wconn_.get();
  auto step = [&](const std::string& q, const char* doing) -> Result<Outcome> {
    Outcome o = run(w, q);
    if (!o.ok) return failed(doing, o);
    return o;
  };
  if (auto o = step("BEGIN", "begin the schema check"); !o) return std::move(o).error();
  auto schema = [&]() -> Result<void> {
    if (auto o = step(sql_.lock, "lock the schema check"); !o) return std::move(o).error();
    auto exists = step(sql_.version_table_exists, "look for the tables");
    if (!exists) return std::move(exists).error();
    // Binary bool: one byte.
    if (*PQgetvalue(exists->res.get(), 0, 0) == 0) {
      // Several statements: the simple protocol.
      PgResult r(PQexec(w, sql_.create.c_str()));
      if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
        Outcome o;
        o.message = trim(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(w));
        const char* st = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
        if (st != nullptr) o.sqlstate = st;
        return failed("create the tables", o);
      }
      return {};
    }
    auto v = step(sql_.read_version, "read the schema version");
    if (!v) return std::move(v).error();
    const PGresult* r = v->res.get();
    std::int64_t version = PQgetisnull(r, 0, 0) != 0 ? 0 : read_int8(PQgetvalue(r, 0, 0));
    if (version > kSchemaVersion)
      return Error(ErrorCode::journal_failed, "postgres journal: schema version " + std::to_string(version) +
                                                  " is newer than this build understands (" +
                                                  std::to_string(kSchemaVersion) + ")");
    if (version != kSchemaVersion)
      return Error(ErrorCode::journal_failed,
                   "postgres journal: unknown schema version " + std::to_string(version));
    return {};
  }();
  if (!schema) {
    (void)run(w, "ROLLBACK");
    return schema;
  }
  if (auto o = step("COMMIT", "commit the schema"); !o) return std::move(o).error();
  for (unsigned i = 0; i < options_.reader_connections; ++i) {
    auto rc = connect();
    if (!rc) return std::move(rc).error();
    auto reader = std::make_unique<Reader>();
    reader->conn = std::move(*rc);
    readers_.push_back(std::move(reader));
  }
  return {};
}

void PostgresCore::start_threads() {
  auto self = shared_from_this();
  threads_.emplace_back([self] { self->writer_loop(); });
  for (auto& r : readers_) threads_.emplace_back([self, reader = r.get()] { self->reader_loop(*reader); });
}

void PostgresCore::shutdown() {
  {
    std::lock_guard lk(wmu_);
    write_closed_ = true;
  }
  wcv_.notify_one();
  {
    std::lock_guard lk(rmu_);
    read_closed_ = true;
  }
  rcv_.notify_all();
  const auto me = std::this_thread::get_id();
  for (auto& t : threads_) {
    if (t.get_id() == me)
      t.detach();  // destroyed from our own callback: this thread finishes and frees the state
    else if (t.joinable())
      t.join();
  }
}

// --- the writer --------------------------------------------------------------------

void PostgresCore::enqueue(WriteOp&& op) {
  bool queued = false, wake = false;
  {
    std::lock_guard lk(wmu_);
    if (!write_closed_) {
      wq_.push_back(std::move(op));
      queued = true;
      // Only an idle writer needs a signal; a busy one swaps the queue when
      // its transaction ends. This keeps notify off the append path.
      wake = writer_idle_;
      writer_idle_ = false;
    }
  }
  if (!queued) return op.done(closed_error());
  if (wake) wcv_.notify_one();
}

void PostgresCore::submit(AppendBatch&& batch, Journal::Callback<void>&& done) {
  WriteOp op;
  op.kind = WriteOp::Kind::append;
  op.batch = std::move(batch);
  op.done = std::move(done);
  enqueue(std::move(op));
}

void PostgresCore::submit_delete(std::string&& id, std::uint64_t to_seq, Journal::Callback<void>&& done) {
  WriteOp op;
  op.kind = WriteOp::Kind::delete_to;
  op.batch.persistence_id = std::move(id);
  op.to_seq = to_seq;
  op.done = std::move(done);
  enqueue(std::move(op));
}

void PostgresCore::submit_snapshot(std::string&& id, SnapshotRecord&& snapshot, Journal::Callback<void>&& done) {
  WriteOp op;
  op.kind = WriteOp::Kind::snapshot;
  op.batch.persistence_id = std::move(id);
  op.snapshot = std::move(snapshot);
  op.done = std::move(done);
  enqueue(std::move(op));
}

void PostgresCore::writer_loop() {
  std::vector<WriteOp> ops;
  std::vector<Result<void>> results;
  for (;;) {
    {
      std::unique_lock lk(wmu_);
      while (wq_.empty() && !write_closed_) {
        writer_idle_ = true;
        wcv_.wait(lk);
      }
      writer_idle_ = false;
      if (wq_.empty()) return;  // closed and drained
      ops.swap(wq_);
    }
    results.assign(ops.size(), Result<void>());
    std::size_t begin = 0;
    while (begin < ops.size()) {
      std::size_t end = begin, weight = 0;
      while (end < ops.size() && (end == begin || weight + ops[end].weight() <= options_.max_batch_events))
        weight += ops[end++].weight();
      commit_chunk(ops, begin, end, results);
      // Callbacks of this transaction before the next one begins: appends
      // for one id complete in the order they were made.
      for (std::size_t i = begin; i < end; ++i) {
        if (ops[i].kind == WriteOp::Kind::append && !results[i].ok())
          append_failures_.fetch_add(1, std::memory_order_relaxed);
        auto done = std::move(ops[i].done);
        done(std::move(results[i]));
      }
      begin = end;
    }
    ops.clear();
  }
}

bool PostgresCore::ensure_writer_connected(Clock::time_point deadline, std::string& why) {
  for (;;) {
    if (wconn_ && PQstatus(wconn_.get()) == CONNECTION_OK) return true;
    auto now = Clock::now();
    if (now >= next_attempt_) {
      auto c = connect();
      if (c) {
        wconn_ = std::move(*c);
        backoff_ms_ = 0;
        reconnects_.fetch_add(1, std::memory_order_relaxed);
        return true;
      }
      last_connect_error_ = c.error().message();
      backoff_ms_ = backoff_ms_ == 0 ? options_.reconnect_initial_ms
                                     : std::min(backoff_ms_ * 2, options_.reconnect_max_ms);
      next_attempt_ = Clock::now() + std::chrono::milliseconds(backoff_ms_);
    }
    if (Clock::now() >= deadline) {
      why = last_connect_error_;
      return false;
    }
    std::this_thread::sleep_until(std::min(next_attempt_, deadline));
  }
}

void PostgresCore::commit_chunk(std::vector<WriteOp>& ops, std::size_t begin, std::size_t end,
                                std::vector<Result<void>>& results) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.unavailable_timeout_ms);
  auto fail_all = [&](const std::string& why) {
    highest_.clear();
    for (std::size_t i = begin; i < end; ++i)
      results[i] = Error(ErrorCode::journal_failed, "postgres journal: " + why + "; nothing of it was stored");
  };
  // A transaction lost before COMMIT stored nothing and is repeated on a new
  // connection while the deadline allows; one lost during COMMIT is not.
  for (;;) {
    std::string why;
    if (!ensure_writer_connected(deadline, why)) return fail_all("the server is unreachable: " + why);
    PGconn* c = wconn_.get();
    Outcome b = run(c, "BEGIN");
    if (!b.ok) {
      if (b.lost && Clock::now() < deadline) continue;
      return fail_all("begin a transaction: " + b.message);
    }
    std::uint64_t written = 0;
    bool lost = false;
    std::string lost_why;
    for (std::size_t i = begin; i < end && !lost; ++i) {
      OpOutcome o = apply(ops[i], written);
      if (o.transaction_lost) {
        lost = true;
        lost_why = o.result.ok() ? "the transaction was lost" : o.result.error().message();
      } else {
        results[i] = std::move(o.result);
      }
    }
    if (lost) {
      highest_.clear();
      if (PQstatus(c) == CONNECTION_OK) (void)run(c, "ROLLBACK");
      if (PQstatus(c) != CONNECTION_OK && Clock::now() < deadline) continue;
      return fail_all(lost_why);
    }
    Outcome cm = run(c, "COMMIT");
    if (cm.ok && cm.res && std::strcmp(PQcmdStatus(cm.res.get()), "ROLLBACK") == 0) {
      cm.ok = false;
      cm.message = "the server rolled the transaction back";
    }
    if (!cm.ok) {
      highest_.clear();
      for (std::size_t i = begin; i < end; ++i) {
        if (!results[i].ok()) continue;  // its own failure stands: it was rolled back to its savepoint anyway
        results[i] = Error(ErrorCode::journal_failed,
                           cm.lost ? "postgres journal: the connection was lost during COMMIT; the outcome is "
                                     "unknown (the write may or may not be stored): " + cm.message
                                   : "postgres journal: COMMIT failed, nothing was stored: " + cm.message);
      }
      return;
    }
    transactions_.fetch_add(1, std::memory_order_relaxed);
    events_written_.fetch_add(written, std::memory_order_relaxed);
    return;
  }
}

PostgresCore::OpOutcome PostgresCore::apply(WriteOp& op, std::uint64_t& written) {
  PGconn* c = wconn_.get();
  if (op.kind == WriteOp::Kind::append) {
    if (auto v = validate_batch(op.batch); !v) return {std::move(v), false};
    if (op.batch.events.back().seq > kMaxSeq)
      return {Error(ErrorCode::invalid_argument, "append to " + printable(op.batch.persistence_id) +
                                                     ": sequence number exceeds the largest storable, " +
                                                     std::to_string(kMaxSeq)),
              false};
  } else if (op.kind == WriteOp::Kind::snapshot) {
    if (op.batch.persistence_id.empty())
      return {Error(ErrorCode::invalid_argument, "snapshot with an empty persistence id"), false};
    if (op.snapshot.seq > kMaxSeq)
      return {Error(ErrorCode::invalid_argument, "snapshot sequence number exceeds the largest storable"), false};
  }
  Outcome sp = run(c, "SAVEPOINT op");
  if (!sp.ok) return {failed("savepoint", sp), true};
  bool lost = false;
  std::uint64_t w = 0;
  Result<void> r;
  switch (op.kind) {
    case WriteOp::Kind::append: r = do_append(op.batch, w, lost); break;
    case WriteOp::Kind::delete_to: r = do_delete(op.batch.persistence_id, op.to_seq, lost); break;
    case WriteOp::Kind::snapshot: r = do_snapshot(op.batch.persistence_id, op.snapshot, lost); break;
  }
  if (lost) return {std::move(r), true};
  Outcome end = run(c, r.ok() ? "RELEASE SAVEPOINT op" : "ROLLBACK TO SAVEPOINT op");
  if (!end.ok) return {failed("end the savepoint", end), true};
  if (!r.ok()) {
    highest_.erase(op.batch.persistence_id);  // reload on next use
  } else if (op.kind == WriteOp::Kind::append) {
    if (auto it = highest_.find(op.batch.persistence_id); it != highest_.end())
      it->second = op.batch.events.back().seq;
    written += w;
  }
  return {std::move(r), false};
}

Result<PostgresCore::Highest> PostgresCore::read_highest(PGconn* c, const Sql& sql, const std::string& id,
                                                         bool& lost) {
  Params p;
  p.bytes(id);
  Outcome o = run(c, sql.highest, &p);
  if (!o.ok) {
    lost = o.lost;
    return failed("read the highest seq of " + printable(id), o);
  }
  Highest h;
  const char* names[] = {"max(seq) of its events", "its deleted_to mark"};
  std::uint64_t* values[] = {&h.max_seq, &h.deleted_to};
  for (int col = 0; col < 2; ++col) {
    if (PQgetisnull(o.res.get(), 0, col) != 0) continue;
    std::int64_t v = read_int8(PQgetvalue(o.res.get(), 0, col));
    if (v < 0)
      return Error(ErrorCode::corrupt_record, "postgres journal: corrupt record of persistence id " +
                                                  printable(id) + " seq ?: " + names[col] + " is " +
                                                  std::to_string(v) + ", expected a non-negative bigint");
    *values[col] = static_cast<std::uint64_t>(v);
  }
  return h;
}

Result<std::uint64_t*> PostgresCore::cached_highest(const std::string& id, bool& lost) {
  if (auto it = highest_.find(id); it != highest_.end()) return &it->second;
  auto h = read_highest(wconn_.get(), sql_, id, lost);
  if (!h) return std::move(h).error();
  if (highest_.size() >= kMaxCachedIds) highest_.clear();
  return &highest_.emplace(id, h->value()).first->second;
}

Result<void> PostgresCore::do_append(AppendBatch& batch, std::uint64_t& written, bool& lost) {
  const std::string& id = batch.persistence_id;
  auto cached = cached_highest(id, lost);
  if (!cached) return std::move(cached).error();
  std::uint64_t highest = *cached.value();
  const std::uint64_t first = batch.events.front().seq;
  if (first != highest + 1) {
    // The cache only saves a read: another journal (another node, after a
    // hand-off) may have written this id since it was filled. Decide on the
    // stored value.
    highest_.erase(id);
    auto fresh = cached_highest(id, lost);
    if (!fresh) return std::move(fresh).error();
    highest = *fresh.value();
  }
  if (first <= highest)
    return Error(ErrorCode::journal_conflict, printable(id) + " already holds sequence number " +
                                                  std::to_string(first) + ": another writer appended it");
  if (first != highest + 1)
    return Error(ErrorCode::journal_conflict, "append to " + printable(id) + " at " + std::to_string(first) +
                                                  " would leave a gap after " + std::to_string(highest));
  for (std::size_t at = 0; at < batch.events.size(); at += kRowsPerInsert) {
    const std::size_t n = std::min(kRowsPerInsert, batch.events.size() - at);
    std::string q = sql_.events_prefix;
    Params p;
    p.bytes(id);
    for (std::size_t i = 0; i < n; ++i) {
      const EventRecord& e = batch.events[at + i];
      const int k = static_cast<int>(2 + 5 * i);
      if (i != 0) q += ',';
      q += "($1,$" + std::to_string(k) + ",$" + std::to_string(k + 1) + ",$" + std::to_string(k + 2) + ",$" +
           std::to_string(k + 3) + ",$" + std::to_string(k + 4) + ")";
      p.int8(static_cast<std::int64_t>(e.seq));
      p.int8(e.timestamp_ms);
      p.bytes(e.type);
      p.int8(static_cast<std::int64_t>(e.version));
      p.bytes(e.payload);
    }
    Outcome o = run(wconn_.get(), q, &p);
    if (!o.ok) {
      lost = o.lost;
      if (o.sqlstate == "23505")
        return Error(ErrorCode::journal_conflict, printable(id) + " already holds one of sequence numbers " +
                                                      std::to_string(batch.events[at].seq) + ".." +
                                                      std::to_string(batch.events[at + n - 1].seq) +
                                                      ": another writer appended it");
      return failed("append " + printable(id) + " seq " + std::to_string(first), o);
    }
  }
  written += batch.events.size();
  return {};
}

Result<void> PostgresCore::do_delete(const std::string& id, std::uint64_t to_seq, bool& lost) {
  auto cached = cached_highest(id, lost);
  if (!cached) return std::move(cached).error();
  const std::uint64_t upto = std::min(to_seq, *cached.value());
  if (upto == 0) return {};
  Params p;
  p.bytes(id);
  p.int8(static_cast<std::int64_t>(upto));
  Outcome o = run(wconn_.get(), sql_.delete_events, &p);
  if (o.ok) o = run(wconn_.get(), sql_.upsert_deletion, &p);
  if (!o.ok) {
    lost = o.lost;
    return failed("delete the events of " + printable(id) + " up to " + std::to_string(upto), o);
  }
  return {};
}

Result<void> PostgresCore::do_snapshot(const std::string& id, const SnapshotRecord& snap, bool& lost) {
  Params p;
  p.bytes(id);
  p.int8(static_cast<std::int64_t>(snap.seq));
  p.int8(snap.timestamp_ms);
  p.bytes(snap.type);
  p.int8(static_cast<std::int64_t>(snap.version));
  p.bytes(snap.payload);
  Outcome o = run(wconn_.get(), sql_.insert_snapshot, &p);
  if (o.ok) {
    Params q;
    q.bytes(id);
    o = run(wconn_.get(), sql_.prune_snapshots, &q);
  }
  if (!o.ok) {
    lost = o.lost;
    return failed("save a snapshot of " + printable(id) + " at " + std::to_string(snap.seq), o);
  }
  return {};
}

// --- the readers ----------------------------------------------------------------

void PostgresCore::read(ReadTask&& task) {
  {
    std::lock_guard lk(rmu_);
    if (!read_closed_) {
      rq_.push_back(std::move(task));
      task = nullptr;
    }
  }
  if (task) return task(nullptr);
  rcv_.notify_one();
}

void PostgresCore::reader_loop(Reader& reader) {
  for (;;) {
    ReadTask task;
    {
      std::unique_lock lk(rmu_);
      rcv_.wait(lk, [&] { return !rq_.empty() || read_closed_; });
      if (rq_.empty()) return;
      task = std::move(rq_.front());
      rq_.pop_front();
    }
    task(&reader);
  }
}

template <class T, class Fn>
Result<T> PostgresCore::with_reader(Reader& r, Fn&& fn) {
  for (int attempt = 0;; ++attempt) {
    if (!r.conn || PQstatus(r.conn.get()) != CONNECTION_OK) {
      auto c = connect();
      if (!c) return std::move(c).error();
      r.conn = std::move(*c);
      reconnects_.fetch_add(1, std::memory_order_relaxed);
    }
    bool lost = false;
    Result<T> out = fn(r.conn.get(), lost);
    if (!lost || attempt == 1) return out;
  }
}

Result<void> PostgresCore::read_events(PGconn* c, const std::string& id, std::uint64_t from, std::uint64_t to,
                                       std::uint64_t deleted_to, std::vector<EventRecord>& out, bool& lost) {
  from = std::max<std::uint64_t>(from, 1);
  to = std::min(to, kMaxSeq);
  if (from > to) return {};
  Params p;
  p.bytes(id);
  p.int8(static_cast<std::int64_t>(from));
  p.int8(static_cast<std::int64_t>(to));
  Outcome o = run(c, sql_.select_events, &p);
  if (!o.ok) {
    lost = o.lost;
    return failed("replay " + printable(id), o);
  }
  std::uint64_t expected = std::max(from, deleted_to + 1);
  const int rows = PQntuples(o.res.get());
  for (int row = 0; row < rows; ++row) {
    EventRecord e;
    if (auto r = read_record(o.res.get(), row, id, "event", 1, e); !r) return r;
    if (row == 0 && e.seq < expected) expected = e.seq;  // leftovers at or below the deletion mark
    if (e.seq != expected)
      return Error(ErrorCode::corrupt_record,
                   "postgres journal: corrupt event log of persistence id " + printable(id) + " seq " +
                       std::to_string(expected) + ": missing (the next stored event is " + std::to_string(e.seq) +
                       ", and events were deleted only up to " + std::to_string(deleted_to) + ")");
    ++expected;
    out.push_back(std::move(e));
  }
  return {};
}

Result<std::optional<SnapshotRecord>> PostgresCore::read_snapshot(PGconn* c, const std::string& id, bool& lost) {
  Params p;
  p.bytes(id);
  Outcome o = run(c, sql_.select_snapshot, &p);
  if (!o.ok) {
    lost = o.lost;
    return failed("load the snapshot of " + printable(id), o);
  }
  if (PQntuples(o.res.get()) == 0) return std::optional<SnapshotRecord>();
  SnapshotRecord snap;
  if (auto r = read_record(o.res.get(), 0, id, "snapshot", 0, snap); !r) return std::move(r).error();
  return std::optional<SnapshotRecord>(std::move(snap));
}

namespace {
// Runs `body` in one read-only REPEATABLE READ transaction, so every read in
// it sees the same committed state.
template <class T, class Body>
Result<T> in_snapshot(PGconn* c, bool& lost, Body&& body) {
  Outcome b = run(c, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  if (!b.ok) {
    lost = b.lost;
    return Error(ErrorCode::journal_failed, "postgres journal: begin a read transaction: " + b.message);
  }
  Result<T> out = body();
  Outcome e = run(c, out.ok() ? "COMMIT" : "ROLLBACK");
  if (!e.ok && out.ok()) {
    lost = e.lost;
    return Error(ErrorCode::journal_failed, "postgres journal: end a read transaction: " + e.message);
  }
  return out;
}
}  // namespace

Result<std::vector<EventRecord>> PostgresCore::replay(Reader& r, const std::string& id, std::uint64_t from,
                                                       std::uint64_t to) {
  return with_reader<std::vector<EventRecord>>(r, [&](PGconn* c, bool& lost) {
    return in_snapshot<std::vector<EventRecord>>(c, lost, [&]() -> Result<std::vector<EventRecord>> {
      auto h = read_highest(c, sql_, id, lost);
      if (!h) return std::move(h).error();
      std::vector<EventRecord> events;
      if (auto e = read_events(c, id, from, to, h->deleted_to, events, lost); !e) return std::move(e).error();
      return events;
    });
  });
}

Result<std::uint64_t> PostgresCore::highest_seq(Reader& r, const std::string& id) {
  return with_reader<std::uint64_t>(r, [&](PGconn* c, bool& lost) -> Result<std::uint64_t> {
    auto h = read_highest(c, sql_, id, lost);
    if (!h) return std::move(h).error();
    return h->value();
  });
}

Result<std::optional<SnapshotRecord>> PostgresCore::load_snapshot(Reader& r, const std::string& id) {
  return with_reader<std::optional<SnapshotRecord>>(r, [&](PGconn* c, bool& lost) { return read_snapshot(c, id, lost); });
}

Result<Recovery> PostgresCore::recover(Reader& r, const std::string& id) {
  return with_reader<Recovery>(r, [&](PGconn* c, bool& lost) {
    return in_snapshot<Recovery>(c, lost, [&]() -> Result<Recovery> {
      Recovery rec;
      auto snap = read_snapshot(c, id, lost);
      if (!snap) return std::move(snap).error();
      rec.snapshot = std::move(*snap);
      auto h = read_highest(c, sql_, id, lost);
      if (!h) return std::move(h).error();
      rec.highest_seq = h->value();
      std::uint64_t from = rec.snapshot ? rec.snapshot->seq + 1 : 1;
      if (auto e = read_events(c, id, from, UINT64_MAX, h->deleted_to, rec.events, lost); !e)
        return std::move(e).error();
      return rec;
    });
  });
}

// --- the public object ---------------------------------------------------------------

Result<std::shared_ptr<PostgresJournal>> PostgresJournal::open(PostgresJournalOptions options) {
  if (options.conninfo.empty())
    return Error(ErrorCode::invalid_argument, "postgres journal: the connection string is empty");
  if (options.schema.empty())
    return Error(ErrorCode::invalid_argument, "postgres journal: the schema name is empty");
  if (options.max_batch_events == 0)
    return Error(ErrorCode::invalid_argument, "postgres journal: max_batch_events must be at least 1");
  if (options.reader_connections == 0)
    return Error(ErrorCode::invalid_argument, "postgres journal: reader_connections must be at least 1");
  if (options.reconnect_initial_ms <= 0 || options.reconnect_max_ms < options.reconnect_initial_ms ||
      options.unavailable_timeout_ms < 0)
    return Error(ErrorCode::invalid_argument, "postgres journal: unusable reconnect timings");
  // The schema name as a quoted identifier (doubling any '"').
  std::string quoted_schema = "\"";
  for (char ch : options.schema) {
    if (ch == '\0') return Error(ErrorCode::invalid_argument, "postgres journal: the schema name holds a NUL");
    quoted_schema += ch;
    if (ch == '"') quoted_schema += '"';
  }
  quoted_schema += '"';
  auto core = std::make_shared<PostgresCore>(std::move(options), std::move(quoted_schema));
  if (auto r = core->open(); !r) return std::move(r).error();
  core->start_threads();
  auto impl = std::make_unique<Impl>();
  impl->core = std::move(core);
  return std::shared_ptr<PostgresJournal>(new PostgresJournal(std::move(impl)));
}

PostgresJournal::PostgresJournal(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PostgresJournal::~PostgresJournal() { impl_->core->shutdown(); }

void PostgresJournal::append(AppendBatch batch, Callback<void> done) {
  impl_->core->submit(std::move(batch), std::move(done));
}

void PostgresJournal::delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) {
  impl_->core->submit_delete(std::move(persistence_id), to_seq, std::move(done));
}

void PostgresJournal::save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) {
  impl_->core->submit_snapshot(std::move(persistence_id), std::move(snapshot), std::move(done));
}

namespace {
template <class T, class Fn>
PostgresCore::ReadTask read_task(Journal::Callback<T> done, Fn fn) {
  return [done = std::move(done), fn = std::move(fn)](PostgresCore::Reader* r) mutable {
    if (r == nullptr) return done(closed_error());
    done(fn(*r));
  };
}
}  // namespace

void PostgresJournal::replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
                             Callback<std::vector<EventRecord>> done) {
  auto* core = impl_->core.get();
  core->read(read_task(std::move(done), [core, id = std::move(persistence_id), from_seq,
                                         to_seq](PostgresCore::Reader& r) { return core->replay(r, id, from_seq, to_seq); }));
}

void PostgresJournal::highest_seq(std::string persistence_id, Callback<std::uint64_t> done) {
  auto* core = impl_->core.get();
  core->read(read_task(std::move(done), [core, id = std::move(persistence_id)](PostgresCore::Reader& r) {
    return core->highest_seq(r, id);
  }));
}

void PostgresJournal::load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) {
  auto* core = impl_->core.get();
  core->read(read_task(std::move(done), [core, id = std::move(persistence_id)](PostgresCore::Reader& r) {
    return core->load_snapshot(r, id);
  }));
}

void PostgresJournal::recover(std::string persistence_id, Callback<Recovery> done) {
  auto* core = impl_->core.get();
  core->read(read_task(std::move(done), [core, id = std::move(persistence_id)](PostgresCore::Reader& r) {
    return core->recover(r, id);
  }));
}

PostgresJournal::Stats PostgresJournal::stats() const { return impl_->core->stats(); }

}  // namespace troupe
