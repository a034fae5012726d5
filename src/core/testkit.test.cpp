// The testkit proves itself here: the rest of the suite trusts a probe to
// fail when a message is missing or wrong, and the fixture to move time only
// when told. (Lives in src/core until the build has a testkit test target.)

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <variant>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::testkit::ExpectationFailed;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

struct Ping {
  int n = 0;
};
struct Pong {
  int n = 0;
};
using Msg = std::variant<Ping, Pong>;

troupe::SystemConfig quiet() {
  troupe::SystemConfig c;
  c.threads = 2;
  c.log_dead_letters = false;
  c.log_failures = false;
  return c;
}

TEST(TestProbe, receives_what_is_told_to_its_ref_in_order) {
  troupe::ActorSystem sys(quiet());
  TestProbe<Msg> probe(sys);
  probe.ref().tell(Ping{1});
  probe.ref().tell(Pong{2});
  EXPECT_EQ(probe.expect<Ping>().n, 1);
  EXPECT_EQ(probe.expect<Pong>().n, 2);
  EXPECT_EQ(probe.pending(), 0u);
}

TEST(TestProbe, spawns_its_actor_under_the_given_name) {
  troupe::ActorSystem sys(quiet());
  TestProbe<Msg> probe(sys, "replies");
  EXPECT_EQ(probe.ref().name(), "replies");
}

TEST(TestProbe, pending_counts_received_messages_not_yet_expected) {
  troupe::ActorSystem sys(quiet());
  TestProbe<int> probe(sys);
  for (int i = 0; i < 3; ++i) probe.ref().tell(i);
  ASSERT_TRUE(sys.wait_idle());
  EXPECT_EQ(probe.pending(), 3u);
  auto all = probe.expect_messages(3);
  EXPECT_EQ(all, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(probe.pending(), 0u);
}

TEST(TestProbe, expect_message_fails_the_test_and_throws_when_nothing_arrives) {
  troupe::ActorSystem sys(quiet());
  TestProbe<int> probe(sys);
  bool threw = false;
  EXPECT_NONFATAL_FAILURE(
      {
        try {
          (void)probe.expect_message(20ms);
        } catch (const ExpectationFailed&) {
          threw = true;
        }
      },
      "expected a message within 20 ms, got none");
  EXPECT_TRUE(threw);
}

TEST(TestProbe, expect_of_one_alternative_fails_on_another_and_names_both) {
  troupe::ActorSystem sys(quiet());
  TestProbe<Msg> probe(sys);
  probe.ref().tell(Ping{7});
  bool threw = false;
  EXPECT_NONFATAL_FAILURE(
      {
        try {
          (void)probe.expect<Pong>();
        } catch (const ExpectationFailed&) {
          threw = true;
        }
      },
      "expected (anonymous namespace)::Pong, got (anonymous namespace)::Ping");
  EXPECT_TRUE(threw);
}

TEST(TestProbe, expect_no_message_fails_when_one_arrives) {
  troupe::ActorSystem sys(quiet());
  TestProbe<Msg> probe(sys);
  probe.ref().tell(Pong{1});
  EXPECT_NONFATAL_FAILURE(probe.expect_no_message(2s), "expected no message within 2000 ms, got");
}

TEST(TestProbe, expect_no_message_passes_in_silence) {
  troupe::ActorSystem sys(quiet());
  TestProbe<Msg> probe(sys);
  probe.expect_no_message(10ms);
  EXPECT_EQ(probe.pending(), 0u);
}

TEST(TestProbe, watch_forwards_the_down_notice_of_the_target) {
  troupe::ActorSystem sys(quiet());
  TestProbe<int> target(sys, "target");
  TestProbe<troupe::Down> probe(sys);
  probe.watch(target.ref());  // the watch races the stop: either order works
  target.ref().stop();
  auto down = probe.expect_message();
  EXPECT_EQ(down.actor, troupe::AnyRef(target.ref()));
  EXPECT_EQ(down.reason, troupe::ExitReason::normal);
}

TEST(TestProbe, a_probe_outliving_its_system_is_harmless) {
  auto sys = std::make_unique<troupe::ActorSystem>(quiet());
  auto probe = std::make_unique<TestProbe<int>>(*sys);
  probe->ref().tell(1);
  EXPECT_EQ(probe->expect_message(), 1);
  sys.reset();
  EXPECT_EQ(probe->ref().tell(2), troupe::Delivery::dead_letter);
  probe.reset();
}

TEST(Gate, wait_returns_true_once_opened_from_another_thread) {
  troupe::testkit::Gate g;
  EXPECT_FALSE(g.wait(1ms));
  std::thread t([&] { g.open(); });
  EXPECT_TRUE(g.wait());
  EXPECT_TRUE(g.is_open());
  t.join();
}

// --- ManualClockTest --------------------------------------------------------

struct Alarm : troupe::Actor<Msg> {
  explicit Alarm(troupe::ActorRef<Msg> to) : to_(std::move(to)) {}
  void on_start() { start_timer("alarm", 100ms, Ping{1}); }
  void receive(Msg& m) { to_.tell(std::move(m)); }
  troupe::ActorRef<Msg> to_;
};

class ManualClockFixture : public ManualClockTest {};

// proves: X3
TEST_F(ManualClockFixture, time_moves_only_by_advance) {
  auto t0 = now();
  std::this_thread::sleep_for(5ms);  // real time passes; virtual time must not
  settle();
  EXPECT_EQ(now(), t0);
  advance(250ms);
  EXPECT_EQ(now(), t0 + 250ms);
}

TEST_F(ManualClockFixture, advance_returns_after_the_fired_messages_were_handled) {
  TestProbe<Msg> probe(system);
  system.spawn<Alarm>(probe.ref());
  settle();
  advance(99ms);
  EXPECT_EQ(probe.pending(), 0u);
  advance(1ms);
  // No waiting on the probe: advance() already settled the system.
  EXPECT_EQ(probe.pending(), 1u);
  EXPECT_EQ(probe.expect<Ping>(0ms).n, 1);
}

TEST_F(ManualClockFixture, the_system_uses_two_threads_and_the_fixture_clock) {
  EXPECT_EQ(system.threads(), 2u);
  EXPECT_EQ(&system.clock(), clock.get());
}

}  // namespace
