// projection_throughput: events/s a Projection applies to an SQLite read
// model with exactly-once offsets (each page and its offset in one
// transaction, synchronous = FULL like the journal of journal_append_N).
// The journal is filled first (kEvents events of kEntities entities, in
// group commits, as journal_append_10000 stores them); the projection then
// starts at the beginning and the time until it has applied every event is
// measured. Its handler keeps a count per entity (an upsert per event), the
// shape of a typical read model. Set beside journal_append_10000 of the
// same invocation: `bench/run --filter '^(journal_append_10000|projection)'`.

#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "common/journal_append.hpp"
#include "common/report.hpp"
#include "troupe/core/actor_system.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "troupe/persist/sqlite_read_model.hpp"

namespace {

constexpr const char* kSide = "bench_troupe";
constexpr long kEvents = 200'000;
constexpr long kEntities = 10'000;

struct Counts {
  using ReadModel = troupe::SqliteReadModel;
  troupe::Result<void> setup(troupe::SqliteTransaction& tx) {
    return tx.exec("CREATE TABLE IF NOT EXISTS counts (id TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID");
  }
  troupe::Result<void> apply(troupe::SqliteTransaction& tx, const troupe::StreamEvent& e) {
    return tx.exec("INSERT INTO counts (id, n) VALUES (?1, 1) ON CONFLICT (id) DO UPDATE SET n = n + 1",
                   {e.persistence_id});
  }
};

// Appends `events` events round-robin over `entities` ids, many in flight.
void fill(troupe::Journal& journal, long events, long entities) {
  const std::string payload = bench::journal_payload();
  std::atomic<long> left{events};
  std::promise<void> done;
  std::atomic<long> in_flight{0};
  std::vector<std::uint64_t> next(static_cast<std::size_t>(entities), 1);
  for (long i = 0; i < events; ++i) {
    const auto ent = static_cast<std::size_t>(i % entities);
    troupe::AppendBatch b;
    b.persistence_id = bench::journal_persistence_id(static_cast<long>(ent));
    b.events.push_back(troupe::EventRecord{next[ent]++, bench::wall_clock_ms(), bench::kJournalEventType,
                                           bench::kJournalEventVersion, payload});
    while (in_flight.load(std::memory_order_relaxed) > 20'000) std::this_thread::yield();
    in_flight.fetch_add(1, std::memory_order_relaxed);
    journal.append(std::move(b), [&](troupe::Result<void> r) {
      if (!r) bench::journal_fail(kSide, "filling the journal: " + r.error().message());
      in_flight.fetch_sub(1, std::memory_order_relaxed);
      if (left.fetch_sub(1) == 1) done.set_value();
    });
  }
  done.get_future().wait();
}

std::int64_t sum_counts(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_stmt* st = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db, "SELECT coalesce(sum(n), 0) FROM counts", -1, &st, nullptr) != SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW)
    bench::journal_fail(kSide, "reading the read model " + path + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
  const auto n = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n;
}

}  // namespace

namespace troupe_bench {

void projection_throughput() {
  const long events = kEvents / bench::scale();
  bench::TempDir dir(kSide);
  troupe::SqliteJournalOptions jo;
  jo.path = (dir.path() / "journal.db").string();
  jo.durability = troupe::Durability::full;
  auto journal = troupe::SqliteJournal::open(jo);
  if (!journal) bench::journal_fail(kSide, "open " + jo.path + ": " + journal.error().message());
  fill(**journal, events, kEntities);

  const std::string model_path = (dir.path() / "read.db").string();
  auto model = troupe::SqliteReadModel::open({.path = model_path, .synchronous_full = true});
  if (!model) bench::journal_fail(kSide, "open the read model: " + model.error().message());
  troupe::ActorSystem system(troupe::SystemConfig{.threads = 1});
  troupe::ProjectionSettings s;
  s.name = "counts";
  s.source = troupe::EventSelector::of_type("bench");
  const auto start = std::chrono::steady_clock::now();
  auto p = troupe::Projection<Counts>::start(system, *journal, *model, s);
  if (!p) bench::journal_fail(kSide, "start the projection: " + p.error().message());
  if (!p->wait_until([&](const troupe::ProjectionStatus& st) {
        return st.events_applied >= static_cast<std::uint64_t>(events) || st.failure;
      },
                     std::chrono::minutes(10)))
    bench::journal_fail(kSide, "the projection did not catch up in 10 minutes");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (auto f = p->status().failure) bench::journal_fail(kSide, "the projection failed: " + f->error.message());
  p->stop();
  system.shutdown();
  const auto applied = sum_counts(model_path);
  if (applied != events)
    bench::journal_fail(kSide, "the read model counts " + std::to_string(applied) + " events of " +
                                   std::to_string(events));
  bench::report("projection_throughput", static_cast<double>(events) / secs, "events/s");
}

}  // namespace troupe_bench
