// Stash and unstash_all, and the stash bound.
// Past the bound, stash() fails with stash_overflow and the message stays
// with the handler; nothing is lost. (The entity runtime's stash bound, E8,
// is its own and is tested in src/persist/entity.test.cpp.)

#include <gtest/gtest.h>

#include <string>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::ErrorCode;
using troupe::SpawnOptions;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

struct Work {
  int n = 0;
};
struct Open {};
struct Close {};
struct ArmWork {  // delivers Work{n} by timer, i.e. not in its own envelope
  int n = 0;
};
struct Ask {
  troupe::ReplyTo<int> reply;
  int n = 0;
};
using StashMsg = std::variant<Work, Open, Close, ArmWork, Ask>;

struct Handled {
  int n = 0;
};
struct Rejected {
  int n = 0;
  ErrorCode code = ErrorCode::ok;
  std::size_t stash_size = 0;
};
using Report = std::variant<Handled, Rejected>;

// Closed: stashes Work and Ask (rejecting what does not fit). Open: handles
// them. Opening unstashes everything.
struct Gatekeeper : troupe::Actor<StashMsg> {
  explicit Gatekeeper(ActorRef<Report> r) : report(std::move(r)) {}
  void receive(StashMsg& m) {
    troupe::match(
        m,
        [&](Work& w) {
          if (open) {
            report.tell(Handled{w.n});
          } else if (auto r = stash(); !r) {
            // the message is still ours: answer it instead of losing it
            report.tell(Rejected{w.n, r.error().code(), stash_size()});
          }
        },
        [&](Ask& a) {
          if (open) {
            a.reply(a.n * 10);
          } else if (auto r = stash(); !r) {
            a.reply.fail(r.error());
          }
        },
        [&](Open&) {
          open = true;
          unstash_all();
        },
        [&](Close&) { open = false; }, [&](ArmWork& a) { start_timer("w" + std::to_string(a.n), 10ms, Work{a.n}); });
  }
  bool open = false;
  ActorRef<Report> report;
};

class Stash : public ManualClockTest {
 protected:
  Stash() : reports(system, "reports") {}
  std::vector<int> handled(std::size_t n) {
    std::vector<int> out;
    for (auto& r : reports.expect_messages(n)) {
      auto* h = std::get_if<Handled>(&r);
      out.push_back(h ? h->n : -1);
    }
    return out;
  }
  TestProbe<Report> reports;
};

TEST_F(Stash, unstash_all_delivers_the_stashed_messages_in_their_order_before_later_ones) {
  auto g = system.spawn<Gatekeeper>(reports.ref());
  for (int i = 1; i <= 3; ++i) g.tell(Work{i});
  g.tell(Open{});
  g.tell(Work{4});
  g.tell(Work{5});
  EXPECT_EQ(handled(5), (std::vector<int>{1, 2, 3, 4, 5}));
}

TEST_F(Stash, stashed_messages_wait_until_unstashed_however_much_else_arrives) {
  auto g = system.spawn<Gatekeeper>(reports.ref());
  for (int i = 1; i <= 100; ++i) g.tell(Work{i});
  settle();
  EXPECT_EQ(reports.pending(), 0u);
  g.tell(Open{});
  std::vector<int> want(100);
  for (int i = 0; i < 100; ++i) want[static_cast<std::size_t>(i)] = i + 1;
  EXPECT_EQ(handled(100), want);
}

TEST_F(Stash, messages_can_be_stashed_again_after_an_unstash) {
  auto g = system.spawn<Gatekeeper>(reports.ref());
  g.tell(Work{1});
  g.tell(Open{});
  g.tell(Close{});
  g.tell(Work{2});
  g.tell(Work{3});
  EXPECT_EQ(handled(1), std::vector<int>{1});
  settle();
  EXPECT_EQ(reports.pending(), 0u);
  g.tell(Open{});
  EXPECT_EQ(handled(2), (std::vector<int>{2, 3}));
}

TEST_F(Stash, past_the_bound_stash_fails_with_stash_overflow_and_no_message_is_lost) {
  auto g = system.spawn<Gatekeeper>(SpawnOptions{.name = "gatekeeper", .stash_capacity = 3}, reports.ref());
  for (int i = 1; i <= 5; ++i) g.tell(Work{i});
  auto r4 = reports.expect<Rejected>();
  auto r5 = reports.expect<Rejected>();
  EXPECT_EQ(r4.n, 4);
  EXPECT_EQ(r4.code, ErrorCode::stash_overflow);
  EXPECT_EQ(r4.stash_size, 3u);
  EXPECT_EQ(r5.n, 5);
  EXPECT_EQ(r5.code, ErrorCode::stash_overflow);
  g.tell(Open{});
  g.tell(Work{6});
  EXPECT_EQ(handled(4), (std::vector<int>{1, 2, 3, 6}));
  settle();
  EXPECT_EQ(reports.pending(), 0u);
  EXPECT_EQ(system.stats().dead_letters, 0u);
}

TEST_F(Stash, an_overflowing_request_can_still_be_answered_with_the_error) {
  auto g = system.spawn<Gatekeeper>(SpawnOptions{.name = "gatekeeper", .stash_capacity = 1}, reports.ref());
  auto first = system.ask<int>(g, [](troupe::ReplyTo<int> r) { return Ask{std::move(r), 1}; }, 1h);
  auto second = system.ask<int>(g, [](troupe::ReplyTo<int> r) { return Ask{std::move(r), 2}; }, 1h);
  auto r2 = second.get();
  ASSERT_FALSE(r2.ok());
  EXPECT_EQ(r2.error().code(), ErrorCode::stash_overflow);
  settle();
  EXPECT_FALSE(first.ready());
  g.tell(Open{});
  auto r1 = first.get();
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(*r1, 10);
}

TEST_F(Stash, a_timer_message_can_be_stashed_and_unstashed) {
  auto g = system.spawn<Gatekeeper>(reports.ref());
  g.tell(ArmWork{7});
  settle();
  advance(10ms);  // Work{7} arrives by timer and is stashed
  EXPECT_EQ(reports.pending(), 0u);
  g.tell(Open{});
  EXPECT_EQ(handled(1), std::vector<int>{7});
}

TEST_F(Stash, a_timer_message_that_does_not_fit_stays_intact_with_the_handler) {
  auto g = system.spawn<Gatekeeper>(SpawnOptions{.name = "gatekeeper", .stash_capacity = 0}, reports.ref());
  g.tell(ArmWork{9});
  settle();
  advance(10ms);
  auto r = reports.expect<Rejected>();
  EXPECT_EQ(r.n, 9);  // the handler still sees the message's content
  EXPECT_EQ(r.code, ErrorCode::stash_overflow);
}

TEST_F(Stash, stashed_messages_of_a_stopped_actor_become_dead_letters) {
  auto g = system.spawn<Gatekeeper>(reports.ref());
  for (int i = 0; i < 4; ++i) g.tell(Work{i});
  settle();
  auto before = system.stats().dead_letters;
  g.stop();
  settle();
  EXPECT_TRUE(g.terminated());
  EXPECT_EQ(system.stats().dead_letters, before + 4);
  EXPECT_EQ(reports.pending(), 0u);
}

TEST_F(Stash, a_stashed_request_of_a_stopped_actor_is_answered_with_no_reply) {
  auto g = system.spawn<Gatekeeper>(reports.ref());
  auto f = system.ask<int>(g, [](troupe::ReplyTo<int> r) { return Ask{std::move(r), 1}; }, 1h);
  settle();
  g.stop();
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::no_reply);
}

}  // namespace
