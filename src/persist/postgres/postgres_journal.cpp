// PostgresJournal: writer lanes with group commit (postgres_writer.cpp),
// reader threads with their own connections, reconnect with back-off, the
// schema check and its migration. Table layout, statements and the rules
// enforced here are documented in doc/journal.md ("PostgreSQL"); keep the
// two in step.

#include "troupe/persist/postgres_journal.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../journal_engine.hpp"
#include "pg_support.hpp"
#include "postgres_writer.hpp"

namespace troupe {

using namespace troupe::pg;

namespace {
Error closed_error() { return Error(ErrorCode::journal_failed, "postgres journal is closed"); }
// Recoveries a reader sends in one round trip at most.
constexpr std::size_t kRecoverBatch = 256;
}  // namespace

// One read connection; used by one reader thread at a time.
class PgReader {
 public:
  explicit PgReader(Shared& shared) : shared_(shared) {}
  Result<void> connect_now();

  Result<std::vector<EventRecord>> replay(const std::string& id, std::uint64_t from, std::uint64_t to);
  Result<std::uint64_t> highest_seq(const std::string& id);
  Result<std::optional<SnapshotRecord>> load_snapshot(const std::string& id);
  Result<Recovery> recover(const std::string& id);
  // The recoveries of `ids`, in order, in one round trip.
  std::vector<Result<Recovery>> recover_many(const std::vector<std::string>& ids);
  Result<std::uint64_t> highest_fence();

 private:
  // Runs prepared statement `name` with `params` and hands its result to
  // `parse`, reconnecting once if the connection is (or turns out to be)
  // lost: reads are safe to repeat. `doing` names the read in errors.
  template <class T, class Parse>
  Result<T> query(const char* name, const Params& params, const std::string& doing, Parse&& parse);
  // The connection, opened again if it is (or was found) lost.
  Result<PGconn*> connection();

  Shared& shared_;
  PgConn conn_;
};

// Everything the journal's threads use. Held by shared_ptr: by the public
// object and by each thread, so that the journal may be destroyed from one
// of its own callbacks.
class PostgresCore : public std::enable_shared_from_this<PostgresCore> {
 public:
  PostgresCore(PostgresJournalOptions options, std::string quoted_schema)
      : shared_(std::move(options), std::move(quoted_schema)) {}

  Result<void> open();
  void start_threads() {
    auto self = shared_from_this();
    writes_->start(self);
    reads_->start(self);
  }
  void shutdown() {
    writes_->close();
    reads_->close();
    writes_->join();
    reads_->join();
  }

  void write(detail::JournalWrite&& op) { writes_->submit(std::move(op)); }

  // Runs `fn(reader)` on a reader thread and answers `done` with its result.
  template <class T, class Fn>
  void read(Journal::Callback<T> done, Fn fn) {
    reads_->submit([done = std::move(done), fn = std::move(fn)](PgReader* r) mutable {
      if (r == nullptr) return done(closed_error());
      done(fn(*r));
    });
  }

  // Recovers `id` on a reader. Recoveries that arrive while every reader is
  // busy wait here, then go together, up to kRecoverBatch in one round trip:
  // a burst of new entities (one recovery each) costs a few round trips,
  // not one each, and a journal with a reader free adds no wait.
  void recover(std::string id, Journal::Callback<Recovery> done) {
    {
      std::lock_guard lk(recover_mu_);
      recoveries_.push_back({std::move(id), std::move(done)});
      if (recover_tasks_ >= shared_.options.reader_connections) return;
      ++recover_tasks_;
    }
    reads_->submit([this](PgReader* r) { recover_batch(r); });
  }

  // A reader saw `highest` stored for `id`: the id's lane need not read it.
  void hint(const std::string& id, std::uint64_t highest) {
    lanes_[writes_->lane_of(id)]->hint(id, highest);
  }

  PostgresJournal::Stats stats() const {
    return {shared_.transactions.load(std::memory_order_relaxed),
            shared_.events_written.load(std::memory_order_relaxed), writes_->append_failures(),
            shared_.reconnects.load(std::memory_order_relaxed)};
  }
  std::uint64_t owner_incarnation() const noexcept { return shared_.owner.value; }

 private:
  Result<void> check_schema(PGconn* c);

  struct PendingRecovery {
    std::string id;
    Journal::Callback<Recovery> done;
  };
  // Runs the recoveries waiting (up to kRecoverBatch) on reader `r`, or
  // fails them when the journal is closed (r null); then leaves any more to
  // a task at the back of the readers' queue, behind the other reads.
  void recover_batch(PgReader* r) {
    std::vector<PendingRecovery> batch;
    {
      std::lock_guard lk(recover_mu_);
      const std::size_t n = std::min(recoveries_.size(), kRecoverBatch);
      for (std::size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(recoveries_.front()));
        recoveries_.pop_front();
      }
    }
    if (r == nullptr) {
      for (auto& p : batch) p.done(closed_error());
    } else if (!batch.empty()) {
      std::vector<std::string> ids;
      ids.reserve(batch.size());
      for (const auto& p : batch) ids.push_back(p.id);
      auto results = r->recover_many(ids);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (results[i]) hint(batch[i].id, results[i]->highest_seq);
        batch[i].done(std::move(results[i]));
      }
    }
    {
      std::lock_guard lk(recover_mu_);
      if (recoveries_.empty()) {
        --recover_tasks_;
        return;
      }
    }
    reads_->submit([this](PgReader* next) { recover_batch(next); });
  }

  Shared shared_;
  std::vector<Writer*> lanes_;  // owned by writes_
  std::unique_ptr<detail::GroupCommit> writes_;
  std::unique_ptr<detail::ReaderPool<PgReader>> reads_;
  std::mutex recover_mu_;
  std::deque<PendingRecovery> recoveries_;  // guarded by recover_mu_
  unsigned recover_tasks_ = 0;  // guarded by recover_mu_: reader tasks queued or running for recoveries_
};

class PostgresJournal::Impl {
 public:
  std::shared_ptr<PostgresCore> core;
};

// --- open -------------------------------------------------------------------------

Result<void> PostgresCore::check_schema(PGconn* w) {
  const Sql& sql = shared_.sql;
  auto step = [&](const std::string& q, const char* doing) -> Result<Outcome> {
    Outcome o = run(w, q);
    if (!o.ok) return failed(doing, o);
    return o;
  };
  // Several statements: the simple protocol.
  auto script = [&](const std::string& q, const char* doing) -> Result<void> {
    PgResult r(PQexec(w, q.c_str()));
    if (!r || PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      Outcome o;
      o.message = trim(r ? PQresultErrorMessage(r.get()) : PQerrorMessage(w));
      const char* st = r ? PQresultErrorField(r.get(), PG_DIAG_SQLSTATE) : nullptr;
      if (st != nullptr) o.sqlstate = st;
      return failed(doing, o);
    }
    return {};
  };
  if (auto o = step("BEGIN", "begin the schema check"); !o) return std::move(o).error();
  auto schema = [&]() -> Result<void> {
    if (auto o = step(sql.lock, "lock the schema check"); !o) return std::move(o).error();
    auto exists = step(sql.version_table_exists, "look for the tables");
    if (!exists) return std::move(exists).error();
    if (*PQgetvalue(exists->res.get(), 0, 0) == 0) return script(sql.create, "create the tables");  // binary bool
    auto v = step(sql.read_version, "read the schema version");
    if (!v) return std::move(v).error();
    const PGresult* r = v->res.get();
    std::int64_t version = PQgetisnull(r, 0, 0) != 0 ? 0 : read_int8(PQgetvalue(r, 0, 0));
    if (version > kSchemaVersion)
      return Error(ErrorCode::journal_failed, "postgres journal: schema version " + std::to_string(version) +
                                                  " is newer than this build understands (" +
                                                  std::to_string(kSchemaVersion) + ")");
    if (version == 1) return script(sql.migrate_from_1, "add the fences (schema 1 to 2)");
    if (version != kSchemaVersion)
      return Error(ErrorCode::journal_failed, "postgres journal: unknown schema version " + std::to_string(version));
    return {};
  }();
  if (!schema) {
    (void)run(w, "ROLLBACK");
    return schema;
  }
  if (auto o = step("COMMIT", "commit the schema"); !o) return std::move(o).error();
  return {};
}

Result<void> PostgresCore::open() {
  const PostgresJournalOptions& options = shared_.options;
  // The tables first, on a plain connection: the lanes prepare statements
  // that name them.
  {
    auto c = shared_.connect({});
    if (!c) return std::move(c).error();
    if (auto r = check_schema(c->get()); !r) return r;
  }
  std::vector<std::unique_ptr<detail::JournalLane>> lanes;
  for (unsigned i = 0; i < options.writer_connections; ++i) {
    auto w = std::make_unique<Writer>(shared_);
    if (auto r = w->connect_now(); !r) return r;
    lanes_.push_back(w.get());
    lanes.push_back(std::move(w));
  }
  if (!options.owner.empty()) {
    // This journal's incarnation as the owner: one above the last one's. The
    // raise waits for that one's appends in flight, and refuses the rest.
    Fence owner{"owner|" + options.owner, 0};
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(options.unavailable_timeout_ms, 1000));
    auto v = lanes_.front()->raise(owner.key, 0, true, deadline);
    if (!v) return std::move(v).error();
    owner.value = *v;
    shared_.owner = std::move(owner);
  }
  writes_ = std::make_unique<detail::GroupCommit>(std::move(lanes), options.max_batch_events, closed_error);
  std::vector<std::unique_ptr<PgReader>> readers;
  for (unsigned i = 0; i < options.reader_connections; ++i) {
    auto r = std::make_unique<PgReader>(shared_);
    if (auto c = r->connect_now(); !c) return c;
    readers.push_back(std::move(r));
  }
  reads_ = std::make_unique<detail::ReaderPool<PgReader>>(std::move(readers));
  return {};
}

// --- the readers ----------------------------------------------------------------

Result<void> PgReader::connect_now() {
  auto c = shared_.connect(shared_.sql.reader_statements());
  if (!c) return std::move(c).error();
  conn_ = std::move(*c);
  return {};
}

template <class T, class Parse>
Result<T> PgReader::query(const char* name, const Params& params, const std::string& doing, Parse&& parse) {
  for (int attempt = 0;; ++attempt) {
    auto c = connection();
    if (!c) return std::move(c).error();
    Outcome o = run_prepared(*c, name, params);
    if (o.ok) return parse(o.res.get());
    if (!o.lost || attempt == 1) return failed(doing, o);
  }
}

Result<PGconn*> PgReader::connection() {
  if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) {
    conn_.reset();
    auto c = shared_.connect(shared_.sql.reader_statements());
    if (!c) return std::move(c).error();
    conn_ = std::move(*c);
    shared_.reconnects.fetch_add(1, std::memory_order_relaxed);
  }
  return conn_.get();
}

Result<std::vector<EventRecord>> PgReader::replay(const std::string& id, std::uint64_t from, std::uint64_t to) {
  from = std::max<std::uint64_t>(from, 1);
  to = std::min(to, kMaxSeq);
  Params p;
  p.bytes(id);
  p.int8(static_cast<std::int64_t>(from));
  p.int8(static_cast<std::int64_t>(to));
  return query<std::vector<EventRecord>>(
      Sql::kReplay, p, "replay " + printable(id), [&](const PGresult* r) { return parse_replay(r, id, from, to); });
}

Result<std::uint64_t> PgReader::highest_seq(const std::string& id) {
  Params p;
  p.bytes(id);
  return query<std::uint64_t>(Sql::kHighest, p, "read the highest seq of " + printable(id),
                              [&](const PGresult* r) { return parse_highest(r, id); });
}

Result<std::optional<SnapshotRecord>> PgReader::load_snapshot(const std::string& id) {
  Params p;
  p.bytes(id);
  return query<std::optional<SnapshotRecord>>(
      Sql::kSnapshot, p, "load the snapshot of " + printable(id),
      [&](const PGresult* r) { return parse_snapshot(r, id); });
}

Result<Recovery> PgReader::recover(const std::string& id) {
  Params p;
  p.bytes(id);
  return query<Recovery>(Sql::kRecover, p, "recover " + printable(id),
                         [&](const PGresult* r) { return parse_recovery(r, id); });
}

std::vector<Result<Recovery>> PgReader::recover_many(const std::vector<std::string>& ids) {
  if (ids.size() == 1) return {recover(ids.front())};
  std::vector<Call> calls;
  calls.reserve(ids.size());
  for (const auto& id : ids) {
    calls.push_back({Sql::kRecover, Params()});
    calls.back().params.bytes(id);
  }
  std::vector<Result<Recovery>> out;
  out.reserve(ids.size());
  for (int attempt = 0;; ++attempt) {
    auto c = connection();
    if (!c) {
      while (out.size() < ids.size()) out.emplace_back(c.error());
      return out;
    }
    std::vector<Outcome> answers = run_each(*c, calls);
    const bool lost = std::any_of(answers.begin(), answers.end(), [](const Outcome& o) { return o.lost; });
    if (lost && attempt == 0) {
      conn_.reset();  // reads are safe to repeat: all of them again, on a new connection
      continue;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (answers[i].ok) {
        out.push_back(parse_recovery(answers[i].res.get(), ids[i]));
      } else {
        out.emplace_back(failed("recover " + printable(ids[i]), answers[i]));
      }
    }
    return out;
  }
}

Result<std::uint64_t> PgReader::highest_fence() {
  return query<std::uint64_t>(Sql::kHighestFence, Params(), "read the highest fence",
                              [](const PGresult* r) { return parse_highest_fence(r); });
}

// --- the public object ---------------------------------------------------------------

Result<std::shared_ptr<PostgresJournal>> PostgresJournal::open(PostgresJournalOptions options) {
  if (options.conninfo.empty())
    return Error(ErrorCode::invalid_argument, "postgres journal: the connection string is empty");
  if (options.schema.empty())
    return Error(ErrorCode::invalid_argument, "postgres journal: the schema name is empty");
  if (options.max_batch_events == 0)
    return Error(ErrorCode::invalid_argument, "postgres journal: max_batch_events must be at least 1");
  if (options.writer_connections == 0 || options.writer_connections > 64)
    return Error(ErrorCode::invalid_argument, "postgres journal: writer_connections must be 1..64");
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
  impl_->core->write({detail::JournalWrite::Kind::append, std::move(batch), 0, {}, std::move(done)});
}

void PostgresJournal::delete_up_to(std::string persistence_id, std::uint64_t to_seq, Callback<void> done) {
  impl_->core->write({detail::JournalWrite::Kind::delete_to, AppendBatch{std::move(persistence_id), {}, {}}, to_seq,
                      {}, std::move(done)});
}

void PostgresJournal::save_snapshot(std::string persistence_id, SnapshotRecord snapshot, Callback<void> done) {
  impl_->core->write({detail::JournalWrite::Kind::snapshot, AppendBatch{std::move(persistence_id), {}, {}}, 0,
                      std::move(snapshot), std::move(done)});
}

void PostgresJournal::raise_fence(std::string key, std::uint64_t value, Callback<void> done) {
  impl_->core->write(
      {detail::JournalWrite::Kind::fence, AppendBatch{std::move(key), {}, {}}, value, {}, std::move(done)});
}

void PostgresJournal::replay(std::string persistence_id, std::uint64_t from_seq, std::uint64_t to_seq,
                             Callback<std::vector<EventRecord>> done) {
  impl_->core->read(std::move(done), [id = std::move(persistence_id), from_seq, to_seq](PgReader& r) {
    return r.replay(id, from_seq, to_seq);
  });
}

void PostgresJournal::highest_seq(std::string persistence_id, Callback<std::uint64_t> done) {
  auto* core = impl_->core.get();
  core->read(std::move(done), [core, id = std::move(persistence_id)](PgReader& r) {
    auto h = r.highest_seq(id);
    if (h) core->hint(id, *h);
    return h;
  });
}

void PostgresJournal::load_snapshot(std::string persistence_id, Callback<std::optional<SnapshotRecord>> done) {
  impl_->core->read(std::move(done), [id = std::move(persistence_id)](PgReader& r) { return r.load_snapshot(id); });
}

void PostgresJournal::recover(std::string persistence_id, Callback<Recovery> done) {
  impl_->core->recover(std::move(persistence_id), std::move(done));
}

void PostgresJournal::highest_fence(Callback<std::uint64_t> done) {
  impl_->core->read(std::move(done), [](PgReader& r) { return r.highest_fence(); });
}

PostgresJournal::Stats PostgresJournal::stats() const { return impl_->core->stats(); }

JournalStats PostgresJournal::journal_stats() const {
  const Stats s = stats();
  return {s.transactions, s.events_written};
}

std::uint64_t PostgresJournal::owner_incarnation() const noexcept { return impl_->core->owner_incarnation(); }

}  // namespace troupe
