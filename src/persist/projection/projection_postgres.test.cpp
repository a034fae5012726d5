// Projections into a PostgreSQL read model (postgres_read_model.hpp, SPEC
// R1): the page and the offset commit together, a failed page leaves
// nothing, two instances never apply an event twice, a restart resumes.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "../journal_test_support.hpp"
#include "../postgres/postgres_test_server.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/postgres_read_model.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::EventSelector;
using troupe::PostgresReadModel;
using troupe::PostgresTransaction;
using troupe::Projection;
using troupe::ProjectionSettings;
using troupe::ProjectionState;
using troupe::StreamEvent;

struct PgLedger {
  using ReadModel = PostgresReadModel;
  std::shared_ptr<std::atomic<int>> fails_left = std::make_shared<std::atomic<int>>(0);

  Result<void> setup(PostgresTransaction& tx) {
    return tx.exec("CREATE TABLE IF NOT EXISTS ledger (id text NOT NULL, seq bigint NOT NULL, payload bytea, "
                   "PRIMARY KEY (id, seq))");
  }
  Result<void> apply(PostgresTransaction& tx, const StreamEvent& e) {
    if (auto r = tx.exec("INSERT INTO ledger (id, seq, payload) VALUES ($1, $2, $3)",
                         {e.persistence_id, static_cast<std::int64_t>(e.event.seq), e.event.payload});
        !r)
      return r;
    // After the insert, so a failure must roll it back.
    if (e.event.seq == 3 && fails_left->load() > 0) {
      --*fails_left;
      return troupe::Error(troupe::ErrorCode::invalid_argument, "refusing " + e.persistence_id + "#3");
    }
    return {};
  }
};

class PostgresProjection : public troupe::testkit::ManualClockTest {
 protected:
  void SetUp() override {
    auto m = PostgresReadModel::open({troupe::test::shared_postgres_conninfo(), troupe::test::fresh_schema()});
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    model = *m;
  }
  ProjectionSettings settings() {
    ProjectionSettings s;
    s.name = "pg_ledger";
    s.source = EventSelector::of_type("acct");
    s.batch = 5;
    return s;
  }
  std::int64_t rows() {
    auto r = model->query("SELECT count(*) FROM ledger");
    if (!r.ok()) return -1;
    return std::get<std::int64_t>((*r)[0][0]);
  }
  void append(const std::string& id, std::uint64_t first, std::uint64_t last) {
    ASSERT_TRUE(js::append(*journal, batch(id, first, last)).ok());
  }

  std::shared_ptr<troupe::MemoryJournal> journal = std::make_shared<troupe::MemoryJournal>();
  std::shared_ptr<PostgresReadModel> model;
};

// proves: R1
TEST_F(PostgresProjection, pages_and_offsets_commit_together_and_a_restart_resumes_where_the_model_stopped) {
  append("acct|a", 1, 4);
  append("acct|b", 1, 4);
  PgLedger h;
  h.fails_left->store(1);
  {
    auto p = Projection<PgLedger>::start(system, journal, model, settings(), h).value();
    ASSERT_TRUE(p.wait_until([](auto& s) { return s.retries >= 1; }, 20s));
    EXPECT_EQ(rows(), 0) << "a failed page left rows behind";
    advance(100ms);
    ASSERT_TRUE(p.wait_until([](auto& s) { return s.events_applied >= 8 && s.caught_up; }, 20s));
    EXPECT_EQ(rows(), 8);
    p.stop();
  }
  append("acct|c", 1, 2);
  auto p = Projection<PgLedger>::start(system, journal, model, settings(), h).value();
  ASSERT_TRUE(p.wait_until([](auto& s) { return s.events_applied >= 2 && s.caught_up; }, 20s));
  EXPECT_EQ(p.status().events_applied, 2u);
  EXPECT_EQ(rows(), 10);
  EXPECT_EQ(model->load_offset("pg_ledger/type:acct").value(), p.status().offset);
}

// proves: R1
TEST_F(PostgresProjection, two_instances_of_one_projection_never_apply_an_event_twice) {
  for (int i = 0; i < 10; ++i) append("acct|" + std::to_string(i), 1, 6);
  auto p1 = Projection<PgLedger>::start(system, journal, model, settings()).value();
  auto p2 = Projection<PgLedger>::start(system, journal, model, settings()).value();
  auto done = [](auto& s) { return s.caught_up && s.offset && s.offset->ordering >= 60; };
  ASSERT_TRUE(p1.wait_until(done, 30s) || p2.wait_until(done, 30s));
  ASSERT_TRUE(p1.wait_until([](auto& s) { return s.caught_up; }, 30s));
  ASSERT_TRUE(p2.wait_until([](auto& s) { return s.caught_up; }, 30s))
      << "conflicts " << p2.status().conflicts << " retries " << p2.status().retries << " applied "
      << p2.status().events_applied << " state " << to_string(p2.status().state)
      << (p2.status().failure ? " failure " + p2.status().failure->error.to_string() : std::string());
  EXPECT_EQ(rows(), 60);
  EXPECT_EQ(p1.status().events_applied + p2.status().events_applied, 60u);
  EXPECT_EQ(p1.status().state, ProjectionState::running);
  EXPECT_EQ(p2.status().state, ProjectionState::running);
}

// A statement the server refuses fails its page, although the page's
// statements are pipelined and answered only at its commit.
struct Duplicating {
  using ReadModel = PostgresReadModel;
  Result<void> setup(PostgresTransaction& tx) {
    return tx.exec("CREATE TABLE IF NOT EXISTS ledger (id text NOT NULL, seq bigint NOT NULL, payload bytea, "
                   "PRIMARY KEY (id, seq))");
  }
  Result<void> apply(PostgresTransaction& tx, const StreamEvent& e) {
    const auto seq = static_cast<std::int64_t>(e.event.seq);
    if (auto r = tx.exec("INSERT INTO ledger (id, seq) VALUES ($1, $2)", {e.persistence_id, seq}); !r) return r;
    if (e.event.seq != 2) return {};
    return tx.exec("INSERT INTO ledger (id, seq) VALUES ($1, $2)", {e.persistence_id, seq});  // a duplicate key
  }
};

TEST_F(PostgresProjection, a_statement_the_server_refuses_fails_its_page_and_leaves_nothing_of_it) {
  append("acct|a", 1, 3);
  auto s = settings();
  s.max_attempts = 2;
  s.min_backoff = 10ms;
  auto p = Projection<Duplicating>::start(system, journal, model, s).value();
  ASSERT_TRUE(p.wait_until([](auto& st) { return st.retries >= 1; }, 20s));
  advance(10ms);
  ASSERT_TRUE(p.wait_until([](auto& st) { return st.state == ProjectionState::failed; }, 20s));
  auto st = p.status();
  ASSERT_TRUE(st.failure.has_value());
  EXPECT_NE(st.failure->error.message().find("23505"), std::string::npos) << st.failure->error.message();
  EXPECT_EQ(rows(), 0) << "a page with a refused statement left rows behind";
  EXPECT_FALSE(model->load_offset("pg_ledger/type:acct").value().has_value());
  EXPECT_TRUE(model->query("SELECT 1").ok());
}

TEST_F(PostgresProjection, bad_options_are_invalid_arguments_and_a_bad_server_is_journal_failed) {
  EXPECT_EQ(PostgresReadModel::open({"", "s"}).error().code(), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(PostgresReadModel::open({troupe::test::shared_postgres_conninfo(), ""}).error().code(),
            troupe::ErrorCode::invalid_argument);
  auto none = PostgresReadModel::open({troupe::test::shared_postgres_conninfo(), "s", 0});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), troupe::ErrorCode::invalid_argument);
  EXPECT_NE(none.error().message().find("max_writers"), std::string::npos) << none.error().message();
  auto r = PostgresReadModel::open({"host=127.0.0.1 port=1 connect_timeout=2", "s"});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), troupe::ErrorCode::journal_failed);
  auto q = model->query("SELECT nonsense FROM nowhere");
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.error().message().find("42P01"), std::string::npos) << q.error().message();
  EXPECT_TRUE(model->query("SELECT 1").ok()) << "a failed query must not break the connection";
}

}  // namespace
