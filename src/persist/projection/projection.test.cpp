// Projections (projection.hpp, SPEC R1) into an SQLite read model: exactly
// once across restarts, failures and a second instance; back-off, failure
// with the event's coordinates, restart; live application; bad settings.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "../journal_test_support.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/projection.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "troupe/persist/sqlite_read_model.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::EventSelector;
using troupe::Projection;
using troupe::ProjectionSettings;
using troupe::ProjectionState;
using troupe::ProjectionStatus;
using troupe::SqliteReadModel;
using troupe::SqliteTransaction;
using troupe::StreamEvent;

// Counts events per entity and keeps every (id, seq) once: a second
// application of an event breaks the primary key and fails the page.
struct Ledger {
  using ReadModel = SqliteReadModel;
  // Pages fail while fail_payload is in them and fails_left > 0.
  std::shared_ptr<std::atomic<int>> fails_left = std::make_shared<std::atomic<int>>(0);
  std::string fail_payload{};

  Result<void> setup(SqliteTransaction& tx) {
    return tx.exec("CREATE TABLE IF NOT EXISTS ledger (id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT, "
                   "PRIMARY KEY (id, seq))");
  }
  Result<void> apply(SqliteTransaction& tx, const StreamEvent& e) {
    if (!fail_payload.empty() && e.event.payload == fail_payload && fails_left->load() > 0) {
      --*fails_left;
      return troupe::Error(troupe::ErrorCode::invalid_argument, "cannot take " + e.event.payload);
    }
    return tx.exec("INSERT INTO ledger (id, seq, payload) VALUES (?1, ?2, ?3)",
                   {e.persistence_id, static_cast<std::int64_t>(e.event.seq), e.event.payload});
  }
};

// The same ledger, written a page at a time: one multi-row statement per
// page. Pages holding fail_payload fail at that event.
struct PageLedger {
  using ReadModel = SqliteReadModel;
  std::string fail_payload{};
  std::shared_ptr<std::vector<std::size_t>> sizes = std::make_shared<std::vector<std::size_t>>();

  Result<void> setup(SqliteTransaction& tx) { return Ledger{}.setup(tx); }
  Result<void> apply(SqliteTransaction& tx, std::span<const StreamEvent> page, std::size_t& failed_at) {
    sizes->push_back(page.size());
    for (std::size_t i = 0; i < page.size(); ++i)
      if (page[i].event.payload == fail_payload) {
        failed_at = i;
        return troupe::Error(troupe::ErrorCode::invalid_argument, "cannot take " + fail_payload);
      }
    std::string values;
    for (const StreamEvent& e : page)
      values += std::string(values.empty() ? "" : ", ") + "('" + e.persistence_id + "', " +
                std::to_string(e.event.seq) + ", '" + e.event.payload + "')";
    return tx.exec("INSERT INTO ledger (id, seq, payload) VALUES " + values);
  }
};

class ProjectionTest : public troupe::testkit::ManualClockTest {
 protected:
  void SetUp() override {
    model = SqliteReadModel::open({.path = dir.file("read.db")}).value();
  }
  ProjectionSettings settings(std::string name = "ledger") {
    ProjectionSettings s;
    s.name = std::move(name);
    s.source = EventSelector::of_type("acct");
    s.batch = 4;
    return s;
  }
  void append(const std::string& id, std::uint64_t first, std::uint64_t last) {
    auto r = js::append(*journal, batch(id, first, last));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  std::int64_t rows() {
    auto r = model->query("SELECT count(*) FROM ledger");
    if (!r.ok()) return -1;
    return std::get<std::int64_t>((*r)[0][0]);
  }
  static bool applied(const ProjectionStatus& s, std::uint64_t n) { return s.events_applied >= n && s.caught_up; }

  TempDir dir;
  std::shared_ptr<troupe::MemoryJournal> journal = std::make_shared<troupe::MemoryJournal>();
  std::shared_ptr<SqliteReadModel> model;
};

// proves: R1
TEST_F(ProjectionTest, applies_every_event_once_and_resumes_from_the_stored_offset_after_a_restart) {
  append("acct|a", 1, 5);
  append("other|x", 1, 3);
  append("acct|b", 1, 6);
  {
    auto p = Projection<Ledger>::start(system, journal, model, settings()).value();
    ASSERT_TRUE(p.wait_until([](auto& s) { return applied(s, 11); }, 10s)) << p.status().events_applied;
    EXPECT_EQ(rows(), 11);
    EXPECT_GE(p.status().pages_applied, 3u);
    p.stop();
  }
  append("acct|a", 6, 8);
  auto p = Projection<Ledger>::start(system, journal, model, settings()).value();
  ASSERT_TRUE(p.wait_until([](auto& s) { return applied(s, 3); }, 10s));
  EXPECT_EQ(p.status().events_applied, 3u) << "the second run started over instead of at the stored offset";
  EXPECT_EQ(rows(), 14);
  auto stored = model->load_offset("ledger/type:acct").value();
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(*stored, *p.status().offset);
}

TEST_F(ProjectionTest, applies_events_stored_after_it_caught_up_without_waiting_for_the_poll) {
  auto s = settings();
  s.poll_interval = std::chrono::hours(1);
  auto p = Projection<Ledger>::start(system, journal, model, s).value();
  ASSERT_TRUE(p.wait_until([](auto& st) { return st.caught_up; }, 10s));
  append("acct|a", 1, 2);
  ASSERT_TRUE(p.wait_until([](auto& st) { return applied(st, 2); }, 10s));
  append("acct|b", 1, 1);
  ASSERT_TRUE(p.wait_until([](auto& st) { return applied(st, 3); }, 10s));
  EXPECT_EQ(rows(), 3);
}

TEST_F(ProjectionTest, a_failing_page_is_retried_after_a_back_off_and_applied_once) {
  append("acct|a", 1, 3);
  Ledger h;
  h.fail_payload = "event 2";
  h.fails_left->store(2);
  auto p = Projection<Ledger>::start(system, journal, model, settings(), h).value();
  ASSERT_TRUE(p.wait_until([](auto& st) { return st.retries >= 1; }, 10s));
  EXPECT_EQ(rows(), 0) << "a failed page left some of its rows";
  advance(100ms);
  ASSERT_TRUE(p.wait_until([](auto& st) { return st.retries >= 2; }, 10s));
  advance(199ms);
  EXPECT_EQ(p.status().events_applied, 0u) << "the second back-off is twice the first";
  advance(1ms);
  ASSERT_TRUE(p.wait_until([](auto& st) { return applied(st, 3); }, 10s));
  EXPECT_EQ(rows(), 3);
  EXPECT_EQ(p.status().state, ProjectionState::running);
}

// proves: R1
TEST_F(ProjectionTest, a_handler_that_keeps_failing_stops_the_projection_at_the_event_and_never_skips_it) {
  append("acct|a", 1, 4);  // one full page
  append("acct|b", 1, 3);  // b#2 fails
  Ledger h;
  h.fail_payload = "event 2";
  h.fails_left->store(1000);
  auto s = settings();
  s.max_attempts = 3;
  s.min_backoff = 10ms;
  // a#2 is in the first page too: let it pass once.
  auto p = Projection<Ledger>::start(system, journal, model, s, h).value();
  for (int i = 0; i < 5 && p.status().state != ProjectionState::failed; ++i) {
    (void)p.wait_until([](auto& st) { return st.retries > 0 || st.state == ProjectionState::failed; }, 2s);
    advance(1s);
  }
  ASSERT_TRUE(p.wait_until([](auto& st) { return st.state == ProjectionState::failed; }, 10s));
  auto st = p.status();
  ASSERT_TRUE(st.failure.has_value());
  EXPECT_EQ(st.failure->persistence_id, "acct|a");
  EXPECT_EQ(st.failure->seq, 2u);
  EXPECT_EQ(st.failure->attempts, 3u);
  EXPECT_NE(st.failure->error.message().find("cannot take event 2"), std::string::npos) << st.failure->error.message();
  EXPECT_EQ(rows(), 0);
  EXPECT_FALSE(st.offset.has_value());

  // Fixed: restart goes on from the stored offset.
  h.fails_left->store(0);
  p.restart();
  ASSERT_TRUE(p.wait_until([](auto& x) { return applied(x, 7); }, 10s));
  EXPECT_EQ(rows(), 7);
}

TEST_F(ProjectionTest, a_page_handler_gets_whole_pages_and_a_failure_names_the_event_it_gives) {
  append("acct|a", 1, 4);
  append("acct|b", 1, 3);
  PageLedger h;
  auto s = settings();
  s.max_attempts = 1;
  {
    h.fail_payload = "event 3";  // a#3, in the first page
    auto p = Projection<PageLedger>::start(system, journal, model, s, h).value();
    ASSERT_TRUE(p.wait_until([](auto& st) { return st.state == ProjectionState::failed; }, 10s));
    auto st = p.status();
    ASSERT_TRUE(st.failure.has_value());
    EXPECT_EQ(st.failure->persistence_id, "acct|a");
    EXPECT_EQ(st.failure->seq, 3u);
    EXPECT_EQ(rows(), 0);
    p.stop();
  }
  h.fail_payload.clear();
  h.sizes->clear();
  auto p = Projection<PageLedger>::start(system, journal, model, s, h).value();
  ASSERT_TRUE(p.wait_until([](auto& st) { return applied(st, 7); }, 10s));
  EXPECT_EQ(rows(), 7);
  EXPECT_EQ(*h.sizes, (std::vector<std::size_t>{4, 3})) << "pages of batch (4) events, each handed over whole";
}

// proves: R1
TEST_F(ProjectionTest, two_instances_of_one_projection_never_apply_an_event_twice) {
  for (int i = 0; i < 20; ++i) append("acct|" + std::to_string(i), 1, 5);
  auto s = settings();
  s.batch = 3;
  auto p1 = Projection<Ledger>::start(system, journal, model, s).value();
  auto p2 = Projection<Ledger>::start(system, journal, model, s).value();
  ASSERT_TRUE(p1.wait_until([](auto& st) { return st.offset && st.offset->ordering >= 100 && st.caught_up; }, 20s) ||
              p2.wait_until([](auto& st) { return st.offset && st.offset->ordering >= 100 && st.caught_up; }, 20s));
  ASSERT_TRUE(p2.wait_until([](auto& st) { return st.caught_up; }, 20s));
  ASSERT_TRUE(p1.wait_until([](auto& st) { return st.caught_up; }, 20s));
  EXPECT_EQ(rows(), 100);
  EXPECT_EQ(p1.status().events_applied + p2.status().events_applied, 100u);
  EXPECT_EQ(p1.status().failure, std::nullopt);
}

TEST_F(ProjectionTest, projects_the_events_of_a_tag_from_a_sqlite_journal) {
  auto j = troupe::SqliteJournal::open({.path = dir.file("journal.db")});
  ASSERT_TRUE(j.ok()) << j.error().to_string();
  std::shared_ptr<Journal> sj = *j;
  ASSERT_TRUE(sj->supports_queries());
  for (int i = 1; i <= 6; ++i) {
    AppendBatch b = batch("acct|" + std::to_string(i), 1, 1);
    b.events[0].tags = {i % 2 == 0 ? "even" : "odd"};
    ASSERT_TRUE(js::append(*sj, b).ok());
  }
  auto s = settings();
  s.source = EventSelector::with_tag("even");
  auto p = Projection<Ledger>::start(system, sj, model, s).value();
  ASSERT_TRUE(p.wait_until([](auto& st) { return applied(st, 3); }, 10s));
  auto r = model->query("SELECT id FROM ledger ORDER BY id").value();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(std::get<std::string>(r[0][0]), "acct|2");
  EXPECT_EQ(std::get<std::string>(r[2][0]), "acct|6");
  p.stop();
}

TEST_F(ProjectionTest, counts_each_events_lag_from_its_timestamp_to_its_commit) {
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock->wall_now().time_since_epoch()).count();
  for (int i = 1; i <= 9; ++i) {
    AppendBatch b = batch("acct|" + std::to_string(i), 1, 1);
    b.events[0].timestamp_ms = now_ms - 30;  // 30 ms old when applied: the bucket up to 30
    ASSERT_TRUE(js::append(*journal, b).ok());
  }
  AppendBatch late = batch("acct|late", 1, 1);
  late.events[0].timestamp_ms = now_ms - 700;  // the bucket up to 750
  ASSERT_TRUE(js::append(*journal, late).ok());
  auto p = Projection<Ledger>::start(system, journal, model, settings()).value();
  ASSERT_TRUE(p.wait_until([](auto& s) { return applied(s, 10); }, 10s));
  auto st = p.status();
  EXPECT_EQ(troupe::projection_lag_quantile(st, 0.5), 30);
  EXPECT_EQ(troupe::projection_lag_quantile(st, 0.9), 30);
  EXPECT_EQ(troupe::projection_lag_quantile(st, 0.99), 750);
  EXPECT_EQ(st.lag_sum_ms, 9 * 30 + 700);
  EXPECT_EQ(troupe::projection_lag_quantile(troupe::ProjectionStatus{}, 0.99), std::nullopt);
}

TEST_F(ProjectionTest, bad_settings_are_invalid_arguments) {
  auto start = [&](ProjectionSettings s) { return Projection<Ledger>::start(system, journal, model, s); };
  auto code = [&](ProjectionSettings s) {
    auto r = start(std::move(s));
    return r.ok() ? troupe::ErrorCode::ok : r.error().code();
  };
  auto s = settings();
  s.name = "";
  EXPECT_EQ(code(s), troupe::ErrorCode::invalid_argument);
  s = settings("has space");
  EXPECT_EQ(code(s), troupe::ErrorCode::invalid_argument);
  s = settings();
  s.source = {};
  EXPECT_EQ(code(s), troupe::ErrorCode::invalid_argument);
  s = settings();
  s.batch = 0;
  EXPECT_EQ(code(s), troupe::ErrorCode::invalid_argument);
  s = settings();
  s.max_attempts = 0;
  EXPECT_EQ(code(s), troupe::ErrorCode::invalid_argument);
  s = settings();
  s.max_backoff = 1ms;
  EXPECT_EQ(code(s), troupe::ErrorCode::invalid_argument);
  EXPECT_EQ(Projection<Ledger>::start(system, journal, nullptr, settings()).error().code(),
            troupe::ErrorCode::invalid_argument);
}

}  // namespace
