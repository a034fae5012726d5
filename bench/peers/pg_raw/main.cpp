// Raw libpq peer of the PostgreSQL journal workloads:
// `bench_pg_raw journal_append_pg_<N>` stores the rows troupe's
// PostgresJournal stores, with the same batching, connections and
// durability, written by hand straight through libpq — what a competent
// engineer would write for "N writers append events to PostgreSQL", and so
// the limit a journal on PostgreSQL can reach on this machine. Prints one
// JSON line per metric (see bench/common/report.hpp and
// bench/common/journal_append.hpp). The server and a fresh database come
// from bench/run (TROUPE_BENCH_PG_CONNINFO). Unknown workload -> stderr,
// exit 2.
//
// What it does, and why it is a fair baseline:
//  - the same table and index: PostgresJournal's events table, column for
//    column (persistence_id bytea, seq bigint, timestamp_ms bigint, type
//    bytea, version bigint, payload bytea) with its only index, the primary
//    key (persistence_id, seq), in the schema PostgresJournal uses by
//    default ("public"). The journal's other tables (deletions, snapshots,
//    journal_schema) play no part in appending;
//  - the same rows (bench/common/journal_append.hpp), every column sent per
//    row, in binary, as the journal sends them;
//  - the same durability: the server's own settings, which bench/run starts
//    with fsync=on and synchronous_commit=on (checked here: the run fails if
//    either is off); a batch counts as stored when its COMMIT returned;
//  - the same group commit: N entities each keep one append of one event in
//    flight; a writer takes whatever is pending (at most
//    kJournalMaxBatchEvents events, the journal's max_batch_events) and
//    commits it as one transaction; an entity's next append is pending as
//    soon as the commit of its previous one returned;
//  - the same number of write connections, kPgWriterConnections
//    (PostgresJournal's writer lanes), one thread each; any writer takes
//    any pending entity (the journal pins each id to one lane, which can
//    only leave a lane idle, never help it);
//  - done the efficient way: one prepared statement,
//      INSERT INTO events (...) SELECT * FROM unnest($1::bytea[], $2::int8[], ...)
//    whose six parameters are binary arrays holding the whole batch, run
//    outside an explicit transaction block, so a batch is one statement, one
//    implicit transaction and one round trip, with no planning per batch and
//    no limit of 65,535 parameters per statement. No SAVEPOINT and no read
//    of the highest seq: each entity knows its next seq, and a conflicting
//    append would be refused by the primary key (and fail the run);
//  - measured like the troupe side (bench::AckMeter), and afterwards the
//    table must hold exactly the events acknowledged.

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/journal_append.hpp"
#include "common/report.hpp"

namespace {

constexpr const char* kSide = "bench_pg_raw";

// Type OIDs (pg_type.h is a server header).
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kByteaArrayOid = 1001;
constexpr Oid kInt8ArrayOid = 1016;

constexpr const char* kCreateTable =
    "CREATE TABLE events (persistence_id bytea NOT NULL, seq bigint NOT NULL, timestamp_ms bigint, type bytea, "
    "version bigint, payload bytea, PRIMARY KEY (persistence_id, seq))";
constexpr const char* kInsertName = "append";
constexpr const char* kInsert =
    "INSERT INTO events (persistence_id, seq, timestamp_ms, type, version, payload) "
    "SELECT * FROM unnest($1::bytea[], $2::int8[], $3::int8[], $4::bytea[], $5::int8[], $6::bytea[])";

[[noreturn]] void fail_conn(PGconn* c, const std::string& what) {
  bench::journal_fail(kSide, what + ": " + (c ? PQerrorMessage(c) : "out of memory"));
}

PGconn* connect(const std::string& conninfo) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  if (c == nullptr || PQstatus(c) != CONNECTION_OK) fail_conn(c, "connect");
  return c;
}

// Runs one statement without parameters; returns its first value, if any.
std::string exec(PGconn* c, const char* sql) {
  PGresult* r = PQexec(c, sql);
  const ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) fail_conn(c, sql);
  std::string v = st == PGRES_TUPLES_OK && PQntuples(r) > 0 ? PQgetvalue(r, 0, 0) : "";
  PQclear(r);
  return v;
}

void put_int32(std::string& b, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<char>((v >> shift) & 0xff));
}
void put_int64(std::string& b, std::uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) b.push_back(static_cast<char>((v >> shift) & 0xff));
}

// A one-dimensional array parameter in PostgreSQL's binary array format:
// ndim, has-nulls flag, element type, length, lower bound, then each
// element as its length and bytes.
class ArrayParam {
 public:
  explicit ArrayParam(Oid element) : element_(element) {}
  void start(std::size_t n) {
    buf_.clear();
    put_int32(buf_, 1);
    put_int32(buf_, 0);
    put_int32(buf_, element_);
    put_int32(buf_, static_cast<std::uint32_t>(n));
    put_int32(buf_, 1);
  }
  void bytes(const std::string& s) {
    put_int32(buf_, static_cast<std::uint32_t>(s.size()));
    buf_ += s;
  }
  void int8(std::int64_t v) {
    put_int32(buf_, 8);
    put_int64(buf_, static_cast<std::uint64_t>(v));
  }
  const std::string& data() const { return buf_; }

 private:
  Oid element_;
  std::string buf_;
};

// The entities and their appends in flight: `pending` holds the entities
// whose next append waits for a writer; each entity is in it, or in one
// writer's batch, at any time.
struct Appends {
  std::vector<std::string> ids;
  std::vector<std::int64_t> next_seq;  // touched only by the writer holding the entity's append
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::uint32_t> pending;
  bool stop = false;
  bench::AckMeter committed;
};

// One write connection: takes whatever is pending (at most
// kJournalMaxBatchEvents), stores it in one transaction, acknowledges it
// and makes the entities' next appends pending.
void writer(Appends& a, PGconn* c) {
  const std::string type = bench::kJournalEventType;
  const std::string payload = bench::journal_payload();
  ArrayParam ids(kByteaOid), seqs(kInt8Oid), times(kInt8Oid), types(kByteaOid), versions(kInt8Oid),
      payloads(kByteaOid);
  ArrayParam* params[] = {&ids, &seqs, &times, &types, &versions, &payloads};
  std::vector<std::uint32_t> batch;
  for (;;) {
    {
      std::unique_lock lk(a.mu);
      a.cv.wait(lk, [&] { return !a.pending.empty() || a.stop; });
      if (a.stop) return;
      const std::size_t n = std::min(a.pending.size(), bench::kJournalMaxBatchEvents);
      batch.assign(a.pending.begin(), a.pending.begin() + static_cast<std::ptrdiff_t>(n));
      a.pending.erase(a.pending.begin(), a.pending.begin() + static_cast<std::ptrdiff_t>(n));
    }
    for (ArrayParam* p : params) p->start(batch.size());
    for (std::uint32_t e : batch) {
      ids.bytes(a.ids[e]);
      seqs.int8(a.next_seq[e]);
      times.int8(bench::wall_clock_ms());
      types.bytes(type);
      versions.int8(bench::kJournalEventVersion);
      payloads.bytes(payload);
    }
    const char* values[6];
    int lengths[6];
    const int formats[6] = {1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 6; ++i) {
      values[i] = params[i]->data().data();
      lengths[i] = static_cast<int>(params[i]->data().size());
    }
    PGresult* r = PQexecPrepared(c, kInsertName, 6, values, lengths, formats, 1);
    if (r == nullptr || PQresultStatus(r) != PGRES_COMMAND_OK) fail_conn(c, "INSERT");
    PQclear(r);
    for (std::uint32_t e : batch) ++a.next_seq[e];
    a.committed.add(batch.size());
    {
      std::lock_guard lk(a.mu);
      a.pending.insert(a.pending.end(), batch.begin(), batch.end());
    }
    a.cv.notify_all();
  }
}

void journal_append(long entities) {
  const std::string conninfo = bench::pg_conninfo(kSide);
  PGconn* setup = connect(conninfo);
  PQsetNoticeProcessor(setup, [](void*, const char*) {}, nullptr);
  for (const char* setting : {"fsync", "synchronous_commit"}) {
    const std::string v = exec(setup, (std::string("SHOW ") + setting).c_str());
    if (v != "on") bench::journal_fail(kSide, std::string(setting) + " is '" + v + "', expected 'on'");
  }
  exec(setup, kCreateTable);

  Appends a;
  a.ids.reserve(static_cast<std::size_t>(entities));
  for (long i = 0; i < entities; ++i) {
    a.ids.push_back(bench::journal_persistence_id(i));
    a.pending.push_back(static_cast<std::uint32_t>(i));
  }
  a.next_seq.assign(a.ids.size(), 1);

  std::vector<PGconn*> conns;
  for (int i = 0; i < bench::kPgWriterConnections; ++i) {
    PGconn* c = connect(conninfo);
    const Oid types[6] = {kByteaArrayOid, kInt8ArrayOid, kInt8ArrayOid, kByteaArrayOid, kInt8ArrayOid, kByteaArrayOid};
    PGresult* r = PQprepare(c, kInsertName, kInsert, 6, types);
    if (r == nullptr || PQresultStatus(r) != PGRES_COMMAND_OK) fail_conn(c, "PREPARE");
    PQclear(r);
    conns.push_back(c);
  }
  std::vector<std::thread> writers;
  for (PGconn* c : conns) writers.emplace_back([&a, c] { writer(a, c); });

  const double rate = a.committed.measure();
  {
    std::lock_guard lk(a.mu);
    a.stop = true;
  }
  a.cv.notify_all();
  for (auto& t : writers) t.join();
  for (PGconn* c : conns) PQfinish(c);

  // Everything acknowledged must be in the table, and nothing else.
  const std::uint64_t rows = std::stoull(exec(setup, "SELECT count(*) FROM events"));
  std::uint64_t by_entities = 0;
  for (std::int64_t s : a.next_seq) by_entities += static_cast<std::uint64_t>(s - 1);
  if (rows != a.committed.count() || by_entities != rows)
    bench::journal_fail(kSide, "committed " + std::to_string(a.committed.count()) + " events (" +
                                   std::to_string(by_entities) + " by the entities' sequence numbers) but the "
                                   "table holds " + std::to_string(rows));
  PQfinish(setup);

  const std::string metric = std::string(bench::kJournalPgPrefix) + std::to_string(entities);
  bench::report(metric.c_str(), rate, "events/s");
}

}  // namespace

int main(int argc, char** argv) {
  return bench::journal_peer_main(argc, argv, kSide, bench::kJournalPgPrefix, journal_append);
}
