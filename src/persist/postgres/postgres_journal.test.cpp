// PostgreSQL-specific behaviour of PostgresJournal; the shared guarantees are
// in src/persist/journal_contract.test.cpp.

#include "troupe/persist/postgres_journal.hpp"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../journal_test_support.hpp"
#include "postgres_test_server.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::PostgresJournal;
using troupe::PostgresJournalOptions;

std::shared_ptr<PostgresJournal> open_journal(const std::string& conninfo, const std::string& schema,
                                              int unavailable_timeout_ms = 2000) {
  PostgresJournalOptions o;
  o.conninfo = conninfo;
  o.schema = schema;
  o.unavailable_timeout_ms = unavailable_timeout_ms;
  auto j = PostgresJournal::open(o);
  if (!j.ok()) throw std::runtime_error(j.error().to_string());
  return *j;
}

void exec_sql(const std::string& conninfo, const std::string& sql) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
  PGresult* r = PQexec(c, sql.c_str());
  EXPECT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQresultErrorMessage(r);
  PQclear(r);
  PQfinish(c);
}

TEST(PostgresJournal, many_concurrent_appends_share_few_transactions) {
  auto j = open_journal(troupe::test::shared_postgres_conninfo(), troupe::test::fresh_schema());
  constexpr int n = 2000;
  std::atomic<int> ok{0}, done{0};
  std::promise<void> all;
  for (int i = 0; i < n; ++i)
    j->append(batch("g" + std::to_string(i % 200), static_cast<std::uint64_t>(i / 200 + 1),
                    static_cast<std::uint64_t>(i / 200 + 1)),
              [&](Result<void> r) {
                if (r.ok()) ++ok;
                if (++done == n) all.set_value();
              });
  ASSERT_EQ(all.get_future().wait_for(30s), std::future_status::ready);
  EXPECT_EQ(ok.load(), n);
  auto s = j->stats();
  EXPECT_EQ(s.events_written, static_cast<std::uint64_t>(n));
  EXPECT_LT(s.transactions, static_cast<std::uint64_t>(n / 4)) << "group commit should batch appends";
  EXPECT_EQ(seqs(*js::replay(*j, "g7")), range(1, 10));
}

TEST(PostgresJournal, recoveries_asked_at_once_each_get_their_own_history_and_a_corrupt_one_fails_alone) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  auto j = open_journal(conninfo, schema);
  // 60 ids with i % 7 + 1 events, every third of them with a snapshot at
  // seq 1 and every fifth with its first event deleted; one corrupt id.
  constexpr int kStored = 60, kEmpty = 400;
  for (int i = 0; i < kStored; ++i) {
    const std::string id = "r" + std::to_string(i);
    const auto last = static_cast<std::uint64_t>(i % 7 + 1);
    ASSERT_TRUE(js::append(*j, batch(id, 1, last)).ok());
    if (i % 3 == 0) {
      troupe::SnapshotRecord snap{1, 5, "S", 1, "snap-" + id};
      ASSERT_TRUE(js::save_snapshot(*j, id, snap).ok());
    }
    if (i % 5 == 0) {
      ASSERT_TRUE(js::delete_up_to(*j, id, 1).ok());
    }
  }
  ASSERT_TRUE(js::append(*j, batch("corrupt", 1, 2)).ok());
  exec_sql(conninfo, "UPDATE \"" + schema + "\".events SET payload = NULL WHERE persistence_id = '\\x636f7272757074'");

  // All at once: far more than the readers, so most wait and go in batches.
  std::vector<std::string> ids;
  for (int i = 0; i < kStored; ++i) ids.push_back("r" + std::to_string(i));
  for (int i = 0; i < kEmpty; ++i) ids.push_back("none-" + std::to_string(i));
  ids.insert(ids.begin() + kStored / 2, "corrupt");
  std::vector<std::promise<Result<troupe::Recovery>>> answers(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i)
    j->recover(ids[i], [&answers, i](Result<troupe::Recovery> r) { answers[i].set_value(std::move(r)); });
  for (std::size_t k = 0; k < ids.size(); ++k) {
    auto f = answers[k].get_future();
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready) << ids[k];
    auto r = f.get();
    const std::string& id = ids[k];
    if (id == "corrupt") {
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.error().code(), ErrorCode::corrupt_record) << r.error().to_string();
      continue;
    }
    ASSERT_TRUE(r.ok()) << id << ": " << r.error().to_string();
    if (id.rfind("none-", 0) == 0) {
      EXPECT_FALSE(r->snapshot.has_value()) << id;
      EXPECT_TRUE(r->events.empty()) << id;
      EXPECT_EQ(r->highest_seq, 0u) << id;
      continue;
    }
    const int i = std::stoi(id.substr(1));
    const auto last = static_cast<std::uint64_t>(i % 7 + 1);
    EXPECT_EQ(r->highest_seq, last) << id;
    if (i % 3 == 0) {
      ASSERT_TRUE(r->snapshot.has_value()) << id;
      EXPECT_EQ(r->snapshot->payload, "snap-" + id);
      EXPECT_EQ(seqs(r->events), last >= 2 ? range(2, last) : range(1, 0)) << id;
    } else {
      EXPECT_FALSE(r->snapshot.has_value()) << id;
      const std::uint64_t first = i % 5 == 0 ? 2 : 1;
      EXPECT_EQ(seqs(r->events), last >= first ? range(first, last) : range(1, 0)) << id;
    }
  }
  // The corrupt id's neighbours in its round trip were answered above; the
  // journal goes on.
  ASSERT_TRUE(js::append(*j, batch("r1", 3, 3)).ok());
}

TEST(PostgresJournal, a_conflict_fails_only_its_own_batch_in_a_shared_transaction) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  auto j = open_journal(conninfo, schema);
  ASSERT_TRUE(js::append(*j, batch("c", 1, 2)).ok());
  // A row written behind the journal's back: only the primary key can catch it.
  exec_sql(conninfo, "INSERT INTO \"" + schema +
                         "\".events VALUES ('\\x63'::bytea, 4, 0, '\\x74'::bytea, 1, '\\x'::bytea)");
  std::promise<Result<void>> a, b, c;
  j->append(batch("ok1", 1, 3), [&](Result<void> r) { a.set_value(std::move(r)); });
  j->append(batch("c", 3, 4), [&](Result<void> r) { b.set_value(std::move(r)); });
  j->append(batch("ok2", 1, 1), [&](Result<void> r) { c.set_value(std::move(r)); });
  auto rb = b.get_future().get();
  EXPECT_TRUE(a.get_future().get().ok());
  EXPECT_TRUE(c.get_future().get().ok());
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(rb.error().code(), ErrorCode::journal_conflict) << rb.error().to_string();
  EXPECT_EQ(js::replay(*j, "ok1")->size(), 3u);
  EXPECT_EQ(js::replay(*j, "ok2")->size(), 1u);
  EXPECT_EQ(*js::highest_seq(*j, "c"), 4u);  // 3 was not stored
}

// Nodes share one schema; each id has one writer at a time.
// proves: E7
TEST(PostgresJournal, two_journals_on_one_schema_take_turns_on_an_id_and_refuse_a_stale_writer) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  auto a = open_journal(conninfo, schema);
  auto b = open_journal(conninfo, schema);
  ASSERT_TRUE(js::append(*a, batch("e", 1, 2)).ok());  // a's writer now knows 2
  ASSERT_TRUE(js::append(*b, batch("e", 3, 4)).ok());  // the id moved to b (a hand-off)
  auto back = js::append(*a, batch("e", 5, 5));         // and back to a, which recovered to 4
  EXPECT_TRUE(back.ok()) << back.error().to_string();
  auto stale = js::append(*b, batch("e", 5, 6));        // b still thinks it owns the id
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ErrorCode::journal_conflict) << stale.error().to_string();
  EXPECT_EQ(seqs(*js::replay(*b, "e")), range(1, 5));
}

TEST(PostgresJournal, a_bad_connection_string_fails_open_with_a_clear_error) {
  PostgresJournalOptions o;
  o.conninfo = "host=127.0.0.1 port=1 connect_timeout=2 dbname=none";
  auto j = PostgresJournal::open(o);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(j.error().message().find("cannot connect"), std::string::npos) << j.error().to_string();
  o.conninfo = "this is = not a connection string";
  j = PostgresJournal::open(o);
  ASSERT_FALSE(j.ok());
  EXPECT_EQ(j.error().code(), ErrorCode::journal_failed);
  EXPECT_FALSE(j.error().message().empty());
}

TEST(PostgresJournal, a_corrupt_row_is_a_corrupt_record_on_replay) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  auto j = open_journal(conninfo, schema);
  ASSERT_TRUE(js::append(*j, batch("bad", 1, 3)).ok());
  ASSERT_TRUE(js::append(*j, batch("good", 1, 1)).ok());
  exec_sql(conninfo, "UPDATE \"" + schema + "\".events SET type = NULL WHERE seq = 2 AND persistence_id = '\\x626164'");
  auto r = js::replay(*j, "bad");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::corrupt_record);
  EXPECT_NE(r.error().message().find("'bad' seq 2"), std::string::npos) << r.error().to_string();
  EXPECT_EQ(js::recover(*j, "bad").error().code(), ErrorCode::corrupt_record);
  EXPECT_TRUE(js::replay(*j, "good").ok());  // other ids are unaffected
  ASSERT_TRUE(js::append(*j, batch("good", 2, 2)).ok());
}

TEST(PostgresJournal, appends_fail_while_the_server_is_down_and_succeed_after_it_is_back) {
  // A server of its own: this test stops it.
  troupe::test::PostgresTestServer server;
  auto j = open_journal(server.conninfo(), "public", 300);
  ASSERT_TRUE(js::append(*j, batch("r", 1, 1)).ok());
  server.stop();
  auto down = js::append(*j, batch("r", 2, 2));
  ASSERT_FALSE(down.ok());
  EXPECT_EQ(down.error().code(), ErrorCode::journal_failed) << down.error().to_string();
  auto read_down = js::replay(*j, "r");
  EXPECT_FALSE(read_down.ok());
  server.start();
  // Back: the writer reconnects (back-off at most 2 s) and the same append succeeds.
  Result<void> up = troupe::Error(ErrorCode::journal_failed, "not tried");
  for (int i = 0; i < 40 && !up.ok(); ++i) {
    up = js::append(*j, batch("r", 2, 2));
    if (!up.ok()) std::this_thread::sleep_for(100ms);
  }
  ASSERT_TRUE(up.ok()) << up.error().to_string();
  auto r = js::replay(*j, "r");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(seqs(*r), range(1, 2));
  EXPECT_GE(j->stats().reconnects, 1u);
  j.reset();
}

// A single node's journal fences by the owner's incarnation.
// proves: E9
TEST(PostgresJournal, a_second_journal_opened_as_the_same_owner_refuses_the_first_ones_appends) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  PostgresJournalOptions o;
  o.conninfo = conninfo;
  o.schema = schema;
  o.owner = "node-1";
  auto first = PostgresJournal::open(o);
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  EXPECT_EQ((*first)->owner_incarnation(), 1u);
  ASSERT_TRUE(js::append(**first, batch("p", 1, 1)).ok());
  // The node restarts while the old process is still alive (paused, say).
  auto second = PostgresJournal::open(o);
  ASSERT_TRUE(second.ok()) << second.error().to_string();
  EXPECT_EQ((*second)->owner_incarnation(), 2u);
  auto stale = js::append(**first, batch("p", 2, 2));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ErrorCode::journal_conflict) << stale.error().to_string();
  EXPECT_NE(stale.error().message().find("fence 'owner|node-1' is at 2, this writer holds it at 1"),
            std::string::npos)
      << stale.error().message();
  ASSERT_TRUE(js::append(**second, batch("p", 2, 2)).ok());
  // Another owner is not concerned.
  o.owner = "node-2";
  auto other = PostgresJournal::open(o);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->owner_incarnation(), 1u);
  EXPECT_TRUE(js::append(**other, batch("q", 1, 1)).ok());
  EXPECT_EQ(seqs(*js::replay(**second, "p")), range(1, 2));
}

TEST(PostgresJournal, a_schema_of_the_first_layout_is_migrated_on_open) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  {
    auto j = open_journal(conninfo, schema);
    ASSERT_TRUE(js::append(*j, batch("m", 1, 2)).ok());
  }
  // Back to layout 1: no fences.
  exec_sql(conninfo, "DROP FUNCTION \"" + schema + "\".check_fences(bytea[], bigint[], bigint[]); DROP TABLE \"" +
                         schema + "\".fences; UPDATE \"" + schema + "\".journal_schema SET version = 1");
  auto j = open_journal(conninfo, schema);
  EXPECT_EQ(seqs(*js::replay(*j, "m")), range(1, 2));
  ASSERT_TRUE(js::raise_fence(*j, "k", 2).ok());
  AppendBatch b = batch("m", 3, 3);
  b.fence = {"k", 1};
  EXPECT_EQ(js::append(*j, b).error().code(), ErrorCode::journal_conflict);
  b.fence = {"k", 2};
  EXPECT_TRUE(js::append(*j, b).ok());
  // A newer layout is refused, naming both versions.
  exec_sql(conninfo, "UPDATE \"" + schema + "\".journal_schema SET version = 4");
  PostgresJournalOptions o;
  o.conninfo = conninfo;
  o.schema = schema;
  auto newer = PostgresJournal::open(o);
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.error().message().find("schema version 4 is newer than this build understands (3)"),
            std::string::npos)
      << newer.error().message();
}

// proves: X4
TEST(PostgresJournal, a_schema_from_before_trace_ids_gains_the_column_on_open_and_keeps_its_rows) {
  const std::string conninfo = troupe::test::shared_postgres_conninfo();
  const std::string schema = troupe::test::fresh_schema();
  {
    auto j = open_journal(conninfo, schema);
    ASSERT_TRUE(js::append(*j, batch("m", 1, 2)).ok());
  }
  exec_sql(conninfo, "ALTER TABLE \"" + schema + "\".events DROP COLUMN trace_id");
  auto j = open_journal(conninfo, schema);
  auto old = js::replay(*j, "m");
  ASSERT_TRUE(old.ok()) << old.error().to_string();
  EXPECT_EQ(seqs(*old), range(1, 2));
  EXPECT_EQ(old->at(0).trace_id, "");
  AppendBatch b = batch("m", 3, 3);
  b.events[0].trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  ASSERT_TRUE(js::append(*j, b).ok());
  auto rec = js::recover(*j, "m");
  ASSERT_TRUE(rec.ok());
  ASSERT_EQ(rec->events.size(), 3u);
  EXPECT_EQ(rec->events[2].trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(rec->events[0].trace_id, "");
}

TEST(PostgresJournal, backends_killed_by_pg_terminate_backend_under_load_lose_no_acknowledged_append) {
  // A server of its own: the test kills its backends.
  troupe::test::PostgresTestServer server;
  auto j = open_journal(server.conninfo(), "public", 5000);
  constexpr int kIds = 50, kRounds = 40;
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, failed{0};
  std::vector<std::uint64_t> acked(kIds, 0);
  std::thread killer([&] {
    PGconn* c = PQconnectdb(server.conninfo().c_str());
    while (!stop.load()) {
      std::this_thread::sleep_for(30ms);
      PGresult* r = PQexec(c, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE pid <> pg_backend_pid() AND datname = current_database()");
      PQclear(r);
    }
    PQfinish(c);
  });
  // Each id appends its next number once the previous one is answered; a
  // failed append is tried again with the same number (the entity would
  // recover and retry).
  std::vector<std::thread> writers;
  for (int w = 0; w < 5; ++w)
    writers.emplace_back([&, w] {
      for (int round = 1; round <= kRounds; ++round)
        for (int i = w; i < kIds; i += 5) {
          const std::string id = "k" + std::to_string(i);
          auto r = js::append(*j, batch(id, acked[i] + 1, acked[i] + 1));
          if (r.ok()) {
            ++acked[i];
            ++ok;
          } else {
            ++failed;
            // Unknown outcome: learn what is stored, as a recovering entity would.
            auto h = js::highest_seq(*j, id);
            if (h.ok()) acked[i] = *h;
          }
        }
    });
  for (auto& t : writers) t.join();
  stop = true;
  killer.join();
  for (int i = 0; i < kIds; ++i) {
    auto r = js::replay(*j, "k" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    EXPECT_EQ(seqs(*r), range(1, acked[i])) << "id k" << i;
  }
  EXPECT_GE(j->stats().reconnects, 1u);
  // The lanes read back what they sent when a connection broke: the
  // appends were answered, not failed.
  EXPECT_EQ(failed.load(), 0) << ok.load() << " succeeded";
  j.reset();
}

}  // namespace
