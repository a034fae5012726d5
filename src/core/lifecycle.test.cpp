// Lifecycle edges: spawn, restart back-off, stop during failure, on_stop.
// Back-off runs on the manual clock; nothing here takes the process down.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::Actor;
using troupe::ActorRef;
using troupe::Down;
using troupe::ExitReason;
using troupe::RestartPolicy;
using troupe::SpawnOptions;
using troupe::Supervision;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

class Lifecycle : public ManualClockTest {};

struct Counts {
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
};

SpawnOptions restart_after(troupe::Duration backoff, std::string name = "a") {
  RestartPolicy p;
  p.min_backoff = backoff;
  p.max_backoff = backoff;
  p.max_restarts = 100;
  return SpawnOptions{.name = std::move(name), .supervision = Supervision::restart(p)};
}

// A handler that calls stop() and then throws, under restart with a back-off:
// the stop wins, the actor terminates once, and it is never brought back.
struct StopThenThrow : Actor<int> {
  explicit StopThenThrow(std::shared_ptr<Counts> c) : counts(std::move(c)) {}
  void on_start() { counts->started++; }
  void on_stop() { counts->stopped++; }
  void receive(int&) {
    stop();
    throw std::runtime_error("after stop");
  }
  std::shared_ptr<Counts> counts;
};

TEST_F(Lifecycle, a_handler_that_stops_and_then_throws_is_stopped_not_restarted) {
  auto counts = std::make_shared<Counts>();
  TestProbe<Down> downs(system);
  auto a = system.spawn<StopThenThrow>(restart_after(1s), counts);
  downs.watch(a);
  a.tell(1);
  auto d = downs.expect_message();
  EXPECT_EQ(d.reason, ExitReason::failure);
  EXPECT_EQ(d.detail, "after stop");
  advance(10s);  // a restart timer, had one been armed, would fire here
  settle();
  EXPECT_EQ(counts->started.load(), 1);
  EXPECT_EQ(counts->stopped.load(), 1);
  EXPECT_EQ(system.stats().restarts, 0u);
  EXPECT_EQ(system.stats().timers_pending, 0u);
  EXPECT_TRUE(a.terminated());
}

// Fails on 0, records everything else.
struct Flaky : Actor<int> {
  Flaky(std::shared_ptr<Counts> c, ActorRef<int> o) : counts(std::move(c)), out(std::move(o)) {}
  void on_start() { counts->started++; }
  void on_stop() { counts->stopped++; }
  void receive(int& n) {
    if (n == 0) throw std::runtime_error("zero");
    out.tell(n);
  }
  std::shared_ptr<Counts> counts;
  ActorRef<int> out;
};

TEST_F(Lifecycle, messages_sent_during_a_restart_back_off_wait_for_it_and_keep_their_order) {
  auto counts = std::make_shared<Counts>();
  TestProbe<int> out(system);
  auto a = system.spawn<Flaky>(restart_after(5s), counts, out.ref());
  a.tell(0);
  for (int i = 1; i <= 5; ++i) a.tell(i);
  settle();
  out.expect_no_message(50ms);  // suspended: nothing handled yet
  advance(4s);
  out.expect_no_message(50ms);
  advance(1s);
  for (int i = 1; i <= 5; ++i) EXPECT_EQ(out.expect_message(), i);
  EXPECT_EQ(counts->started.load(), 2);
  EXPECT_EQ(counts->stopped.load(), 1);
}

TEST_F(Lifecycle, a_stop_during_a_restart_back_off_stops_at_once_and_reports_the_waiting_messages) {
  auto counts = std::make_shared<Counts>();
  TestProbe<int> out(system);
  TestProbe<Down> downs(system);
  auto a = system.spawn<Flaky>(restart_after(1h), counts, out.ref());
  downs.watch(a);
  a.tell(0);
  a.tell(7);
  a.tell(8);
  settle();
  auto before = system.stats().dead_letters;
  a.stop();  // no clock advance: the back-off must not delay the stop
  auto d = downs.expect_message();
  EXPECT_EQ(d.reason, ExitReason::normal);
  EXPECT_EQ(system.stats().dead_letters - before, 2u);  // 7 and 8, reported, not lost silently
  EXPECT_EQ(system.stats().timers_pending, 0u);
  EXPECT_EQ(counts->started.load(), 1);  // never rebuilt just to be stopped
  out.expect_no_message(50ms);
}

TEST_F(Lifecycle, shutdown_does_not_wait_for_a_restart_back_off) {
  auto counts = std::make_shared<Counts>();
  auto a = system.spawn<Flaky>(restart_after(1h), counts, ActorRef<int>{});
  a.tell(0);
  settle();
  auto t0 = std::chrono::steady_clock::now();
  system.shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(system.stats().actors_live, 0u);
}

// Messages an actor's constructor sends to itself are handled after on_start.
struct SelfStarter : Actor<std::string> {
  explicit SelfStarter(ActorRef<std::string> o) : out(std::move(o)) {
    for (int i = 0; i < 3; ++i) self().tell("ctor " + std::to_string(i));
  }
  void on_start() { out.tell("start"); }
  void receive(std::string& s) { out.tell(s); }
  ActorRef<std::string> out;
};

TEST_F(Lifecycle, messages_a_constructor_sends_to_itself_are_handled_after_on_start) {
  TestProbe<std::string> out(system);
  system.spawn<SelfStarter>(out.ref());
  EXPECT_EQ(out.expect_message(), "start");
  EXPECT_EQ(out.expect_message(), "ctor 0");
  EXPECT_EQ(out.expect_message(), "ctor 1");
  EXPECT_EQ(out.expect_message(), "ctor 2");
}

// A constructor that throws: the spawner gets the exception, nothing leaks
// (ASan), nothing runs.
struct ThrowingCtor : Actor<int> {
  explicit ThrowingCtor(ActorRef<int> o) {
    self().tell(1);
    start_timer("t", 1s, 2);
    o.tell(0);
    throw std::invalid_argument("bad config");
  }
  void receive(int&) {}
};

TEST_F(Lifecycle, a_throwing_constructor_throws_to_the_spawner_and_leaves_nothing_behind) {
  TestProbe<int> out(system);
  EXPECT_THROW(system.spawn<ThrowingCtor>(out.ref()), std::invalid_argument);
  EXPECT_EQ(out.expect_message(), 0);
  advance(2s);
  EXPECT_EQ(system.stats().timers_pending, 0u);
  EXPECT_EQ(system.stats().actors_live, 1u);  // the probe only
}

// on_stop cannot leave a timer behind, at restart or at the final stop.
struct TimerInOnStop : Actor<int> {
  TimerInOnStop(std::shared_ptr<Counts> c, ActorRef<int> o) : counts(std::move(c)), out(std::move(o)) {}
  void on_start() { counts->started++; }
  void on_stop() { start_timer("late", 1s, 99); }
  void receive(int& n) {
    if (n == 0) throw std::runtime_error("zero");
    out.tell(n);
  }
  std::shared_ptr<Counts> counts;
  ActorRef<int> out;
};

TEST_F(Lifecycle, a_timer_armed_in_on_stop_never_fires_in_the_next_incarnation_or_after_the_end) {
  auto counts = std::make_shared<Counts>();
  TestProbe<int> out(system);
  auto a = system.spawn<TimerInOnStop>(restart_after(0s), counts, out.ref());
  a.tell(0);  // restart: on_stop arms "late"
  a.tell(1);
  EXPECT_EQ(out.expect_message(), 1);
  advance(2s);
  out.expect_no_message(50ms);
  a.stop();  // final stop: on_stop arms "late" again
  settle();
  EXPECT_EQ(system.stats().timers_pending, 0u);
  advance(2s);
  out.expect_no_message(50ms);
  EXPECT_EQ(counts->started.load(), 2);
}

// Over-aligned state (false-sharing padding) is honoured.
struct alignas(64) Padded : Actor<int> {
  explicit Padded(ActorRef<long> o) : out(std::move(o)) {}
  void on_start() { out.tell(static_cast<long>(reinterpret_cast<std::uintptr_t>(&hot) % 64)); }
  void receive(int& n) { hot += n; }
  alignas(64) std::atomic<long> hot{0};
  ActorRef<long> out;
};

TEST_F(Lifecycle, an_over_aligned_actor_is_placed_on_its_alignment) {
  TestProbe<long> out(system);
  for (int i = 0; i < 64; ++i) system.spawn<Padded>(out.ref());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out.expect_message(), 0L) << "actor " << i;
}

}  // namespace
