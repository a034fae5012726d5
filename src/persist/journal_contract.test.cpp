// The journal contract: the guarantees journal.hpp promises, checked against
// every back end. A back end joins by adding one factory to back_ends()
// (journal_under_test.hpp; a PostgreSQL one adds a JournalUnderTest that
// connects to a fresh schema); nothing else here changes.
// At the journal level, a sequence number that is stored or was deleted is
// refused with journal_conflict and nothing of that batch is stored;
// acknowledged events read back whole and in order (E7).

#include <gtest/gtest.h>
#include <stdlib.h>  // mkdtemp

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "journal_test_support.hpp"
#include "journal_under_test.hpp"
#include "troupe/persist/fenced_journal.hpp"
#include "troupe/persist/forwarding_journal.hpp"
#include "troupe/persist/journal.hpp"
#include "troupe/persist/memory_journal.hpp"
#include "troupe/persist/postgres_journal.hpp"
#include "troupe/persist/sqlite_journal.hpp"
#include "postgres/postgres_test_server.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::test::back_ends;
using troupe::test::BackEnd;
using troupe::test::JournalUnderTest;

SnapshotRecord snapshot(std::uint64_t seq, std::string payload) {
  SnapshotRecord s;
  s.seq = seq;
  s.timestamp_ms = 42;
  s.type = "test.State";
  s.version = 2;
  s.payload = std::move(payload);
  return s;
}

// Collects the results of asynchronous calls: slot i's callback stores its
// result and counts how often it ran, so a test can wait for all and check
// each ran exactly once. Also records the order completions arrived in.
template <class T>
class Results {
 public:
  explicit Results(std::size_t n) : results_(n), calls_(n) {}

  Journal::Callback<T> callback(std::size_t i) {
    return [this, i](Result<T> r) {
      std::lock_guard lk(mu_);
      ++calls_[i];
      results_[i].emplace(std::move(r));
      order_.push_back(i);
      cv_.notify_all();
    };
  }
  bool wait_all(std::chrono::milliseconds timeout = 30s) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return order_.size() >= results_.size(); });
  }
  const Result<T>& operator[](std::size_t i) const { return *results_[i]; }
  std::vector<int> calls() const {
    std::lock_guard lk(mu_);
    return calls_;
  }
  std::vector<std::size_t> order() const {
    std::lock_guard lk(mu_);
    return order_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<Result<T>>> results_;
  std::vector<int> calls_;
  std::vector<std::size_t> order_;
};

class JournalContract : public ::testing::TestWithParam<BackEnd> {
 protected:
  void SetUp() override { under_test_ = GetParam().make(); }
  Journal& j() { return under_test_->journal(); }
  void close() { under_test_->close(); }

  std::unique_ptr<JournalUnderTest> under_test_;
};

// --- fences (E9) -----------------------------------------------------------------

AppendBatch fenced(const std::string& id, std::uint64_t first, std::uint64_t last, const std::string& key,
                   std::uint64_t value) {
  AppendBatch b = batch(id, first, last);
  b.fence = {key, value};
  return b;
}

// proves: E9
TEST_P(JournalContract, an_append_fenced_below_the_stored_fence_is_refused_naming_both_and_stores_nothing) {
  ASSERT_TRUE(js::raise_fence(j(), "shard/1", 3).ok());
  auto stale = js::append(j(), fenced("a", 1, 2, "shard/1", 2));
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code(), ErrorCode::journal_conflict) << stale.error().to_string();
  EXPECT_NE(stale.error().message().find("fence 'shard/1' is at 3, this writer holds it at 2"), std::string::npos)
      << stale.error().message();
  EXPECT_TRUE(js::replay(j(), "a")->empty());
  EXPECT_EQ(*js::highest_seq(j(), "a"), 0u);
  // The owner at the stored fence, or above it, appends.
  EXPECT_TRUE(js::append(j(), fenced("a", 1, 1, "shard/1", 3)).ok());
  EXPECT_TRUE(js::append(j(), fenced("a", 2, 2, "shard/1", 4)).ok());
  // Other keys and unfenced appends are not concerned.
  EXPECT_TRUE(js::append(j(), fenced("b", 1, 1, "shard/2", 1)).ok());
  EXPECT_TRUE(js::append(j(), batch("c", 1, 1)).ok());
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(1, 2));
}

// proves: E9
TEST_P(JournalContract, a_fence_never_goes_down_and_bad_fences_are_invalid_arguments) {
  ASSERT_TRUE(js::raise_fence(j(), "k", 5).ok());
  EXPECT_TRUE(js::raise_fence(j(), "k", 5).ok());  // the same value again
  auto lower = js::raise_fence(j(), "k", 4);
  ASSERT_FALSE(lower.ok());
  EXPECT_EQ(lower.error().code(), ErrorCode::journal_conflict);
  EXPECT_NE(lower.error().message().find("fence 'k' is at 5, cannot take it at 4"), std::string::npos)
      << lower.error().message();
  // The refused raise changed nothing: 5 still appends, 4 still does not.
  EXPECT_TRUE(js::append(j(), fenced("a", 1, 1, "k", 5)).ok());
  EXPECT_FALSE(js::append(j(), fenced("a", 2, 2, "k", 4)).ok());
  for (auto r : {js::raise_fence(j(), "", 1), js::raise_fence(j(), "k", 0),
                 js::raise_fence(j(), "k", std::uint64_t{1} << 63),
                 js::append(j(), fenced("a", 2, 2, "", 7))}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  }
}

TEST_P(JournalContract, highest_fence_is_the_highest_raised_under_any_key) {
  EXPECT_EQ(*js::highest_fence(j()), 0u);
  ASSERT_TRUE(js::raise_fence(j(), "a/1", 7).ok());
  ASSERT_TRUE(js::raise_fence(j(), "a/2", 3).ok());
  EXPECT_FALSE(js::raise_fence(j(), "a/1", 5).ok());
  EXPECT_EQ(*js::highest_fence(j()), 7u);
}

// proves: E9
TEST_P(JournalContract, a_refused_fenced_append_fails_only_its_own_batch_among_appends_in_flight) {
  ASSERT_TRUE(js::raise_fence(j(), "s", 2).ok());
  std::vector<AppendBatch> batches = {fenced("a", 1, 1, "s", 2), fenced("b", 1, 2, "s", 1),  // stale
                                      batch("c", 1, 1), fenced("a", 2, 2, "s", 2), fenced("d", 1, 1, "t", 1)};
  Results<void> results(batches.size());
  for (std::size_t i = 0; i < batches.size(); ++i) j().append(batches[i], results.callback(i));
  ASSERT_TRUE(results.wait_all());
  for (std::size_t i : {0u, 2u, 3u, 4u}) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].error().to_string();
  ASSERT_FALSE(results[1].ok());
  EXPECT_EQ(results[1].error().code(), ErrorCode::journal_conflict);
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(1, 2));
  EXPECT_TRUE(js::replay(j(), "b")->empty());
}

// The raise and the appends in flight under the old fence are ordered: each such append is either refused or visible to a read made after the raise returned.
// proves: E9
TEST_P(JournalContract, every_append_stored_under_an_old_fence_is_visible_once_the_raise_is_acknowledged) {
  constexpr int kIds = 200;
  for (int round = 0; round < 12; ++round) {
    const std::string key = "race/" + std::to_string(round);
    ASSERT_TRUE(js::raise_fence(j(), key, 1).ok());
    Results<void> appends(kIds);
    std::atomic<bool> go{false};
    std::thread writer([&] {
      while (!go.load()) std::this_thread::yield();
      for (int i = 0; i < kIds; ++i)
        j().append(fenced(key + "/" + std::to_string(i), 1, 1, key, 1), appends.callback(static_cast<std::size_t>(i)));
    });
    go = true;
    std::this_thread::sleep_for(std::chrono::microseconds(100 * round));
    ASSERT_TRUE(js::raise_fence(j(), key, 2).ok());
    std::vector<bool> visible(kIds);
    for (int i = 0; i < kIds; ++i) visible[i] = *js::highest_seq(j(), key + "/" + std::to_string(i)) == 1;
    writer.join();
    ASSERT_TRUE(appends.wait_all());
    for (int i = 0; i < kIds; ++i) {
      const auto& r = appends[static_cast<std::size_t>(i)];
      if (r.ok()) {
        EXPECT_TRUE(visible[i]) << "round " << round << ": append " << i
                                << " was stored under the old fence after the raise returned";
      } else {
        EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict) << r.error().to_string();
      }
    }
  }
}

// proves: E9
TEST_P(JournalContract, a_fenced_view_waits_for_its_raise_then_stamps_appends_and_a_stale_view_fails_everything) {
  auto inner = std::shared_ptr<Journal>(&j(), [](Journal*) {});
  auto owner = troupe::FencedJournal::open(inner, {"shard/9", 7});
  ASSERT_TRUE(js::append(*owner, batch("a", 1, 2)).ok());
  ASSERT_TRUE(owner->raised().has_value());
  EXPECT_TRUE(owner->raised()->ok());
  // An unfenced writer of the same ids is not stopped; a writer fenced
  // below 7 is.
  EXPECT_FALSE(js::append(j(), fenced("a", 3, 3, "shard/9", 6)).ok());
  auto stale = troupe::FencedJournal::open(inner, {"shard/9", 6});
  auto rec = js::recover(*stale, "a");
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.error().code(), ErrorCode::journal_conflict) << rec.error().to_string();
  auto app = js::append(*stale, batch("a", 3, 3));
  ASSERT_FALSE(app.ok());
  EXPECT_EQ(app.error().code(), ErrorCode::journal_conflict);
  // A newer owner takes over: the old view's appends are refused from now on.
  auto newer = troupe::FencedJournal::open(inner, {"shard/9", 8});
  ASSERT_TRUE(js::recover(*newer, "a").ok());
  auto old = js::append(*owner, batch("a", 3, 3));
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.error().code(), ErrorCode::journal_conflict);
  EXPECT_TRUE(js::append(*newer, batch("a", 3, 3)).ok());
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(1, 3));
}

// --- appends ----------------------------------------------------------------------

TEST_P(JournalContract, a_batch_is_stored_whole_and_replays_in_order) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 3)).ok());
  ASSERT_TRUE(js::append(j(), batch("a", 4, 4)).ok());
  auto r = js::replay(j(), "a");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 4u);
  for (std::uint64_t s = 1; s <= 4; ++s) EXPECT_EQ((*r)[s - 1], event(s));
}

// proves: E7
TEST_P(JournalContract, appending_a_stored_seq_is_a_conflict_and_stores_nothing_of_that_batch) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 2)).ok());
  auto r = js::append(j(), batch("a", 2, 4));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict) << r.error().to_string();
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(1, 2));
  EXPECT_EQ(*js::highest_seq(j(), "a"), 2u);
  // The log goes on from where it was.
  EXPECT_TRUE(js::append(j(), batch("a", 3, 3)).ok());
}

// Two incarnations both think the next number is 1.
// proves: E7
TEST_P(JournalContract, a_second_writer_replaying_the_same_seq_is_refused_whatever_its_payload) {
  AppendBatch first = batch("e", 1, 1);
  AppendBatch stale = batch("e", 1, 1);
  stale.events[0].payload = "the stale incarnation's event";
  ASSERT_TRUE(js::append(j(), first).ok());
  auto r = js::append(j(), stale);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict);
  auto events = js::replay(j(), "e");
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0], first.events[0]);
}

TEST_P(JournalContract, an_append_that_would_leave_a_gap_is_a_conflict_and_stores_nothing) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 2)).ok());
  auto r = js::append(j(), batch("a", 4, 5));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict) << r.error().to_string();
  auto fresh = js::append(j(), batch("b", 2, 2));  // a new id starts at 1
  ASSERT_FALSE(fresh.ok());
  EXPECT_EQ(fresh.error().code(), ErrorCode::journal_conflict);
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(1, 2));
  EXPECT_TRUE(js::replay(j(), "b")->empty());
  EXPECT_EQ(*js::highest_seq(j(), "b"), 0u);
}

TEST_P(JournalContract, malformed_batches_are_invalid_arguments_and_store_nothing) {
  AppendBatch not_consecutive = batch("a", 1, 3);
  not_consecutive.events[2].seq = 4;
  AppendBatch descending = batch("a", 1, 2);
  std::swap(descending.events[0], descending.events[1]);
  AppendBatch seq_zero = batch("a", 0, 1);
  AppendBatch empty_id = batch("", 1, 1);
  AppendBatch empty_batch;
  empty_batch.persistence_id = "a";
  for (const AppendBatch& b : {not_consecutive, descending, seq_zero, empty_id, empty_batch}) {
    auto r = js::append(j(), b);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  }
  EXPECT_TRUE(js::replay(j(), "a")->empty());
  EXPECT_TRUE(js::replay(j(), "")->empty());
  EXPECT_EQ(*js::highest_seq(j(), "a"), 0u);
}

TEST_P(JournalContract, a_conflict_fails_only_its_own_batch_when_appends_are_in_flight_together) {
  // Issued without waiting, so a back end that commits several batches in
  // one transaction gets them together.
  std::vector<AppendBatch> batches = {batch("a", 1, 1), batch("b", 1, 2), batch("a", 1, 1),  // stale
                                      batch("b", 3, 3), batch("c", 1, 3), batch("c", 5, 5),  // gap
                                      batch("a", 2, 2), batch("", 1, 1)};                    // invalid
  Results<void> results(batches.size());
  for (std::size_t i = 0; i < batches.size(); ++i) j().append(batches[i], results.callback(i));
  ASSERT_TRUE(results.wait_all());
  EXPECT_EQ(results[2].error().code(), ErrorCode::journal_conflict);
  EXPECT_EQ(results[5].error().code(), ErrorCode::journal_conflict);
  EXPECT_EQ(results[7].error().code(), ErrorCode::invalid_argument);
  for (std::size_t i : {0u, 1u, 3u, 4u, 6u}) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i].error().to_string();
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(1, 2));
  EXPECT_EQ(seqs(*js::replay(j(), "b")), range(1, 3));
  EXPECT_EQ(seqs(*js::replay(j(), "c")), range(1, 3));
}

// --- replay and highest ------------------------------------------------------------

TEST_P(JournalContract, replay_returns_exactly_the_requested_range) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 10)).ok());
  EXPECT_EQ(seqs(*js::replay(j(), "a", 3, 6)), range(3, 6));
  EXPECT_EQ(seqs(*js::replay(j(), "a", 0, 2)), range(1, 2));  // 0 reads like 1
  EXPECT_EQ(seqs(*js::replay(j(), "a", 8)), range(8, 10));
  EXPECT_EQ(seqs(*js::replay(j(), "a", 10, 10)), range(10, 10));
  EXPECT_TRUE(js::replay(j(), "a", 11)->empty());
  EXPECT_TRUE(js::replay(j(), "a", 6, 5)->empty());
  EXPECT_TRUE(js::replay(j(), "unknown")->empty());
}

TEST_P(JournalContract, highest_seq_is_zero_for_an_unknown_id_and_the_last_appended_otherwise) {
  EXPECT_EQ(*js::highest_seq(j(), "a"), 0u);
  ASSERT_TRUE(js::append(j(), batch("a", 1, 3)).ok());
  EXPECT_EQ(*js::highest_seq(j(), "a"), 3u);
  EXPECT_EQ(*js::highest_seq(j(), "b"), 0u);
}

TEST_P(JournalContract, ids_are_independent_even_when_one_is_a_prefix_of_another) {
  ASSERT_TRUE(js::append(j(), batch("acct|1", 1, 2)).ok());
  ASSERT_TRUE(js::append(j(), batch("acct|10", 1, 5)).ok());
  EXPECT_EQ(seqs(*js::replay(j(), "acct|1")), range(1, 2));
  EXPECT_EQ(*js::highest_seq(j(), "acct|10"), 5u);
  EXPECT_EQ(*js::highest_seq(j(), "acct|"), 0u);
}

// --- deletion ------------------------------------------------------------------------

TEST_P(JournalContract, delete_up_to_removes_the_events_but_keeps_the_highest_seq) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 5)).ok());
  ASSERT_TRUE(js::delete_up_to(j(), "a", 3).ok());
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(4, 5));
  EXPECT_EQ(*js::highest_seq(j(), "a"), 5u);
  ASSERT_TRUE(js::delete_up_to(j(), "a", 5).ok());
  EXPECT_TRUE(js::replay(j(), "a")->empty());
  EXPECT_EQ(*js::highest_seq(j(), "a"), 5u);
}

// A stale incarnation cannot slip in under a deletion.
// proves: E7
TEST_P(JournalContract, deleted_sequence_numbers_are_never_reused) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 3)).ok());
  ASSERT_TRUE(js::delete_up_to(j(), "a", 3).ok());
  for (std::uint64_t s : {1u, 3u}) {
    auto r = js::append(j(), batch("a", s, 3));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::journal_conflict) << s;
  }
  ASSERT_TRUE(js::append(j(), batch("a", 4, 4)).ok());
  EXPECT_EQ(seqs(*js::replay(j(), "a")), range(4, 4));
}

TEST_P(JournalContract, deleting_past_the_highest_reserves_no_later_numbers) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 2)).ok());
  ASSERT_TRUE(js::delete_up_to(j(), "a", UINT64_MAX).ok());
  EXPECT_EQ(*js::highest_seq(j(), "a"), 2u);
  EXPECT_TRUE(js::append(j(), batch("a", 3, 3)).ok());
  // An id with nothing stored stays at 0.
  ASSERT_TRUE(js::delete_up_to(j(), "b", 10).ok());
  EXPECT_EQ(*js::highest_seq(j(), "b"), 0u);
  EXPECT_TRUE(js::append(j(), batch("b", 1, 1)).ok());
}

// --- snapshots and recovery ----------------------------------------------------------

TEST_P(JournalContract, loading_the_snapshot_of_an_id_without_one_gives_none) {
  auto s = js::load_snapshot(j(), "a");
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->has_value());
}

TEST_P(JournalContract, the_snapshot_with_the_highest_seq_wins) {
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(5, "five")).ok());
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(3, "three")).ok());
  EXPECT_EQ(**js::load_snapshot(j(), "a"), snapshot(5, "five"));
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(5, "five again")).ok());
  EXPECT_EQ(**js::load_snapshot(j(), "a"), snapshot(5, "five again"));
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(7, "seven")).ok());
  EXPECT_EQ(**js::load_snapshot(j(), "a"), snapshot(7, "seven"));
  EXPECT_FALSE(js::load_snapshot(j(), "b")->has_value());
}

TEST_P(JournalContract, saving_a_snapshot_with_an_empty_id_is_an_invalid_argument) {
  auto r = js::save_snapshot(j(), "", snapshot(1, "x"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument);
}

TEST_P(JournalContract, recover_gives_the_latest_snapshot_the_events_after_it_and_the_highest_seq) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 6)).ok());
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(2, "two")).ok());
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(4, "four")).ok());
  auto r = js::recover(j(), "a");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_TRUE(r->snapshot.has_value());
  EXPECT_EQ(*r->snapshot, snapshot(4, "four"));
  EXPECT_EQ(seqs(r->events), range(5, 6));
  EXPECT_EQ(r->events[0], event(5));
  EXPECT_EQ(r->highest_seq, 6u);
}

TEST_P(JournalContract, recover_without_a_snapshot_gives_every_event) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 3)).ok());
  auto r = js::recover(j(), "a");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->snapshot.has_value());
  EXPECT_EQ(seqs(r->events), range(1, 3));
  EXPECT_EQ(r->highest_seq, 3u);
}

TEST_P(JournalContract, recover_of_an_unknown_id_is_empty) {
  auto r = js::recover(j(), "nobody");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->snapshot.has_value());
  EXPECT_TRUE(r->events.empty());
  EXPECT_EQ(r->highest_seq, 0u);
}

TEST_P(JournalContract, recover_after_snapshot_and_deletion_keeps_the_highest_seq) {
  ASSERT_TRUE(js::append(j(), batch("a", 1, 4)).ok());
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(4, "four")).ok());
  ASSERT_TRUE(js::delete_up_to(j(), "a", 4).ok());
  auto r = js::recover(j(), "a");
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(*r->snapshot, snapshot(4, "four"));
  EXPECT_TRUE(r->events.empty());
  EXPECT_EQ(r->highest_seq, 4u);
}

// --- bytes -----------------------------------------------------------------------

TEST_P(JournalContract, every_byte_value_including_nul_round_trips_in_payloads_and_manifests) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  AppendBatch b;
  b.persistence_id = std::string("id\0with nul", 11);
  EventRecord e1 = event(1, std::string("\0\0x\0", 4));
  EventRecord e2 = event(2, all_bytes + all_bytes);
  EventRecord e3 = event(3);
  e3.payload.clear();  // an empty payload stays empty
  e3.type = "";
  e3.version = UINT32_MAX;
  e3.timestamp_ms = -1;
  b.events = {e1, e2, e3};
  ASSERT_TRUE(js::append(j(), b).ok());
  auto r = js::replay(j(), b.persistence_id);
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  ASSERT_EQ(r->size(), 3u);
  EXPECT_EQ((*r)[0], e1);
  EXPECT_EQ((*r)[1], e2);
  EXPECT_EQ((*r)[2], e3);
  EXPECT_TRUE(js::replay(j(), "id")->empty());  // the NUL is part of the id

  ASSERT_TRUE(js::save_snapshot(j(), "s", snapshot(1, all_bytes)).ok());
  EXPECT_EQ(**js::load_snapshot(j(), "s"), snapshot(1, all_bytes));
}

TEST_P(JournalContract, a_one_megabyte_payload_round_trips) {
  std::string big(1 << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + 7) % 251);
  ASSERT_TRUE(js::append(j(), AppendBatch{"a", {event(1, big), event(2, big + "!")}}).ok());
  ASSERT_TRUE(js::save_snapshot(j(), "a", snapshot(2, big)).ok());
  auto r = js::replay(j(), "a");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->size(), 2u);
  EXPECT_TRUE((*r)[0].payload == big);
  EXPECT_TRUE((*r)[1].payload == big + "!");
  EXPECT_TRUE((*js::load_snapshot(j(), "a"))->payload == big);
}

// --- ordering, concurrency, callbacks ---------------------------------------------------

// "Never reordered", failed appends among good ones included.
// proves: E7
TEST_P(JournalContract, completions_for_one_id_arrive_in_the_order_the_appends_were_made) {
  constexpr std::size_t n = 300;
  std::vector<AppendBatch> batches;
  std::uint64_t next = 1;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 50 == 25) {
      batches.push_back(batch("o", next - 1, next - 1));  // stale: conflict
    } else if (i % 50 == 40) {
      batches.push_back(AppendBatch{"o", {}});  // invalid
    } else {
      std::uint64_t last = next + i % 3;
      batches.push_back(batch("o", next, last));
      next = last + 1;
    }
  }
  Results<void> results(n);
  for (std::size_t i = 0; i < n; ++i) j().append(batches[i], results.callback(i));
  ASSERT_TRUE(results.wait_all());
  std::vector<std::size_t> expected(n);
  for (std::size_t i = 0; i < n; ++i) expected[i] = i;
  EXPECT_EQ(results.order(), expected);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(results[i].ok(), i % 50 != 25 && i % 50 != 40) << i;
  EXPECT_EQ(seqs(*js::replay(j(), "o")), range(1, next - 1));
}

TEST_P(JournalContract, concurrent_appends_from_several_threads_to_distinct_ids_are_all_stored) {
  constexpr int threads = 4, ids_per_thread = 8, rounds = 20;
  std::atomic<int> failures{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int r = 0; r < rounds; ++r) {
        for (int k = 0; k < ids_per_thread; ++k) {
          std::string id = "t" + std::to_string(t) + "-" + std::to_string(k);
          // Alternate one- and two-event batches: seqs 3r+1 .. 3r+1 and 3r+2 .. 3r+3.
          auto seq = static_cast<std::uint64_t>(3 * r);
          if (!js::append(j(), batch(id, seq + 1, seq + 1)).ok()) ++failures;
          if (!js::append(j(), batch(id, seq + 2, seq + 3)).ok()) ++failures;
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < threads; ++t) {
    for (int k = 0; k < ids_per_thread; ++k) {
      std::string id = "t" + std::to_string(t) + "-" + std::to_string(k);
      auto r = js::replay(j(), id);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(seqs(*r), range(1, 3 * rounds)) << id;
      EXPECT_EQ((*r)[7], event(8)) << id;
    }
  }
}

TEST_P(JournalContract, every_callback_runs_exactly_once_even_when_the_journal_closes_with_work_queued) {
  constexpr std::size_t n = 400;
  Results<void> writes(n);
  Results<std::vector<EventRecord>> replays(n / 4);
  Results<Recovery> recoveries(n / 4);
  Results<std::uint64_t> highs(n / 4);
  for (std::size_t i = 0; i < n; ++i) {
    std::string id = "x" + std::to_string(i % 10);
    std::uint64_t seq = i / 10 + 1;
    switch (i % 8) {
      case 3: j().delete_up_to(id, seq / 2, writes.callback(i)); break;
      case 5: j().save_snapshot(id, snapshot(seq, "s"), writes.callback(i)); break;
      case 6: j().append(batch(id, 1, 1), writes.callback(i)); break;  // conflict (mostly)
      default: j().append(batch(id, seq, seq), writes.callback(i)); break;
    }
    if (i % 4 == 0) {
      j().replay(id, 1, UINT64_MAX, replays.callback(i / 4));
      j().recover(id, recoveries.callback(i / 4));
      j().highest_seq(id, highs.callback(i / 4));
    }
  }
  close();
  // The close answered everything (wait_all would otherwise time out).
  EXPECT_TRUE(writes.wait_all(1s));
  EXPECT_TRUE(replays.wait_all(1s));
  EXPECT_TRUE(recoveries.wait_all(1s));
  EXPECT_TRUE(highs.wait_all(1s));
  for (int c : writes.calls()) EXPECT_EQ(c, 1);
  for (int c : replays.calls()) EXPECT_EQ(c, 1);
  for (int c : recoveries.calls()) EXPECT_EQ(c, 1);
  for (int c : highs.calls()) EXPECT_EQ(c, 1);
}

TEST_P(JournalContract, a_read_made_after_an_append_is_acknowledged_sees_it) {
  for (std::uint64_t s = 1; s <= 50; ++s) {
    ASSERT_TRUE(js::append(j(), batch("rw", s, s)).ok());
    ASSERT_EQ(*js::highest_seq(j(), "rw"), s);
    auto r = js::recover(j(), "rw");
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->events.size(), s);
  }
}

// --- statistics --------------------------------------------------------------------

TEST_P(JournalContract, journal_stats_count_the_committed_writes_and_views_report_their_inner_journals) {
  ASSERT_TRUE(js::append(j(), batch("st", 1, 2)).ok());
  ASSERT_TRUE(js::append(j(), batch("st", 3, 3)).ok());
  const troupe::JournalStats st = j().journal_stats();
  if (j().name() == "memory") {
    // It stores each operation at once, in no transaction: nothing to count.
    EXPECT_FALSE(st.transactions.has_value());
    EXPECT_FALSE(st.events_written.has_value());
  } else {
    ASSERT_TRUE(st.transactions.has_value());
    ASSERT_TRUE(st.events_written.has_value());
    EXPECT_GE(*st.transactions, 1u);
    EXPECT_LE(*st.transactions, 2u);
    EXPECT_EQ(*st.events_written, 3u);
  }
  auto inner = std::shared_ptr<Journal>(&j(), [](Journal*) {});
  auto view = troupe::FencedJournal::open(inner, {"stats/1", 1});
  troupe::ForwardingJournal forwarding(view);
  ASSERT_TRUE(js::append(forwarding, batch("st", 4, 4)).ok());
  const troupe::JournalStats after = j().journal_stats();
  for (const troupe::JournalStats& s : {view->journal_stats(), forwarding.journal_stats()}) {
    EXPECT_EQ(s.transactions, after.transactions);
    EXPECT_EQ(s.events_written, after.events_written);
  }
  if (after.events_written) {
    EXPECT_EQ(*after.events_written, 4u);
  }
}

// proves: X4
TEST_P(JournalContract, an_events_trace_id_is_stored_with_it_and_read_back_by_replay_and_recover) {
  AppendBatch b = batch("t", 1, 3);
  b.events[0].trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  b.events[2].trace_id = "0af7651916cd43dd8448eb211c80319c";
  ASSERT_TRUE(js::append(j(), b).ok());
  auto replayed = js::replay(j(), "t");
  ASSERT_TRUE(replayed.ok()) << replayed.error().to_string();
  ASSERT_EQ(replayed->size(), 3u);
  EXPECT_EQ((*replayed)[0].trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ((*replayed)[1].trace_id, "") << "an event without a trace reads back without one";
  EXPECT_EQ((*replayed)[2].trace_id, "0af7651916cd43dd8448eb211c80319c");
  EXPECT_EQ(*replayed, b.events);
  auto rec = js::recover(j(), "t");
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->events, b.events);
}

INSTANTIATE_TEST_SUITE_P(EveryBackEnd, JournalContract, ::testing::ValuesIn(back_ends()),
                         [](const ::testing::TestParamInfo<BackEnd>& p) { return p.param.name; });

}  // namespace
