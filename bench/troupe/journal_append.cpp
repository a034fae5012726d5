// journal_append_N on troupe's SqliteJournal and journal_append_pg_N on its
// PostgresJournal (see bench/common/journal_append.hpp; the raw peers are
// bench/peers/sqlite and bench/peers/pg_raw). N entities each keep exactly one
// append in flight: when an append is acknowledged the entity issues its
// next one from the callback, as an entity actor does once its persist
// completed. The journal's group commit gathers whatever is queued.

#include <libpq-fe.h>
#include <sqlite3.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/journal_append.hpp"
#include "common/report.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

constexpr const char* kSide = "bench_troupe";

struct Entity {
  std::string persistence_id;
  std::uint64_t next_seq = 1;  // touched only by the one append in flight
};

class Appenders {
 public:
  Appenders(troupe::Journal& journal, long entities) : journal_(journal), remaining_(entities) {
    entities_.reserve(static_cast<std::size_t>(entities));
    for (long i = 0; i < entities; ++i) entities_.push_back(Entity{bench::journal_persistence_id(i)});
  }

  void start() {
    for (auto& e : entities_) append(e);
  }

  // Entities stop issuing appends; waits until the last one in flight came back.
  void stop_and_drain() {
    stop_ = true;
    all_stopped_.get_future().wait();
  }

  const bench::AckMeter& acked() const { return acked_; }

  std::uint64_t stored_by_entities() const {
    std::uint64_t n = 0;
    for (const auto& e : entities_) n += e.next_seq - 1;
    return n;
  }

 private:
  void append(Entity& e) {
    troupe::AppendBatch batch;
    batch.persistence_id = e.persistence_id;
    batch.events.push_back(troupe::EventRecord{e.next_seq, bench::wall_clock_ms(), bench::kJournalEventType,
                                               bench::kJournalEventVersion, payload_});
    journal_.append(std::move(batch), [this, &e](troupe::Result<void> r) {
      if (!r.ok()) bench::journal_fail(kSide, "append to " + e.persistence_id + " failed: " + r.error().message());
      ++e.next_seq;
      acked_.add(1);
      if (stop_.load(std::memory_order_relaxed)) {
        if (remaining_.fetch_sub(1) == 1) all_stopped_.set_value();
      } else {
        append(e);
      }
    });
  }

  troupe::Journal& journal_;
  const std::string payload_ = bench::journal_payload();
  std::vector<Entity> entities_;
  bench::AckMeter acked_;
  std::atomic<bool> stop_{false};
  std::atomic<long> remaining_;
  std::promise<void> all_stopped_;
};

// Counts the stored events straight from the file, after the journal closed.
std::uint64_t count_rows(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "SELECT count(*) FROM events", -1, &st, nullptr) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW) {
    bench::journal_fail(kSide, "counting the rows of " + path + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
  }
  const auto rows = static_cast<std::uint64_t>(sqlite3_column_int64(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return rows;
}

// Counts the stored events through a connection of its own, after the
// journal closed.
std::uint64_t count_pg_rows(const std::string& conninfo) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  PGresult* r = PQstatus(c) == CONNECTION_OK ? PQexec(c, "SELECT count(*) FROM events") : nullptr;
  if (r == nullptr || PQresultStatus(r) != PGRES_TUPLES_OK)
    bench::journal_fail(kSide, std::string("counting the rows in PostgreSQL: ") + PQerrorMessage(c));
  const auto rows = std::stoull(PQgetvalue(r, 0, 0));
  PQclear(r);
  PQfinish(c);
  return rows;
}

// Runs the workload on `journal` (which it closes) and reports `metric`,
// after checking that what `count_rows` finds stored is exactly what was
// acknowledged.
void measure(std::shared_ptr<troupe::Journal> journal, long entities, const std::string& metric,
             const std::function<std::uint64_t()>& count_rows) {
  auto appenders = std::make_unique<Appenders>(*journal, entities);
  appenders->start();
  const double rate = appenders->acked().measure();
  appenders->stop_and_drain();
  const std::uint64_t acked = appenders->acked().count();
  const std::uint64_t by_entities = appenders->stored_by_entities();
  // Closing joins the journal's threads, so no callback still runs when the
  // appenders go.
  journal.reset();
  appenders.reset();

  const std::uint64_t rows = count_rows();
  if (rows != acked || by_entities != acked)
    bench::journal_fail(kSide, std::to_string(acked) + " events acknowledged, " + std::to_string(by_entities) +
                                   " by the entities' sequence numbers, but the table holds " +
                                   std::to_string(rows));
  bench::report(metric.c_str(), rate, "events/s");
}

}  // namespace

namespace troupe_bench {

void journal_append(long entities) {
  bench::TempDir dir(kSide);
  troupe::SqliteJournalOptions opts;
  opts.path = (dir.path() / "journal.db").string();
  opts.durability = troupe::Durability::full;
  auto opened = troupe::SqliteJournal::open(opts);
  if (!opened.ok()) bench::journal_fail(kSide, "open " + opts.path + ": " + opened.error().message());
  measure(std::move(*opened), entities, std::string(bench::kJournalSqlitePrefix) + std::to_string(entities),
          [&] { return count_rows(opts.path); });
}

// PostgresJournal with its defaults, in the fresh database bench/run made
// for this process (its schema "public").
void journal_append_pg(long entities) {
  troupe::PostgresJournalOptions opts;
  opts.conninfo = bench::pg_conninfo(kSide);
  if (opts.max_batch_events != bench::kJournalMaxBatchEvents)
    bench::journal_fail(kSide, "PostgresJournalOptions::max_batch_events defaults to " +
                                   std::to_string(opts.max_batch_events) + ", the peer commits at most " +
                                   std::to_string(bench::kJournalMaxBatchEvents) +
                                   ": keep bench/common/journal_append.hpp in step");
  if (opts.writer_connections != static_cast<unsigned>(bench::kPgWriterConnections))
    bench::journal_fail(kSide, "PostgresJournalOptions::writer_connections defaults to " +
                                   std::to_string(opts.writer_connections) + ", the peer writes through " +
                                   std::to_string(bench::kPgWriterConnections) +
                                   ": keep bench/common/journal_append.hpp in step");
  auto opened = troupe::PostgresJournal::open(opts);
  if (!opened.ok()) bench::journal_fail(kSide, "open PostgresJournal: " + opened.error().message());
  measure(std::move(*opened), entities, std::string(bench::kJournalPgPrefix) + std::to_string(entities),
          [&] { return count_pg_rows(opts.conninfo); });
}

}  // namespace troupe_bench
