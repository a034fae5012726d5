// The bounded mailbox: SpawnOptions::mailbox_capacity.
// A full mailbox refuses at once with mailbox_full, counted; what it
// accepted is all handled.


#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::Delivery;
using troupe::ErrorCode;
using troupe::SpawnOptions;
using troupe::testkit::Gate;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

struct Item {
  int n = 0;
};
struct Hold {
  Gate* entered = nullptr;
  Gate* release = nullptr;
};
struct Count {
  troupe::ReplyTo<std::vector<int>> reply;
};
struct Tick {};
struct ArmTick {};
using SinkMsg = std::variant<Item, Hold, Count, Tick, ArmTick>;

// Records every Item it handles, in order; Hold blocks it.
struct Sink : troupe::Actor<SinkMsg> {
  void receive(SinkMsg& m) {
    troupe::match(
        m, [&](Item& i) { items.push_back(i.n); },
        [&](Hold& h) {
          h.entered->open();
          ASSERT_TRUE(h.release->wait());
        },
        [&](Count& c) { c.reply(items); }, [&](Tick&) { items.push_back(-1); },
        [&](ArmTick&) { start_timer("tick", 10ms, Tick{}); });
  }
  std::vector<int> items;
};

class Mailbox : public ManualClockTest {
 protected:
  std::vector<int> items_of(const ActorRef<SinkMsg>& s) {
    auto r = system.ask<std::vector<int>>(s, [](auto reply) { return Count{std::move(reply)}; }, 1h).get();
    EXPECT_TRUE(r.ok());
    return r.ok() ? *r : std::vector<int>{};
  }
  static std::vector<int> iota(int from, int to) {
    std::vector<int> v;
    for (int i = from; i <= to; ++i) v.push_back(i);
    return v;
  }
};

TEST_F(Mailbox, a_full_bounded_mailbox_refuses_tells_and_loses_none_it_accepted) {
  auto s = system.spawn<Sink>(SpawnOptions{.name = "sink", .mailbox_capacity = 5});
  Gate entered, release;
  ASSERT_EQ(s.tell(Hold{&entered, &release}), Delivery::delivered);
  ASSERT_TRUE(entered.wait());  // the Hold left the mailbox: it is empty now
  auto before = system.stats().mailbox_overflows;
  std::vector<Delivery> outcomes;
  for (int i = 1; i <= 8; ++i) outcomes.push_back(s.tell(Item{i}));
  EXPECT_EQ(outcomes, (std::vector<Delivery>{Delivery::delivered, Delivery::delivered, Delivery::delivered,
                                             Delivery::delivered, Delivery::delivered, Delivery::mailbox_full,
                                             Delivery::mailbox_full, Delivery::mailbox_full}));
  EXPECT_EQ(system.stats().mailbox_overflows, before + 3);
  release.open();
  settle();
  EXPECT_EQ(items_of(s), iota(1, 5));
  EXPECT_EQ(system.stats().dead_letters, 0u);  // refused is not dead
}

TEST_F(Mailbox, room_comes_back_once_the_actor_has_taken_its_messages) {
  auto s = system.spawn<Sink>(SpawnOptions{.name = "sink", .mailbox_capacity = 3});
  for (int round = 0; round < 3; ++round) {
    Gate entered, release;
    s.tell(Hold{&entered, &release});
    ASSERT_TRUE(entered.wait());
    for (int i = 1; i <= 3; ++i) EXPECT_EQ(s.tell(Item{round * 10 + i}), Delivery::delivered);
    EXPECT_EQ(s.tell(Item{-99}), Delivery::mailbox_full);
    release.open();
    settle();
  }
  EXPECT_EQ(items_of(s), (std::vector<int>{1, 2, 3, 11, 12, 13, 21, 22, 23}));
  EXPECT_EQ(system.stats().mailbox_overflows, 3u);
}

TEST_F(Mailbox, an_ask_into_a_full_mailbox_fails_at_once_with_mailbox_full) {
  auto s = system.spawn<Sink>(SpawnOptions{.name = "sink", .mailbox_capacity = 1});
  Gate entered, release;
  s.tell(Hold{&entered, &release});
  ASSERT_TRUE(entered.wait());
  ASSERT_EQ(s.tell(Item{1}), Delivery::delivered);
  auto f = system.ask<std::vector<int>>(s, [](auto reply) { return Count{std::move(reply)}; }, 1h);
  ASSERT_TRUE(f.ready()) << "a refused ask must not wait for its timeout";
  auto r = f.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), ErrorCode::mailbox_full);
  EXPECT_EQ(system.stats().mailbox_overflows, 1u);
  release.open();
  settle();
}

TEST_F(Mailbox, timer_fires_and_stop_requests_are_never_refused_by_the_bound) {
  auto s = system.spawn<Sink>(SpawnOptions{.name = "sink", .mailbox_capacity = 2});
  s.tell(ArmTick{});
  settle();
  Gate entered, release;
  s.tell(Hold{&entered, &release});
  ASSERT_TRUE(entered.wait());
  s.tell(Item{1});
  s.tell(Item{2});
  ASSERT_EQ(s.tell(Item{3}), Delivery::mailbox_full);
  clock->advance(10ms);  // the fire goes past the bound
  release.open();
  settle();
  EXPECT_EQ(items_of(s), (std::vector<int>{1, 2, -1}));

  Gate entered2, release2;
  s.tell(Hold{&entered2, &release2});
  ASSERT_TRUE(entered2.wait());
  s.tell(Item{4});
  s.tell(Item{5});
  s.stop();  // also past the bound
  release2.open();
  settle();
  EXPECT_TRUE(s.terminated());
}

TEST_F(Mailbox, an_unbounded_mailbox_takes_everything_while_its_actor_is_busy) {
  auto s = system.spawn<Sink>();
  Gate entered, release;
  s.tell(Hold{&entered, &release});
  ASSERT_TRUE(entered.wait());
  for (int i = 1; i <= 10'000; ++i) ASSERT_EQ(s.tell(Item{i}), Delivery::delivered);
  release.open();
  settle();
  EXPECT_EQ(items_of(s), iota(1, 10'000));
  EXPECT_EQ(system.stats().mailbox_overflows, 0u);
}

TEST_F(Mailbox, concurrent_senders_into_a_bound_get_exactly_capacity_accepted) {
  constexpr int kCapacity = 1000;
  auto s = system.spawn<Sink>(SpawnOptions{.name = "sink", .mailbox_capacity = kCapacity});
  Gate entered, release;
  s.tell(Hold{&entered, &release});
  ASSERT_TRUE(entered.wait());
  std::atomic<int> accepted{0}, refused{0};
  std::vector<std::thread> senders;
  for (int t = 0; t < 4; ++t)
    senders.emplace_back([&, t] {
      for (int i = 0; i < 500; ++i) {
        (s.tell(Item{t * 1000 + i}) == Delivery::delivered ? accepted : refused).fetch_add(1);
      }
    });
  for (auto& th : senders) th.join();
  EXPECT_EQ(accepted.load(), kCapacity);
  EXPECT_EQ(refused.load(), 2000 - kCapacity);
  EXPECT_EQ(system.stats().mailbox_overflows, static_cast<std::uint64_t>(2000 - kCapacity));
  release.open();
  settle();
  EXPECT_EQ(items_of(s).size(), static_cast<std::size_t>(kCapacity));
}

}  // namespace
