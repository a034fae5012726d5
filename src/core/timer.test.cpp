// Keyed timers and the receive timeout, on the manual clock.
// Every timeout here is driven by advance(), nothing sleeps. A replaced or
// cancelled timer's message is never delivered, even when its fire is
// already in the mailbox: what the entity runtime's deadline cancel (E4)
// relies on.

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "troupe/core.hpp"
#include "troupe/testkit/gate.hpp"
#include "troupe/testkit/manual_clock_fixture.hpp"
#include "troupe/testkit/probe.hpp"

namespace {

using namespace std::chrono_literals;
using troupe::ActorRef;
using troupe::Duration;
using troupe::ErrorCode;
using troupe::TimePoint;
using troupe::testkit::Gate;
using troupe::testkit::ManualClockTest;
using troupe::testkit::TestProbe;

// What the actor under test reports: which timer message it handled, and when.
struct Seen {
  int tag = 0;
  TimePoint at{};
};

class Timed;

struct Start {
  std::string key;
  Duration delay{};
  int tag = 0;
};
struct StartPeriodic {
  std::string key;
  Duration interval{};
  int tag = 0;
};
struct Cancel {
  std::string key;
};
struct Fired {  // the timer message itself
  int tag = 0;
};
// Holds the actor inside a handler: opens `entered`, waits for `release`,
// then runs `then` on the actor (still inside the same handler).
struct Block {
  Gate* entered = nullptr;
  Gate* release = nullptr;
  std::function<void(Timed&)> then;
};
using TimerMsg = std::variant<Start, StartPeriodic, Cancel, Fired, Block>;

// Answers for control messages: the result of start_periodic_timer or cancel_timer.
struct PeriodicResult {
  ErrorCode code = ErrorCode::ok;
  bool active = false;
};
struct CancelResult {
  bool was_running = false;
  bool active_after = false;
};
using Control = std::variant<PeriodicResult, CancelResult>;

class Timed : public troupe::Actor<TimerMsg> {
 public:
  Timed(ActorRef<Seen> seen, ActorRef<Control> control) : seen_(std::move(seen)), control_(std::move(control)) {}

  void receive(TimerMsg& m) {
    troupe::match(
        m, [&](Start& s) { start_timer(s.key, s.delay, Fired{s.tag}); },
        [&](StartPeriodic& s) {
          auto r = start_periodic_timer(s.key, s.interval, Fired{s.tag});
          control_.tell(PeriodicResult{r.ok() ? ErrorCode::ok : r.error().code(), timer_active(s.key)});
        },
        [&](Cancel& c) {
          bool was = cancel_timer(c.key);
          control_.tell(CancelResult{was, timer_active(c.key)});
        },
        [&](Fired& f) { seen_.tell(Seen{f.tag, now()}); },
        [&](Block& b) {
          b.entered->open();
          ASSERT_TRUE(b.release->wait());
          if (b.then) b.then(*this);
        });
  }

  // For Block::then, which runs inside a handler.
  void restart(const std::string& key, Duration d, int tag) { start_timer(key, d, Fired{tag}); }
  bool cancel(const std::string& key) { return cancel_timer(key); }

 private:
  ActorRef<Seen> seen_;
  ActorRef<Control> control_;
};

class Timers : public ManualClockTest {
 protected:
  Timers() : seen(system, "seen"), control(system, "control") {}

  ActorRef<TimerMsg> spawn_timed() {
    auto t = system.spawn<Timed>(seen.ref(), control.ref());
    settle();
    return t;
  }
  // Tells and waits until handled, so that a following advance() sees the
  // timer the message started.
  void tell(const ActorRef<TimerMsg>& t, TimerMsg m) {
    t.tell(std::move(m));
    settle();
  }
  std::vector<int> seen_tags() {
    std::vector<int> tags;
    while (auto s = seen.try_receive()) tags.push_back(s->tag);
    return tags;
  }

  TestProbe<Seen> seen;
  TestProbe<Control> control;
};

// proves: X3
TEST_F(Timers, a_single_timer_fires_once_at_its_deadline_and_not_before) {
  auto t = spawn_timed();
  auto t0 = now();
  tell(t, Start{"t", 100ms, 1});
  settle();
  EXPECT_EQ(system.stats().timers_pending, 1u);

  advance(99ms);
  EXPECT_EQ(seen.pending(), 0u);
  advance(1ms);
  ASSERT_EQ(seen.pending(), 1u);
  auto s = seen.expect_message(0ms);
  EXPECT_EQ(s.tag, 1);
  EXPECT_EQ(s.at, t0 + 100ms);

  advance(10s);
  EXPECT_EQ(seen.pending(), 0u);
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

TEST_F(Timers, a_periodic_timer_fires_once_per_interval_at_each_interval) {
  auto t = spawn_timed();
  auto t0 = now();
  tell(t, StartPeriodic{"tick", 10ms, 7});
  EXPECT_EQ(control.expect<PeriodicResult>().code, ErrorCode::ok);
  for (int i = 1; i <= 5; ++i) {
    advance(9ms);
    EXPECT_EQ(seen.pending(), 0u) << "fired early in interval " << i;
    advance(1ms);
    auto s = seen.expect_message(0ms);
    EXPECT_EQ(s.tag, 7);
    EXPECT_EQ(s.at, t0 + i * 10ms);
  }
  EXPECT_EQ(seen.pending(), 0u);
}

TEST_F(Timers, a_periodic_timer_fires_n_times_over_n_intervals_in_one_advance) {
  auto t = spawn_timed();
  tell(t, StartPeriodic{"tick", 10ms, 7});
  (void)control.expect<PeriodicResult>();
  advance(100ms);
  EXPECT_EQ(seen_tags(), std::vector<int>(10, 7));
  EXPECT_EQ(system.stats().timers_pending, 1u);  // still running
}

TEST_F(Timers, a_periodic_timer_stops_when_cancelled) {
  auto t = spawn_timed();
  tell(t, StartPeriodic{"tick", 10ms, 7});
  (void)control.expect<PeriodicResult>();
  advance(30ms);
  EXPECT_EQ(seen_tags().size(), 3u);
  tell(t, Cancel{"tick"});
  auto c = control.expect<CancelResult>();
  EXPECT_TRUE(c.was_running);
  EXPECT_FALSE(c.active_after);
  advance(1s);
  EXPECT_EQ(seen.pending(), 0u);
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

TEST_F(Timers, starting_a_running_key_replaces_it_and_the_old_message_is_never_delivered) {
  auto t = spawn_timed();
  auto t0 = now();
  tell(t, Start{"t", 100ms, 1});
  advance(50ms);
  tell(t, Start{"t", 100ms, 2});
  settle();
  EXPECT_EQ(system.stats().timers_pending, 1u);  // the old one left the queue
  advance(50ms);                                   // the old deadline passes
  EXPECT_EQ(seen.pending(), 0u);
  advance(50ms);
  auto s = seen.expect_message(0ms);
  EXPECT_EQ(s.tag, 2);
  EXPECT_EQ(s.at, t0 + 150ms);
  advance(1s);
  EXPECT_EQ(seen.pending(), 0u);
}

// The hard case: the old timer has already fired and its message sits in the
// mailbox, behind the handler that replaces the timer.
TEST_F(Timers, a_replaced_timer_whose_fire_is_already_queued_is_never_delivered) {
  auto t = spawn_timed();
  tell(t, Start{"t", 100ms, 1});
  settle();
  Gate entered, release;
  t.tell(Block{&entered, &release, [](Timed& self) { self.restart("t", 100ms, 2); }});
  ASSERT_TRUE(entered.wait());
  clock->advance(100ms);  // fires while the actor is held: the fire is queued
  EXPECT_EQ(system.stats().timers_pending, 0u);
  auto stale_before = system.stats().stale_timer_fires;
  release.open();  // the handler replaces the timer, then the old fire runs
  settle();
  EXPECT_EQ(seen.pending(), 0u) << "the replaced timer's message was delivered";
  EXPECT_EQ(system.stats().stale_timer_fires, stale_before + 1);

  advance(100ms);
  EXPECT_EQ(seen_tags(), std::vector<int>{2});
}

TEST_F(Timers, a_cancelled_timer_whose_fire_is_already_queued_is_never_delivered) {
  auto t = spawn_timed();
  tell(t, Start{"t", 100ms, 1});
  settle();
  Gate entered, release;
  std::atomic<bool> cancelled{false};
  t.tell(Block{&entered, &release, [&](Timed& self) { cancelled = self.cancel("t"); }});
  ASSERT_TRUE(entered.wait());
  clock->advance(100ms);
  auto stale_before = system.stats().stale_timer_fires;
  release.open();
  settle();
  EXPECT_TRUE(cancelled) << "the timer still counts as running until its fire is handled";
  EXPECT_EQ(seen.pending(), 0u) << "the cancelled timer's message was delivered";
  EXPECT_EQ(system.stats().stale_timer_fires, stale_before + 1);
}

TEST_F(Timers, a_cancelled_periodic_timer_with_a_fire_already_queued_delivers_nothing_more) {
  auto t = spawn_timed();
  tell(t, StartPeriodic{"tick", 10ms, 7});
  (void)control.expect<PeriodicResult>();
  Gate entered, release;
  t.tell(Block{&entered, &release, [](Timed& self) { self.cancel("tick"); }});
  ASSERT_TRUE(entered.wait());
  clock->advance(30ms);  // three fires queued behind the handler
  auto stale_before = system.stats().stale_timer_fires;
  release.open();
  settle();
  EXPECT_EQ(seen.pending(), 0u);
  EXPECT_EQ(system.stats().stale_timer_fires, stale_before + 3);
  EXPECT_EQ(system.stats().timers_pending, 0u);
}

TEST_F(Timers, cancel_prevents_delivery_and_says_whether_a_timer_was_running) {
  auto t = spawn_timed();
  tell(t, Start{"t", 100ms, 1});
  advance(50ms);
  tell(t, Cancel{"t"});
  auto c = control.expect<CancelResult>();
  EXPECT_TRUE(c.was_running);
  EXPECT_FALSE(c.active_after);
  advance(1s);
  EXPECT_EQ(seen.pending(), 0u);
  EXPECT_EQ(system.stats().timers_pending, 0u);

  tell(t, Cancel{"t"});
  EXPECT_FALSE(control.expect<CancelResult>().was_running);
  tell(t, Cancel{"never-started"});
  EXPECT_FALSE(control.expect<CancelResult>().was_running);
}

TEST_F(Timers, a_single_timer_is_inactive_after_it_fired_and_its_key_can_be_started_again) {
  auto t = spawn_timed();
  tell(t, Start{"t", 10ms, 1});
  advance(10ms);
  tell(t, Cancel{"t"});
  EXPECT_FALSE(control.expect<CancelResult>().was_running);
  tell(t, Start{"t", 10ms, 2});
  advance(10ms);
  EXPECT_EQ(seen_tags(), (std::vector<int>{1, 2}));
}

TEST_F(Timers, timers_of_a_stopped_actor_never_fire_and_are_released) {
  auto t = spawn_timed();
  tell(t, Start{"a", 10ms, 1});
  tell(t, Start{"b", 1h, 2});
  tell(t, StartPeriodic{"c", 5ms, 3});
  (void)control.expect<PeriodicResult>();
  settle();
  EXPECT_EQ(system.stats().timers_pending, 3u);
  t.stop();
  settle();
  EXPECT_TRUE(t.terminated());
  EXPECT_EQ(system.stats().timers_pending, 0u);
  advance(2h);
  EXPECT_EQ(seen.pending(), 0u);
}

// The Actor hooks contract (actor.hpp): "on_stop(); // after the last
// message; timers already cancelled".
struct StopReporter : troupe::Actor<int> {
  explicit StopReporter(ActorRef<std::string> r) : report(std::move(r)) {}
  void on_start() { start_timer("t", 1h, 1); }
  void receive(int&) {}
  void on_stop() { report.tell(timer_active("t") ? "timer still active" : "timers cancelled"); }
  ActorRef<std::string> report;
};

TEST_F(Timers, timers_are_already_cancelled_when_on_stop_runs) {
  TestProbe<std::string> report(system);
  auto a = system.spawn<StopReporter>(report.ref());
  settle();
  a.stop();
  EXPECT_EQ(report.expect_message(), "timers cancelled");
}

TEST_F(Timers, an_actor_stopped_with_a_fire_in_its_mailbox_never_handles_it) {
  auto t = spawn_timed();
  tell(t, Start{"t", 10ms, 1});
  settle();
  Gate entered, release;
  t.tell(Block{&entered, &release, {}});
  ASSERT_TRUE(entered.wait());
  t.stop();               // queued first
  clock->advance(10ms);   // the fire is queued behind the stop
  release.open();
  settle();
  EXPECT_TRUE(t.terminated());
  EXPECT_EQ(seen.pending(), 0u);
}

TEST_F(Timers, timers_fire_in_deadline_order_and_equal_deadlines_in_start_order) {
  auto t = spawn_timed();
  tell(t, Start{"c", 30ms, 3});
  tell(t, Start{"a", 10ms, 1});
  tell(t, Start{"b", 20ms, 2});
  tell(t, Start{"d", 20ms, 4});  // same deadline as b, started after it
  tell(t, Start{"e", 10ms, 5});  // same deadline as a, started after it
  settle();
  advance(30ms);
  EXPECT_EQ(seen_tags(), (std::vector<int>{1, 5, 2, 4, 3}));
}

TEST_F(Timers, each_timer_is_handled_with_now_equal_to_its_deadline_when_time_steps_to_it) {
  auto t = spawn_timed();
  auto t0 = now();
  tell(t, Start{"a", 10ms, 1});
  tell(t, Start{"b", 25ms, 2});
  settle();
  advance(10ms);
  advance(15ms);
  auto a = seen.expect_message(0ms);
  auto b = seen.expect_message(0ms);
  EXPECT_EQ(a.at, t0 + 10ms);
  EXPECT_EQ(b.at, t0 + 25ms);
}

TEST_F(Timers, a_zero_or_negative_periodic_interval_is_refused_with_invalid_argument) {
  auto t = spawn_timed();
  tell(t, StartPeriodic{"z", 0ms, 1});
  auto z = control.expect<PeriodicResult>();
  EXPECT_EQ(z.code, ErrorCode::invalid_argument);
  EXPECT_FALSE(z.active);
  tell(t, StartPeriodic{"n", -5ms, 1});
  auto n = control.expect<PeriodicResult>();
  EXPECT_EQ(n.code, ErrorCode::invalid_argument);
  EXPECT_FALSE(n.active);
  settle();
  EXPECT_EQ(system.stats().timers_pending, 0u);
  advance(1s);
  EXPECT_EQ(seen.pending(), 0u);
}

TEST_F(Timers, a_refused_periodic_start_leaves_a_running_timer_of_that_key_alone) {
  auto t = spawn_timed();
  tell(t, Start{"k", 10ms, 1});
  tell(t, StartPeriodic{"k", 0ms, 2});
  EXPECT_EQ(control.expect<PeriodicResult>().code, ErrorCode::invalid_argument);
  advance(10ms);
  EXPECT_EQ(seen_tags(), std::vector<int>{1});
}

TEST_F(Timers, the_same_key_in_two_actors_names_two_independent_timers) {
  auto a = spawn_timed();
  auto b = spawn_timed();
  tell(a, Start{"t", 10ms, 1});
  tell(b, Start{"t", 20ms, 2});
  advance(5ms);
  tell(a, Cancel{"t"});
  EXPECT_TRUE(control.expect<CancelResult>().was_running);
  advance(20ms);
  EXPECT_EQ(seen_tags(), std::vector<int>{2});
}

// --- receive timeout ------------------------------------------------------------------

struct Touch {};
struct Quiet {};
struct SetTimeout {
  Duration d{};
};
struct CancelTimeout {};
struct HoldRT {
  Gate* entered = nullptr;
  Gate* release = nullptr;
  bool cancel_after = false;
};
using RtMsg = std::variant<Touch, Quiet, SetTimeout, CancelTimeout, HoldRT>;

struct Idler : troupe::Actor<RtMsg> {
  Idler(ActorRef<TimePoint> q, ActorRef<ErrorCode> r) : quiet(std::move(q)), results(std::move(r)) {}
  void receive(RtMsg& m) {
    troupe::match(
        m, [&](Touch&) {}, [&](Quiet&) { quiet.tell(now()); },
        [&](SetTimeout& s) {
          auto r = set_receive_timeout(s.d, Quiet{});
          results.tell(r.ok() ? ErrorCode::ok : r.error().code());
        },
        [&](CancelTimeout&) { cancel_receive_timeout(); },
        [&](HoldRT& h) {
          h.entered->open();
          ASSERT_TRUE(h.release->wait());
          if (h.cancel_after) cancel_receive_timeout();
        });
  }
  ActorRef<TimePoint> quiet;
  ActorRef<ErrorCode> results;
};

class ReceiveTimeout : public ManualClockTest {
 protected:
  ReceiveTimeout() : quiet(system, "quiet"), results(system, "results") {}
  ActorRef<RtMsg> spawn_idler(Duration d, ErrorCode expected = ErrorCode::ok) {
    auto a = system.spawn<Idler>(quiet.ref(), results.ref());
    a.tell(SetTimeout{d});
    EXPECT_EQ(results.expect_message(), expected);
    settle();
    return a;
  }
  TestProbe<TimePoint> quiet;
  TestProbe<ErrorCode> results;
};

TEST_F(ReceiveTimeout, is_delivered_after_the_quiet_period_and_not_before) {
  auto t0 = now();
  auto a = spawn_idler(100ms);
  advance(99ms);
  EXPECT_EQ(quiet.pending(), 0u);
  advance(1ms);
  EXPECT_EQ(quiet.expect_message(0ms), t0 + 100ms);
}

TEST_F(ReceiveTimeout, is_repeated_every_period_while_the_actor_stays_quiet) {
  auto t0 = now();
  auto a = spawn_idler(100ms);
  advance_in_steps(300ms, 100ms);
  EXPECT_EQ(quiet.expect_messages(3, 0ms), (std::vector<TimePoint>{t0 + 100ms, t0 + 200ms, t0 + 300ms}));
}

TEST_F(ReceiveTimeout, is_pushed_back_by_every_message) {
  auto t0 = now();
  auto a = spawn_idler(100ms);
  advance(60ms);
  a.tell(Touch{});
  settle();
  advance(40ms);  // the original deadline: the actor was active 40ms ago
  EXPECT_EQ(quiet.pending(), 0u);
  advance(59ms);
  EXPECT_EQ(quiet.pending(), 0u);
  advance(1ms);
  EXPECT_EQ(quiet.expect_message(0ms), t0 + 160ms);
}

TEST_F(ReceiveTimeout, cancel_stops_it_for_good) {
  auto a = spawn_idler(100ms);
  advance(50ms);
  a.tell(CancelTimeout{});
  settle();
  EXPECT_EQ(system.stats().timers_pending, 0u);
  advance_in_steps(1s, 100ms);
  EXPECT_EQ(quiet.pending(), 0u);
}

TEST_F(ReceiveTimeout, setting_it_again_replaces_the_earlier_period) {
  auto t0 = now();
  auto a = spawn_idler(100ms);
  a.tell(SetTimeout{300ms});
  EXPECT_EQ(results.expect_message(), ErrorCode::ok);
  settle();
  advance(100ms);
  EXPECT_EQ(quiet.pending(), 0u);
  advance(200ms);
  EXPECT_EQ(quiet.expect_message(0ms), t0 + 300ms);
  EXPECT_EQ(system.stats().timers_pending, 1u);  // one node, not two
}

TEST_F(ReceiveTimeout, a_timeout_already_queued_when_it_is_cancelled_is_never_delivered) {
  auto a = spawn_idler(100ms);
  Gate entered, release;
  advance(50ms);
  a.tell(HoldRT{&entered, &release, true});
  ASSERT_TRUE(entered.wait());
  clock->advance(200ms);  // the timeout fires while the actor is held
  auto stale_before = system.stats().stale_timer_fires;
  release.open();
  settle();
  EXPECT_EQ(quiet.pending(), 0u);
  EXPECT_GE(system.stats().stale_timer_fires, stale_before + 1);
  advance_in_steps(1s, 100ms);
  EXPECT_EQ(quiet.pending(), 0u);
}

// A zero or negative period would re-arm at now() after every delivery: a
// busy loop on the system clock (about 60k messages a second were measured
// before it was refused). Like a periodic timer's interval, it is refused.
TEST_F(ReceiveTimeout, a_zero_or_negative_period_is_refused_with_invalid_argument_and_never_fires) {
  auto a = spawn_idler(0ms, ErrorCode::invalid_argument);
  a.tell(SetTimeout{-5ms});
  EXPECT_EQ(results.expect_message(), ErrorCode::invalid_argument);
  settle();
  EXPECT_EQ(system.stats().timers_pending, 0u);
  advance_in_steps(10ms, 1ms);
  EXPECT_EQ(quiet.pending(), 0u);
}

TEST_F(ReceiveTimeout, a_refused_period_leaves_the_running_timeout_alone) {
  auto t0 = now();
  auto a = spawn_idler(100ms);
  a.tell(SetTimeout{0ms});
  EXPECT_EQ(results.expect_message(), ErrorCode::invalid_argument);
  settle();
  advance(100ms);
  EXPECT_EQ(quiet.expect_message(0ms), t0 + 100ms);
}

TEST_F(ReceiveTimeout, stops_with_the_actor) {
  auto a = spawn_idler(100ms);
  a.stop();
  settle();
  EXPECT_EQ(system.stats().timers_pending, 0u);
  advance_in_steps(1s, 100ms);
  EXPECT_EQ(quiet.pending(), 0u);
}

}  // namespace
