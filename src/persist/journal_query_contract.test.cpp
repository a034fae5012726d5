// The query contract (event_query.hpp, SPEC R1): events by entity type or
// tag, in one global order, from an offset, in pages, never one skipped or
// returned twice, with listeners told of appends. Checked against every back
// end of journal_under_test.hpp (every one keeps the global order).

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "journal_test_support.hpp"
#include "journal_under_test.hpp"
#include "troupe/persist/event_query.hpp"
#include "troupe/persist/journal.hpp"

namespace {

using namespace std::chrono_literals;
using namespace troupe::test::journal_names;
using troupe::EventPage;
using troupe::EventQuery;
using troupe::EventSelector;
using troupe::JournalOffset;
using troupe::StreamEvent;
using troupe::test::back_ends;
using troupe::test::BackEnd;
using troupe::test::JournalUnderTest;

class QueryContract : public ::testing::TestWithParam<BackEnd> {
 protected:
  void SetUp() override {
    under_test_ = GetParam().make();
    ASSERT_TRUE(j().supports_queries()) << GetParam().name << " keeps no global order";
  }
  Journal& j() { return under_test_->journal(); }

  void append(AppendBatch b) {
    auto r = js::append(j(), std::move(b));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
  }
  // Every event the selector gives after `after`, in pages of `page`.
  std::vector<StreamEvent> read_all(EventSelector sel, std::size_t page = 1000, JournalOffset after = {}) {
    std::vector<StreamEvent> out;
    for (;;) {
      auto r = js::query_events(j(), EventQuery{sel, after, page});
      EXPECT_TRUE(r.ok()) << r.error().to_string();
      if (!r.ok() || r->events.empty()) return out;
      EXPECT_LE(r->events.size(), page);
      for (auto& e : r->events) out.push_back(std::move(e));
      after = out.back().offset;
    }
  }

  std::unique_ptr<JournalUnderTest> under_test_;
};

AppendBatch tagged(const std::string& id, std::uint64_t seq, std::vector<std::string> tags) {
  AppendBatch b = batch(id, seq, seq);
  b.events[0].tags = std::move(tags);
  return b;
}

std::vector<std::string> ids_and_seqs(const std::vector<StreamEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.persistence_id + "#" + std::to_string(e.event.seq));
  return out;
}

void expect_increasing(const std::vector<StreamEvent>& events) {
  for (std::size_t i = 1; i < events.size(); ++i)
    EXPECT_LT(events[i - 1].offset, events[i].offset) << "at " << i;
}

// proves: R1
TEST_P(QueryContract, events_of_a_type_come_in_append_order_across_ids_and_resume_after_an_offset) {
  append(batch("payment|a", 1, 2));
  append(batch("order|x", 1, 1));
  append(batch("payment|b", 1, 1));
  append(batch("payment|a", 3, 3));
  append(batch("payments|c", 1, 1));  // another type whose name starts the same

  auto all = read_all(EventSelector::of_type("payment"));
  EXPECT_EQ(ids_and_seqs(all),
            (std::vector<std::string>{"payment|a#1", "payment|a#2", "payment|b#1", "payment|a#3"}));
  expect_increasing(all);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[0].event.payload, "event 1");
  EXPECT_EQ(all[0].event.type, "test.Event");

  auto rest = read_all(EventSelector::of_type("payment"), 1000, all[1].offset);
  EXPECT_EQ(ids_and_seqs(rest), (std::vector<std::string>{"payment|b#1", "payment|a#3"}));
  EXPECT_TRUE(read_all(EventSelector::of_type("payment"), 1000, all.back().offset).empty());
  EXPECT_EQ(ids_and_seqs(read_all(EventSelector::of_type("order"))), (std::vector<std::string>{"order|x#1"}));
  EXPECT_TRUE(read_all(EventSelector::of_type("nobody")).empty());
}

// proves: R1
TEST_P(QueryContract, events_with_a_tag_come_in_order_and_read_back_their_tags_in_queries_and_replays) {
  append(tagged("payment|a", 1, {"customer-7", "eu"}));
  append(tagged("payment|b", 1, {"customer-8"}));
  append(tagged("refund|r", 1, {"customer-7"}));
  append(tagged("payment|a", 2, {}));

  auto c7 = read_all(EventSelector::with_tag("customer-7"));
  EXPECT_EQ(ids_and_seqs(c7), (std::vector<std::string>{"payment|a#1", "refund|r#1"}));
  expect_increasing(c7);
  ASSERT_EQ(c7.size(), 2u);
  EXPECT_EQ(c7[0].event.tags, (std::vector<std::string>{"customer-7", "eu"}));
  EXPECT_EQ(ids_and_seqs(read_all(EventSelector::with_tag("eu"))), (std::vector<std::string>{"payment|a#1"}));
  EXPECT_TRUE(read_all(EventSelector::with_tag("customer-")).empty());

  auto replayed = js::replay(j(), "payment|a");
  ASSERT_TRUE(replayed.ok());
  ASSERT_EQ(replayed->size(), 2u);
  EXPECT_EQ((*replayed)[0].tags, (std::vector<std::string>{"customer-7", "eu"}));
  EXPECT_TRUE((*replayed)[1].tags.empty());
}

TEST_P(QueryContract, pages_of_any_size_cover_every_event_once) {
  for (int i = 0; i < 10; ++i) append(batch("t|" + std::to_string(i % 3), i / 3 + 1, i / 3 + 1));
  auto whole = read_all(EventSelector::of_type("t"));
  ASSERT_EQ(whole.size(), 10u);
  for (std::size_t page : {1u, 3u, 9u, 10u, 11u}) {
    auto paged = read_all(EventSelector::of_type("t"), page);
    EXPECT_EQ(ids_and_seqs(paged), ids_and_seqs(whole)) << "pages of " << page;
  }
}

TEST_P(QueryContract, deleted_events_are_not_returned_and_later_events_still_follow_the_order) {
  append(batch("t|a", 1, 3));
  auto before = read_all(EventSelector::of_type("t"));
  ASSERT_EQ(before.size(), 3u);
  ASSERT_TRUE(js::delete_up_to(j(), "t|a", 3).ok());
  EXPECT_TRUE(read_all(EventSelector::of_type("t")).empty());
  append(batch("t|a", 4, 4));
  auto after = read_all(EventSelector::of_type("t"), 1000, before.back().offset);
  ASSERT_EQ(ids_and_seqs(after), (std::vector<std::string>{"t|a#4"}));
  EXPECT_LT(before.back().offset, after[0].offset) << "a number of a deleted event was given again";
}

TEST_P(QueryContract, bad_queries_and_bad_tags_are_invalid_arguments_and_store_nothing) {
  auto query = [&](EventQuery q) { return js::query_events(j(), std::move(q)); };
  EXPECT_EQ(query({EventSelector{}, {}, 10}).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(query({EventSelector{"t", "x"}, {}, 10}).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(query({EventSelector::of_type("t"), {}, 0}).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(query({EventSelector::of_type("t"), {}, troupe::max_query_limit + 1}).error().code(),
            ErrorCode::invalid_argument);
  EXPECT_EQ(query({EventSelector::of_type("a|b"), {}, 10}).error().code(), ErrorCode::invalid_argument);
  EXPECT_EQ(query({EventSelector::with_tag("bad\ntag"), {}, 10}).error().code(), ErrorCode::invalid_argument);

  for (auto tags : std::vector<std::vector<std::string>>{
           {""}, {"a\x01"}, {std::string(troupe::max_tag_length + 1, 'x')}, std::vector<std::string>(17, "many")}) {
    auto r = js::append(j(), tagged("t|a", 1, tags));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), ErrorCode::invalid_argument) << r.error().to_string();
  }
  EXPECT_EQ(js::highest_seq(j(), "t|a").value(), 0u);
  append(tagged("t|a", 1, {std::string(troupe::max_tag_length, 'x'), "ok"}));
  EXPECT_EQ(read_all(EventSelector::with_tag(std::string(troupe::max_tag_length, 'x'))).size(), 1u);
}

TEST_P(QueryContract, listeners_hear_of_appends_until_they_are_removed) {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  std::uint64_t id = j().add_append_listener([&] {
    std::lock_guard lk(mu);
    ++calls;
    cv.notify_all();
  });
  ASSERT_NE(id, 0u);
  append(batch("t|a", 1, 1));
  {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, 10s, [&] { return calls >= 1; }));
  }
  j().remove_append_listener(id);
  int seen = 0;
  {
    std::lock_guard lk(mu);
    seen = calls;
  }
  append(batch("t|a", 2, 2));
  std::this_thread::sleep_for(50ms);
  std::lock_guard lk(mu);
  EXPECT_EQ(calls, seen);
}

// Writers on many threads, a reader paging behind them all the while: the
// reader sees every acknowledged event exactly once, in increasing offsets,
// although appends commit concurrently and out of order (the gap problem on
// back ends with concurrent writers).
// proves: R1
TEST_P(QueryContract, a_reader_racing_concurrent_writers_sees_every_event_once_in_increasing_order) {
  constexpr int kWriters = 4, kIds = 8, kPerId = 40;
  std::atomic<int> failures{0};
  std::atomic<bool> writing{true};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w)
    writers.emplace_back([&, w] {
      for (int s = 1; s <= kPerId; ++s)
        for (int i = w; i < kIds; i += kWriters) {
          std::promise<Result<void>> p;
          auto f = p.get_future();
          j().append(batch("race|" + std::to_string(i), s, s), [&p](Result<void> r) { p.set_value(std::move(r)); });
          if (!f.get().ok()) ++failures;
        }
    });
  std::vector<StreamEvent> seen;
  JournalOffset after{};
  auto drain = [&] {
    for (;;) {
      auto r = js::query_events(j(), EventQuery{EventSelector::of_type("race"), after, 7});
      ASSERT_TRUE(r.ok()) << r.error().to_string();
      if (r->events.empty()) return;
      for (auto& e : r->events) {
        EXPECT_LT(after, e.offset);
        after = e.offset;
        seen.push_back(std::move(e));
      }
    }
  };
  std::thread stopper([&] {
    for (auto& t : writers) t.join();
    writing = false;
  });
  while (writing) drain();
  stopper.join();
  drain();
  EXPECT_EQ(failures.load(), 0);
  std::map<std::string, std::uint64_t> next;
  std::set<std::string> once;
  for (const auto& e : seen) {
    EXPECT_TRUE(once.insert(e.persistence_id + "#" + std::to_string(e.event.seq)).second) << "twice: " << e.persistence_id;
    // One id's events come in its own order.
    EXPECT_EQ(e.event.seq, ++next[e.persistence_id]) << e.persistence_id;
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kIds * kPerId));
}

INSTANTIATE_TEST_SUITE_P(EveryBackEnd, QueryContract, ::testing::ValuesIn(back_ends()),
                         [](const ::testing::TestParamInfo<BackEnd>& p) { return p.param.name; });

TEST(JournalOffset, prints_and_parses_and_refuses_what_is_not_an_offset) {
  JournalOffset o{17, 42};
  EXPECT_EQ(o.to_string(), "17:42");
  EXPECT_EQ(troupe::parse_offset("17:42").value(), o);
  EXPECT_EQ(troupe::parse_offset("0:0").value(), JournalOffset{});
  for (const char* bad : {"", ":", "1:", ":1", "a:1", "1:2:3", "-1:2", "1 :2", "18446744073709551616:1"})
    EXPECT_FALSE(troupe::parse_offset(bad).ok()) << bad;
  EXPECT_LT((JournalOffset{1, 99}), (JournalOffset{2, 1}));
  EXPECT_EQ(troupe::entity_type_of("payment|17"), "payment");
  EXPECT_EQ(troupe::entity_type_of("plain"), "plain");
  EXPECT_EQ(EventSelector::of_type("p").to_string(), "type:p");
  EXPECT_EQ(EventSelector::with_tag("t").to_string(), "tag:t");
}

}  // namespace
