// The outbox contract (outbox.hpp, journal.hpp), checked against every back
// end of journal_under_test.hpp: records are stored atomically with the
// events of their append, under its fence; claims lease them to one
// dispatcher at a time; settlements store what became of them; a restarted
// owner takes its leases back; files and schemas written before the outbox
// existed get its table on open.

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "journal_test_support.hpp"
#include "journal_under_test.hpp"
#include "postgres/pg_support.hpp"
#include "postgres/postgres_test_server.hpp"
#include "troupe/persist/fenced_journal.hpp"
#include "troupe/persist/forwarding_journal.hpp"
#include "troupe/persist/journal.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"

namespace {

using namespace troupe::test::journal_names;
using troupe::OutboxClaim;
using troupe::OutboxEntry;
using troupe::OutboxQuery;
using troupe::OutboxRecord;
using troupe::OutboxSettlement;
using troupe::OutboxStatus;
using troupe::OutboxView;
using troupe::test::BackEnd;
using troupe::test::JournalUnderTest;
using Outcome = OutboxSettlement::Outcome;

constexpr std::int64_t kNow = 1'700'000'000'000;

// Events first..last of `id` with one record per key in `keys`.
AppendBatch with_records(const std::string& id, std::uint64_t first, std::uint64_t last,
                         const std::vector<std::string>& keys) {
  AppendBatch b = batch(id, first, last);
  for (const auto& k : keys) b.outbox.push_back(OutboxRecord{k, "refund", "pay back " + k});
  return b;
}

OutboxClaim claim_by(const std::string& owner, std::uint64_t incarnation, std::int64_t now = kNow,
                     std::size_t limit = 100) {
  return OutboxClaim{owner, incarnation, now, 30'000, limit};
}

std::vector<std::string> keys_of(const std::vector<OutboxEntry>& es) {
  std::vector<std::string> out;
  for (const auto& e : es) out.push_back(e.record.key);
  return out;
}

class OutboxContract : public ::testing::TestWithParam<BackEnd> {
 protected:
  void SetUp() override { under_test_ = GetParam().make(); }
  Journal& j() { return under_test_->journal(); }

  std::vector<OutboxEntry> claim(OutboxClaim c) {
    auto r = js::claim_outbox(j(), std::move(c));
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : std::vector<OutboxEntry>{};
  }
  OutboxView view(OutboxStatus status = OutboxStatus::pending, std::size_t limit = 100) {
    auto r = js::read_outbox(j(), OutboxQuery{status, limit});
    EXPECT_TRUE(r.ok()) << r.error().to_string();
    return r.ok() ? *r : OutboxView{};
  }

  std::unique_ptr<JournalUnderTest> under_test_;
};

// proves: A1
TEST_P(OutboxContract, records_are_stored_with_the_events_of_their_append_and_read_back_whole) {
  ASSERT_TRUE(j().stores_outbox());
  AppendBatch b = with_records("pay|p1", 1, 2, {"pay|p1/2/0", "pay|p1/2/1"});
  b.outbox[1].payload = std::string("nul\0byte", 8);
  ASSERT_TRUE(js::append(j(), b).ok());
  ASSERT_TRUE(js::append(j(), batch("pay|p1", 3, 3)).ok());  // an append without records stores none
  EXPECT_EQ(seqs(*js::replay(j(), "pay|p1")), range(1, 3));
  OutboxView v = view();
  EXPECT_EQ(v.pending, 2u);
  EXPECT_EQ(v.failed, 0u);
  ASSERT_EQ(v.entries.size(), 2u);
  const OutboxEntry& e = v.entries[1];
  EXPECT_EQ(e.record, b.outbox[1]);
  EXPECT_EQ(e.persistence_id, "pay|p1");
  EXPECT_EQ(e.entity_id(), "p1");
  EXPECT_EQ(e.seq, 2u);
  EXPECT_EQ(e.created_ms, b.events.back().timestamp_ms);
  EXPECT_EQ(e.status, OutboxStatus::pending);
  EXPECT_EQ(e.attempts, 0u);
  EXPECT_EQ(e.last_error, "");
}

// proves: A1
TEST_P(OutboxContract, an_append_refused_by_its_fence_stores_none_of_its_records) {
  ASSERT_TRUE(js::raise_fence(j(), "shard/1", 3).ok());
  AppendBatch stale = with_records("pay|p1", 1, 1, {"k1"});
  stale.fence = {"shard/1", 2};
  auto r = js::append(j(), stale);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict) << r.error().to_string();
  EXPECT_EQ(view().pending, 0u);
  EXPECT_TRUE(claim(claim_by("a", 1)).empty());
  // Through a fenced view that a newer owner has overtaken: refused, nothing stored.
  auto inner = std::shared_ptr<Journal>(&j(), [](Journal*) {});
  auto old_owner = troupe::FencedJournal::open(inner, {"shard/1", 2});
  EXPECT_FALSE(js::append(*old_owner, with_records("pay|p1", 1, 1, {"k2"})).ok());
  EXPECT_EQ(view().pending, 0u);
  // The owner at the fence stores its records, through a view and a decorator.
  auto owner = troupe::FencedJournal::open(inner, {"shard/1", 3});
  troupe::ForwardingJournal forwarding(owner);
  EXPECT_TRUE(forwarding.stores_outbox());
  ASSERT_TRUE(js::append(forwarding, with_records("pay|p1", 1, 1, {"k3"})).ok());
  EXPECT_EQ(keys_of(claim(claim_by("a", 1))), std::vector<std::string>{"k3"});
}

// proves: A1
TEST_P(OutboxContract, an_append_refused_for_its_seq_or_a_taken_key_stores_nothing_of_its_batch) {
  ASSERT_TRUE(js::append(j(), with_records("pay|p1", 1, 1, {"k1"})).ok());
  // The seq is taken: neither the events nor the records go in.
  auto seq_taken = js::append(j(), with_records("pay|p1", 1, 2, {"k2"}));
  ASSERT_FALSE(seq_taken.ok());
  EXPECT_EQ(seq_taken.error().code(), ErrorCode::journal_conflict);
  // The key is taken (another id's append): neither go in either.
  auto key_taken = js::append(j(), with_records("pay|p2", 1, 2, {"k3", "k1"}));
  ASSERT_FALSE(key_taken.ok());
  EXPECT_EQ(key_taken.error().code(), ErrorCode::journal_conflict) << key_taken.error().to_string();
  EXPECT_EQ(*js::highest_seq(j(), "pay|p2"), 0u);
  EXPECT_EQ(keys_of(view().entries), std::vector<std::string>{"k1"});
}

TEST_P(OutboxContract, malformed_records_claims_and_settlements_are_invalid_arguments) {
  std::vector<AppendBatch> bad = {with_records("a", 1, 1, {""}), with_records("a", 1, 1, {"k", "k"})};
  bad.push_back(with_records("a", 1, 1, {"k"}));
  bad.back().outbox[0].kind.clear();
  for (auto& b : bad) {
    auto r = js::append(j(), b);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  }
  EXPECT_EQ(*js::highest_seq(j(), "a"), 0u);
  for (auto c : {OutboxClaim{"", 1, kNow, 1000, 1}, OutboxClaim{"a", 1, kNow, 0, 1}, OutboxClaim{"a", 1, kNow, 1000, 0}}) {
    auto r = js::claim_outbox(j(), c);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  }
  for (auto s : {OutboxSettlement{"", "a", 1, Outcome::done, 0, ""}, OutboxSettlement{"k", "", 1, Outcome::done, 0, ""}}) {
    auto r = js::settle_outbox(j(), s);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  }
}

// proves: A1
TEST_P(OutboxContract, a_claimed_record_is_leased_to_its_claimer_until_the_lease_runs_out) {
  ASSERT_TRUE(js::append(j(), with_records("pay|p1", 1, 1, {"k1", "k2"})).ok());
  ASSERT_TRUE(js::append(j(), with_records("pay|p2", 1, 1, {"k3"})).ok());
  auto mine = claim(claim_by("a", 1, kNow, 2));
  EXPECT_EQ(keys_of(mine), (std::vector<std::string>{"k1", "k2"}));  // oldest first, up to the limit
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].attempts, 1u);
  EXPECT_EQ(keys_of(claim(claim_by("b", 1))), std::vector<std::string>{"k3"});
  EXPECT_TRUE(claim(claim_by("b", 1, kNow + 29'999)).empty());  // all leased
  // The lease of "a" runs out: another dispatcher takes them, a second try.
  auto theirs = claim(claim_by("c", 1, kNow + 30'000));
  ASSERT_EQ(keys_of(theirs), (std::vector<std::string>{"k1", "k2", "k3"}));
  EXPECT_EQ(theirs[0].attempts, 2u);
  // What "a" says of them now is ignored: they are not its any more.
  ASSERT_TRUE(js::settle_outbox(j(), {"k1", "a", 1, Outcome::done, 0, ""}).ok());
  EXPECT_EQ(view().pending, 3u);
  ASSERT_TRUE(js::settle_outbox(j(), {"k1", "c", 1, Outcome::done, 0, ""}).ok());
  EXPECT_EQ(keys_of(view().entries), (std::vector<std::string>{"k2", "k3"}));
}

// proves: A1
TEST_P(OutboxContract, a_restarted_owner_takes_its_leases_back_at_once_and_no_one_else_does) {
  ASSERT_TRUE(js::append(j(), with_records("pay|p1", 1, 1, {"k1"})).ok());
  ASSERT_EQ(claim(claim_by("node-1", 7)).size(), 1u);
  EXPECT_TRUE(claim(claim_by("node-2", 1)).empty());
  EXPECT_TRUE(claim(claim_by("node-1", 7)).empty());  // the same run does not claim its own twice
  auto again = claim(claim_by("node-1", 8));           // node-1 restarted
  ASSERT_EQ(keys_of(again), std::vector<std::string>{"k1"});
  EXPECT_EQ(again[0].attempts, 2u);
  // The earlier run's word no longer counts.
  ASSERT_TRUE(js::settle_outbox(j(), {"k1", "node-1", 7, Outcome::done, 0, ""}).ok());
  EXPECT_EQ(view().pending, 1u);
}

// proves: A1
TEST_P(OutboxContract, settlements_remove_a_done_record_delay_a_retry_and_keep_a_failure) {
  ASSERT_TRUE(js::append(j(), with_records("pay|p1", 1, 1, {"done", "retry", "failed"})).ok());
  ASSERT_EQ(claim(claim_by("a", 1)).size(), 3u);
  ASSERT_TRUE(js::settle_outbox(j(), {"done", "a", 1, Outcome::done, 0, ""}).ok());
  ASSERT_TRUE(js::settle_outbox(j(), {"retry", "a", 1, Outcome::retry, kNow + 5'000, "gateway: 503"}).ok());
  ASSERT_TRUE(js::settle_outbox(j(), {"failed", "a", 1, Outcome::failed, 0, "declined for good"}).ok());
  OutboxView v = view(OutboxStatus::failed);
  EXPECT_EQ(v.pending, 1u);
  EXPECT_EQ(v.failed, 1u);
  ASSERT_EQ(v.entries.size(), 1u);
  EXPECT_EQ(v.entries[0].record.key, "failed");
  EXPECT_EQ(v.entries[0].status, OutboxStatus::failed);
  EXPECT_EQ(v.entries[0].last_error, "declined for good");
  EXPECT_EQ(v.entries[0].attempts, 1u);
  // The retry waits for its time, whoever asks; the failure is never claimed.
  EXPECT_TRUE(claim(claim_by("b", 1, kNow + 4'999)).empty());
  auto later = claim(claim_by("b", 1, kNow + 5'000));
  ASSERT_EQ(keys_of(later), std::vector<std::string>{"retry"});
  EXPECT_EQ(later[0].attempts, 2u);
  EXPECT_EQ(later[0].last_error, "gateway: 503");
  EXPECT_EQ(later[0].next_attempt_ms, kNow + 5'000);
  EXPECT_TRUE(claim(claim_by("c", 1, kNow + 6'000)).empty());  // the failure never, the retry is leased to b
  // Counts only.
  OutboxView counts = view(OutboxStatus::pending, 0);
  EXPECT_EQ(counts.pending, 1u);
  EXPECT_TRUE(counts.entries.empty());
}

// Dispatchers on several nodes claim at once: each record goes to one.
// proves: A1
TEST_P(OutboxContract, dispatchers_claiming_at_once_get_each_record_once) {
  constexpr int kRecords = 120;
  for (int i = 0; i < kRecords; ++i)
    ASSERT_TRUE(js::append(j(), with_records("pay|" + std::to_string(i), 1, 1, {"k" + std::to_string(i)})).ok());
  constexpr int kClaimers = 4;
  std::vector<std::vector<std::string>> got(kClaimers);
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClaimers; ++c)
    threads.emplace_back([&, c] {
      while (!go.load()) std::this_thread::yield();
      for (int round = 0; round < 20; ++round) {
        auto r = js::claim_outbox(j(), claim_by("node-" + std::to_string(c), 1, kNow, 7));
        if (!r.ok()) continue;
        for (auto& e : *r) got[static_cast<std::size_t>(c)].push_back(e.record.key);
      }
    });
  go = true;
  for (auto& t : threads) t.join();
  std::multiset<std::string> all;
  for (const auto& g : got) all.insert(g.begin(), g.end());
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kRecords));
  EXPECT_EQ(std::set<std::string>(all.begin(), all.end()).size(), all.size()) << "a record was claimed twice";
}

INSTANTIATE_TEST_SUITE_P(EveryBackEnd, OutboxContract, ::testing::ValuesIn(troupe::test::back_ends()),
                         [](const ::testing::TestParamInfo<BackEnd>& p) { return p.param.name; });

// --- journals written before the outbox existed -------------------------------------

// `j` was reopened after its outbox table was dropped: event 1 of "a" is
// still there, and records go in again.
void expect_old_events_and_a_working_outbox(Journal& j) {
  EXPECT_EQ(seqs(*js::replay(j, "a")), range(1, 1));
  ASSERT_TRUE(js::append(j, with_records("a", 2, 2, {"k"})).ok());
  auto v = js::read_outbox(j, OutboxQuery{OutboxStatus::pending, 10});
  ASSERT_TRUE(v.ok()) << v.error().to_string();
  EXPECT_EQ(v->pending, 1u);
}

TEST(OutboxTable, an_sqlite_file_without_the_outbox_table_gets_it_on_open) {
  TempDir dir;
  troupe::SqliteJournalOptions options;
  options.path = dir.file("journal.db");
  {
    auto j = troupe::SqliteJournal::open(options);
    ASSERT_TRUE(j.ok()) << j.error().to_string();
    ASSERT_TRUE(js::append(**j, batch("a", 1, 1)).ok());
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(options.path.c_str(), &db), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db, "DROP TABLE outbox", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  auto j = troupe::SqliteJournal::open(options);
  ASSERT_TRUE(j.ok()) << j.error().to_string();
  expect_old_events_and_a_working_outbox(**j);
}

TEST(OutboxTable, a_postgres_schema_without_the_outbox_table_gets_it_on_open) {
  troupe::PostgresJournalOptions options;
  options.conninfo = troupe::test::shared_postgres_conninfo();
  options.schema = troupe::test::fresh_schema();
  {
    auto j = troupe::PostgresJournal::open(options);
    ASSERT_TRUE(j.ok()) << j.error().to_string();
    ASSERT_TRUE(js::append(**j, batch("a", 1, 1)).ok());
  }
  {
    troupe::pg::PgConn c(PQconnectdb(options.conninfo.c_str()));
    ASSERT_EQ(PQstatus(c.get()), CONNECTION_OK);
    troupe::pg::Outcome o = troupe::pg::run(c.get(), "DROP TABLE \"" + options.schema + "\".outbox");
    ASSERT_TRUE(o.ok) << o.message;
  }
  auto j = troupe::PostgresJournal::open(options);
  ASSERT_TRUE(j.ok()) << j.error().to_string();
  expect_old_events_and_a_working_outbox(**j);
}

TEST(OutboxTable, a_journal_without_an_outbox_says_so) {
  class Plain final : public troupe::ForwardingJournal {
   public:
    using ForwardingJournal::ForwardingJournal;
    bool stores_outbox() const noexcept override { return false; }
    void claim_outbox(OutboxClaim c, Callback<std::vector<OutboxEntry>> done) override {
      Journal::claim_outbox(std::move(c), std::move(done));
    }
  };
  Plain plain(std::make_shared<troupe::MemoryJournal>());
  EXPECT_FALSE(plain.stores_outbox());
  auto r = js::claim_outbox(plain, claim_by("a", 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
  EXPECT_NE(r.error().message().find("keeps no outbox"), std::string::npos) << r.error().message();
}

}  // namespace
