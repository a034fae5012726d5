// PostgresJournal: writer lanes (postgres_writer.cpp) and reader
// connections, run by the group-commit engine (journal_engine.hpp); the
// readers' reconnects, the schema check and its migration. Table layout, statements and the rules
// enforced here are documented in doc/journal.md ("PostgreSQL"); keep the
// two in step.

#include "troupe/persist/postgres_journal.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../journal_engine.hpp"
#include "pg_announce.hpp"
#include "pg_outbox.hpp"
#include "pg_support.hpp"
#include "postgres_writer.hpp"

namespace troupe {

using namespace troupe::pg;

namespace {
Error closed_error() { return Error(ErrorCode::journal_failed, "postgres journal is closed"); }
// Recoveries a reader sends in one round trip at most.
constexpr std::size_t kRecoverBatch = 256;
}  // namespace

// One read connection; used by one reader thread at a time. What it learns
// of an id's highest seq it passes on to the id's writer lane (`hint`).
class PgReader final : public detail::JournalReader {
 public:
  using Hint = std::function<void(const std::string& id, std::uint64_t highest)>;
  PgReader(Shared& shared, Hint hint) : shared_(shared), hint_(std::move(hint)) {}
  Result<void> connect_now();

  Result<std::vector<EventRecord>> replay(const std::string& id, std::uint64_t from, std::uint64_t to) override;
  Result<std::uint64_t> highest_seq(const std::string& id) override;
  Result<std::optional<SnapshotRecord>> load_snapshot(const std::string& id) override;
  Result<Recovery> recover(const std::string& id) override;
  // The recoveries of `ids`, in order, in one round trip.
  std::vector<Result<Recovery>> recover_many(const std::vector<std::string>& ids) override;
  Result<std::uint64_t> highest_fence() override;
  Result<OutboxView> read_outbox(const OutboxQuery& query) override;
  Result<EventPage> query_events(const EventQuery& query) override;

 private:
  // Runs prepared statement `name` with `params` and hands its result to
  // `parse`, reconnecting once if the connection is (or turns out to be)
  // lost: reads are safe to repeat. `doing` names the read in errors.
  template <class T, class Parse>
  Result<T> query(const char* name, const Params& params, const std::string& doing, Parse&& parse);
  // The connection, opened again if it is (or was found) lost.
  Result<PGconn*> connection();
  std::vector<Result<Recovery>> recover_all(const std::vector<std::string>& ids);

  Shared& shared_;
  const Hint hint_;
  PgConn conn_;
};

// Everything the journal's threads use. Held by shared_ptr: by the public
// object and by each thread, so that the journal may be destroyed from one
// of its own callbacks. The engine is declared last: it goes first, with
// the lanes and readers, which use the rest.
class PostgresJournal::Impl {
 public:
  Impl(PostgresJournalOptions options, std::string quoted_schema)
      : shared(std::move(options), quoted_schema),
        // The channel: the schema's name with ".events" (a quoted identifier).
        announcer(shared, quoted_schema.substr(0, quoted_schema.size() - 1) + ".events\"",
                  [this] { engine.notify_appended(); }),
        engine({shared.options.max_batch_events, kRecoverBatch, closed_error, true}) {}

  Result<void> open();

  // A reader saw `highest` stored for `id`: the id's lane need not read it.
  void hint(const std::string& id, std::uint64_t highest) { lanes[engine.lane_of(id)]->hint(id, highest); }

  Shared shared;
  // Tells other processes' journals of this one's commits and hears theirs.
  Announcer announcer;
  std::vector<Writer*> lanes;  // owned by the engine
  detail::JournalEngine engine;

 private:
  Result<void> check_schema(PGconn* c);
};

// --- open -------------------------------------------------------------------------

Result<void> PostgresJournal::Impl::check_schema(PGconn* w) {
  const Sql& sql = shared.sql;
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
    std::int64_t version = 2;  // what `create` makes; the migrations below finish it
    if (*PQgetvalue(exists->res.get(), 0, 0) == 0) {  // binary bool
      if (auto c = script(sql.create, "create the tables"); !c) return c;
    } else {
      auto v = step(sql.read_version, "read the schema version");
      if (!v) return std::move(v).error();
      const PGresult* r = v->res.get();
      version = PQgetisnull(r, 0, 0) != 0 ? 0 : read_int8(PQgetvalue(r, 0, 0));
    }
    if (version > kSchemaVersion)
      return Error(ErrorCode::journal_failed, "postgres journal: schema version " + std::to_string(version) +
                                                  " is newer than this build understands (" +
                                                  std::to_string(kSchemaVersion) + ")");
    if (version == 1) {
      if (auto m = script(sql.migrate_from_1, "add the fences (schema 1 to 2)"); !m) return m;
      version = 2;
    }
    if (version == 2) {
      if (auto m = script(sql.migrate_from_2, "add the global order and tags (schema 2 to 3)"); !m) return m;
      version = 3;
    }
    if (version != kSchemaVersion)
      return Error(ErrorCode::journal_failed, "postgres journal: unknown schema version " + std::to_string(version));
    return {};
  }();
  // The events' trace_id column, in a new schema or one from before it.
  if (schema) {
    auto has = step(sql.has_trace_column, "look for the trace_id column");
    if (!has) {
      schema = std::move(has).error();
    } else if (read_int8(PQgetvalue(has->res.get(), 0, 0)) == 0) {
      schema = script(sql.add_trace_column, "add the trace_id column");
    }
  }
  if (schema) schema = script(sql.outbox_create, "create the outbox table");
  if (!schema) {
    (void)run(w, "ROLLBACK");
    return schema;
  }
  if (auto o = step("COMMIT", "commit the schema"); !o) return std::move(o).error();
  return {};
}

Result<void> PostgresJournal::Impl::open() {
  const PostgresJournalOptions& options = shared.options;
  // The tables first, on a plain connection: the lanes prepare statements
  // that name them.
  {
    auto c = shared.connect({});
    if (!c) return std::move(c).error();
    if (auto r = check_schema(c->get()); !r) return r;
  }
  std::vector<std::unique_ptr<detail::JournalLane>> writers;
  for (unsigned i = 0; i < options.writer_connections; ++i) {
    auto w = std::make_unique<Writer>(shared);
    if (auto r = w->connect_now(); !r) return r;
    lanes.push_back(w.get());
    writers.push_back(std::move(w));
  }
  if (!options.owner.empty()) {
    // This journal's incarnation as the owner: one above the last one's. The
    // raise waits for that one's appends in flight, and refuses the rest.
    Fence owner{"owner|" + options.owner, 0};
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(options.unavailable_timeout_ms, 1000));
    auto v = lanes.front()->raise(owner.key, 0, true, deadline);
    if (!v) return std::move(v).error();
    owner.value = *v;
    shared.owner = std::move(owner);
  }
  std::vector<std::unique_ptr<detail::JournalReader>> readers;
  for (unsigned i = 0; i < options.reader_connections; ++i) {
    auto r = std::make_unique<PgReader>(shared, [this](const std::string& id, std::uint64_t h) { hint(id, h); });
    if (auto c = r->connect_now(); !c) return c;
    readers.push_back(std::move(r));
  }
  if (auto a = announcer.open(); !a) return a;
  shared.announcer = &announcer;  // the lanes announce their commits
  engine.open(std::move(writers), std::move(readers));
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
  auto h = query<std::uint64_t>(Sql::kHighest, p, "read the highest seq of " + printable(id),
                                [&](const PGresult* r) { return parse_highest(r, id); });
  if (h) hint_(id, *h);
  return h;
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
  auto out = recover_all(ids);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (out[i]) hint_(ids[i], out[i]->highest_seq);
  return out;
}

std::vector<Result<Recovery>> PgReader::recover_all(const std::vector<std::string>& ids) {
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

Result<OutboxView> PgReader::read_outbox(const OutboxQuery& q) {
  auto counts = query<OutboxView>(Sql::kOutboxCounts, Params(), "count the outbox",
                                  [](const PGresult* r) { return parse_outbox_counts(r); });
  if (!counts || q.limit == 0) return counts;
  Params p;
  p.int8(q.status == OutboxStatus::pending ? 0 : 1);
  p.int8(static_cast<std::int64_t>(std::min<std::size_t>(q.limit, INT64_MAX)));
  auto entries = query<std::vector<OutboxEntry>>(Sql::kOutboxEntries, p, "list the outbox",
                                                 [](const PGresult* r) { return parse_outbox_entries(r); });
  if (!entries) return std::move(entries).error();
  counts->entries = std::move(*entries);
  return counts;
}

Result<EventPage> PgReader::query_events(const EventQuery& q) {
  const bool by_tag = !q.select.tag.empty();
  Params p;
  p.bytes(by_tag ? q.select.tag : q.select.entity_type);
  p.xid8(q.after.tx);
  // Orderings are bigints: after the largest there is nothing in that tx.
  p.int8(static_cast<std::int64_t>(std::min(q.after.ordering, kMaxSeq)));
  p.int8(static_cast<std::int64_t>(q.limit));
  // An empty page while committed events wait behind the horizon (an older
  // transaction, usually another lane's commit, is still open): ask again
  // for a while, so a query made after an append returned sees it unless
  // some transaction stays open longer than the query's hidden_wait. A page with
  // events returns at once: its reader comes back for the rest, and under
  // load some transaction is nearly always open.
  const auto deadline = Clock::now() + q.hidden_wait;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    bool behind = false;
    auto page = query<EventPage>(by_tag ? Sql::kQueryTag : Sql::kQueryType, p,
                                 "query " + printable(q.select.to_string()),
                                 [&](const PGresult* r) { return parse_page(r, behind); });
    if (!page || !behind || !page->events.empty() || Clock::now() + pause > deadline) return page;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(16));
  }
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
  auto impl = std::make_shared<Impl>(std::move(options), std::move(quoted_schema));
  if (auto r = impl->open(); !r) return std::move(r).error();
  impl->engine.start(impl);
  impl->announcer.start(impl);
  return std::shared_ptr<PostgresJournal>(new PostgresJournal(std::move(impl)));
}

// The engine's handle shares ownership of the whole state.
PostgresJournal::PostgresJournal(std::shared_ptr<Impl> impl)
    : GroupCommitJournal(std::shared_ptr<detail::JournalEngine>(impl, &impl->engine)), impl_(std::move(impl)) {}

// The announcer first: its thread holds the state alive. The engine's
// threads stop in ~GroupCommitJournal, right after.
PostgresJournal::~PostgresJournal() { impl_->announcer.stop(); }

PostgresJournal::Stats PostgresJournal::stats() const {
  return {GroupCommitJournal::stats(), impl_->shared.reconnects.load(std::memory_order_relaxed)};
}

std::uint64_t PostgresJournal::owner_incarnation() const noexcept { return impl_->shared.owner.value; }

}  // namespace troupe
