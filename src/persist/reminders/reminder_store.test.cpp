// The ReminderStore contract (reminders.hpp), run against every back end:
// memory, SQLite (its own file, and a journal's file) and PostgreSQL.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "../journal_test_support.hpp"
#include "../postgres/postgres_test_server.hpp"
#include "troupe/persist/reminders.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

using troupe::ErrorCode;
using troupe::Reminder;
using troupe::ReminderSpec;
using troupe::ReminderStore;

struct Backend {
  std::string name;
  std::function<std::shared_ptr<ReminderStore>(troupe::test::TempDir&)> open;
};
// Names the parameter in test listings (ctest's names) by its back end
// rather than by its bytes.
void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }

// A claim long enough that no test below sees one lapse unless it says so.
constexpr std::int64_t kLease = 60'000;

std::shared_ptr<ReminderStore> must(troupe::Result<std::shared_ptr<ReminderStore>> r) {
  if (!r) throw std::runtime_error(r.error().to_string());
  return *r;
}

class StoreContract : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override { store = GetParam().open(dir); }
  troupe::test::TempDir dir;
  std::shared_ptr<ReminderStore> store;
};

ReminderSpec spec(std::string owner, std::string name, std::int64_t due, std::int64_t period = 0,
                  std::string payload = {}) {
  return ReminderSpec{std::move(owner), std::move(name), due, period, std::move(payload)};
}

std::vector<std::string> names(const std::vector<Reminder>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs) out.push_back(r.owner + "/" + r.name);
  return out;
}

TEST_P(StoreContract, a_set_reminder_is_listed_by_owner_and_taken_when_due_oldest_first) {
  ASSERT_TRUE(store->set(spec("pay|a", "expire", 300, 0, std::string("x\0y", 3))).ok());
  ASSERT_TRUE(store->set(spec("pay|a", "audit", 100, 50)).ok());
  ASSERT_TRUE(store->set(spec("pay|b", "expire", 200)).ok());
  auto listed = store->list("pay|a");
  ASSERT_TRUE(listed.ok()) << listed.error().to_string();
  ASSERT_EQ(names(*listed), (std::vector<std::string>{"pay|a/audit", "pay|a/expire"}));
  EXPECT_EQ((*listed)[1].payload, std::string("x\0y", 3));
  EXPECT_EQ((*listed)[0].period_ms, 50);
  EXPECT_EQ((*listed)[0].next_try_ms, 100);
  EXPECT_NE((*listed)[0].token, 0u);

  EXPECT_TRUE(store->take_due(99, 10, kLease)->empty());
  auto taken = store->take_due(250, 10, kLease);
  ASSERT_TRUE(taken.ok()) << taken.error().to_string();
  EXPECT_EQ(names(*taken), (std::vector<std::string>{"pay|a/audit", "pay|b/expire"}));
  EXPECT_EQ((*taken)[0].next_try_ms, 100) << "returned with the try time it was taken at";
  EXPECT_EQ((*taken)[1].next_try_ms, 200);
  // Taken is claimed: the rest comes next, in order.
  EXPECT_EQ(names(*store->take_due(1000, 10, kLease)), (std::vector<std::string>{"pay|a/expire"}));
  EXPECT_TRUE(store->take_due(1000, 10, kLease)->empty());
}

// proves: R2
TEST_P(StoreContract, a_taken_reminder_is_claimed_until_its_lease_ends_and_then_taken_again) {
  ASSERT_TRUE(store->set(spec("o", "r", 100)).ok());
  ASSERT_TRUE(store->set(spec("o", "s", 150)).ok());
  auto first = store->take_due(200, 1, 1000);
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  ASSERT_EQ(names(*first), (std::vector<std::string>{"o/r"}));
  // Another taker gets the other one, then nothing until the claim ends.
  EXPECT_EQ(names(*store->take_due(200, 10, 1000)), (std::vector<std::string>{"o/s"}));
  EXPECT_TRUE(store->take_due(1199, 10, 1000)->empty());
  EXPECT_EQ(store->list("o")->at(0).next_try_ms, 1200) << "the claim's end is its next try";
  auto sum = store->summary(1199);
  ASSERT_TRUE(sum.ok());
  EXPECT_EQ(sum->due, 0u) << "claimed reminders are not due";
  EXPECT_EQ(sum->next_try_ms, 1200);
  EXPECT_EQ(store->summary(1200)->due, 2u);
  // The claim lapsed: taken again, as it was.
  auto again = store->take_due(1200, 1, 1000);
  ASSERT_EQ(names(*again), (std::vector<std::string>{"o/r"}));
  EXPECT_EQ(again->at(0).next_try_ms, 1200);
  EXPECT_EQ(again->at(0).token, first->at(0).token);
  EXPECT_EQ(again->at(0).due_ms, 100);
  // The first holder still records it; the second holder's record is then stale.
  EXPECT_TRUE(*store->record_fired(first->at(0), 1300));
  EXPECT_FALSE(*store->record_fired(again->at(0), 1300));
  EXPECT_EQ(names(*store->list("o")), (std::vector<std::string>{"o/s"}));
}

TEST_P(StoreContract, a_one_shot_reminder_is_deleted_once_fired_and_a_periodic_one_fires_once_for_missed_periods) {
  ASSERT_TRUE(store->set(spec("o", "once", 100)).ok());
  ASSERT_TRUE(store->set(spec("o", "every", 100, 1000)).ok());
  auto due = store->take_due(100, 10, kLease);
  ASSERT_EQ(due->size(), 2u);
  for (const auto& r : *due) EXPECT_TRUE(*store->record_fired(r, 100));
  auto left = store->list("o");
  ASSERT_EQ(names(*left), (std::vector<std::string>{"o/every"}));
  EXPECT_EQ((*left)[0].due_ms, 1100);
  // Down from 1,100 to 60,000: 58 periods missed, one firing, then the next
  // boundary after the firing.
  due = store->take_due(60'000, 10, kLease);
  ASSERT_EQ(due->size(), 1u);
  EXPECT_TRUE(*store->record_fired((*due)[0], 60'000));
  left = store->list("o");
  EXPECT_EQ((*left)[0].due_ms, 60'100);
  EXPECT_TRUE(store->take_due(60'099, 10, kLease)->empty());
  // Recording the same taken copy again changes nothing.
  EXPECT_FALSE(*store->record_fired((*due)[0], 60'000));
  EXPECT_EQ(store->list("o")->at(0).due_ms, 60'100);
}

TEST_P(StoreContract, a_failed_try_moves_the_next_try_and_counts_and_a_later_firing_clears_it) {
  ASSERT_TRUE(store->set(spec("o", "r", 10, 100)).ok());
  auto r = store->take_due(10, 1, kLease)->at(0);
  EXPECT_TRUE(*store->record_failed(r, 500, "gateway down"));
  EXPECT_TRUE(store->take_due(499, 10, kLease)->empty());
  auto again = store->take_due(500, 10, kLease)->at(0);
  EXPECT_EQ(again.attempts, 1u);
  EXPECT_EQ(again.last_error, "gateway down");
  EXPECT_EQ(again.due_ms, 10);
  EXPECT_EQ(again.next_try_ms, 500);
  EXPECT_TRUE(*store->record_fired(again, 520));
  auto now = store->list("o")->at(0);
  EXPECT_EQ(now.attempts, 0u);
  EXPECT_EQ(now.last_error, "");
  EXPECT_EQ(now.due_ms, 610);
}

TEST_P(StoreContract, setting_again_replaces_and_a_record_of_the_old_registration_is_ignored) {
  ASSERT_TRUE(store->set(spec("o", "r", 10)).ok());
  auto old = store->take_due(10, 1, kLease)->at(0);
  ASSERT_TRUE(store->set(spec("o", "r", 5000, 10)).ok());
  EXPECT_FALSE(*store->record_fired(old, 10));
  EXPECT_FALSE(*store->record_failed(old, 20, "x"));
  auto now = store->list("o")->at(0);
  EXPECT_EQ(now.due_ms, 5000);
  EXPECT_EQ(now.period_ms, 10);
  EXPECT_NE(now.token, old.token);
}

TEST_P(StoreContract, cancel_deletes_and_says_whether_there_was_one) {
  ASSERT_TRUE(store->set(spec("o", "r", 10)).ok());
  auto taken = store->take_due(10, 1, kLease)->at(0);
  EXPECT_TRUE(*store->cancel("o", "r"));
  EXPECT_FALSE(*store->cancel("o", "r"));
  EXPECT_TRUE(store->list("o")->empty());
  EXPECT_FALSE(*store->record_fired(taken, 10));
  EXPECT_FALSE(store->summary(100)->next_try_ms.has_value());
}

TEST_P(StoreContract, bad_owners_names_times_and_limits_are_refused) {
  EXPECT_EQ(store->set(spec("", "r", 1)).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->set(spec("o", "", 1)).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->set(spec("o", std::string(129, 'n'), 1)).error().code(), ErrorCode::invalid_argument);
  EXPECT_TRUE(store->set(spec("o", std::string(128, 'n'), 1)).ok());
  EXPECT_EQ(store->set(spec("o", "r", -1)).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->set(spec("o", "r", 1, -5)).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->cancel("", "r").error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->take_due(1, 0, kLease).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->take_due(1, 10, 0).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(store->take_due(1, 10, -1).error().code(), ErrorCode::invalid_argument);
  // Any byte in owner and name, and a period that would overflow.
  const std::string odd("\0|\xff\"'", 5);
  ASSERT_TRUE(store->set(spec(odd, odd, INT64_MAX - 5, INT64_MAX / 2)).ok());
  auto r = store->list(odd)->at(0);
  EXPECT_EQ(r.name, odd);
  EXPECT_TRUE(*store->record_fired(r, INT64_MAX - 5));
  EXPECT_EQ(store->list(odd)->at(0).due_ms, INT64_MAX);
}

TEST_P(StoreContract, many_due_reminders_come_in_pages_in_due_order) {
  for (int i = 0; i < 250; ++i) ASSERT_TRUE(store->set(spec("o" + std::to_string(i % 7), "r" + std::to_string(i), 1000 - i)).ok());
  std::int64_t last = -1;
  std::size_t seen = 0;
  for (;;) {
    auto page = store->take_due(1000, 64, kLease);
    ASSERT_TRUE(page.ok());
    if (page->empty()) break;
    EXPECT_LE(page->size(), 64u);
    for (const auto& r : *page) {
      EXPECT_GE(r.next_try_ms, last);
      last = r.next_try_ms;
      EXPECT_TRUE(*store->record_fired(r, 1000));
      ++seen;
    }
  }
  EXPECT_EQ(seen, 250u);
}

// The SQLite file rule (doc/reminders.md): the store adds its table to a
// journal's file and the journal keeps working beside it, before and after a
// reopen; a file of another application is refused and left as it was; a
// reminders-only file is not a journal.
TEST(SqliteReminderFile, the_store_shares_a_journal_file_and_the_journal_still_opens_it) {
  troupe::test::TempDir dir;
  const std::string path = dir.file("node.db");
  auto journal = troupe::SqliteJournal::open({.path = path});
  ASSERT_TRUE(journal.ok()) << journal.error().to_string();
  auto store = troupe::open_sqlite_reminder_store({.path = path});
  ASSERT_TRUE(store.ok()) << store.error().to_string();
  ASSERT_TRUE(troupe::journal_sync::append(**journal, troupe::test::batch("pay|a", 1, 3)).ok());
  ASSERT_TRUE((*store)->set(spec("pay|a", "expire", 10)).ok());
  ASSERT_TRUE(troupe::journal_sync::append(**journal, troupe::test::batch("pay|a", 4, 4)).ok());
  store->reset();
  journal->reset();

  auto again = troupe::SqliteJournal::open({.path = path});
  ASSERT_TRUE(again.ok()) << again.error().to_string();
  EXPECT_EQ(troupe::test::seqs(*troupe::journal_sync::replay(**again, "pay|a")),
            (std::vector<std::uint64_t>{1, 2, 3, 4}));
  auto reopened = troupe::open_sqlite_reminder_store({.path = path});
  ASSERT_TRUE(reopened.ok()) << reopened.error().to_string();
  EXPECT_EQ((*reopened)->list("pay|a")->size(), 1u);
}

TEST(SqliteReminderFile, a_file_of_another_application_is_refused_and_left_alone) {
  troupe::test::TempDir dir;
  const std::string path = dir.file("other.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE accounts (id INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto store = troupe::open_sqlite_reminder_store({.path = path});
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.error().code(), ErrorCode::journal_failed);
  EXPECT_NE(store.error().message().find("another application"), std::string::npos) << store.error().message();
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM sqlite_schema WHERE name = 'reminders'", -1, &q, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(q, 0), 0);
  sqlite3_finalize(q);
  sqlite3_close(db);

  auto not_a_db = dir.file("text.db");
  std::FILE* f = std::fopen(not_a_db.c_str(), "w");
  std::fputs("this is not a database, just text long enough to fill a header of one hundred bytes........", f);
  std::fclose(f);
  auto refused = troupe::open_sqlite_reminder_store({.path = not_a_db});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), ErrorCode::journal_failed);
  EXPECT_EQ(troupe::open_sqlite_reminder_store({.path = ""}).error().code(), ErrorCode::invalid_argument);
}

TEST(SqliteReminderFile, a_reminders_only_file_is_not_a_journal) {
  troupe::test::TempDir dir;
  const std::string path = dir.file("reminders.db");
  ASSERT_TRUE(troupe::open_sqlite_reminder_store({.path = path}).ok());
  auto journal = troupe::SqliteJournal::open({.path = path});
  ASSERT_FALSE(journal.ok()) << "open the journal first to share its file";
  EXPECT_NE(journal.error().message().find("another application"), std::string::npos) << journal.error().message();
}

std::vector<Backend> backends() {
  return {
      {"memory", [](troupe::test::TempDir&) { return troupe::make_memory_reminder_store(); }},
      {"sqlite",
       [](troupe::test::TempDir& d) {
         return must(troupe::open_sqlite_reminder_store({.path = d.file("reminders.db")}));
       }},
      {"sqlite_in_a_journal_file",
       [](troupe::test::TempDir& d) {
         auto j = troupe::SqliteJournal::open({.path = d.file("journal.db")});
         if (!j) throw std::runtime_error(j.error().to_string());
         return must(troupe::open_sqlite_reminder_store({.path = d.file("journal.db")}));
       }},
      {"postgres",
       [](troupe::test::TempDir&) {
         return must(troupe::open_postgres_reminder_store(
             {.conninfo = troupe::test::shared_postgres_conninfo(), .schema = troupe::test::fresh_schema()}));
       }},
  };
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreContract, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<Backend>& p) { return p.param.name; });

}  // namespace
